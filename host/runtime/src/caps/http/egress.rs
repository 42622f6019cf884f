//! The provider's HTTP client: the `http` import's only way out.
//!
//! One pooled `hyper` client per provider, built at load: rustls (ring) trusting the
//! Mozilla roots plus the granted CAs, HTTP/1.1, no proxy (a proxy from the operator's
//! environment would be an egress path the grants do not describe). Redirects are
//! followed here, each hop asked of the gate like a direct request, so a redirect to an
//! ungranted host is refused. Every request's timeout is capped by what is left of the
//! call's deadline; reply bodies are read up to `limits.max_response_bytes`. The gate's
//! fence ([`crate::gate::Fence`]) is asked before each request (redirect hops included)
//! and again by the connection before each write ([`super::wire`]): the last moment
//! before the fabric sees a byte.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use url::Url;

use super::grant::{Header, HttpGrant, RequestTo};
use super::wire::{FencedConnector, WriteFenced};
use super::wit::{HttpError, Method, Request, Response};
use crate::base::{DeadlineExceeded, quote};
use crate::gate::Gate;

const MAX_REDIRECTS: usize = 10;
/// How long an idle pooled connection is kept for the provider's next request.
const POOL_IDLE: Duration = Duration::from_secs(90);

pub(crate) struct HttpEgress {
    client: Client<FencedConnector, Full<Bytes>>,
    /// What the gate checks every request and redirect against.
    grants: Arc<[HttpGrant]>,
    max_response_bytes: u64,
}

/// Why an exchange ended without a reply for the guest.
enum Failed {
    /// The guest gets this error.
    Http(HttpError),
    /// The transport failed: classified by [`classify`].
    Transport(Box<dyn std::error::Error + Send + Sync + 'static>),
}

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
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(FencedConnector::new(Arc::new(tls), gate));
        Ok(HttpEgress {
            client,
            grants: grants.into(),
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
        let mut headers = match with_headers(&request.headers) {
            Ok(h) => h,
            Err(e) => return Ok(Err(e)),
        };
        let mut url = url;
        credentials_to_header(&mut url, &mut headers);
        // Asked here, after everything else, so nothing but the client's own work lies
        // between the fence's answer and the request leaving (and the connection asks
        // again before each write).
        if let Err(reason) = gate.fence_allows() {
            return Ok(Err(not_sent(&reason)));
        }
        let first = Hop {
            method: method(request.method),
            url,
            headers,
            body: Bytes::from(request.body),
        };
        match tokio::time::timeout(timeout, self.exchange(gate, first)).await {
            Err(_elapsed) if capped => Err(DeadlineExceeded),
            Err(_elapsed) => Ok(Err(HttpError::Timeout)),
            Ok(Ok(response)) => Ok(Ok(response)),
            Ok(Err(Failed::Http(e))) => Ok(Err(e)),
            Ok(Err(Failed::Transport(e))) => Ok(Err(classify(e.as_ref()))),
        }
    }

    /// Sends `hop` and follows redirects (each hop checked by the gate and its fence), then
    /// reads the final reply's body up to the limit.
    async fn exchange(&self, gate: &Gate, mut hop: Hop) -> Result<Response, Failed> {
        let mut redirects = 0usize;
        loop {
            let reply = self
                .client
                .request(hop.to_request()?)
                .await
                .map_err(|e| Failed::Transport(Box::new(e)))?;
            let Some(next) = self.redirect(gate, &hop, &reply, redirects)? else {
                return self.read(reply).await;
            };
            redirects += 1;
            hop = next;
        }
    }

    /// The next hop if `reply` redirects, after the gate and the fence allowed it.
    fn redirect(
        &self,
        gate: &Gate,
        hop: &Hop,
        reply: &hyper::Response<hyper::body::Incoming>,
        redirects: usize,
    ) -> Result<Option<Hop>, Failed> {
        let status = reply.status();
        let keeps_method = match status {
            StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND | StatusCode::SEE_OTHER => false,
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => true,
            _ => return Ok(None),
        };
        // A redirect without a usable Location is the reply itself, as browsers do.
        let Some(location) = reply
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| hop.url.join(l).ok())
            .filter(|u| matches!(u.scheme(), "http" | "https"))
        else {
            return Ok(None);
        };
        let from = hop.url.to_string();
        if redirects >= MAX_REDIRECTS {
            return Err(Failed::Http(HttpError::Denied(format!(
                "more than {MAX_REDIRECTS} redirects"
            ))));
        }
        let to = RequestTo {
            grants: &self.grants,
            url: &location,
        };
        if let Err(denial) = gate.check(&to) {
            return Err(Failed::Http(HttpError::Denied(format!(
                "{denial} (redirect from {})",
                quote(&from)
            ))));
        }
        // A hop is a new request, made after the previous reply came back: the process
        // may have lost the right to act meanwhile.
        if let Err(reason) = gate.fence_allows() {
            return Err(Failed::Http(not_sent(&format!(
                "{reason} (redirect from {})",
                quote(&from)
            ))));
        }
        Ok(Some(hop.follow(location, keeps_method)))
    }

    /// The reply, its body read up to the limit.
    async fn read(
        &self,
        reply: hyper::Response<hyper::body::Incoming>,
    ) -> Result<Response, Failed> {
        let max = self.max_response_bytes;
        let too_large = || Failed::Http(HttpError::TooLarge(max));
        let declared = reply
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(too_large());
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
        let mut incoming = reply.into_body();
        let mut body = Vec::new();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| Failed::Transport(Box::new(e)))?;
            if let Ok(chunk) = frame.into_data() {
                if (body.len() + chunk.len()) as u64 > max {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// One request of an exchange: the guest's, or a redirect hop derived from it.
struct Hop {
    method: hyper::Method,
    url: Url,
    headers: HeaderMap,
    body: Bytes,
}

impl Hop {
    fn to_request(&self) -> Result<hyper::Request<Full<Bytes>>, Failed> {
        let mut request = hyper::Request::builder()
            .method(self.method.clone())
            .uri(self.url.as_str())
            .body(Full::new(self.body.clone()))
            .map_err(|e| {
                Failed::Http(HttpError::InvalidRequest(format!(
                    "`{}`: {e}",
                    quote(self.url.as_str())
                )))
            })?;
        *request.headers_mut() = self.headers.clone();
        Ok(request)
    }

    /// The hop to `to`: 301/302/303 turn a request with a body into a body-less GET (what
    /// every HTTP client does); 307/308 repeat it. Credentials never follow a redirect
    /// to another origin.
    fn follow(&self, to: Url, keeps_method: bool) -> Hop {
        let mut headers = self.headers.clone();
        let (method, body) =
            if keeps_method || matches!(self.method, hyper::Method::GET | hyper::Method::HEAD) {
                (self.method.clone(), self.body.clone())
            } else {
                for name in [
                    header::CONTENT_TYPE,
                    header::CONTENT_ENCODING,
                    header::CONTENT_LENGTH,
                    header::TRANSFER_ENCODING,
                ] {
                    headers.remove(name);
                }
                (hyper::Method::GET, Bytes::new())
            };
        if self.url.origin() != to.origin() {
            for name in [
                header::AUTHORIZATION,
                header::COOKIE,
                header::PROXY_AUTHORIZATION,
                header::WWW_AUTHENTICATE,
            ] {
                headers.remove(name);
            }
        }
        Hop {
            method,
            url: to,
            headers,
            body,
        }
    }
}

/// The guest's headers for the request (and `accept: */*` unless it names its own); a
/// name or value HTTP cannot carry is an invalid request.
fn with_headers(guest: &[(String, String)]) -> Result<HeaderMap, HttpError> {
    let mut headers = HeaderMap::new();
    for (name, value) in guest {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| {
            HttpError::InvalidRequest(format!("header name `{}`: {e}", quote(name)))
        })?;
        let value = HeaderValue::from_str(value).map_err(|e| {
            HttpError::InvalidRequest(format!("header `{}` value: {e}", quote(name.as_str())))
        })?;
        headers.append(name, value);
    }
    if !headers.contains_key(header::ACCEPT) {
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    }
    Ok(headers)
}

/// Credentials written in the URL (`http://user:secret@host/`) go as HTTP basic
/// authentication, as HTTP clients do, unless the guest set its own `authorization`.
/// They are taken out of the URL either way: the request line never carries them, and a
/// redirect does not take them along.
fn credentials_to_header(url: &mut Url, headers: &mut HeaderMap) {
    if url.username().is_empty() && url.password().is_none() {
        return;
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = decode(url.username());
    let password = url.password().map(decode).unwrap_or_default();
    // Only an http(s) URL with a host gets here (`check`), and those take both.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    if headers.contains_key(header::AUTHORIZATION) {
        return;
    }
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    if let Ok(value) = HeaderValue::from_str(&format!("Basic {token}")) {
        headers.insert(header::AUTHORIZATION, value);
    }
}

/// A request the fence refused: a connection failure, not `denied` (no grant is missing,
/// and the guest should treat it like a fabric it cannot reach right now).
fn not_sent(reason: &str) -> HttpError {
    HttpError::Connect(format!("not sent: {reason}"))
}

fn method(m: Method) -> hyper::Method {
    match m {
        Method::Get => hyper::Method::GET,
        Method::Head => hyper::Method::HEAD,
        Method::Post => hyper::Method::POST,
        Method::Put => hyper::Method::PUT,
        Method::Patch => hyper::Method::PATCH,
        Method::Delete => hyper::Method::DELETE,
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

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in causes(e) {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// What the guest is told of a failed transport: a fenced write is a request not sent, a
/// TLS failure is `tls`, and every other failure to connect, send or read the reply
/// (refused, reset, closed mid-reply, a reply that is not HTTP) is `connect`.
fn classify(e: &(dyn std::error::Error + Send + Sync + 'static)) -> HttpError {
    let e: &(dyn std::error::Error + 'static) = e;
    let all = causes(e);
    if let Some(fenced) = all.iter().find_map(|c| c.downcast_ref::<WriteFenced>()) {
        return not_sent(&fenced.0);
    }
    if all
        .iter()
        .any(|c| c.downcast_ref::<rustls::Error>().is_some())
    {
        return HttpError::Tls(chain(e));
    }
    let transport = all.iter().any(|c| {
        c.downcast_ref::<hyper::Error>().is_some()
            || c.downcast_ref::<std::io::Error>().is_some()
            || c.downcast_ref::<hyper_util::client::legacy::Error>()
                .is_some_and(|l| l.is_connect())
    });
    if transport {
        return HttpError::Connect(chain(e));
    }
    HttpError::Other(chain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_become_basic_authentication_and_leave_the_url() {
        let mut url = Url::parse("http://fm%20user:p%40ss@fabric:8080/x?y=1").unwrap();
        let mut headers = HeaderMap::new();
        credentials_to_header(&mut url, &mut headers);
        assert_eq!(url.as_str(), "http://fabric:8080/x?y=1");
        // base64("fm user:p@ss")
        assert_eq!(headers[header::AUTHORIZATION], "Basic Zm0gdXNlcjpwQHNz");

        // The guest's own authorization wins; the URL is cleaned all the same.
        let mut url = Url::parse("https://user@fabric/").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        credentials_to_header(&mut url, &mut headers);
        assert_eq!(url.as_str(), "https://fabric/");
        assert_eq!(headers[header::AUTHORIZATION], "Bearer t");

        // Nothing to do without credentials.
        let mut url = Url::parse("https://fabric/").unwrap();
        let mut headers = HeaderMap::new();
        credentials_to_header(&mut url, &mut headers);
        assert!(headers.is_empty());
    }

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
