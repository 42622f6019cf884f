//! The provider's HTTP client: the `http` import's only way out.
//!
//! One `reqwest` client per provider, built at load: rustls (ring) trusting the Mozilla
//! roots plus the granted CAs, no proxy (a proxy from the operator's environment would be
//! an egress path the grants do not describe), and a redirect policy that asks the gate
//! about every hop, so a redirect to an ungranted host is refused like a direct request.
//! Every request's timeout is capped by what is left of the call's deadline; reply bodies
//! are read up to `limits.max_response_bytes`. The gate's fence ([`crate::gate::Fence`])
//! is asked right before each request, redirect hops included, is handed to `reqwest`:
//! the last moment before the fabric sees it.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use url::Url;

use super::grant::{Header, HttpGrant, RequestTo};
use super::wit::{HttpError, Method, Request, Response};
use crate::base::{DeadlineExceeded, quote};
use crate::gate::Gate;

const MAX_REDIRECTS: usize = 10;

pub(crate) struct HttpEgress {
    client: reqwest::Client,
    /// What the gate checks every request and redirect against.
    grants: Arc<[HttpGrant]>,
    max_response_bytes: u64,
}

/// The redirect policy's refusal, found again in the error's source chain.
#[derive(Debug)]
struct RedirectDenied(String);

impl std::fmt::Display for RedirectDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectDenied {}

/// The fence's refusal of a redirect hop, found again in the error's source chain: the
/// hop is not sent, and the guest gets a connection failure like a fenced first request.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RedirectFenced(String);

impl HttpEgress {
    pub(crate) fn new(
        grants: &[HttpGrant],
        gate: Arc<Gate>,
        max_response_bytes: u64,
    ) -> Result<HttpEgress, String> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for grant in grants {
            for cert in grant.ca_pem.iter().flat_map(|c| c.certificates()) {
                roots
                    .add(cert.clone())
                    .map_err(|e| format!("CA of the grant for {}: {e}", grant.url))?;
            }
        }
        let grants: Arc<[HttpGrant]> = grants.into();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let granted = grants.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(RedirectDenied(format!(
                    "more than {MAX_REDIRECTS} redirects"
                )));
            }
            let from = attempt
                .previous()
                .last()
                .map(|u| u.to_string())
                .unwrap_or_default();
            let hop = RequestTo {
                grants: &granted,
                url: attempt.url(),
            };
            if let Err(denial) = gate.check(&hop) {
                let message = format!("{denial} (redirect from {})", quote(&from));
                return attempt.error(RedirectDenied(message));
            }
            // A hop is a new request, made after the previous reply came back: the
            // process may have lost the right to act meanwhile.
            match gate.fence_allows() {
                Ok(()) => attempt.follow(),
                Err(reason) => attempt.error(RedirectFenced(format!(
                    "{reason} (redirect from {})",
                    quote(&from)
                ))),
            }
        });
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(policy)
            .no_proxy()
            .build()
            .map_err(|e| format!("HTTP client: {}", chain(&e)))?;
        Ok(HttpEgress {
            client,
            grants,
            max_response_bytes,
        })
    }

    /// Whether the gate allows `request`: its URL parsed, when it does. Nothing is sent.
    pub(crate) fn check(&self, gate: &Gate, request: &Request) -> Result<Url, HttpError> {
        let url = match Url::parse(&request.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => url,
            Ok(url) => {
                return Err(HttpError::InvalidRequest(format!(
                    "`{}`: only http and https URLs",
                    quote(url.scheme())
                )));
            }
            Err(e) => {
                return Err(HttpError::InvalidRequest(format!(
                    "`{}`: {e}",
                    quote(&request.url)
                )));
            }
        };
        let to = RequestTo {
            grants: &self.grants,
            url: &url,
        };
        if let Err(denial) = gate.check(&to) {
            return Err(HttpError::Denied(denial.0));
        }
        for (name, _) in &request.headers {
            if let Err(denial) = gate.check(&Header(name)) {
                return Err(HttpError::Denied(denial.0));
            }
        }
        Ok(url)
    }

    /// Sends `request` to `url`, which [`HttpEgress::check`] allowed, if `gate`'s fence
    /// still allows it. `Err` means the call's deadline passed while waiting: the call is
    /// over.
    pub(crate) async fn send_checked(
        &self,
        gate: &Gate,
        url: Url,
        request: Request,
        remaining: Duration,
    ) -> Result<Result<Response, HttpError>, DeadlineExceeded> {
        let wanted = request
            .timeout_ms
            .map(|ms| Duration::from_millis(u64::from(ms)));
        // When the deadline is the tighter bound, running out of time ends the call rather
        // than handing the guest a timeout it has no time left to act on.
        let (timeout, capped) = match wanted {
            Some(w) if w < remaining => (w, false),
            _ => (remaining, true),
        };
        if timeout.is_zero() {
            return if capped {
                Err(DeadlineExceeded)
            } else {
                Ok(Err(HttpError::Timeout))
            };
        }
        let builder = self
            .client
            .request(method(request.method), url)
            .timeout(timeout)
            .body(request.body);
        let builder = match with_headers(builder, &request.headers) {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        // Asked here, after everything else, so nothing but the client's own work lies
        // between the fence's answer and the request leaving.
        if let Err(reason) = gate.fence_allows() {
            return Ok(Err(not_sent(&reason)));
        }
        match self.exchange(builder).await {
            Ok(result) => Ok(result),
            Err(e) if e.is_timeout() && capped => Err(DeadlineExceeded),
            Err(e) => Ok(Err(classify(&e))),
        }
    }

    async fn exchange(
        &self,
        builder: reqwest::RequestBuilder,
    ) -> Result<Result<Response, HttpError>, reqwest::Error> {
        let max = self.max_response_bytes;
        let mut reply = builder.send().await?;
        if reply.content_length().is_some_and(|n| n > max) {
            return Ok(Err(HttpError::TooLarge(max)));
        }
        let status = reply.status().as_u16();
        let headers = reply
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = reply.chunk().await? {
            if (body.len() + chunk.len()) as u64 > max {
                return Ok(Err(HttpError::TooLarge(max)));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Ok(Response {
            status,
            headers,
            body,
        }))
    }
}

/// The guest's headers on the request; a name or value HTTP cannot carry is an invalid
/// request.
fn with_headers(
    mut builder: reqwest::RequestBuilder,
    headers: &[(String, String)],
) -> Result<reqwest::RequestBuilder, HttpError> {
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| {
            HttpError::InvalidRequest(format!("header name `{}`: {e}", quote(name)))
        })?;
        let value = HeaderValue::from_str(value).map_err(|e| {
            HttpError::InvalidRequest(format!("header `{}` value: {e}", quote(name.as_str())))
        })?;
        builder = builder.header(name, value);
    }
    Ok(builder)
}

/// A request the fence refused: a connection failure, not `denied` (no grant is missing,
/// and the guest should treat it like a fabric it cannot reach right now).
fn not_sent(reason: &str) -> HttpError {
    HttpError::Connect(format!("not sent: {reason}"))
}

fn method(m: Method) -> reqwest::Method {
    match m {
        Method::Get => reqwest::Method::GET,
        Method::Head => reqwest::Method::HEAD,
        Method::Post => reqwest::Method::POST,
        Method::Put => reqwest::Method::PUT,
        Method::Patch => reqwest::Method::PATCH,
        Method::Delete => reqwest::Method::DELETE,
    }
}

/// Every error in the source chain, `io::Error` payloads included (an `io::Error`'s
/// `source()` skips its payload and goes straight to the payload's source).
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        out.push(err);
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(payload) => Some(payload as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    out
}

fn chain(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in causes(e) {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

fn classify(e: &reqwest::Error) -> HttpError {
    let all = causes(e);
    if let Some(denied) = all.iter().find_map(|c| c.downcast_ref::<RedirectDenied>()) {
        return HttpError::Denied(denied.0.clone());
    }
    if let Some(fenced) = all.iter().find_map(|c| c.downcast_ref::<RedirectFenced>()) {
        return not_sent(&fenced.0);
    }
    if e.is_timeout() {
        return HttpError::Timeout;
    }
    if all
        .iter()
        .any(|c| c.downcast_ref::<rustls::Error>().is_some())
    {
        return HttpError::Tls(chain(e));
    }
    // A connection closed before or while the reply came ("incomplete message", a reset
    // mid-body) is the WIT's `connect`: refused, reset or dropped.
    if e.is_connect() || e.is_request() || e.is_body() {
        return HttpError::Connect(chain(e));
    }
    HttpError::Other(chain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_payloads_are_part_of_the_chain() {
        let tls = rustls::Error::General("bad cert".into());
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let io = std::io::Error::other(inner);
        let all = causes(&io);
        assert_eq!(all.len(), 3);
        assert!(
            all.iter()
                .any(|c| c.downcast_ref::<rustls::Error>().is_some())
        );
    }
}
