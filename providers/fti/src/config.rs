//! The provider's configuration, read from the host's `config` interface.
//!
//! | key | meaning |
//! | --- | --- |
//! | `api_type` | `FM` (Fabric Manager) or `CM` (Cluster Manager), case-insensitive; required |
//! | `endpoint` | `host:port/` as in `FTI_CDI_ENDPOINT` (HTTPS is implied) or a full `https://` / `http://` URL; required |
//! | `tenant_id` | the fabric tenant; required |
//! | `cluster_id` | the CM cluster; required for CM; when set, nodes are resolved through the OpenShift/Metal3 annotation chain |
//! | `username_key`, `password_key`, `client_id_key`, `client_secret_key`, `realm_key` | names of the keys of the granted Secret holding the credentials; default `username`, `password`, `client_id`, `client_secret`, `realm` |
//! | `timeout_ms` | per-request timeout asked of the host (optional; the host caps it by the call's deadline, which is what bounds a slow fabric) |
//! | `no_capacity_codes` | comma-separated fabric error codes that mean "no free device", besides the built-in `insufficient_resources` and `E0409` (optional) |

use crate::host::Host;
use crate::model::ProviderError;

/// Every configuration key: (name, required, meaning), as `describe` declares them.
pub const KEYS: &[(&str, bool, &str)] = &[
    (
        "api_type",
        true,
        "FM (Fabric Manager) or CM (Cluster Manager)",
    ),
    (
        "endpoint",
        true,
        "host:port/ (HTTPS implied) or a full http(s):// URL of the fabric",
    ),
    ("tenant_id", true, "the fabric tenant"),
    (
        "cluster_id",
        false,
        "the CM cluster; resolves nodes through OpenShift Machines",
    ),
    (
        "username_key",
        false,
        "Secret key of the user name (default username)",
    ),
    (
        "password_key",
        false,
        "Secret key of the password (default password)",
    ),
    (
        "client_id_key",
        false,
        "Secret key of the OAuth client id (default client_id)",
    ),
    (
        "client_secret_key",
        false,
        "Secret key of the OAuth client secret (default client_secret)",
    ),
    (
        "realm_key",
        false,
        "Secret key of the identity realm (default realm)",
    ),
    ("timeout_ms", false, "per-request timeout asked of the host"),
    (
        "no_capacity_codes",
        false,
        "comma-separated extra fabric codes meaning no free device",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiType {
    /// Fabric Manager: synchronous attach/detach.
    Fm,
    /// Cluster Manager: asynchronous resize.
    Cm,
}

/// Names of the granted Secret's keys holding each credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretKeys {
    pub username: String,
    pub password: String,
    pub client_id: String,
    pub client_secret: String,
    pub realm: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub api_type: ApiType,
    /// Absolute base URL ending in `/`; every API path is appended to it.
    pub base_url: String,
    pub tenant_id: String,
    pub cluster_id: Option<String>,
    pub secret_keys: SecretKeys,
    pub timeout_ms: Option<u32>,
    /// Extra error codes read as "no free device" (`no-capacity`).
    pub no_capacity_codes: Vec<String>,
}

impl Config {
    pub fn load<H: Host + ?Sized>(host: &H) -> Result<Self, ProviderError> {
        let get = |key: &str| {
            host.config_get(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let required = |key: &str| {
            get(key).ok_or_else(|| ProviderError::Config(format!("config key '{key}' is not set")))
        };

        let api_raw = required("api_type")?;
        let api_type = if api_raw.eq_ignore_ascii_case("FM") {
            ApiType::Fm
        } else if api_raw.eq_ignore_ascii_case("CM") {
            ApiType::Cm
        } else {
            return Err(ProviderError::Config(format!(
                "config key 'api_type' must be FM or CM, not '{api_raw}'"
            )));
        };
        let base_url = base_url(&required("endpoint")?)?;
        let tenant_id = required("tenant_id")?;
        let cluster_id = get("cluster_id");
        if api_type == ApiType::Cm && cluster_id.is_none() {
            return Err(ProviderError::Config(
                "config key 'cluster_id' is required for the Cluster Manager API (api_type CM)"
                    .into(),
            ));
        }
        let key = |name: &str| get(&format!("{name}_key")).unwrap_or_else(|| name.to_string());
        let secret_keys = SecretKeys {
            username: key("username"),
            password: key("password"),
            client_id: key("client_id"),
            client_secret: key("client_secret"),
            realm: key("realm"),
        };
        let timeout_ms = match get("timeout_ms") {
            None => None,
            Some(v) => Some(v.parse::<u32>().map_err(|_| {
                ProviderError::Config(format!(
                    "config key 'timeout_ms' must be a number of milliseconds, not '{v}'"
                ))
            })?),
        };
        let no_capacity_codes = get("no_capacity_codes")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Config {
            no_capacity_codes,
            api_type,
            base_url,
            tenant_id,
            cluster_id,
            secret_keys,
            timeout_ms,
        })
    }
}

/// The Go operator prefixes `https://` to `FTI_CDI_ENDPOINT`; a full URL is accepted too
/// so tests and plain-HTTP labs can name the scheme.
fn base_url(endpoint: &str) -> Result<String, ProviderError> {
    let mut url = if let Some((scheme, rest)) = endpoint.split_once("://") {
        if !scheme.eq_ignore_ascii_case("https") && !scheme.eq_ignore_ascii_case("http") {
            return Err(ProviderError::Config(format!(
                "config key 'endpoint' must use http or https, not '{scheme}'"
            )));
        }
        format!("{}://{rest}", scheme.to_ascii_lowercase())
    } else {
        format!("https://{endpoint}")
    };
    let authority = url.split_once("://").map(|(_, r)| r).unwrap_or("");
    let host = authority.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty()
        || authority.contains(['?', '#'])
        || endpoint.chars().any(char::is_whitespace)
    {
        return Err(ProviderError::Config(format!(
            "config key 'endpoint' is not a usable host[:port][/path]: '{endpoint}'"
        )));
    }
    if !url.ends_with('/') {
        url.push('/');
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    use cro_provider_sdk::host::{
        HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, SecretError,
    };
    use cro_provider_sdk::testing::TestHost;

    /// Records every configuration key asked for; everything else is `TestHost`'s.
    struct Recorder {
        inner: TestHost,
        asked: RefCell<Vec<String>>,
    }

    impl Host for Recorder {
        fn http_send(&self, r: HttpRequest) -> Result<HttpResponse, HttpError> {
            self.inner.http_send(r)
        }
        fn secret_get(&self, key: &str) -> Result<String, SecretError> {
            self.inner.secret_get(key)
        }
        fn get_node(&self, name: &str) -> Result<String, LookupError> {
            self.inner.get_node(name)
        }
        fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
            self.inner.list_nodes()
        }
        fn get_object(
            &self,
            v: &str,
            k: &str,
            ns: Option<&str>,
            n: &str,
        ) -> Result<String, LookupError> {
            self.inner.get_object(v, k, ns, n)
        }
        fn config_get(&self, key: &str) -> Option<String> {
            self.asked.borrow_mut().push(key.to_string());
            self.inner.config_get(key)
        }
        fn log(&self, level: LogLevel, message: &str) {
            self.inner.log(level, message)
        }
        fn state_get(&self, key: &str) -> Option<Vec<u8>> {
            self.inner.state_get(key)
        }
        fn state_set(&self, key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool {
            self.inner.state_set(key, value, ttl_ms)
        }
        fn state_remove(&self, key: &str) {
            self.inner.state_remove(key)
        }
        fn now(&self) -> std::time::SystemTime {
            self.inner.now()
        }
    }

    /// `describe` declares exactly the keys the provider reads, with the right
    /// `required` flags: the operator refuses configurations by this list.
    #[test]
    fn declared_keys_are_the_keys_read() {
        let host = Recorder {
            inner: TestHost::new()
                .with_config("api_type", "CM")
                .with_config("endpoint", "fabric.example:8443")
                .with_config("tenant_id", "t")
                .with_config("cluster_id", "c"),
            asked: RefCell::default(),
        };
        Config::load(&host).unwrap();
        let mut asked = host.asked.take();
        asked.sort();
        asked.dedup();
        let mut declared: Vec<String> = KEYS.iter().map(|(k, _, _)| k.to_string()).collect();
        declared.sort();
        assert_eq!(asked, declared);
        let required: Vec<&str> = KEYS
            .iter()
            .filter(|(_, r, _)| *r)
            .map(|(k, _, _)| *k)
            .collect();
        assert_eq!(required, ["api_type", "endpoint", "tenant_id"]);
        for missing in &required {
            let mut host = TestHost::new();
            for (k, v) in [("api_type", "FM"), ("endpoint", "e:1"), ("tenant_id", "t")] {
                if k != *missing {
                    host = host.with_config(k, v);
                }
            }
            assert!(
                matches!(Config::load(&host), Err(ProviderError::Config(_))),
                "{missing}"
            );
        }
    }

    #[test]
    fn endpoint_without_scheme_gets_https_and_slash() {
        assert_eq!(
            base_url("fabric.example:8443").unwrap(),
            "https://fabric.example:8443/"
        );
        assert_eq!(
            base_url("fabric.example:8443/").unwrap(),
            "https://fabric.example:8443/"
        );
    }

    #[test]
    fn endpoint_with_scheme_is_kept() {
        assert_eq!(
            base_url("http://127.0.0.1:9000/base").unwrap(),
            "http://127.0.0.1:9000/base/"
        );
        assert_eq!(base_url("HTTPS://h:1/").unwrap(), "https://h:1/");
    }

    #[test]
    fn bad_endpoints_are_config_errors() {
        for e in ["ftp://h/", "https://", "/path", "h:1/?x=1", "h 1"] {
            assert!(
                matches!(base_url(e), Err(ProviderError::Config(_))),
                "{e} accepted"
            );
        }
    }
}
