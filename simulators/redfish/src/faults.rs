//! Fault injection: what goes wrong in a Redfish service (the kit keeps the book of
//! injections and carries out the reply-level ones).

use std::time::Duration;

use sim_kit::FaultKind;

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
}

impl FaultKind for Fault {
    fn latency(&self) -> Option<Duration> {
        match self {
            Fault::Latency(d) => Some(*d),
            _ => None,
        }
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

/// A fault with its route filter and scope. From a bare [`Fault`]: any route, once.
pub type Injection = sim_kit::Injection<Fault, Route>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_routes() {
        let mut book = sim_kit::FaultBook::<Fault, Route>::default();
        book.inject(Fault::Drop.on(Route::SystemPatch).times(2));
        book.inject(Fault::Latency(Duration::from_millis(5)).always());
        assert!(book.plan_reply(Some(&Route::System)).action.is_none());
        let p = book.plan_reply(Some(&Route::SystemPatch));
        assert_eq!(p.action, Some(Fault::Drop));
        assert_eq!(p.latency, Duration::from_millis(5));
        assert_eq!(
            book.plan_reply(Some(&Route::SystemPatch)).action,
            Some(Fault::Drop)
        );
        assert!(book.plan_reply(Some(&Route::SystemPatch)).action.is_none());
        assert_eq!(book.len(), 1);
        let id = book.inject(Fault::ComposeFails("x".into()).always());
        // Not reply-level: only the composition step takes it.
        assert!(book.plan_reply(None).action.is_none());
        assert!(book.remove(id));
        book.clear();
        assert_eq!(book.len(), 0);
    }
}
