//! The provider's configuration, read from the host's `config` interface.
//!
//! | key | meaning |
//! | --- | --- |
//! | `configuration_manager_endpoint` | `http(s)://host:port` of CDIM's configuration manager (Go: `http://$NEC_CDIM_IP:$CONFIGURATION_MANAGER_PORT`); its API is under `/cdim/api/v1`; required |
//! | `layout_apply_endpoint` | `http(s)://host:port` of CDIM's layout-apply service (Go: `http://$NEC_CDIM_IP:$LAYOUT_APPLY_PORT`); required |
//! | `provisional_gpu_uuid` | Go compatibility (`NEC_PROVISIONAL_GPU_UUID`): the GPU UUID reported for every GPU, `GPU-` prefixed when it is not; unset: a GPU's CDIM device id is its device id |
//! | `timeout_ms` | per-request timeout asked of the host; default 30000 (the Go client's) |

use cro_provider_sdk::{Host, ProviderError};

/// Every configuration key: (name, required, meaning), as `describe` declares them.
pub const KEYS: &[(&str, bool, &str)] = &[
    (
        "configuration_manager_endpoint",
        true,
        "http(s)://host:port of CDIM's configuration manager; its API is under /cdim/api/v1",
    ),
    (
        "layout_apply_endpoint",
        true,
        "http(s)://host:port of CDIM's layout-apply service; its API is under /cdim/api/v1",
    ),
    (
        "provisional_gpu_uuid",
        false,
        "Go compatibility (NEC_PROVISIONAL_GPU_UUID): the GPU UUID reported for every GPU, since CDIM reports none; unset: the CDIM device id",
    ),
    (
        "timeout_ms",
        false,
        "per-request timeout asked of the host in milliseconds (default 30000)",
    ),
];

/// Where both services keep their API.
pub const API_BASE: &str = "/cdim/api/v1";
/// The Go client's per-request timeout.
pub const DEFAULT_TIMEOUT_MS: u32 = 30_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `scheme://host[:port]` of the configuration manager.
    pub configuration_manager: String,
    /// `scheme://host[:port]` of the layout-apply service.
    pub layout_apply: String,
    /// The GPU UUID every GPU is reported with, `GPU-` prefixed.
    pub provisional_gpu_uuid: Option<String>,
    pub timeout_ms: u32,
}

impl Config {
    pub fn load<H: Host + ?Sized>(host: &H) -> Result<Config, ProviderError> {
        let endpoint = |key: &str| -> Result<String, ProviderError> {
            let value = host
                .config_get(key)
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .ok_or_else(|| {
                    ProviderError::Config(format!("configuration key `{key}` is not set"))
                })?;
            origin(key, &value)
        };
        let configuration_manager = endpoint("configuration_manager_endpoint")?;
        let layout_apply = endpoint("layout_apply_endpoint")?;
        let provisional_gpu_uuid = host
            .config_get("provisional_gpu_uuid")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .map(|v| {
                // As the Go client: a UUID without the prefix nvidia-smi prints gets it.
                if v.to_ascii_uppercase().starts_with("GPU-") {
                    v
                } else {
                    format!("GPU-{v}")
                }
            });
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
            configuration_manager,
            layout_apply,
            provisional_gpu_uuid,
            timeout_ms,
        })
    }

    /// The device id a GPU is reported with.
    pub fn device_id(&self, gpu: &str) -> String {
        self.provisional_gpu_uuid
            .clone()
            .unwrap_or_else(|| gpu.to_string())
    }
}

/// The endpoint as an origin (`http(s)://authority`), accepting (and dropping) a
/// trailing `/` or `/cdim/api/v1`, refusing any other path.
fn origin(key: &str, endpoint: &str) -> Result<String, ProviderError> {
    cro_provider_sdk::endpoint::origin(key, endpoint, &[API_BASE])
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_provider_sdk::testing::TestHost;

    fn host() -> TestHost {
        TestHost::new()
            .with_config("configuration_manager_endpoint", "http://10.0.0.1:8080/")
            .with_config("layout_apply_endpoint", "http://10.0.0.1:8003/cdim/api/v1")
    }

    #[test]
    fn endpoints_uuid_and_timeout() {
        let c = Config::load(&host()).unwrap();
        assert_eq!(c.configuration_manager, "http://10.0.0.1:8080");
        assert_eq!(c.layout_apply, "http://10.0.0.1:8003");
        assert_eq!(c.provisional_gpu_uuid, None);
        assert_eq!(c.device_id("G1"), "G1");
        assert_eq!(c.timeout_ms, DEFAULT_TIMEOUT_MS);
        let c = Config::load(
            &host()
                .with_config("provisional_gpu_uuid", "1234-abcd")
                .with_config("timeout_ms", "500"),
        )
        .unwrap();
        assert_eq!(c.device_id("G1"), "GPU-1234-abcd");
        assert_eq!(c.timeout_ms, 500);
        let c = Config::load(&host().with_config("provisional_gpu_uuid", "gpu-9")).unwrap();
        assert_eq!(c.device_id("G1"), "gpu-9");
    }

    #[test]
    fn bad_configuration_is_a_config_error() {
        for (key, value) in [
            ("configuration_manager_endpoint", ""),
            ("configuration_manager_endpoint", "10.0.0.1:8080"),
            ("layout_apply_endpoint", "http://10.0.0.1:8003/other"),
            ("layout_apply_endpoint", "http:///x"),
            ("timeout_ms", "0"),
            ("timeout_ms", "soon"),
        ] {
            let h = host().with_config(key, value);
            assert!(
                matches!(Config::load(&h), Err(ProviderError::Config(_))),
                "{key}={value}"
            );
        }
    }
}
