//! What every fabric simulator shares, so that a new one (another vendor's fabric
//! manager) is its protocol only:
//!
//! - [`faults`]: injections (a fault, the route it applies to, how long it lasts), the
//!   book that hands them out per request, and the plans the server carries out around
//!   a handler ([`Action`], [`After`]: answer instead, slow reply, drop before or after
//!   acting, cut the body).
//! - [`record`]: every request as received ([`RecordedRequest`]: with the client's
//!   address and, when a test installs a [`CallerResolver`], who the client is) and the
//!   log of them.
//! - [`Controls`]: the fault book and the log together, the part of a simulator's handle
//!   a test or the conformance suite drives ([`SimControl`]).
//! - [`server`]: loopback listeners (HTTP, or HTTPS with [`tls`]) served on a thread of
//!   their own, and the per-request wrapper that records, applies faults and really
//!   drops connections; a simulator plugs in with [`Protocol`].

pub mod controls;
pub mod faults;
pub mod record;
pub mod server;
pub mod tls;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use controls::{CallerResolver, Controls, SimControl};
pub use faults::{Action, After, FaultBook, FaultId, FaultKind, Injection, ReplyPlan, Scope};
pub use record::{RecordedRequest, RequestLog, bearer_token};
pub use server::{Listener, Protocol, Server, bind_loopback, raw_reply};
pub use tls::{TlsError, TlsMaterial};

/// Locks without propagating poison: a panicking test thread must not take a simulator
/// down with it, and every critical section leaves its state consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
