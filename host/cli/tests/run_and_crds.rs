//! `cro crds` and the refusals of `cro run` that need no cluster.

use std::process::{Command, Output};

fn cro(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cro"));
    cmd.args(args);
    // Only what the test sets reaches the operator's configuration.
    for var in [
        "DEVICE_RESOURCE_TYPE",
        "CDI_PROVIDER_TYPE",
        "CRO_PROVIDER_SPEC",
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn crds_prints_the_committed_manifests() {
    let out = cro(&["crds"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2);
    for file in files {
        let committed = std::fs::read_to_string(&file).unwrap();
        assert!(
            stdout.contains(&committed),
            "`cro crds` lacks {}",
            file.display()
        );
    }
    assert_eq!(stdout.matches("kind: CustomResourceDefinition").count(), 2);
}

#[test]
fn run_help_names_the_go_operator_variables() {
    let out = cro(&["run", "--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for name in [
        "DEVICE_RESOURCE_TYPE",
        "NVIDIA_GPU_OPERATOR_NAMESPACE",
        "CRO_PROVIDER_SPEC",
    ] {
        assert!(help.contains(name), "{name} missing from:\n{help}");
    }
}

#[test]
fn run_refuses_a_bad_configuration_before_connecting() {
    let out = cro(&["run"], &[("DEVICE_RESOURCE_TYPE", "FPGA")]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("invalid configuration"), "{stderr}");
    assert!(stderr.contains("FPGA"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn run_without_a_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = cro(
        &["run", "--metrics-addr", ""],
        &[("KUBECONFIG", missing.to_str().unwrap())],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("the operator stopped"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn error_causes_are_not_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = cro(
        &["run", "--metrics-addr", ""],
        &[("KUBECONFIG", missing.to_str().unwrap())],
    );
    let stderr = text(&out.stderr);
    assert_eq!(stderr.matches("no-such-kubeconfig").count(), 1, "{stderr}");
}

/// `cro status` against a real API server: the request, its devices with node, device id
/// and state, the errors, and a device no request claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_requests_devices_nodes_and_errors() {
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use serde_json::json;

    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let requests: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<cro_api::ComposabilityRequest>(&()),
    );
    let resources: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<cro_api::ComposableResource>(&()),
    );
    let create = |api: Api<kube::api::DynamicObject>,
                  obj: serde_json::Value,
                  status: serde_json::Value| async move {
        let obj: kube::api::DynamicObject = serde_json::from_value(obj).unwrap();
        let name = obj.metadata.name.clone().unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    };
    create(
        requests.clone(),
        json!({"apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposabilityRequest",
            "metadata": {"name": "training"},
            "spec": {"resource": {"type": "gpu", "model": "A100", "size": 2}}}),
        json!({"state": "Updating", "error": ""}),
    )
    .await;
    for (name, owner, node, device, state, error) in [
        (
            "gpu-1",
            Some("training"),
            "worker-1",
            "GPU-aaaa",
            "Online",
            "",
        ),
        (
            "gpu-2",
            Some("training"),
            "worker-2",
            "",
            "Attaching",
            "fabric busy: 503",
        ),
        ("gpu-3", None, "worker-3", "GPU-cccc", "Online", ""),
    ] {
        let mut meta = json!({"name": name});
        if let Some(o) = owner {
            meta["labels"] = json!({"app.kubernetes.io/managed-by": o});
        }
        create(
            resources.clone(),
            json!({"apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposableResource",
                "metadata": meta,
                "spec": {"type": "gpu", "model": "A100", "target_node": node}}),
            json!({"state": state, "device_id": device, "error": error}),
        )
        .await;
    }

    let kubeconfig = harness
        .kubeconfig_path()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let out = tokio::task::spawn_blocking(move || cro(&["status"], &[("KUBECONFIG", &kubeconfig)]))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(words(lines[0])[0], "REQUEST");
    let first = words(lines[1]);
    assert_eq!(
        first,
        [
            "training", "Updating", "gpu", "2x", "A100", "gpu-1", "worker-1", "GPU-aaaa", "Online",
            "-"
        ]
    );
    assert!(lines[2].contains("gpu-2") && lines[2].contains("worker-2"));
    assert!(
        lines[2].contains("Attaching") && lines[2].ends_with("fabric busy: 503"),
        "{table}"
    );
    assert!(
        lines[3].starts_with("(none)") && lines[3].contains("GPU-cccc"),
        "{table}"
    );

    // Without a cluster: a clear error, no panic.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope").display().to_string();
    let out = cro(&["status"], &[("KUBECONFIG", &missing)]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot reach the cluster"),
        "{}",
        text(&out.stderr)
    );
}
