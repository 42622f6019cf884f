//! The `wasi` capability: the deny-everything WASI context of one call.
//!
//! Rust `std` components import `wasi:*` 0.2, so the linker provides them, but this context
//! grants nothing: no preopened directories (every file operation fails), no environment
//! variables, no arguments, stdin closed, TCP/UDP and name lookup disabled with every socket
//! address refused, stdout/stderr into bounded captures ([`capture`]). Clocks only when
//! `grants.wasi.clocks` (see `caps::clocks`). Random numbers are allowed (they reveal
//! nothing about the host).

pub(crate) mod capture;
pub mod grant;

use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

use self::capture::TailCapture;
use self::grant::WasiGrant;
use super::clocks;
use crate::base::WallClock;

pub(crate) fn context(
    grant: WasiGrant,
    clock: &WallClock,
    stdout: TailCapture,
    stderr: TailCapture,
) -> WasiCtx {
    let mut b = WasiCtxBuilder::new();
    b.stdout(stdout)
        .stderr(stderr)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }));
    clocks::install(&mut b, grant.clocks, clock);
    b.build()
}
