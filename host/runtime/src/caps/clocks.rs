//! The clocks capability (`wasi:clocks`): the runtime's wall clock and the monotonic
//! clock only when `grants.wasi.clocks`; otherwise the wall clock reads the Unix epoch
//! and the monotonic clock stands still, so an ungranted provider learns nothing about
//! time (and cannot time the host).

use std::time::{Duration, UNIX_EPOCH};

use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use crate::base::WallClock;

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

/// Gives the context the clocks the grant allows.
pub(crate) fn install(builder: &mut WasiCtxBuilder, granted: bool, clock: &WallClock) {
    if granted {
        builder.wall_clock(InjectedWallClock(clock.clone()));
    } else {
        builder
            .wall_clock(FrozenWallClock)
            .monotonic_clock(FrozenMonotonicClock);
    }
}
