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
    assert_eq!(files.len(), 3);
    for file in files {
        let committed = std::fs::read_to_string(&file).unwrap();
        assert!(
            stdout.contains(&committed),
            "`cro crds` lacks {}",
            file.display()
        );
    }
    assert_eq!(stdout.matches("kind: CustomResourceDefinition").count(), 3);
}

#[test]
fn run_help_names_the_go_operator_variables() {
    let out = cro(&["run", "--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    // Every variable `cro run` reads, the flags' own and the others (issue 15).
    for name in [
        "DEVICE_RESOURCE_TYPE",
        "NVIDIA_GPU_OPERATOR_NAMESPACE",
        "CRO_PROVIDER_SPEC",
        "RUST_LOG",
        "CRO_LOG_FORMAT",
        "NO_COLOR",
        "POD_NAME",
        "CDI_PROVIDER_TYPE",
        "FTI_CDI_API_TYPE",
        "FTI_CDI_ENDPOINT",
        "FTI_CDI_TENANT_ID",
        "FTI_CDI_CLUSTER_ID",
        "CRO_FTI_COMPONENT",
        "CRO_FTI_CA_FILE",
        "CRO_FTI_CALL_TIMEOUT",
        "CRO_CREDENTIALS_NAMESPACE",
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

/// Issue 15 row "`--sync-period 20`": refused, naming the setting and the fix.
#[test]
fn a_duration_without_unit_is_refused_naming_the_setting() {
    let out = cro(&["run", "--sync-period", "20"], &[]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--sync-period (CRO_SYNC_PERIOD)") && stderr.contains("20s"),
        "{stderr}"
    );
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

/// `cro run` as its own process, as in a pod: a kubeconfig holding only a token the API
/// server issued for the chart's ServiceAccount (bound by the chart's roles), the Go
/// operator's environment for the FTI component, secure metrics and a probe port. It
/// takes the Go operator's Lease, serves /readyz, reconciles a request (watch, finalizer,
/// status) without a single `forbidden`, and on SIGTERM releases the Lease and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cro_run_works_under_the_charts_service_account() {
    use std::time::{Duration, Instant};

    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, PostParams};
    use kube_harness::tools::{self, DEPLOY_DIR, Tool};

    const NS: &str = "composable-resource-operator-system";
    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    for ns in [NS, "gpu-operator"] {
        let obj: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
    }
    let helm = tools::locate(Tool::Helm).unwrap();
    let chart = std::path::Path::new(DEPLOY_DIR).join("helm/cro");
    let rendered = tools::run(
        &helm,
        &[
            "template",
            "cro",
            chart.to_str().unwrap(),
            "--namespace",
            NS,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
        std::path::Path::new(DEPLOY_DIR),
    )
    .unwrap();
    let objs = kube_harness::manifests::parse(&rendered).unwrap();
    kube_harness::manifests::apply(&client, &objs, false)
        .await
        .unwrap();
    let token = harness
        .service_account_token(NS, "cro-controller", Duration::from_secs(3600))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let ca = harness.ca_pem().unwrap();
    let b64 = {
        // k8s_openapi's ByteString serialises as base64.
        serde_json::to_value(k8s_openapi::ByteString(ca.as_bytes().to_vec())).unwrap()
    };
    std::fs::write(
        &kubeconfig,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": harness.server_url(), "certificate-authority-data": b64}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
            "current-context": "c",
        })
        .to_string(),
    )
    .unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (metrics_port, probe_port) = (free(), free());
    let component = cro_test_support::component("fti-provider");
    let log = dir.path().join("cro.log");
    // Another replica holds the Lease (and stops renewing): this one starts as a
    // standby, says so, and takes over once the Lease has expired.
    let held: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c5744f42.hpsys.ibm.ie.com", "namespace": NS},
        "spec": {"holderIdentity": "other-replica", "leaseDurationSeconds": 2,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now())},
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cro"))
        .args([
            "run",
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
            "--metrics-secure",
            "--health-probe-bind-address",
            &format!("127.0.0.1:{probe_port}"),
            "--leader-elect",
            "--sync-period",
            "1s",
        ])
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", NS)
        .env("POD_NAME", "cro-under-rbac")
        .env("CDI_PROVIDER_TYPE", "FTI_CDI")
        // Nothing listens there: fabric calls fail and are retried; RBAC is what is tested.
        .env("FTI_CDI_ENDPOINT", "127.0.0.1:9/")
        .env("FTI_CDI_TENANT_ID", "tenant")
        .env("CRO_FTI_COMPONENT", &component)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let until = |what: &str, deadline: Instant| {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; log:\n{}",
            logs()
        );
    };

    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let holder = leases
            .get_opt("c5744f42.hpsys.ibm.ie.com")
            .await
            .unwrap()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        let ready = reqwest::get(format!("http://127.0.0.1:{probe_port}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success());
        if holder.as_deref() == Some("cro-under-rbac") && ready {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "cro run exited:\n{}",
            logs()
        );
        until("the Lease and /readyz", deadline);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let requests: Api<cro_api::ComposabilityRequest> = Api::all(client.clone());
    let req: cro_api::ComposabilityRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposabilityRequest",
        "metadata": {"name": "sa-run"},
        "spec": {"resource": {"type": "gpu", "model": "A100", "size": 1}},
    }))
    .unwrap();
    requests.create(&PostParams::default(), &req).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = requests.get("sa-run").await.unwrap();
        let has_finalizer = r
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.contains(&cro_api::FINALIZER.to_string()));
        if has_finalizer && r.status.is_some() {
            break;
        }
        until("the request reconciled (finalizer and status)", deadline);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        until("cro run to exit after SIGTERM", deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = logs();
    assert!(status.success(), "{status}:\n{text}");
    // Issue 15, logs written to a file: no colour codes, no Debug dumps of API errors,
    // one start-up line with every address and mode, and a line on becoming leader.
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file:\n{text}"
    );
    assert!(
        !text.contains("Status {") && !text.contains("ErrorResponse"),
        "a Debug dump in the log:\n{text}"
    );
    let start = text
        .lines()
        .find(|l| l.contains("cro starting"))
        .unwrap_or_else(|| panic!("no start-up line:\n{text}"));
    for part in [
        format!("metrics_and_probes=127.0.0.1:{metrics_port}"),
        "metrics_https=true".to_string(),
        format!("health_probes=127.0.0.1:{probe_port}"),
        "webhook=off".to_string(),
        "exposure=DEVICE_PLUGIN".to_string(),
        format!("leader_election=Lease {NS}/c5744f42.hpsys.ibm.ie.com"),
    ] {
        assert!(start.contains(&part), "{part} not in: {start}");
    }
    let standby = text
        .lines()
        .find(|l| l.contains("standby"))
        .unwrap_or_else(|| panic!("no standby line:\n{text}"));
    assert!(standby.contains("leader=other-replica"), "{standby}");
    assert!(text.contains("became the leader"), "{text}");
    assert!(
        !text.contains("forbidden"),
        "a call was forbidden under the chart's roles:\n{text}"
    );
    let holder = leases
        .get("c5744f42.hpsys.ibm.ie.com")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the Lease was released on SIGTERM");
}

/// `cro before-uninstall` against a real API server (no kubelet: the operator's pods are
/// plain objects here; the real-node tests run it against a real operator): a live
/// request makes it refuse, changing nothing; `--detach` deletes requests and devices;
/// then the Deployment goes to zero and a Lease naming a pod that is gone is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_uninstall_refuses_then_detaches_scales_down_and_frees_the_lease() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, PostParams};
    use serde_json::json;

    const NS: &str = "cro-uninstall";
    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let kubeconfig = harness
        .kubeconfig_path()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let post = PostParams::default();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&post, &ns)
        .await
        .unwrap();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "cro-controller", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"control-plane": "controller-manager"}},
            "template": {
                "metadata": {"labels": {"control-plane": "controller-manager"}},
                "spec": {"containers": [{"name": "manager", "image": "localhost/cro:test"}]},
            },
        },
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments.create(&post, &deployment).await.unwrap();
    // The Lease of a replica killed before it could release it.
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "c5744f42.hpsys.ibm.ie.com", "namespace": NS},
        "spec": {"holderIdentity": "cro-controller-killed", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases.create(&post, &lease).await.unwrap();
    let requests: Api<cro_api::ComposabilityRequest> = Api::all(client.clone());
    let request: cro_api::ComposabilityRequest = serde_json::from_value(json!({
        "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposabilityRequest",
        "metadata": {"name": "training"},
        "spec": {"resource": {"type": "gpu", "model": "A100", "size": 2}},
    }))
    .unwrap();
    requests.create(&post, &request).await.unwrap();

    let run = |extra: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec![
                "before-uninstall",
                "--namespace",
                NS,
                "--deployment",
                "cro-controller",
                "--timeout",
                "30s",
            ];
            args.extend_from_slice(extra);
            cro(&args, &[("KUBECONFIG", &kubeconfig)])
        })
    };
    let out = run(&[]).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("refusing to uninstall: 1 ComposabilityRequest(s)")
            && said.contains("training"),
        "{said}"
    );
    assert!(requests.get_opt("training").await.unwrap().is_some());
    let replicas = |d: Deployment| d.spec.replicas;
    assert_eq!(
        replicas(deployments.get("cro-controller").await.unwrap()),
        Some(2)
    );

    let out = run(&["--detach"]).await.unwrap();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(requests.get_opt("training").await.unwrap().is_none());
    assert_eq!(
        replicas(deployments.get("cro-controller").await.unwrap()),
        Some(0)
    );
    assert!(
        leases
            .get_opt("c5744f42.hpsys.ibm.ie.com")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        said.contains("still named cro-controller-killed, whose pod is gone: deleted"),
        "{said}"
    );

    // A Deployment that is not there is an error that names it.
    let out = tokio::task::spawn_blocking(move || {
        cro(
            &[
                "before-uninstall",
                "--namespace",
                NS,
                "--deployment",
                "nope",
            ],
            &[("KUBECONFIG", &kubeconfig)],
        )
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("the Deployment cro-uninstall/nope does not exist"),
        "{}",
        text(&out.stderr)
    );
}

/// `cro crds | head -1`: the reader goes away; the command ends on SIGPIPE, quietly,
/// without a panic message. The pipe is made small (4 KiB, less than the 34 KB of CRDs)
/// so the command is still writing when the reader leaves.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, each then owned once below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: resizing a pipe this test owns.
    assert!(unsafe { libc::fcntl(fds[0], libc::F_SETPIPE_SZ, 4096) } >= 4096);
    let child = Command::new(env!("CARGO_BIN_EXE_cro"))
        .arg("crds")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(std::fs::File::from(read));
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(!first.is_empty());
    drop(reader); // what `head -1` does after its line
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}
