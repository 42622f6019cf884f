//! The part of a simulator a test or the conformance suite drives: the faults in force
//! and the requests received.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::faults::{FaultBook, FaultId, FaultKind, Injection, ReplyPlan};
use crate::lock;
use crate::record::{RecordedRequest, RequestLog};

/// Names the client of a connection (e.g. the process owning its socket), or None when
/// it does not know it: called with the client's address (the peer) and the address it
/// connected to (the server's side of the connection; both are needed, since one local
/// port may serve a process's connections to several servers at once). Called when the
/// connection is accepted, and again at its requests while it has no name: the client's
/// socket exists then.
pub type CallerResolver = Arc<dyn Fn(SocketAddr, SocketAddr) -> Option<String> + Send + Sync>;

/// A simulator's fault book and request log, shared by its server and its handle.
pub struct Controls<F, R> {
    faults: Mutex<FaultBook<F, R>>,
    log: RequestLog<R>,
    callers: Mutex<Option<CallerResolver>>,
}

impl<F, R> Default for Controls<F, R> {
    fn default() -> Self {
        Controls {
            faults: Mutex::new(FaultBook::default()),
            log: RequestLog::default(),
            callers: Mutex::new(None),
        }
    }
}

impl<F: FaultKind, R: Clone + PartialEq> Controls<F, R> {
    // ---- faults ----

    /// Injects a fault; a bare fault applies once, to any route.
    pub fn inject(&self, injection: impl Into<Injection<F, R>>) -> FaultId {
        lock(&self.faults).inject(injection.into())
    }

    /// Removes one injection; false if it was used up or removed already.
    pub fn remove_fault(&self, id: FaultId) -> bool {
        lock(&self.faults).remove(id)
    }

    pub fn clear_faults(&self) {
        lock(&self.faults).clear();
    }

    /// Injections not used up yet.
    pub fn active_faults(&self) -> usize {
        lock(&self.faults).len()
    }

    /// For the server: consumes the latencies and the reply-level fault of a request.
    pub fn plan_reply(&self, route: Option<&R>) -> ReplyPlan<F> {
        lock(&self.faults).plan_reply(route)
    }

    /// For a protocol step: consumes the first fault on `route` that `pred` accepts.
    pub fn take_fault(&self, route: Option<&R>, pred: impl Fn(&F) -> bool) -> Option<F> {
        lock(&self.faults).take(route, pred)
    }

    // ---- requests ----

    /// For the server: appends a request to the log.
    pub fn record(&self, req: RecordedRequest<R>) {
        self.log.record(req);
    }

    /// Every request received since start or the last [`Controls::clear_requests`].
    pub fn requests(&self) -> Vec<RecordedRequest<R>> {
        self.log.all()
    }

    pub fn requests_to(&self, route: R) -> Vec<RecordedRequest<R>> {
        self.log.to(&route)
    }

    /// The sequence number of the newest request recorded (0: none yet, or cleared).
    pub fn last_seq(&self) -> u64 {
        self.log.last_seq()
    }

    /// Whether a request to one of `routes` came after request `seq` and satisfies `pred`.
    pub fn any_request_since(
        &self,
        seq: u64,
        routes: &[R],
        pred: impl Fn(&RecordedRequest<R>) -> bool,
    ) -> bool {
        self.log.any_since(seq, routes, pred)
    }

    /// `f` of each request after request `seq`, in arrival order, without copying the
    /// requests.
    pub fn map_requests_since<T>(
        &self,
        seq: u64,
        f: impl FnMut(&RecordedRequest<R>) -> T,
    ) -> Vec<T> {
        self.log.map_since(seq, f)
    }

    pub fn clear_requests(&self) {
        self.log.clear();
    }

    // ---- callers ----

    /// Names the callers of connections with `resolver` (None: stop): asked as a
    /// connection is accepted, and at its requests while it has no name. A connection
    /// keeps the name it was given.
    pub fn set_caller_resolver(&self, resolver: Option<CallerResolver>) {
        *lock(&self.callers) = resolver;
    }

    /// For the server: the resolver to ask about a new connection, if any.
    pub fn caller_resolver(&self) -> Option<CallerResolver> {
        lock(&self.callers).clone()
    }
}

/// A running simulator as a generic driver (a conformance fabric, a benchmark) sees it:
/// where it serves, and its controls. Each simulator's handle also offers the controls
/// as methods of its own.
pub trait SimControl {
    type Fault: FaultKind;
    type Route: Clone + PartialEq;

    /// The base URL its APIs are under, with a trailing slash.
    fn endpoint(&self) -> String;

    fn controls(&self) -> &Controls<Self::Fault, Self::Route>;

    /// Stops the server and waits for its thread.
    fn shutdown(&self);
}
