//! `future-version-provider`: a test fixture exporting `cro:provider/provider@0.9.0` (its
//! WIT is in this crate's `wit/` folder), a version the host does not serve, which it
//! must refuse naming the versions it does serve.
//!
//! The examples are fixtures too: `other_world` is a component of an unrelated world and
//! `extra_import` a provider that imports an interface the host does not provide.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        path: "wit",
        world: "provider-world",
    });

    use cro::provider::types::{
        AddOutcome, ComposableResource, DeviceInfo, ProviderError, RemoveOutcome,
    };

    struct Future;

    export!(Future);

    fn unsupported() -> ProviderError {
        ProviderError::Other("future-version fixture".into())
    }

    impl exports::cro::provider::provider::Guest for Future {
        fn add_resource(_: ComposableResource) -> Result<AddOutcome, ProviderError> {
            Err(unsupported())
        }

        fn remove_resource(_: ComposableResource) -> Result<RemoveOutcome, ProviderError> {
            Err(unsupported())
        }

        fn check_resource(_: ComposableResource) -> Result<(), ProviderError> {
            Err(unsupported())
        }

        fn get_resources() -> Result<Vec<DeviceInfo>, ProviderError> {
            Err(unsupported())
        }

        fn describe() -> String {
            "a provider from the future".into()
        }
    }
}
