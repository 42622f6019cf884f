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

use std::sync::Arc;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use self::capture::TailCapture;
use self::grant::WasiGrant;
use super::capability::{CallSetup, Capability, Declared, Findings, Load, SetupError};
use super::clocks;
use crate::base::{FieldError, WallClock};

/// The capability, as `crate::caps` registers it.
pub(crate) struct WasiCap;

impl Capability for WasiCap {
    const NAME: &'static str = "wasi";
    type Grant = WasiGrant;
    type Shared = Wasi;
    type Call = WasiCall;

    /// Its one field is a boolean: nothing the types do not say already.
    fn validate(_: &WasiGrant) -> Result<(), FieldError> {
        Ok(())
    }

    fn load(grant: &WasiGrant, load: &Load<'_>) -> Result<Wasi, SetupError> {
        Ok(Wasi {
            grant: *grant,
            clock: load.clock.clone(),
            output_bytes: load.guest_output_bytes,
            handles: load.limits.wasi_handles_per_call as usize,
        })
    }

    fn call(shared: &Arc<Wasi>, _: &CallSetup) -> WasiCall {
        let stdout = TailCapture::new(shared.output_bytes);
        let stderr = TailCapture::new(shared.output_bytes);
        // Each handle is a table entry and the object behind it, on the host's heap and
        // not in the guest's memory: without a cap, 100,000 pollables cost 29 MiB the
        // memory budget never saw. A push beyond it fails; `crate::provider` reports the
        // call as over `limits.wasi_handles_per_call`.
        let mut table = ResourceTable::new();
        table.set_max_capacity(shared.handles);
        WasiCall {
            ctx: context(shared.grant, &shared.clock, stdout.clone(), stderr.clone()),
            table,
            stdout,
            stderr,
        }
    }

    /// WASI's bindings reach this call's side through the store's [`WasiView`] (which
    /// hands out [`WasiCall::ctx`]), not through `get`.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _get: fn(&mut T) -> &mut WasiCall,
    ) -> wasmtime::Result<()> {
        wasmtime_wasi::p2::add_to_linker_async(linker)
    }

    fn report(grant: &WasiGrant, declared: &Declared<'_>, findings: &mut Findings) {
        match (declared.info.capabilities.clocks, grant.clocks) {
            (true, false) => findings.wanted_not_granted.push("clocks".into()),
            (false, true) => findings.granted_not_wanted.push("clocks".into()),
            _ => {}
        }
    }

    #[cfg(test)]
    fn example() -> WasiGrant {
        WasiGrant { clocks: true }
    }
}

/// The provider's side.
pub(crate) struct Wasi {
    grant: WasiGrant,
    clock: WallClock,
    output_bytes: usize,
    /// `limits.wasi_handles_per_call`.
    handles: usize,
}

/// One call's side: its WASI context, its resources and what it wrote.
pub(crate) struct WasiCall {
    ctx: WasiCtx,
    table: ResourceTable,
    stdout: TailCapture,
    stderr: TailCapture,
}

impl WasiCall {
    /// What the call wrote to stdout and stderr (kept after its store is gone).
    pub(crate) fn output(&self) -> (TailCapture, TailCapture) {
        (self.stdout.clone(), self.stderr.clone())
    }
}

impl WasiView for WasiCall {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

fn context(
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
