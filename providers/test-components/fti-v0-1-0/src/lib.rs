//! `fti-v0-1-0`: a test fixture. The FTI provider's current logic (`fti-provider`
//! without its 0.2.0 export) wrapped in the `cro:provider@0.1.0` world, the way FTI
//! components were built before 0.2.0. It keeps the promise that components already
//! deployed keep working: `provider-it` runs the FTI integration tests against it too,
//! and loads it beside the 0.2.0 build in one runtime.
//!
//! Why a wrapper rather than a frozen copy of the old source: the logic stays one, so
//! the tests compare contract versions, not two diverging providers; the 0.1.0 world
//! reaches it without claims, attempt key or machine id, as an old component would.

#[cfg(target_arch = "wasm32")]
mod guest {
    use cro_provider_sdk::guest::WasmHost;
    use fti_provider::{
        AddOutcome, ComposableResource, DeviceInfo, DeviceType, Fti, ProviderError, RemoveOutcome,
    };

    wit_bindgen::generate!({
        path: "../../../wit/since_v0.1.0",
        world: "provider-world",
        // The capability imports are the SDK's (the same interfaces).
        with: {
            "cro:provider/http@0.1.0": cro_provider_sdk::guest::imports::cro::provider::http,
            "cro:provider/secrets@0.1.0": cro_provider_sdk::guest::imports::cro::provider::secrets,
            "cro:provider/lookup@0.1.0": cro_provider_sdk::guest::imports::cro::provider::lookup,
            "cro:provider/config@0.1.0": cro_provider_sdk::guest::imports::cro::provider::config,
            "cro:provider/log@0.1.0": cro_provider_sdk::guest::imports::cro::provider::log,
            "cro:provider/state@0.1.0": cro_provider_sdk::guest::imports::cro::provider::state,
        },
    });

    use cro::provider::types as wit;

    fn device_type_out(t: DeviceType) -> wit::DeviceType {
        match t {
            DeviceType::Gpu => wit::DeviceType::Gpu,
            DeviceType::Cxlmemory => wit::DeviceType::Cxlmemory,
        }
    }

    fn resource_in(r: wit::ComposableResource) -> ComposableResource {
        ComposableResource {
            name: r.name,
            device_type: match r.device_type {
                wit::DeviceType::Gpu => DeviceType::Gpu,
                wit::DeviceType::Cxlmemory => DeviceType::Cxlmemory,
            },
            model: r.model,
            target_node: r.target_node,
            device_id: r.device_id,
            fabric_device_id: r.fabric_device_id,
            machine_id: None,
            force_detach: r.force_detach,
        }
    }

    fn error_out(e: ProviderError) -> wit::ProviderError {
        use wit::ProviderError as W;
        match e {
            ProviderError::Fabric {
                status,
                code,
                message,
            } => W::Fabric(wit::FabricError {
                status,
                code,
                message,
            }),
            ProviderError::MalformedReply(m) => W::MalformedReply(m),
            ProviderError::NotFound(m) => W::NotFound(m),
            ProviderError::Warning(m) => W::Warning(m),
            ProviderError::Critical(m) => W::Critical(m),
            ProviderError::Denied(m) => W::Denied(m),
            ProviderError::Config(m) => W::Config(m),
            ProviderError::Unavailable(m) => W::Unavailable(m),
            ProviderError::NoCapacity(m) => W::NoCapacity(m),
            ProviderError::Other(m) => W::Other(m),
        }
    }

    struct V010;

    impl exports::cro::provider::provider::Guest for V010 {
        fn add_resource(
            resource: wit::ComposableResource,
        ) -> Result<wit::AddOutcome, wit::ProviderError> {
            match Fti::new(WasmHost).add_resource(&resource_in(resource)) {
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
            match Fti::new(WasmHost).remove_resource(&resource_in(resource)) {
                Ok(RemoveOutcome::Removed) => Ok(wit::RemoveOutcome::Removed),
                Ok(RemoveOutcome::InProgress(why)) => Ok(wit::RemoveOutcome::InProgress(why)),
                Err(e) => Err(error_out(e)),
            }
        }

        fn check_resource(resource: wit::ComposableResource) -> Result<(), wit::ProviderError> {
            Fti::new(WasmHost)
                .check_resource(&resource_in(resource))
                .map_err(error_out)
        }

        fn get_resources() -> Result<Vec<wit::DeviceInfo>, wit::ProviderError> {
            let devices = Fti::new(WasmHost).get_resources().map_err(error_out)?;
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

    export!(V010);
}
