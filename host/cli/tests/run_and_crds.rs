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
