//! Fault injection: what can go wrong, on which route, and for how many requests.

use std::time::Duration;

use serde_json::Value;

use sim_kit::FaultKind;

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
}

/// A fault with its route filter and scope. From a bare [`Fault`]: any route, once.
pub type Injection = sim_kit::Injection<Fault, Route>;

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
                | Fault::StallAfterProcessing(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_routes() {
        let mut book = sim_kit::FaultBook::<Fault, Route>::default();
        book.inject(Fault::Drop.on(Route::FmAttach).times(2));
        assert!(book.plan_reply(Some(&Route::Token)).action.is_none());
        assert_eq!(
            book.plan_reply(Some(&Route::FmAttach)).action,
            Some(Fault::Drop)
        );
        assert_eq!(
            book.plan_reply(Some(&Route::FmAttach)).action,
            Some(Fault::Drop)
        );
        assert!(book.plan_reply(Some(&Route::FmAttach)).action.is_none());

        let id = book.inject(Fault::Latency(Duration::from_millis(5)).always());
        book.inject(Fault::Latency(Duration::from_millis(7)).into());
        let plan = book.plan_reply(None);
        assert_eq!(plan.latency, Duration::from_millis(12));
        assert_eq!(book.plan_reply(None).latency, Duration::from_millis(5));
        assert!(book.remove(id));
        assert_eq!(book.plan_reply(None).latency, Duration::ZERO);
        assert_eq!(book.len(), 0);

        book.inject(Fault::NoFreeDevice.always());
        assert!(book.plan_reply(Some(&Route::FmAttach)).action.is_none());
        assert_eq!(
            book.take(Some(&Route::FmAttach), |f| *f == Fault::NoFreeDevice),
            Some(Fault::NoFreeDevice)
        );
        assert_eq!(
            book.take(Some(&Route::CmResize), |f| *f == Fault::NoFreeDevice),
            Some(Fault::NoFreeDevice)
        );
        book.clear();
        assert_eq!(book.take(Some(&Route::FmAttach), |_| true), None);
    }
}
