//! Fault injection: what goes wrong in a CDIM (the kit keeps the book of injections and
//! carries out the reply-level ones).

use std::time::Duration;

use sim_kit::FaultKind;

use crate::route::Route;

/// One kind of misbehaviour.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Delay the reply; combines with any other fault on the same request.
    Latency(Duration),
    /// Reply with a CDIM error body (`{"code", "message"}`) and this status, without
    /// touching state.
    Error {
        status: u16,
        code: String,
        message: String,
    },
    /// Reply with exactly this status and body, without touching state.
    Reply { status: u16, body: String },
    /// Do the request, then send its status with the JSON body cut in half.
    MalformedJson,
    /// Close the connection without a reply, before the request changes anything.
    Drop,
    /// Do the request (a layout apply starts), then close the connection without a
    /// reply.
    DropAfterProcessing,
    /// The next layout apply is accepted (202) and ends `FAILED` with this message,
    /// connecting or disconnecting nothing.
    ApplyFails(String),
    /// The next layout apply is accepted, carries out its procedures halfway through,
    /// then is rolled back: it ends `CANCELED` with `rollbackStatus` `COMPLETED` and
    /// nothing changed.
    ApplyRollsBack,
}

impl Fault {
    pub fn error(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        Fault::Error {
            status,
            code: code.into(),
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

    /// Whether the layout-apply step takes it.
    pub(crate) fn is_apply_fate(&self) -> bool {
        matches!(self, Fault::ApplyFails(_) | Fault::ApplyRollsBack)
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
        )
    }
}

/// A fault with its route filter and scope. From a bare [`Fault`]: any route, once.
pub type Injection = sim_kit::Injection<Fault, Route>;
