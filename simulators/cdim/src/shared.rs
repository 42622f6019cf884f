//! What the server threads and the test's handle share.

use std::sync::Mutex;
use std::time::Duration;

use sim_kit::Controls;
pub(crate) use sim_kit::lock;

use crate::faults::Fault;
use crate::route::Route;
use crate::state::State;

/// One request as received.
pub type RecordedRequest = sim_kit::RecordedRequest<Route>;

pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// How long a layout apply takes.
    pub apply_delay: Mutex<Duration>,
    /// Faults in force and requests received, of both services.
    pub controls: Controls<Fault, Route>,
}
