//! Loading refuses, with a clear typed error, anything that is not a provider of our world
//! and version; inspection describes what a component is.

mod common;
mod component_cache;

use std::sync::Arc;

use common::*;
use cro_runtime::AddRequest;
use cro_runtime::cluster::StaticCluster;
use cro_runtime::{InspectError, LoadError, ProviderSpec};

async fn load_bytes(bytes: Vec<u8>) -> LoadError {
    let spec = ProviderSpec::new("bad", "unused.wasm");
    runtime()
        .load_bytes(&spec, bytes, Arc::new(StaticCluster::new()))
        .await
        .unwrap_err()
}

async fn load_file(path: std::path::PathBuf) -> LoadError {
    let spec = ProviderSpec::new("bad", path);
    runtime()
        .load(&spec, Arc::new(StaticCluster::new()))
        .await
        .unwrap_err()
}

#[tokio::test]
async fn a_core_module_is_refused() {
    let module = wat::parse_str("(module (func (export \"f\")))").unwrap();
    let err = load_bytes(module).await;
    assert!(
        matches!(err, LoadError::Component(InspectError::CoreModule)),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("core WebAssembly module, not a component")
    );
}

#[tokio::test]
async fn a_random_file_is_refused() {
    let err = load_bytes(b"#!/bin/sh\nrm -rf /\n".to_vec()).await;
    assert!(
        matches!(err, LoadError::Component(InspectError::NotWasm)),
        "{err:?}"
    );
    let err = load_bytes(b"\0asm\x0d\0\x01\0garbage".to_vec()).await;
    assert!(
        matches!(err, LoadError::Component(InspectError::Invalid(_))),
        "{err:?}"
    );
    let err = load_file("/nonexistent/provider.wasm".into()).await;
    assert!(matches!(err, LoadError::Read { .. }), "{err:?}");
}

#[tokio::test]
async fn a_future_version_is_refused_by_name() {
    let err = load_file(cro_test_support::component("future-version-provider")).await;
    assert!(
        matches!(&err, LoadError::UnsupportedVersion { found } if found == "0.9.0"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the component targets cro:provider@0.9.0; this host supports 0.1.0, 0.2.0, 0.3.0"
    );
}

#[tokio::test]
async fn a_component_of_another_world_is_refused() {
    let path = cro_test_support::example_component("future-version-provider", "other_world");
    let err = load_file(path).await;
    let LoadError::WrongWorld { exports } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(exports, &["greet".to_string()]);
    let text = err.to_string();
    assert!(
        text.contains(
            "does not export cro:provider/provider@0.1.0 or cro:provider/cdi-provider@0.2.0 \
             or cro:provider/cdi-provider@0.3.0"
        ),
        "{text}"
    );
    assert!(text.contains("it exports: greet"), "{text}");
}

#[tokio::test]
async fn unsatisfiable_imports_are_named() {
    let path = cro_test_support::example_component("future-version-provider", "extra_import");
    let err = load_file(path).await;
    let LoadError::UnsatisfiedImports { imports, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(imports, &["acme:extra/backdoor@1.0.0".to_string()]);
    assert!(
        err.to_string().contains("acme:extra/backdoor@1.0.0"),
        "{err}"
    );
}

#[tokio::test]
async fn limits_beyond_the_runtime_are_refused() {
    let mut spec = spec("fake", &[]);
    spec.limits.memory_bytes = runtime().options().max_memory_bytes + 1;
    let err = runtime()
        .load(&spec, Arc::new(StaticCluster::new()))
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Limits(_)), "{err:?}");
    // An invalid spec built in code is caught at load too.
    let mut spec = spec.clone();
    spec.limits.memory_bytes = 64 << 20;
    spec.name = "Not A Name".into();
    let err = runtime()
        .load(&spec, Arc::new(StaticCluster::new()))
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Spec(_)), "{err:?}");
}

#[test]
fn inspect_describes_the_testkit() {
    let bytes = std::fs::read(testkit()).unwrap();
    for info in [
        cro_runtime::inspect(&bytes).unwrap(),
        runtime().inspect(&bytes).unwrap(),
    ] {
        assert_eq!(
            info.world.as_deref(),
            Some("cro:provider/provider-world@0.1.0")
        );
        assert_eq!(info.contract_version.as_deref(), Some("0.1.0"));
        assert!(info.supported_version);
        assert!(info.unsatisfied_imports.is_empty(), "{info:?}");
        let names: Vec<&str> = info.imports.iter().map(|i| i.name.as_str()).collect();
        for wanted in [
            "cro:provider/http@0.1.0",
            "cro:provider/state@0.1.0",
            "cro:provider/config@0.1.0",
        ] {
            assert!(names.contains(&wanted), "{names:?}");
        }
        assert!(
            names.iter().any(|n| n.starts_with("wasi:cli/")),
            "{names:?}"
        );
        let export = &info.exports[0];
        assert_eq!(export.name, "cro:provider/provider@0.1.0");
        assert_eq!(
            export.functions,
            [
                "add-resource",
                "remove-resource",
                "check-resource",
                "get-resources"
            ]
        );
    }
}

#[test]
fn inspect_refuses_non_components() {
    let module = wat::parse_str("(module)").unwrap();
    assert_eq!(cro_runtime::inspect(&module), Err(InspectError::CoreModule));
    assert_eq!(cro_runtime::inspect(b"hello"), Err(InspectError::NotWasm));
}

#[tokio::test]
async fn a_0_3_0_component_declares_what_it_needs_and_0_1_0_does_not() {
    let bytes = std::fs::read(cro_test_support::component("fti-provider")).unwrap();
    let info = cro_runtime::inspect(&bytes).unwrap();
    assert_eq!(info.contract_version.as_deref(), Some("0.3.0"));
    assert!(info.supported_version);
    assert!(info.unsatisfied_imports.is_empty(), "{info:?}");
    let export = &info.exports[0];
    assert_eq!(export.name, "cro:provider/cdi-provider@0.3.0");
    assert_eq!(
        export.functions,
        [
            "describe",
            "add-resource",
            "remove-resource",
            "check-resource",
            "get-resources",
            "get-pool"
        ]
    );
    // 0.3.0 reuses the 0.1.0 capability interfaces and the 0.2.0 records: one host
    // implementation for all.
    let names: Vec<&str> = info.imports.iter().map(|i| i.name.as_str()).collect();
    assert!(names.contains(&"cro:provider/http@0.1.0"), "{names:?}");
    assert!(names.contains(&"cro:provider/types@0.2.0"), "{names:?}");
    assert!(names.contains(&"cro:provider/pool@0.3.0"), "{names:?}");

    // `describe` runs at load with nothing granted (the load would fail if it used an
    // import: every capability is denied).
    let declared = runtime()
        .describe_bytes(bytes)
        .await
        .unwrap()
        .expect("a 0.3.0 component declares");
    assert_eq!(declared.name, "fti");
    assert_eq!(declared.capabilities.http, ["${endpoint}"]);
    assert!(declared.capabilities.clocks);
    assert!(
        declared
            .config
            .iter()
            .any(|k| k.name == "endpoint" && k.required)
    );
    let testkit = std::fs::read(testkit()).unwrap();
    assert_eq!(runtime().describe_bytes(testkit).await.unwrap(), None);
}

#[tokio::test]
async fn both_served_versions_load_side_by_side_with_their_reports() {
    let rt = runtime();
    let cluster = Arc::new(StaticCluster::new());
    let old = rt
        .load(&ProviderSpec::new("old", testkit()), cluster.clone())
        .await
        .unwrap();
    let mut spec = ProviderSpec::new("fti", cro_test_support::component("fti-provider"));
    spec.config
        .insert("endpoint".into(), "fabric.example:8443/".into());
    spec.config.insert("api_typo".into(), "FM".into());
    let new = rt.load(&spec, cluster).await.unwrap();
    assert_eq!(old.contract_version(), "0.1.0");
    assert_eq!(new.contract_version(), "0.3.0");
    assert!(old.info().is_none());
    assert!(!old.capability_report().declared);
    let report = new.capability_report();
    assert!(report.declared);
    assert!(
        report
            .wanted_not_granted
            .contains(&"http https://fabric.example:8443 (${endpoint})".to_string()),
        "{report:?}"
    );
    assert!(report.wanted_not_granted.contains(&"clocks".to_string()));
    assert_eq!(report.unknown_config, ["api_typo"]);
    assert!(report.missing_config.contains(&"api_type".to_string()));
    // Both answer calls in the same runtime; the new one is refused its HTTP.
    let gpu = common::gpu("gpu-a");
    assert!(matches!(
        old.add(&AddRequest::new(gpu.clone())).await,
        Ok(cro_runtime::AddOutcome::Attached(_))
    ));
    let err = new.add(&AddRequest::new(gpu.clone())).await.unwrap_err();
    assert!(
        matches!(err, cro_runtime::CallError::Provider(_)),
        "{err:?}"
    );
    // A provider of a contract without a pool is not called for one: it says why.
    let query = cro_runtime::PoolQuery {
        kinds: vec![cro_runtime::PoolKind {
            device_type: cro_runtime::DeviceType::Gpu,
            model: "A100".into(),
        }],
        nodes: vec!["w0".into()],
    };
    match old.pool(&query).await {
        Ok(cro_runtime::PoolOutcome::NotSupported(why)) => {
            assert!(why.contains("contract 0.1.0, which has no pool"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // The 0.3.0 one is, and its refused HTTP is a typed error, not an empty pool.
    let err = new.pool(&query).await.unwrap_err();
    assert!(
        matches!(err, cro_runtime::CallError::Provider(_)),
        "{err:?}"
    );
}

/// A hand-written contract 0.2.0 provider whose every export traps, `describe` included.
fn trapping_v0_2_0() -> Vec<u8> {
    let wat = r#"(module
      (memory (export "memory") 1)
      (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) unreachable)
      (func (export "cro:provider/cdi-provider@0.2.0#describe") (result i32) unreachable)
      (func (export "cro:provider/cdi-provider@0.2.0#add-resource") (param i32) (result i32)
        unreachable)
      (func (export "cro:provider/cdi-provider@0.2.0#remove-resource") (param i32) (result i32)
        unreachable)
      (func (export "cro:provider/cdi-provider@0.2.0#check-resource") (param i32) (result i32)
        unreachable)
      (func (export "cro:provider/cdi-provider@0.2.0#get-resources") (param i32 i32) (result i32)
        unreachable))"#;
    common::provider_component(wat, "since_v0.2.0")
}

#[tokio::test]
async fn a_describe_that_traps_fails_the_load() {
    let err = load_bytes(trapping_v0_2_0()).await;
    assert!(matches!(err, LoadError::Describe(_)), "{err:?}");
    assert!(err.to_string().contains("describe failed at load"), "{err}");
}
