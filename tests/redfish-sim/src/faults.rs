//! Fault injection, in the style of the FTI fabric simulator: what goes wrong, on which
//! route, for how many requests.

use std::time::Duration;

use crate::route::Route;

/// One kind of misbehaviour.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Delay the reply; combines with any other fault on the same request.
    Latency(Duration),
    /// Reply with a Redfish error body (`error.code`, one `@Message.ExtendedInfo` entry
    /// with `message_id`) and this status, without touching state.
    Error {
        status: u16,
        message_id: String,
        message: String,
    },
    /// Reply with exactly this status and body, without touching state.
    Reply { status: u16, body: String },
    /// Do the request, then send its status with the JSON body cut in half.
    MalformedJson,
    /// Close the connection without a reply, before the request changes anything.
    Drop,
    /// Do the request (state changes), then close the connection without a reply.
    DropAfterProcessing,
    /// The session of this request has expired: every session is ended and the request
    /// is answered 401 `NoValidSession`.
    ExpireSession,
    /// The next composition change fails: its task ends in `Exception` with this
    /// message (or, without a task, the PATCH answers 500), and the blocks stay as
    /// they were.
    ComposeFails(String),
}

impl Fault {
    pub fn error(status: u16, message_id: impl Into<String>, message: impl Into<String>) -> Self {
        Fault::Error {
            status,
            message_id: message_id.into(),
            message: message.into(),
        }
    }

    pub fn on(self, route: Route) -> Injection {
        Injection::from(self).on(route)
    }

    pub fn times(self, n: u32) -> Injection {
        Injection::from(self).times(n)
    }

    pub fn always(self) -> Injection {
        Injection::from(self).always()
    }

    fn is_reply_level(&self) -> bool {
        matches!(
            self,
            Fault::Error { .. }
                | Fault::Reply { .. }
                | Fault::MalformedJson
                | Fault::Drop
                | Fault::DropAfterProcessing
                | Fault::ExpireSession
        )
    }
}

/// How long an injection lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Times(u32),
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

/// Handle to remove one injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultId(pub(crate) u64);

struct Active {
    id: u64,
    injection: Injection,
    used: u32,
}

impl Active {
    fn matches(&self, route: Option<Route>) -> bool {
        self.injection.route.is_none() || self.injection.route == route
    }
    fn exhausted(&self) -> bool {
        matches!(self.injection.scope, Scope::Times(n) if self.used >= n)
    }
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
        if injection.scope != Scope::Times(0) {
            self.active.push(Active {
                id: self.next_id,
                injection,
                used: 0,
            });
        }
        FaultId(self.next_id)
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
        plan.action = self.take(route, Fault::is_reply_level);
        plan
    }

    /// Consumes the first fault matching `route` that `pred` accepts.
    pub fn take(&mut self, route: Option<Route>, pred: impl Fn(&Fault) -> bool) -> Option<Fault> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_routes() {
        let mut book = FaultBook::default();
        book.inject(Fault::Drop.on(Route::SystemPatch).times(2));
        book.inject(Fault::Latency(Duration::from_millis(5)).always());
        assert!(book.plan_reply(Some(Route::System)).action.is_none());
        let p = book.plan_reply(Some(Route::SystemPatch));
        assert_eq!(p.action, Some(Fault::Drop));
        assert_eq!(p.latency, Duration::from_millis(5));
        assert_eq!(
            book.plan_reply(Some(Route::SystemPatch)).action,
            Some(Fault::Drop)
        );
        assert!(book.plan_reply(Some(Route::SystemPatch)).action.is_none());
        assert_eq!(book.len(), 1);
        let id = book.inject(Fault::ComposeFails("x".into()).always());
        // Not reply-level: only the composition step takes it.
        assert!(book.plan_reply(None).action.is_none());
        assert!(book.remove(id));
        book.clear();
        assert_eq!(book.len(), 0);
    }
}
