//! The kubelet's plugin messages, written with prost's derive instead of generated from
//! the .proto files (field numbers and types as in `k8s.io/kubelet`'s
//! `pkg/apis/pluginregistration/v1/api.proto` and `pkg/apis/dra/v1/api.proto`), and the
//! services build.rs generates for them.

use std::collections::HashMap;

// ---- pluginregistration (the kubelet's plugin watcher) ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    /// `DRAPlugin` for a DRA driver.
    #[prost(string, tag = "1")]
    pub r#type: String,
    /// The DRA driver's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The socket the kubelet then calls the DRA service on.
    #[prost(string, tag = "3")]
    pub endpoint: String,
    /// For DRA, the gRPC services offered, as `<package>.<service>` (`v1.DRAPlugin`).
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatusResponse {}

// ---- k8s.io.kubelet.pkg.apis.dra.v1 ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct Claim {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesResponse {
    /// Keyed by claim UID.
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodePrepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourceResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
    /// Non-empty when the claim could not be prepared (the kubelet retries).
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, repeated, tag = "1")]
    pub request_names: Vec<String>,
    #[prost(string, tag = "2")]
    pub pool_name: String,
    #[prost(string, tag = "3")]
    pub device_name: String,
    #[prost(string, repeated, tag = "4")]
    pub cdi_device_ids: Vec<String>,
    #[prost(string, optional, tag = "5")]
    pub share_id: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesResponse {
    /// Keyed by claim UID.
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodeUnprepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourceResponse {
    #[prost(string, tag = "1")]
    pub error: String,
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub(crate) mod registration {
    include!(concat!(
        env!("OUT_DIR"),
        "/pluginregistration.Registration.rs"
    ));
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub(crate) mod dra {
    include!(concat!(
        env!("OUT_DIR"),
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin.rs"
    ));
}
