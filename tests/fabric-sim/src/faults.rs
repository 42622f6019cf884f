//! Fault injection: what can go wrong, on which route, and for how many requests.

use std::time::Duration;

use serde_json::Value;

use crate::record::Route;

/// One kind of misbehaviour. Reply-level faults (latency, errors, malformed JSON,
/// dropped connections) apply to any request the injection's route matches; the others
/// only to requests that reach the step they change (for example `NoFreeDevice` is
/// consumed by an attach that would otherwise succeed, never by a GET).
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Delay the reply; combines with any other fault on the same request.
    Latency(Duration),
    /// Reply `{"status": N, "detail": {"code": .., "message": ..}}` with HTTP status N
    /// without touching state. `message` may be a JSON string or any other JSON value.
    Error {
        status: u16,
        code: String,
        message: Value,
    },
    /// Reply with exactly this status and body (content type `application/json`)
    /// without touching state.
    Reply { status: u16, body: String },
    /// Do the request, then send its status with the JSON body cut in half.
    MalformedJson,
    /// Close the connection without a reply, before the request changes anything.
    Drop,
    /// Do the request (state changes), then close the connection without a reply.
    DropAfterProcessing,
    /// Act, then drop the reply late: do the request (state changes), hold the reply
    /// for this long, then close the connection without it. A client whose deadline is
    /// shorter gives up first, like against a fabric that acted but answered too slowly.
    StallAfterProcessing(Duration),
    /// Token endpoint: issue tokens whose `exp` is already in the past.
    ExpiredTokens,
    /// Token endpoint: reject the credentials with 401 `invalid_grant`.
    RejectCredentials,
    /// FM attach / CM increase: behave as if the pool of the model were empty.
    NoFreeDevice,
    /// FM attach / CM increase: the attached devices get this `res_op_status`
    /// (`""`, `"x"`, `"1"`, `"2"`, ...).
    AttachOpStatus(String),
    /// CM increase: the new devices end in `ADD_FAILED` with this `status_reason`.
    CmAddFailed { reason: String },
    /// CM remove: the devices end in `REMOVE_FAILED` with this `status_reason`.
    CmRemoveFailed { reason: String },
}

impl Fault {
    /// An FTI error reply whose message is a JSON string.
    pub fn error(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        Fault::Error {
            status,
            code: code.into(),
            message: Value::String(message.into()),
        }
    }

    /// An FTI error reply whose message is any JSON value (e.g. an object).
    pub fn error_value(status: u16, code: impl Into<String>, message: Value) -> Self {
        Fault::Error {
            status,
            code: code.into(),
            message,
        }
    }

    /// Restrict to one route.
    pub fn on(self, route: Route) -> Injection {
        Injection::from(self).on(route)
    }

    /// Apply to the next `n` matching requests.
    pub fn times(self, n: u32) -> Injection {
        Injection::from(self).times(n)
    }

    /// Apply until removed or `clear_faults`.
    pub fn always(self) -> Injection {
        Injection::from(self).always()
    }

    pub(crate) fn is_reply_level(&self) -> bool {
        matches!(
            self,
            Fault::Error { .. }
                | Fault::Reply { .. }
                | Fault::MalformedJson
                | Fault::Drop
                | Fault::DropAfterProcessing
                | Fault::StallAfterProcessing(_)
        )
    }
}

/// How long an injection lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The next N requests it applies to.
    Times(u32),
    /// Until removed or cleared.
    UntilCleared,
}

/// A fault with its route filter and scope. From a bare [`Fault`]: any route, once.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    pub fault: Fault,
    pub route: Option<Route>,
    pub scope: Scope,
}

impl Injection {
    pub fn on(mut self, route: Route) -> Self {
        self.route = Some(route);
        self
    }

    pub fn times(mut self, n: u32) -> Self {
        self.scope = Scope::Times(n);
        self
    }

    pub fn always(mut self) -> Self {
        self.scope = Scope::UntilCleared;
        self
    }
}

impl From<Fault> for Injection {
    fn from(fault: Fault) -> Self {
        Injection {
            fault,
            route: None,
            scope: Scope::Times(1),
        }
    }
}

/// Handle to remove one injection with `FabricSim::remove_fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultId(pub(crate) u64);

struct Active {
    id: u64,
    injection: Injection,
    used: u32,
}

#[derive(Default)]
pub(crate) struct FaultBook {
    next_id: u64,
    active: Vec<Active>,
}

/// What the server does around the handler for one request.
#[derive(Default, Debug)]
pub(crate) struct ReplyPlan {
    pub latency: Duration,
    pub action: Option<Fault>,
}

impl FaultBook {
    pub fn inject(&mut self, injection: Injection) -> FaultId {
        self.next_id += 1;
        let id = self.next_id;
        if injection.scope != Scope::Times(0) {
            self.active.push(Active {
                id,
                injection,
                used: 0,
            });
        }
        FaultId(id)
    }

    pub fn remove(&mut self, id: FaultId) -> bool {
        let before = self.active.len();
        self.active.retain(|a| a.id != id.0);
        self.active.len() != before
    }

    pub fn clear(&mut self) {
        self.active.clear();
    }

    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// Consumes all matching latencies and the first matching reply-level fault.
    pub fn plan_reply(&mut self, route: Option<Route>) -> ReplyPlan {
        let mut plan = ReplyPlan::default();
        for a in &mut self.active {
            if let Fault::Latency(d) = a.injection.fault
                && a.matches(route)
            {
                plan.latency += d;
                a.used = a.used.saturating_add(1);
            }
        }
        plan.action = self.take_where(route, Fault::is_reply_level);
        plan
    }

    /// Consumes the first fault on `route` that `pred` accepts.
    pub fn take(&mut self, route: Route, pred: impl Fn(&Fault) -> bool) -> Option<Fault> {
        self.take_where(Some(route), pred)
    }

    fn take_where(&mut self, route: Option<Route>, pred: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let found = self
            .active
            .iter_mut()
            .find(|a| a.matches(route) && pred(&a.injection.fault))
            .map(|a| {
                a.used = a.used.saturating_add(1);
                a.injection.fault.clone()
            });
        self.active.retain(|a| !a.exhausted());
        found
    }
}

impl Active {
    fn matches(&self, route: Option<Route>) -> bool {
        self.injection.route.is_none() || self.injection.route == route
    }

    fn exhausted(&self) -> bool {
        matches!(self.injection.scope, Scope::Times(n) if self.used >= n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_routes() {
        let mut book = FaultBook::default();
        book.inject(Fault::Drop.on(Route::FmAttach).times(2));
        assert!(book.plan_reply(Some(Route::Token)).action.is_none());
        assert_eq!(
            book.plan_reply(Some(Route::FmAttach)).action,
            Some(Fault::Drop)
        );
        assert_eq!(
            book.plan_reply(Some(Route::FmAttach)).action,
            Some(Fault::Drop)
        );
        assert!(book.plan_reply(Some(Route::FmAttach)).action.is_none());

        let id = book.inject(Fault::Latency(Duration::from_millis(5)).always());
        book.inject(Fault::Latency(Duration::from_millis(7)).into());
        let plan = book.plan_reply(None);
        assert_eq!(plan.latency, Duration::from_millis(12));
        assert_eq!(book.plan_reply(None).latency, Duration::from_millis(5));
        assert!(book.remove(id));
        assert_eq!(book.plan_reply(None).latency, Duration::ZERO);
        assert_eq!(book.len(), 0);

        book.inject(Fault::NoFreeDevice.always());
        assert!(book.plan_reply(Some(Route::FmAttach)).action.is_none());
        assert_eq!(
            book.take(Route::FmAttach, |f| *f == Fault::NoFreeDevice),
            Some(Fault::NoFreeDevice)
        );
        assert_eq!(
            book.take(Route::CmResize, |f| *f == Fault::NoFreeDevice),
            Some(Fault::NoFreeDevice)
        );
        book.clear();
        assert_eq!(book.take(Route::FmAttach, |_| true), None);
    }
}
