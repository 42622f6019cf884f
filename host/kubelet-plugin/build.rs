//! Generates the two gRPC services the kubelet calls, from their descriptions here (the
//! messages are written by hand in src/proto.rs, so no protoc is needed). The package and
//! route names are the kubelet's wire names and must not change.

use tonic_build::manual::{Builder, Method, Service};

fn unary(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::proto::{input}"))
        .output_type(format!("crate::proto::{output}"))
        .codec_path("tonic_prost::ProstCodec")
        .build()
}

fn main() {
    let registration = Service::builder()
        .name("Registration")
        .package("pluginregistration")
        .method(unary("get_info", "GetInfo", "InfoRequest", "PluginInfo"))
        .method(unary(
            "notify_registration_status",
            "NotifyRegistrationStatus",
            "RegistrationStatus",
            "RegistrationStatusResponse",
        ))
        .build();
    let dra = Service::builder()
        .name("DRAPlugin")
        .package("k8s.io.kubelet.pkg.apis.dra.v1")
        .method(unary(
            "node_prepare_resources",
            "NodePrepareResources",
            "NodePrepareResourcesRequest",
            "NodePrepareResourcesResponse",
        ))
        .method(unary(
            "node_unprepare_resources",
            "NodeUnprepareResources",
            "NodeUnprepareResourcesRequest",
            "NodeUnprepareResourcesResponse",
        ))
        .build();
    Builder::new()
        .build_client(false)
        .build_transport(false)
        .compile(&[registration, dra]);
    println!("cargo:rerun-if-changed=build.rs");
}
