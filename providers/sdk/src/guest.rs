//! The component glue (wasm32 only): [`WasmHost`] (the [`Host`] trait over the WIT
//! imports) and, with feature `export`, the `cro:provider@0.3.0` bindings and the export
//! of a [`crate::Provider`]. Vendors never touch the bindings: `export_provider!` wires
//! their type in.

use std::time::SystemTime;

use crate::host::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};

/// The capability imports alone (a world with no export), so a crate wrapping provider
/// logic in another contract version can reuse [`WasmHost`] (providers/test-components/fti-v0-1-0 does)
/// without this crate's 0.3.0 export being linked in.
#[doc(hidden)]
pub mod imports {
    wit_bindgen::generate!({
        path: "../../wit/since_v0.1.0",
        inline: "
            package cro-sdk:imports;
            world capability-imports {
                import cro:provider/http@0.1.0;
                import cro:provider/secrets@0.1.0;
                import cro:provider/lookup@0.1.0;
                import cro:provider/config@0.1.0;
                import cro:provider/log@0.1.0;
                import cro:provider/state@0.1.0;
            }
        ",
        world: "cro-sdk:imports/capability-imports",
        generate_all,
    });
}

/// The `cro:provider@0.3.0` world's bindings (public for `export_provider!` only).
#[cfg(feature = "export")]
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/since_v0.3.0",
        world: "provider-world",
        with: {
            "cro:provider/http@0.1.0": crate::guest::imports::cro::provider::http,
            "cro:provider/secrets@0.1.0": crate::guest::imports::cro::provider::secrets,
            "cro:provider/lookup@0.1.0": crate::guest::imports::cro::provider::lookup,
            "cro:provider/config@0.1.0": crate::guest::imports::cro::provider::config,
            "cro:provider/log@0.1.0": crate::guest::imports::cro::provider::log,
            "cro:provider/state@0.1.0": crate::guest::imports::cro::provider::state,
            "cro:provider/types@0.2.0": generate,
            "cro:provider/pool@0.3.0": generate,
        },
        pub_export_macro: true,
        export_macro_name: "__export_cro_provider_world",
        default_bindings_module: "cro_provider_sdk::guest::bindings",
    });
}

#[cfg(feature = "export")]
pub use export::{Exported, FromHost};
use imports::cro::provider::{config, http, log, lookup, secrets, state};

/// The host as a component sees it: every method is a WIT import.
#[derive(Debug, Clone, Copy, Default)]
pub struct WasmHost;

impl Host for WasmHost {
    fn http_send(&self, r: HttpRequest) -> Result<HttpResponse, HttpError> {
        let method = match r.method {
            Method::Get => http::Method::Get,
            Method::Head => http::Method::Head,
            Method::Post => http::Method::Post,
            Method::Put => http::Method::Put,
            Method::Patch => http::Method::Patch,
            Method::Delete => http::Method::Delete,
        };
        let request = http::Request {
            method,
            url: r.url,
            headers: r.headers,
            body: r.body,
            timeout_ms: r.timeout_ms,
        };
        match http::send(&request) {
            Ok(resp) => Ok(HttpResponse {
                status: resp.status,
                headers: resp.headers,
                body: resp.body,
            }),
            Err(e) => Err(match e {
                http::HttpError::Denied(m) => HttpError::Denied(m),
                http::HttpError::InvalidRequest(m) => HttpError::InvalidRequest(m),
                http::HttpError::Timeout => HttpError::Timeout,
                http::HttpError::Connect(m) => HttpError::Connect(m),
                http::HttpError::Tls(m) => HttpError::Tls(m),
                http::HttpError::TooLarge(n) => HttpError::TooLarge(n),
                http::HttpError::Other(m) => HttpError::Other(m),
            }),
        }
    }

    fn secret_get(&self, key: &str) -> Result<String, SecretError> {
        secrets::get(key).map_err(|e| match e {
            secrets::SecretError::Denied(m) => SecretError::Denied(m),
            secrets::SecretError::NotFound(m) => SecretError::NotFound(m),
            secrets::SecretError::Other(m) => SecretError::Other(m),
        })
    }

    fn get_node(&self, name: &str) -> Result<String, LookupError> {
        lookup::get_node(name).map_err(lookup_error)
    }

    fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
        lookup::list_nodes().map_err(lookup_error)
    }

    fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError> {
        lookup::get_object(api_version, kind, namespace, name).map_err(lookup_error)
    }

    fn config_get(&self, key: &str) -> Option<String> {
        config::get(key)
    }

    fn log(&self, level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Trace => log::Level::Trace,
            LogLevel::Debug => log::Level::Debug,
            LogLevel::Info => log::Level::Info,
            LogLevel::Warn => log::Level::Warn,
            LogLevel::Error => log::Level::Error,
        };
        log::log(level, message);
    }

    fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        state::get(key)
    }

    fn state_set(&self, key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool {
        state::set(key, value, ttl_ms)
    }

    fn state_remove(&self, key: &str) {
        state::remove(key)
    }

    fn now(&self) -> SystemTime {
        // WASI's wall clock, which the host serves (frozen at the epoch unless granted).
        SystemTime::now()
    }
}

fn lookup_error(e: lookup::LookupError) -> LookupError {
    match e {
        lookup::LookupError::Denied(m) => LookupError::Denied(m),
        lookup::LookupError::NotFound(m) => LookupError::NotFound(m),
        lookup::LookupError::Other(m) => LookupError::Other(m),
    }
}

/// The export of a [`Provider`] as `cdi-provider`, with the conversions.
#[cfg(feature = "export")]
mod export {
    use std::marker::PhantomData;

    use super::WasmHost;
    use super::bindings::cro::provider0_2_0::types as wit;
    use super::bindings::cro::provider0_3_0::pool as wit_pool;
    use super::bindings::exports::cro::provider0_3_0::cdi_provider::Guest;
    use crate::model;
    use crate::provider::Provider;

    /// A provider made for one call over the component's host.
    pub trait FromHost {
        fn from_host(host: WasmHost) -> Self;
    }

    /// The export of provider `P` (named by `export_provider!`).
    #[doc(hidden)]
    pub struct Exported<P>(PhantomData<P>);

    impl<P: Provider + FromHost> Guest for Exported<P> {
        fn describe() -> wit::ProviderInfo {
            info_out(P::describe())
        }

        fn add_resource(request: wit::AddRequest) -> Result<wit::AddOutcome, wit::ProviderError> {
            let request = model::AddRequest {
                resource: resource_in(request.resource),
                attempt_key: request.attempt_key,
                size_bytes: request.size_bytes,
                claims: request.claims.into_iter().map(claim_in).collect(),
            };
            match P::from_host(WasmHost).add_resource(&request) {
                Ok(model::AddOutcome::Attached(d)) => {
                    Ok(wit::AddOutcome::Attached(wit::AttachedDevice {
                        device_id: d.device_id,
                        fabric_device_id: d.fabric_device_id,
                        machine_id: d.machine_id,
                    }))
                }
                Ok(model::AddOutcome::InProgress(why)) => Ok(wit::AddOutcome::InProgress(why)),
                Err(e) => Err(error_out(e)),
            }
        }

        fn remove_resource(
            resource: wit::ComposableResource,
        ) -> Result<wit::RemoveOutcome, wit::ProviderError> {
            match P::from_host(WasmHost).remove_resource(&resource_in(resource)) {
                Ok(model::RemoveOutcome::Removed) => Ok(wit::RemoveOutcome::Removed),
                Ok(model::RemoveOutcome::InProgress(why)) => {
                    Ok(wit::RemoveOutcome::InProgress(why))
                }
                Err(e) => Err(error_out(e)),
            }
        }

        fn check_resource(resource: wit::ComposableResource) -> Result<(), wit::ProviderError> {
            P::from_host(WasmHost)
                .check_resource(&resource_in(resource))
                .map_err(error_out)
        }

        fn get_resources(
            claims: Vec<wit::Claim>,
        ) -> Result<Vec<wit::DeviceInfo>, wit::ProviderError> {
            let claims: Vec<model::Claim> = claims.into_iter().map(claim_in).collect();
            let devices = P::from_host(WasmHost)
                .get_resources(&claims)
                .map_err(error_out)?;
            Ok(devices
                .into_iter()
                .map(|d| wit::DeviceInfo {
                    node: d.node,
                    machine_id: d.machine_id,
                    device_type: device_type_out(d.device_type),
                    model: d.model,
                    device_id: d.device_id,
                    fabric_device_id: d.fabric_device_id,
                })
                .collect())
        }

        fn get_pool(
            query: wit_pool::PoolQuery,
        ) -> Result<wit_pool::PoolOutcome, wit::ProviderError> {
            let query = model::PoolQuery {
                kinds: query.kinds.into_iter().map(kind_in).collect(),
                nodes: query.nodes,
            };
            match P::from_host(WasmHost).get_pool(&query) {
                Ok(model::PoolOutcome::Pools(pools)) => Ok(wit_pool::PoolOutcome::Pools(
                    pools.into_iter().map(pool_out).collect(),
                )),
                Ok(model::PoolOutcome::NotSupported(why)) => {
                    Ok(wit_pool::PoolOutcome::NotSupported(why))
                }
                Err(e) => Err(error_out(e)),
            }
        }
    }

    fn kind_in(k: wit_pool::DeviceKind) -> model::PoolKind {
        model::PoolKind {
            device_type: device_type_in(k.device_type),
            model: k.model,
        }
    }

    fn pool_out(p: model::FabricPool) -> wit_pool::FabricPool {
        wit_pool::FabricPool {
            id: p.id,
            nodes: p.nodes,
            free: p
                .free
                .into_iter()
                .map(|f| wit_pool::FreeDevices {
                    kind: wit_pool::DeviceKind {
                        device_type: device_type_out(f.kind.device_type),
                        model: f.kind.model,
                    },
                    count: f.count,
                    sizes: f.sizes,
                })
                .collect(),
        }
    }

    fn device_type_in(t: wit::DeviceType) -> model::DeviceType {
        match t {
            wit::DeviceType::Gpu => model::DeviceType::Gpu,
            wit::DeviceType::Cxlmemory => model::DeviceType::Cxlmemory,
        }
    }

    fn device_type_out(t: model::DeviceType) -> wit::DeviceType {
        match t {
            model::DeviceType::Gpu => wit::DeviceType::Gpu,
            model::DeviceType::Cxlmemory => wit::DeviceType::Cxlmemory,
        }
    }

    fn resource_in(r: wit::ComposableResource) -> model::ComposableResource {
        model::ComposableResource {
            name: r.name,
            device_type: device_type_in(r.device_type),
            model: r.model,
            target_node: r.target_node,
            device_id: r.device_id,
            fabric_device_id: r.fabric_device_id,
            machine_id: r.machine_id,
            force_detach: r.force_detach,
        }
    }

    fn claim_in(c: wit::Claim) -> model::Claim {
        model::Claim {
            resource: c.resource,
            device_id: c.device_id,
            fabric_device_id: c.fabric_device_id,
        }
    }

    fn info_out(i: model::ProviderInfo) -> wit::ProviderInfo {
        wit::ProviderInfo {
            name: i.name,
            vendor: i.vendor,
            version: i.version,
            devices: i
                .devices
                .into_iter()
                .map(|d| wit::DeviceKind {
                    device_type: device_type_out(d.device_type),
                    models: d.models,
                })
                .collect(),
            capabilities: wit::Capabilities {
                http: i.capabilities.http,
                secret_keys: i.capabilities.secret_keys,
                lookup: i
                    .capabilities
                    .lookup
                    .into_iter()
                    .map(|l| wit::LookupKind {
                        api_version: l.api_version,
                        kind: l.kind,
                        when_config: l.when_config,
                    })
                    .collect(),
                clocks: i.capabilities.clocks,
            },
            config: i
                .config
                .into_iter()
                .map(|k| wit::ConfigKey {
                    name: k.name,
                    required: k.required,
                    description: k.description,
                })
                .collect(),
        }
    }

    fn error_out(e: model::ProviderError) -> wit::ProviderError {
        use model::ProviderError as P;
        match e {
            P::Fabric {
                status,
                code,
                message,
            } => wit::ProviderError::Fabric(wit::FabricError {
                status,
                code,
                message,
            }),
            P::MalformedReply(m) => wit::ProviderError::MalformedReply(m),
            P::NotFound(m) => wit::ProviderError::NotFound(m),
            P::Warning(m) => wit::ProviderError::Warning(m),
            P::Critical(m) => wit::ProviderError::Critical(m),
            P::Denied(m) => wit::ProviderError::Denied(m),
            P::Config(m) => wit::ProviderError::Config(m),
            P::Unavailable(m) => wit::ProviderError::Unavailable(m),
            P::NoCapacity(m) => wit::ProviderError::NoCapacity(m),
            P::Other(m) => wit::ProviderError::Other(m),
        }
    }
}
