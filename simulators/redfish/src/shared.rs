//! What the server thread and the test's handle share.

use std::sync::Mutex;
use std::time::Duration;

use sim_kit::Controls;
pub(crate) use sim_kit::lock;

use crate::faults::Fault;
use crate::route::Route;
use crate::state::State;

/// Fixed at start.
#[derive(Clone, Debug)]
pub(crate) struct Fixed {
    pub username: String,
    pub password: String,
    pub session_timeout: Duration,
}

/// One request as received.
pub type RecordedRequest = sim_kit::RecordedRequest<Route>;

pub(crate) struct Shared {
    pub config: Fixed,
    pub state: Mutex<State>,
    pub compose_delay: Mutex<Duration>,
    /// Faults in force and requests received.
    pub controls: Controls<Fault, Route>,
}
