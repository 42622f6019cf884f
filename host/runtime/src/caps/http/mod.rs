//! The `http` capability: grants of `scheme://host:port` targets ([`grant`]), the
//! provider's client ([`egress`]) and the `cro:provider/http` host function. Budgets:
//! the call's deadline caps every request, reply bodies are bounded by
//! `limits.max_response_bytes`, and framing/routing headers are refused by the gate.

pub(crate) mod egress;
pub mod grant;

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};

use crate::base::until_deadline;
use crate::gate::Gate;
use crate::wit::imports::http as wit;

/// The provider's side: its client and its gate.
pub(crate) struct Http {
    pub(crate) egress: egress::HttpEgress,
    pub(crate) gate: Arc<Gate>,
}

/// One call's side.
pub(crate) struct HttpCall {
    shared: Arc<Http>,
    deadline: Instant,
}

impl HttpCall {
    pub(crate) fn new(shared: Arc<Http>, deadline: Instant) -> HttpCall {
        HttpCall { shared, deadline }
    }
}

impl wit::Host for HttpCall {
    async fn send(
        &mut self,
        request: wit::Request,
    ) -> wasmtime::Result<Result<wit::Response, wit::HttpError>> {
        let shared = self.shared.clone();
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let sent = until_deadline(
            self.deadline,
            shared.egress.send(&shared.gate, request, remaining),
        )
        .await?;
        sent.map_err(wasmtime::Error::new)
    }
}

pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut HttpCall,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasSelf<HttpCall>>(linker, get)
}
