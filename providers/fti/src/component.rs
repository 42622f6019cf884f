//! The component wrapper: [`Host`] over the WIT imports, `provider` exported over [`Fti`].

use std::time::SystemTime;

use crate::Fti;
use crate::host::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};
use crate::model::{
    AddOutcome, ComposableResource, DeviceInfo, DeviceType, ProviderError, RemoveOutcome,
};

wit_bindgen::generate!({
    path: "../../wit/since_v0.1.0",
    world: "provider-world",
});

use cro::provider::types as wit;
use cro::provider::{config, http, log, lookup, secrets, state};

struct WitHost;

impl Host for WitHost {
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

fn device_type_in(t: wit::DeviceType) -> DeviceType {
    match t {
        wit::DeviceType::Gpu => DeviceType::Gpu,
        wit::DeviceType::Cxlmemory => DeviceType::Cxlmemory,
    }
}

fn device_type_out(t: DeviceType) -> wit::DeviceType {
    match t {
        DeviceType::Gpu => wit::DeviceType::Gpu,
        DeviceType::Cxlmemory => wit::DeviceType::Cxlmemory,
    }
}

fn resource_in(r: wit::ComposableResource) -> ComposableResource {
    ComposableResource {
        name: r.name,
        device_type: device_type_in(r.device_type),
        model: r.model,
        target_node: r.target_node,
        device_id: r.device_id,
        fabric_device_id: r.fabric_device_id,
        force_detach: r.force_detach,
    }
}

fn error_out(e: ProviderError) -> wit::ProviderError {
    match e {
        ProviderError::Fabric {
            status,
            code,
            message,
        } => wit::ProviderError::Fabric(wit::FabricError {
            status,
            code,
            message,
        }),
        ProviderError::MalformedReply(m) => wit::ProviderError::MalformedReply(m),
        ProviderError::NotFound(m) => wit::ProviderError::NotFound(m),
        ProviderError::Warning(m) => wit::ProviderError::Warning(m),
        ProviderError::Critical(m) => wit::ProviderError::Critical(m),
        ProviderError::Denied(m) => wit::ProviderError::Denied(m),
        ProviderError::Config(m) => wit::ProviderError::Config(m),
        ProviderError::Unavailable(m) => wit::ProviderError::Unavailable(m),
        ProviderError::NoCapacity(m) => wit::ProviderError::NoCapacity(m),
        ProviderError::Other(m) => wit::ProviderError::Other(m),
    }
}

struct Component;

impl exports::cro::provider::provider::Guest for Component {
    fn add_resource(
        resource: wit::ComposableResource,
    ) -> Result<wit::AddOutcome, wit::ProviderError> {
        match Fti::new(WitHost).add_resource(&resource_in(resource)) {
            Ok(AddOutcome::Attached(d)) => Ok(wit::AddOutcome::Attached(wit::AttachedDevice {
                device_id: d.device_id,
                fabric_device_id: d.fabric_device_id,
            })),
            Ok(AddOutcome::InProgress(why)) => Ok(wit::AddOutcome::InProgress(why)),
            Err(e) => Err(error_out(e)),
        }
    }

    fn remove_resource(
        resource: wit::ComposableResource,
    ) -> Result<wit::RemoveOutcome, wit::ProviderError> {
        match Fti::new(WitHost).remove_resource(&resource_in(resource)) {
            Ok(RemoveOutcome::Removed) => Ok(wit::RemoveOutcome::Removed),
            Ok(RemoveOutcome::InProgress(why)) => Ok(wit::RemoveOutcome::InProgress(why)),
            Err(e) => Err(error_out(e)),
        }
    }

    fn check_resource(resource: wit::ComposableResource) -> Result<(), wit::ProviderError> {
        Fti::new(WitHost)
            .check_resource(&resource_in(resource))
            .map_err(error_out)
    }

    fn get_resources() -> Result<Vec<wit::DeviceInfo>, wit::ProviderError> {
        let devices = Fti::new(WitHost).get_resources().map_err(error_out)?;
        Ok(devices
            .into_iter()
            .map(|d: DeviceInfo| wit::DeviceInfo {
                node: d.node,
                machine_id: d.machine_id,
                device_type: device_type_out(d.device_type),
                model: d.model,
                device_id: d.device_id,
                fabric_device_id: d.fabric_device_id,
            })
            .collect())
    }
}

export!(Component);
