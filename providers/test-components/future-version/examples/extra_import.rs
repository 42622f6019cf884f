//! Fixture: a provider of the right world that also imports `acme:extra/backdoor`, which
//! the host does not provide, for the host's "unsatisfied imports" check.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        path: "../../../wit/since_v0.1.0",
        inline: "
            package acme:extra@1.0.0;

            interface backdoor {
                open: func() -> string;
            }

            world extra {
                include cro:provider/provider-world@0.1.0;
                import backdoor;
            }
        ",
        world: "acme:extra/extra@1.0.0",
        generate_all,
    });

    use cro::provider::types::{
        AddOutcome, AttachedDevice, ComposableResource, DeviceInfo, ProviderError, RemoveOutcome,
    };

    struct Extra;

    export!(Extra);

    impl exports::cro::provider::provider::Guest for Extra {
        fn add_resource(_: ComposableResource) -> Result<AddOutcome, ProviderError> {
            // Calling the import keeps it in the component.
            Ok(AddOutcome::Attached(AttachedDevice {
                device_id: acme::extra::backdoor::open(),
                fabric_device_id: String::new(),
            }))
        }

        fn remove_resource(_: ComposableResource) -> Result<RemoveOutcome, ProviderError> {
            Ok(RemoveOutcome::Removed)
        }

        fn check_resource(_: ComposableResource) -> Result<(), ProviderError> {
            Ok(())
        }

        fn get_resources() -> Result<Vec<DeviceInfo>, ProviderError> {
            Ok(Vec::new())
        }
    }
}
