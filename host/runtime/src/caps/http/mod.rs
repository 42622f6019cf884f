//! The `http` capability: grants of `scheme://host:port` targets and their checks
//! ([`grant`]), the provider's client ([`egress`]), the `cro:provider/http` host function
//! and its bindings (`wit`), and its part of the report (`report`). Budgets: the call's
//! deadline caps every request, reply bodies are bounded by `limits.max_response_bytes`,
//! and framing/routing headers are refused by the gate. The gate's fence, when the
//! embedder gave one, is asked right before each request leaves (`egress`) and before each write to
//! the connection (`wire`).

pub(crate) mod egress;
pub mod grant;
mod report;
mod wire;
pub(crate) mod wit;

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use self::egress::HttpEgress;
use self::grant::HttpGrant;
use super::capability::{CallSetup, Capability, Declared, Findings, Load, SetupError};
use crate::base::{FieldError, until_deadline};
use crate::budget::{Budget, BudgetCounters, BudgetExceeded};
use crate::gate::{CapabilityKind, Gate, HttpExchange, UseOutcome};

/// The capability, as `crate::caps` registers it.
pub(crate) struct HttpCap;

impl Capability for HttpCap {
    const NAME: &'static str = "http";
    type Grant = Vec<HttpGrant>;
    type Shared = Http;
    type Call = HttpCall;

    fn validate(grant: &Vec<HttpGrant>) -> Result<(), FieldError> {
        grant::validate(grant)
    }

    fn load(grant: &Vec<HttpGrant>, load: &Load<'_>) -> Result<Http, SetupError> {
        let egress = HttpEgress::new(grant, load.gate.clone(), load.limits.max_response_bytes)
            .map_err(SetupError::Client)?;
        Ok(Http {
            egress,
            gate: load.gate.clone(),
            requests_per_call: load.limits.http_requests_per_call,
            bytes_sent_per_call: load.limits.http_bytes_sent_per_call,
            budgets: load.budgets.clone(),
        })
    }

    fn call(shared: &Arc<Http>, setup: &CallSetup) -> HttpCall {
        HttpCall::new(shared.clone(), setup.deadline)
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut HttpCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<HttpCall>>(linker, get)
    }

    fn report(grant: &Vec<HttpGrant>, declared: &Declared<'_>, findings: &mut Findings) {
        report::report(grant, declared, findings);
    }

    #[cfg(test)]
    fn example() -> Vec<HttpGrant> {
        vec![HttpGrant::new(
            "https://fabric.example:8443".parse().unwrap(),
        )]
    }
}

/// The provider's side: its client, its gate and its per-call budgets.
pub(crate) struct Http {
    pub(crate) egress: egress::HttpEgress,
    pub(crate) gate: Arc<Gate>,
    requests_per_call: u32,
    bytes_sent_per_call: u64,
    budgets: Arc<BudgetCounters>,
}

/// One call's side: its deadline and what it has sent so far.
pub(crate) struct HttpCall {
    shared: Arc<Http>,
    deadline: Instant,
    requests: u32,
    bytes_sent: u64,
}

impl HttpCall {
    pub(crate) fn new(shared: Arc<Http>, deadline: Instant) -> HttpCall {
        HttpCall {
            shared,
            deadline,
            requests: 0,
            bytes_sent: 0,
        }
    }

    /// Counts `request` against the call's budgets before anything is sent; over one,
    /// the call stops (a trap carrying [`BudgetExceeded`]).
    fn spend(&mut self, request: &wit::Request) -> wasmtime::Result<()> {
        let shared = &self.shared;
        let size = request.url.len()
            + request
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
            + request.body.len();
        self.requests = self.requests.saturating_add(1);
        self.bytes_sent = self.bytes_sent.saturating_add(size as u64);
        let over = if self.requests > shared.requests_per_call {
            Some((Budget::HttpRequests, u64::from(shared.requests_per_call)))
        } else if self.bytes_sent > shared.bytes_sent_per_call {
            Some((Budget::HttpBytesSent, shared.bytes_sent_per_call))
        } else {
            None
        };
        match over {
            Some((budget, limit)) => {
                shared.budgets.hit(budget);
                Err(wasmtime::Error::new(BudgetExceeded { budget, limit }))
            }
            None => Ok(()),
        }
    }
}

impl wit::Host for HttpCall {
    async fn send(
        &mut self,
        request: wit::Request,
    ) -> wasmtime::Result<Result<wit::Response, wit::HttpError>> {
        let shared = self.shared.clone();
        // Only a request the gate allows is counted: a denied one sends nothing.
        let checked = shared.egress.check(&shared.gate, &request);
        if checked.is_ok() {
            self.spend(&request)?;
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let started = shared.gate.start();
        // Only kept when observed: the URL is moved into the request.
        let target = started.map(|_| format!("{} {}", method_name(request.method), request.url));
        // Only copied for an observer that shows them.
        let sent_side = (started.is_some() && shared.gate.wants_exchanges()).then(|| {
            (
                HttpExchange::headers(&request.headers),
                HttpExchange::body(&request.body),
            )
        });
        let sent = until_deadline(self.deadline, async {
            match checked {
                Ok(url) => {
                    shared
                        .egress
                        .send_checked(&shared.gate, url, request, remaining)
                        .await
                }
                Err(e) => Ok(Err(e)),
            }
        })
        .await;
        shared.gate.used_with(started, || {
            let outcome = match &sent {
                Ok(Ok(Ok(r))) => UseOutcome::Allowed {
                    status: Some(r.status),
                    bytes: r.body.len() as u64,
                },
                Ok(Ok(Err(wit::HttpError::Denied(why)))) => UseOutcome::Denied(why.clone()),
                Ok(Ok(Err(e))) => UseOutcome::Failed(http_error_text(e)),
                Ok(Err(_)) | Err(_) => UseOutcome::Failed("the call's deadline passed".into()),
            };
            let exchange = sent_side.map(|(request_headers, request_body)| {
                let (response_headers, response_body) = match &sent {
                    Ok(Ok(Ok(r))) => (
                        HttpExchange::headers(&r.headers),
                        HttpExchange::body(&r.body),
                    ),
                    _ => (Vec::new(), Vec::new()),
                };
                HttpExchange {
                    request_headers,
                    request_body,
                    response_headers,
                    response_body,
                }
            });
            (
                CapabilityKind::Http,
                target.unwrap_or_default(),
                outcome,
                exchange,
            )
        });
        sent?.map_err(wasmtime::Error::new)
    }
}

fn method_name(m: wit::Method) -> &'static str {
    match m {
        wit::Method::Get => "GET",
        wit::Method::Head => "HEAD",
        wit::Method::Post => "POST",
        wit::Method::Put => "PUT",
        wit::Method::Patch => "PATCH",
        wit::Method::Delete => "DELETE",
    }
}

fn http_error_text(e: &wit::HttpError) -> String {
    match e {
        wit::HttpError::Denied(m) => format!("denied: {m}"),
        wit::HttpError::InvalidRequest(m) => format!("invalid request: {m}"),
        wit::HttpError::Timeout => "timeout".into(),
        wit::HttpError::Connect(m) => format!("connect: {m}"),
        wit::HttpError::Tls(m) => format!("tls: {m}"),
        wit::HttpError::TooLarge(n) => format!("reply larger than {n} bytes"),
        wit::HttpError::Other(m) => m.clone(),
    }
}
