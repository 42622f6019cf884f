//! `cro-provider-sdk`: what a Rust vendor needs to write a cro provider (contract
//! `cro:provider@0.3.0`) without touching WIT bindings.
//!
//! - [`Provider`]: the six operations in the host's own terms ([`model`]);
//! - [`Host`]: what the host offers (HTTP, Secret keys, cluster lookups, configuration,
//!   logging, `state`, the clock); inside a component `WasmHost` implements it;
//! - [`json`]: JSON over HTTP with typed errors (a fabric's error reply keeps the
//!   vendor's code and message); [`oauth2`]: a client-credentials token cached in
//!   `state`; [`encode`] and [`lenient`]: URL encoding and loose JSON fields;
//!   [`endpoint`]: a configured endpoint checked and reduced to its origin; [`nodes`]:
//!   Nodes' names and `providerID`s through the host's lookups;
//! - [`testing::TestHost`]: a native double of the host for unit tests;
//! - `export_provider!(MyProvider)` (wasm32): makes `MyProvider` (a [`Provider`] and
//!   `guest::FromHost`) the component's `cdi-provider` export.
//!
//! ```text
//! struct Acme<H: Host> { host: H }
//! impl<H: Host> Provider for Acme<H> { ... }
//! impl cro_provider_sdk::guest::FromHost for Acme<cro_provider_sdk::guest::WasmHost> { ... }
//! cro_provider_sdk::export_provider!(Acme<cro_provider_sdk::guest::WasmHost>);
//! ```

// The generated bindings name this crate by its path, from inside too.
extern crate self as cro_provider_sdk;

pub mod encode;
pub mod endpoint;
pub mod host;
pub mod json;
pub mod lenient;
pub mod model;
pub mod nodes;
pub mod oauth2;
pub mod provider;
pub mod testing;

#[cfg(target_arch = "wasm32")]
pub mod guest;

pub use host::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};
pub use model::{
    AddOutcome, AddRequest, AttachedDevice, Capabilities, Claim, ComposableResource, ConfigKey,
    DeviceInfo, DeviceKind, DeviceType, FabricPool, FreeDevices, LookupKind, PoolKind, PoolOutcome,
    PoolQuery, ProviderError, ProviderInfo, RemoveOutcome,
};
pub use provider::Provider;

/// Makes `$ty` (a [`Provider`] and `guest::FromHost`) the component's export. Use once,
/// in the component crate, on wasm32.
#[cfg(feature = "export")]
#[macro_export]
macro_rules! export_provider {
    ($ty:ty) => {
        type __CroProviderExport = $crate::guest::Exported<$ty>;
        $crate::guest::bindings::__export_cro_provider_world!(
            __CroProviderExport with_types_in $crate::guest::bindings
        );
    };
}
