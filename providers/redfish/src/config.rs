//! The provider's configuration, read from the host's `config` interface.
//!
//! | key | meaning |
//! | --- | --- |
//! | `endpoint` | base URL of the Redfish service (`http(s)://host:port`); the service root is `<endpoint>/redfish/v1`; required |
//! | `timeout_ms` | per-request timeout asked of the host; default 10000 |
//!
//! The session's credentials are the granted Secret's keys `username` and `password`.

use cro_provider_sdk::{Host, ProviderError};

/// Every configuration key: (name, required, meaning), as `describe` declares them.
pub const KEYS: &[(&str, bool, &str)] = &[
    (
        "endpoint",
        true,
        "base URL of the Redfish service (http(s)://host:port); the service root is <endpoint>/redfish/v1",
    ),
    (
        "timeout_ms",
        false,
        "per-request timeout asked of the host in milliseconds (default 10000)",
    ),
];

/// Secret keys of the session log-in.
pub const SECRET_KEYS: &[&str] = &["username", "password"];

pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `scheme://host[:port]` without a trailing slash or path.
    pub endpoint: String,
    pub timeout_ms: u32,
}

impl Config {
    pub fn load<H: Host + ?Sized>(host: &H) -> Result<Config, ProviderError> {
        let endpoint = host
            .config_get("endpoint")
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .ok_or_else(|| {
                ProviderError::Config("configuration key `endpoint` is not set".into())
            })?;
        let endpoint = origin(&endpoint)?;
        let timeout_ms = match host.config_get("timeout_ms") {
            None => DEFAULT_TIMEOUT_MS,
            Some(t) => match t.trim().parse::<u32>() {
                Ok(ms) if ms > 0 => ms,
                _ => {
                    return Err(ProviderError::Config(format!(
                        "configuration key `timeout_ms` must be a positive number of milliseconds, not '{t}'"
                    )));
                }
            },
        };
        Ok(Config {
            endpoint,
            timeout_ms,
        })
    }

    /// The absolute URL of a service path (`/redfish/v1/...`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }
}

/// The endpoint as an origin (`http(s)://authority`), accepting (and dropping) a trailing
/// `/` or `/redfish/v1` path, refusing anything else: every path the provider requests is
/// a service path under `/redfish/v1/`.
fn origin(endpoint: &str) -> Result<String, ProviderError> {
    cro_provider_sdk::endpoint::origin("endpoint", endpoint, &["/redfish/v1", "/redfish"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_provider_sdk::testing::TestHost;

    #[test]
    fn endpoint_and_timeout() {
        let host = TestHost::new().with_config("endpoint", "http://127.0.0.1:8000/");
        let c = Config::load(&host).unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:8000");
        assert_eq!(c.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(
            c.url("/redfish/v1/Systems"),
            "http://127.0.0.1:8000/redfish/v1/Systems"
        );
        let host = TestHost::new()
            .with_config("endpoint", "https://bmc.example/redfish/v1/")
            .with_config("timeout_ms", "2500");
        let c = Config::load(&host).unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.timeout_ms),
            ("https://bmc.example", 2500)
        );
    }

    #[test]
    fn bad_configuration_is_a_config_error() {
        for (endpoint, timeout) in [
            (None, None),
            (Some("bmc.example:8000"), None),
            (Some("http://bmc/other"), None),
            (Some("http:///x"), None),
            (Some("http://bmc"), Some("soon")),
            (Some("http://bmc"), Some("0")),
        ] {
            let mut host = TestHost::new();
            if let Some(e) = endpoint {
                host = host.with_config("endpoint", e);
            }
            if let Some(t) = timeout {
                host = host.with_config("timeout_ms", t);
            }
            assert!(
                matches!(Config::load(&host), Err(ProviderError::Config(_))),
                "{endpoint:?} {timeout:?}"
            );
        }
    }
}
