//! The `http` capability's grant: which `scheme://host:port` targets a provider may
//! reach, parsed and checked here; which request headers no grant can allow; and the
//! gate's checks of both ([`RequestTo`], [`Header`]).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use url::Url;

use crate::base::{FieldError, quote};
use crate::gate::{CapabilityKind, Check};

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// The host part of an HTTP grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// One host name or IP address (as the URL parser normalises it).
    Exact(String),
    /// `*.example.com`: any name ending in `.example.com` (one or more labels in front),
    /// never `example.com` itself.
    Subdomains(String),
}

impl HostPattern {
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Subdomains(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|front| front.strip_suffix('.'))
                .is_some_and(|front| !front.is_empty()),
        }
    }
}

/// `scheme://host:port`, the unit HTTP grants are written in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HttpTarget {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

impl HttpTarget {
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    pub fn host(&self) -> &HostPattern {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether a request to `url` falls under this target (scheme, host and port).
    pub fn allows(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        url.scheme() == self.scheme.as_str()
            && url.port_or_known_default() == Some(self.port)
            && self.host.matches(host)
    }

    /// `scheme://host:port` of a URL, the way denial messages name what was missing.
    pub fn describe(url: &Url) -> String {
        match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}", url.scheme()),
            _ => url.to_string(),
        }
    }
}

impl fmt::Display for HttpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Exact(h) => h.clone(),
            HostPattern::Subdomains(s) => format!("*.{s}"),
        };
        write!(f, "{}://{host}:{}", self.scheme.as_str(), self.port)
    }
}

impl From<HttpTarget> for String {
    fn from(t: HttpTarget) -> String {
        t.to_string()
    }
}

impl TryFrom<String> for HttpTarget {
    type Error = String;
    fn try_from(s: String) -> Result<HttpTarget, String> {
        s.parse()
    }
}

impl FromStr for HttpTarget {
    type Err = String;

    fn from_str(text: &str) -> Result<HttpTarget, String> {
        let shape = || format!("`{text}` must look like scheme://host[:port] (http or https)");
        let (scheme_text, rest) = text.split_once("://").ok_or_else(shape)?;
        let scheme = match scheme_text.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            other => return Err(format!("`{text}`: scheme `{other}` is not http or https")),
        };
        let (wildcard, rest) = match rest.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        if rest.contains('*') {
            return Err(format!(
                "`{text}`: a wildcard is only allowed as the whole first label (`*.example.com`)"
            ));
        }
        let url = Url::parse(&format!("{}://{rest}", scheme.as_str()))
            .map_err(|e| format!("`{text}`: {e}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("`{text}`: credentials do not belong in a grant"));
        }
        if url.path() != "/" && !url.path().is_empty() {
            return Err(format!(
                "`{text}`: a grant covers a whole host:port, remove the path `{}`",
                url.path()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("`{text}`: remove the query or fragment"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) if !wildcard => ip.to_string(),
            Some(url::Host::Ipv6(ip)) if !wildcard => format!("[{ip}]"),
            Some(_) => return Err(format!("`{text}`: a wildcard needs a domain name")),
            None => return Err(shape()),
        };
        if wildcard && !host.contains('.') {
            return Err(format!(
                "`{text}`: `*.` needs at least two labels after it (e.g. `*.example.com`)"
            ));
        }
        if wildcard && is_public_suffix(&host) {
            return Err(format!(
                "`{text}`: `{host}` is a public suffix, under which anyone can register a \
                 name: grant the fabric's own domain (e.g. `*.fabric.{host}`) instead"
            ));
        }
        Ok(HttpTarget {
            scheme,
            host: if wildcard {
                HostPattern::Subdomains(host)
            } else {
                HostPattern::Exact(host)
            },
            port: url.port().unwrap_or(scheme.default_port()),
        })
    }
}

/// Whether `host` is itself a suffix of the Public Suffix List (`co.uk`, `github.io`):
/// a wildcard on it would grant names anyone can register.
fn is_public_suffix(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    psl::suffix(host.as_bytes()).is_some_and(|s| s.is_known() && s.as_bytes() == host.as_bytes())
}

/// One HTTP endpoint a provider may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpGrant {
    pub url: HttpTarget,
    /// An extra root the provider's HTTPS client trusts (for a fabric manager with a
    /// private CA). The provider has one client, so it trusts every granted CA for every
    /// granted https endpoint.
    #[serde(default)]
    pub ca_pem: Option<CaPem>,
}

impl HttpGrant {
    pub fn new(url: HttpTarget) -> HttpGrant {
        HttpGrant { url, ca_pem: None }
    }

    pub fn allows(&self, url: &Url) -> bool {
        self.url.allows(url)
    }
}

/// PEM text holding one or more X.509 certificates, checked when parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CaPem {
    pem: String,
    certs: Vec<CertificateDer<'static>>,
}

impl CaPem {
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }
}

impl From<CaPem> for String {
    fn from(c: CaPem) -> String {
        c.pem
    }
}

impl TryFrom<String> for CaPem {
    type Error = String;

    fn try_from(pem: String) -> Result<CaPem, String> {
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("ca_pem is not PEM: {e}"))?;
        if certs.is_empty() {
            return Err("ca_pem holds no `-----BEGIN CERTIFICATE-----` block".into());
        }
        let mut store = rustls::RootCertStore::empty();
        for (i, cert) in certs.iter().enumerate() {
            store
                .add(cert.clone())
                .map_err(|e| format!("ca_pem certificate #{} is not usable: {e}", i + 1))?;
        }
        Ok(CaPem { pem, certs })
    }
}

/// Checks the `grants.http` list as a whole.
pub(crate) fn validate(grants: &[HttpGrant]) -> Result<(), FieldError> {
    let mut seen = BTreeSet::new();
    for (i, grant) in grants.iter().enumerate() {
        if !seen.insert(grant.url.to_string()) {
            return Err(FieldError::new(
                format!("grants.http[{i}].url"),
                format!("`{}` is granted twice", grant.url),
            ));
        }
        if grant.ca_pem.is_some() && grant.url.scheme() != Scheme::Https {
            return Err(FieldError::new(
                format!("grants.http[{i}].ca_pem"),
                format!(
                    "a CA only makes sense for https, but the grant is `{}`",
                    grant.url
                ),
            ));
        }
    }
    Ok(())
}

/// Request headers a provider may never set, whatever it was granted: `Host` would let a
/// granted address reach another virtual host behind the same proxy or load balancer;
/// the others frame the message or the connection (`Content-Length`,
/// `Transfer-Encoding`, `Connection`, `Upgrade`, `TE`, `Trailer`, `Keep-Alive`) and
/// would let a provider smuggle a second request; `Proxy-*` speaks to proxies the
/// grants do not describe. The host's client sets the ones a request needs.
pub fn refused_header(name: &str) -> bool {
    const REFUSED: &[&str] = &[
        "host",
        "connection",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        // Routing: a proxy or gateway in front of the fabric would send the request
        // somewhere the grant never named.
        "forwarded",
        "x-forwarded-host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-forwarded-server",
        "x-original-url",
        "x-rewrite-url",
        "x-original-host",
        "x-host",
        "x-http-method-override",
    ];
    let lower = name.trim().to_ascii_lowercase();
    REFUSED.contains(&lower.as_str()) || lower.starts_with("proxy-")
}

/// A request (or a redirect) to `url`: allowed when a grant covers its scheme, host
/// and port.
pub(crate) struct RequestTo<'a> {
    pub(crate) grants: &'a [HttpGrant],
    pub(crate) url: &'a Url,
}

impl Check for RequestTo<'_> {
    fn kind(&self) -> Option<CapabilityKind> {
        Some(CapabilityKind::Http)
    }

    fn decide(&self) -> Result<(), String> {
        if self.grants.iter().any(|g| g.allows(self.url)) {
            return Ok(());
        }
        Err(format!(
            "no http grant for {}",
            quote(&HttpTarget::describe(self.url))
        ))
    }
}

/// A request header the provider wants to send: framing and routing headers are never
/// allowed ([`refused_header`]).
pub(crate) struct Header<'a>(pub(crate) &'a str);

impl Check for Header<'_> {
    fn kind(&self) -> Option<CapabilityKind> {
        Some(CapabilityKind::Http)
    }

    fn decide(&self) -> Result<(), String> {
        if !refused_header(self.0) {
            return Ok(());
        }
        Err(format!(
            "the request header `{}` is set by the host only (Host, Connection, \
             Transfer-Encoding, Content-Length, Upgrade, TE, Trailer, Keep-Alive, \
             Proxy-*, and the routing headers Forwarded, X-Forwarded-*, X-Original-URL, \
             X-Rewrite-URL, X-Original-Host, X-Host and X-HTTP-Method-Override cannot be granted)",
            quote(self.0)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_and_routing_headers_are_refused() {
        for name in [
            "Host",
            "host",
            "Connection",
            "Transfer-Encoding",
            "content-length",
            "Upgrade",
            "Proxy-Authorization",
            "proxy-connection",
            "TE",
            "Forwarded",
            "X-Forwarded-Host",
            "x-forwarded-for",
            "X-Original-URL",
            "X-Rewrite-URL",
            "X-HTTP-Method-Override",
        ] {
            assert!(refused_header(name), "{name}");
        }
        for name in [
            "authorization",
            "content-type",
            "x-auth-token",
            "accept",
            "hostname",
        ] {
            assert!(!refused_header(name), "{name}");
        }
    }
}
