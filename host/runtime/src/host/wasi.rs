//! The deny-everything WASI context of one call.
//!
//! Rust `std` components import `wasi:*` 0.2, so the linker provides them, but this context
//! grants nothing: no preopened directories (every file operation fails), no environment
//! variables, no arguments, stdin closed, TCP/UDP and name lookup disabled with every socket
//! address refused, stdout/stderr into bounded captures. Clocks only when
//! `grants.wasi.clocks`; otherwise the wall clock reads the Unix epoch and the monotonic
//! clock stands still. Random numbers are allowed (they reveal nothing about the host).

use std::time::{Duration, UNIX_EPOCH};

use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder};

use super::capture::TailCapture;
use crate::grants::WasiGrant;
use crate::runtime::WallClock;

struct InjectedWallClock(WallClock);

impl HostWallClock for InjectedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        (self.0)().duration_since(UNIX_EPOCH).unwrap_or_default()
    }
}

struct FrozenWallClock;

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }

    fn now(&self) -> u64 {
        0
    }
}

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
    if grant.clocks {
        b.wall_clock(InjectedWallClock(clock.clone()));
    } else {
        b.wall_clock(FrozenWallClock)
            .monotonic_clock(FrozenMonotonicClock);
    }
    b.build()
}
