//! What the server thread and the test's handle share.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::faults::FaultBook;
use crate::route::Route;
use crate::state::State;

/// Locks, ignoring poisoning: a panicking test thread must not wedge the server.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Fixed at start.
#[derive(Clone, Debug)]
pub(crate) struct Fixed {
    pub username: String,
    pub password: String,
    pub session_timeout: Duration,
}

/// One request as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path without the query.
    pub path: String,
    pub route: Option<Route>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

pub(crate) struct Shared {
    pub config: Fixed,
    pub state: Mutex<State>,
    pub faults: Mutex<FaultBook>,
    pub compose_delay: Mutex<Duration>,
    pub requests: Mutex<Vec<RecordedRequest>>,
}
