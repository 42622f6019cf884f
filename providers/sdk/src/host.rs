//! What a provider imports from its host, as a trait: inside a component
//! `crate::guest::WasmHost` implements it over the WIT imports; native unit tests use
//! [`crate::testing::TestHost`] or their own double.

use std::time::SystemTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: Method,
    /// Absolute `http://` or `https://` URL.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("timed out")]
    Timeout,
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("TLS failed: {0}")]
    Tls(String),
    #[error("reply larger than the granted {0} bytes")]
    TooLarge(u64),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The capabilities a provider instance gets from the host. Methods take `&self`:
/// each call of the provider runs on one instance, so a host needs no `&mut`.
pub trait Host {
    fn http_send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError>;
    fn secret_get(&self, key: &str) -> Result<String, SecretError>;
    fn get_node(&self, name: &str) -> Result<String, LookupError>;
    fn list_nodes(&self) -> Result<Vec<String>, LookupError>;
    fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError>;
    fn config_get(&self, key: &str) -> Option<String>;
    fn log(&self, level: LogLevel, message: &str);
    fn state_get(&self, key: &str) -> Option<Vec<u8>>;
    /// False when the host refused to store the value.
    fn state_set(&self, key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool;
    fn state_remove(&self, key: &str);
    /// Wall-clock time; inside the component it is WASI's clock, which the host serves.
    fn now(&self) -> SystemTime;
}

/// Seconds since the Unix epoch; a clock before the epoch reads as 0.
pub fn unix_now<H: Host + ?Sized>(host: &H) -> u64 {
    host.now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A borrowed host is a host, so callers can keep theirs and inspect it afterwards.
impl<T: Host + ?Sized> Host for &T {
    fn http_send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        (**self).http_send(request)
    }
    fn secret_get(&self, key: &str) -> Result<String, SecretError> {
        (**self).secret_get(key)
    }
    fn get_node(&self, name: &str) -> Result<String, LookupError> {
        (**self).get_node(name)
    }
    fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
        (**self).list_nodes()
    }
    fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError> {
        (**self).get_object(api_version, kind, namespace, name)
    }
    fn config_get(&self, key: &str) -> Option<String> {
        (**self).config_get(key)
    }
    fn log(&self, level: LogLevel, message: &str) {
        (**self).log(level, message)
    }
    fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        (**self).state_get(key)
    }
    fn state_set(&self, key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool {
        (**self).state_set(key, value, ttl_ms)
    }
    fn state_remove(&self, key: &str) {
        (**self).state_remove(key)
    }
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}
