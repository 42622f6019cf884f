//! The harness against real etcd and kube-apiserver processes: it serves, several run at
//! once, and nothing survives it (drop, panic, killed test process).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube_harness::real_node::{Leftovers, NODE_NAME, RealNode, STANDIN_IMAGE, node_ready};
use kube_harness::{Harness, pid_alive, sweep_stale_dirs};
use serde_json::json;

/// Set in the environment of the child test processes this file starts.
const CHILD_ENV: &str = "KUBE_HARNESS_TEST_CHILD";

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_cleaned_up(pids: &[u32], dir: &Path) {
    assert_eq!(pids.len(), 2, "expected the apiserver and etcd pids");
    for &pid in pids {
        assert!(!pid_alive(pid), "process {pid} survived the harness");
    }
    assert!(!dir.exists(), "{} survived the harness", dir.display());
}

fn named_configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_owned());
    cm
}

/// A restarted API server is a new process on the same port, with every object kept
/// (etcd's), and a client made before it keeps working; the old process is gone, and
/// dropping the harness still ends both.
#[tokio::test]
async fn a_restarted_api_server_keeps_objects_port_and_clients() {
    let harness = Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &named_configmap("before"))
        .await
        .unwrap();
    let (url, old) = (harness.server_url(), harness.pids()[0]);

    let gone = harness
        .restart_apiserver(Duration::from_secs(60))
        .await
        .unwrap();
    eprintln!("the API server was gone for {gone:?}");
    let new = harness.pids()[0];
    assert_ne!(new, old);
    assert!(!pid_alive(old), "the old API server survived its restart");
    assert_eq!(harness.server_url(), url);
    assert!(cms.get_opt("before").await.unwrap().is_some());
    cms.create(&PostParams::default(), &named_configmap("after"))
        .await
        .unwrap();

    let (pids, dir) = (harness.pids(), harness.dir().unwrap().to_path_buf());
    drop(harness);
    assert_cleaned_up(&pids, &dir);
}

#[tokio::test]
async fn two_harnesses_serve_separately_and_drop_cleans_up() {
    let (a, b) = tokio::join!(Harness::start(), Harness::start());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.server_url(), b.server_url());
    eprintln!(
        "startup timings: {:?} / {:?}",
        a.startup_timings(),
        b.startup_timings()
    );

    let client = a.client().unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        version.git_version,
        kube_harness::binaries::DEFAULT_K8S_VERSION
    );

    // The repository's CRDs are installed and established.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let names: Vec<_> = crds
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(
        names.contains(&"composabilityrequests.cro.hpsys.ibm.ie.com".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"composableresources.cro.hpsys.ibm.ie.com".to_owned()),
        "{names:?}"
    );

    // Separate etcds: what one server stores, the other does not see.
    let ns: Api<Namespace> = Api::all(client.clone());
    let mut only_in_a = Namespace::default();
    only_in_a.metadata.name = Some("only-in-a".into());
    ns.create(&PostParams::default(), &only_in_a).await.unwrap();
    let ns_b: Api<Namespace> = Api::all(b.client().unwrap());
    assert!(ns_b.get_opt("only-in-a").await.unwrap().is_none());
    assert!(ns.get_opt("only-in-a").await.unwrap().is_some());

    // Another process would connect through the kubeconfig file.
    let kubeconfig = kube::config::Kubeconfig::read_from(a.kubeconfig_path().unwrap()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let from_file: Api<Namespace> = Api::all(kube::Client::try_from(config).unwrap());
    assert!(from_file.get_opt("only-in-a").await.unwrap().is_some());
    assert!(a.token().is_some_and(|t| !t.is_empty()));
    assert!(a.ca_pem().is_some_and(|c| c.contains("BEGIN CERTIFICATE")));
    assert!(!a.is_existing_cluster());

    let (pids_a, dir_a) = (a.pids(), a.dir().unwrap().to_owned());
    let (pids_b, dir_b) = (b.pids(), b.dir().unwrap().to_owned());
    assert!(dir_a.join("kube-apiserver.log").exists() && dir_a.join("etcd.log").exists());
    for pid in pids_a.iter().chain(&pids_b) {
        assert!(pid_alive(*pid));
    }
    drop(a);
    assert_cleaned_up(&pids_a, &dir_a);
    assert!(
        pids_b.iter().all(|&p| pid_alive(p)),
        "dropping one harness hit the other"
    );
    drop(b);
    assert_cleaned_up(&pids_b, &dir_b);
}

#[tokio::test]
async fn a_panic_in_the_test_body_still_cleans_up() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let body = tokio::spawn(async move {
        let harness = Harness::builder()
            .without_default_crds()
            .start()
            .await
            .unwrap();
        tx.send((harness.pids(), harness.dir().unwrap().to_owned()))
            .unwrap();
        panic!("deliberate panic while holding the harness");
    });
    let outcome = body.await;
    assert!(outcome.is_err_and(|e| e.is_panic()));
    let (pids, dir) = rx.await.unwrap();
    assert_cleaned_up(&pids, &dir);
}

/// Runs one test of this binary in a child process and returns it with stdout piped.
fn child_test(name: &str, envs: &[(&str, &str)]) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's `HARNESS <pid> <pid> <dir>` line; kills the child if there is none.
fn read_harness_line(child: &mut std::process::Child) -> (Vec<u32>, PathBuf) {
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    for line in lines.by_ref() {
        eprintln!("child: {line}");
        // libtest prints "test <name> ... " before the test's own output on the same line.
        if let Some((_, rest)) = line.split_once("HARNESS ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            let pids = parts[..2].iter().map(|p| p.parse().unwrap()).collect();
            // Keep reading: a closed pipe would make the child's later output fail it.
            std::thread::spawn(move || lines.for_each(|line| eprintln!("child: {line}")));
            return (pids, PathBuf::from(parts[2]));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the child test printed no HARNESS line");
}

async fn announce_harness() -> Harness {
    let harness = Harness::builder()
        .without_default_crds()
        .start()
        .await
        .unwrap();
    let pids = harness.pids();
    println!(
        "HARNESS {} {} {}",
        pids[0],
        pids[1],
        harness.dir().unwrap().display()
    );
    harness
}

#[tokio::test]
#[ignore = "child process of a_killed_test_process_leaves_nothing_running"]
async fn child_holds_a_harness_until_killed() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let _harness = announce_harness().await;
    // Wait for the parent's SIGKILL.
    std::future::pending::<()>().await;
}

#[test]
fn a_killed_test_process_leaves_nothing_running() {
    let mut child = child_test("child_holds_a_harness_until_killed", &[]);
    let (pids, dir) = read_harness_line(&mut child);
    assert!(pids.iter().all(|&p| pid_alive(p)));
    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    child.wait().unwrap();
    for &pid in &pids {
        wait_until(
            &format!("process {pid} is gone"),
            Duration::from_secs(10),
            || !pid_alive(pid),
        );
    }
    // Nobody could remove the directory of a killed process; the next harness sweeps it
    // (a harness starting concurrently in another test may already have done so).
    sweep_stale_dirs();
    assert_cleaned_up(&pids, &dir);
}

#[tokio::test]
#[ignore = "child process of a_failing_child_test_cleans_up"]
async fn child_panics_while_holding_a_harness() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let _harness = announce_harness().await;
    panic!("deliberate failure of the child test");
}

#[test]
fn a_failing_child_test_cleans_up() {
    let mut child = child_test("child_panics_while_holding_a_harness", &[]);
    let (pids, dir) = read_harness_line(&mut child);
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child test was meant to fail");
    assert_cleaned_up(&pids, &dir);
}

#[tokio::test]
#[ignore = "child process of an_existing_cluster_is_used_from_kubeconfig"]
async fn child_uses_the_existing_cluster() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let harness = Harness::start().await.unwrap();
    assert!(harness.is_existing_cluster());
    assert!(harness.pids().is_empty() && harness.dir().is_none() && harness.token().is_none());
    let cms: Api<ConfigMap> = Api::namespaced(harness.client().unwrap(), "default");
    cms.create(&PostParams::default(), &named_configmap("made-by-child"))
        .await
        .unwrap();
    println!(
        "HARNESS 0 0 {}",
        harness.kubeconfig_path().unwrap().display()
    );
}

#[tokio::test]
async fn an_existing_cluster_is_used_from_kubeconfig() {
    let local = Harness::builder()
        .without_default_crds()
        .start()
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(local.client().unwrap());
    assert!(
        crds.get_opt("composabilityrequests.cro.hpsys.ibm.ie.com")
            .await
            .unwrap()
            .is_none()
    );

    let kubeconfig = local
        .kubeconfig_path()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let mut child = child_test(
        "child_uses_the_existing_cluster",
        &[
            ("KUBECONFIG", &kubeconfig),
            ("CRO_TEST_USE_EXISTING_CLUSTER", "1"),
        ],
    );
    let (_, reported) = read_harness_line(&mut child);
    assert!(child.wait().unwrap().success());
    assert_eq!(reported, Path::new(&kubeconfig));

    // The child worked on our cluster: its object and the CRDs it installed are here.
    let cms: Api<ConfigMap> = Api::namespaced(local.client().unwrap(), "default");
    assert!(cms.get_opt("made-by-child").await.unwrap().is_some());
    assert!(
        crds.get_opt("composabilityrequests.cro.hpsys.ibm.ie.com")
            .await
            .unwrap()
            .is_some()
    );
    // Dropping the child's harness stopped nothing of ours.
    assert!(local.pids().iter().all(|&p| pid_alive(p)));
}

#[tokio::test]
#[ignore = "child process of the_shared_harness_is_removed_at_exit"]
async fn child_uses_the_shared_harness() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let shared = kube_harness::shared().await.unwrap();
    let again = kube_harness::shared().await.unwrap();
    assert!(std::ptr::eq(shared, again));
    let ns: Api<Namespace> = Api::all(shared.client().unwrap());
    assert!(ns.get_opt("default").await.unwrap().is_some());
    let pids = shared.pids();
    println!(
        "HARNESS {} {} {}",
        pids[0],
        pids[1],
        shared.dir().unwrap().display()
    );
}

#[test]
fn the_shared_harness_is_removed_at_exit() {
    let mut child = child_test("child_uses_the_shared_harness", &[]);
    let (pids, dir) = read_harness_line(&mut child);
    assert!(child.wait().unwrap().success());
    // The exit handler killed and reaped the processes before the child exited.
    assert_cleaned_up(&pids, &dir);
}

/// Teardown leaves the host as it was: no process, mount, cgroup, socket or changed
/// sysctl of the node, after a pod ran on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_teardown_leaves_nothing_behind() {
    let node = RealNode::start().await.expect("the real node");
    let before = node.host_before();
    let client = node.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(node_ready(&nodes.get(NODE_NAME).await.unwrap()));
    node.wait_default_service_account("default").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": "default"},
        "spec": {"hostNetwork": true, "containers": [{"name": "s", "image": STANDIN_IMAGE,
            "imagePullPolicy": "Never", "command": ["/node-standin", "pause"]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pods.get("sleeper").await.unwrap();
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            break;
        }
        assert!(Instant::now() < deadline, "the pod did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let root = node.dir().to_path_buf();
    let pids = node.pids();
    // The check sees a running node (so an empty answer after teardown means something).
    let during = Leftovers::check(&root, &pids, &before);
    assert!(
        during.0.iter().any(|l| l.starts_with("cgroup "))
            && during.0.iter().any(|l| l.starts_with("process "))
            && during.0.iter().any(|l| l.starts_with("mount ")),
        "a running node shows no processes, cgroups or mounts: {during}"
    );
    eprintln!("real node started in {:?}", node.timings);
    let t = std::time::Instant::now();
    let left = node.teardown().await;
    eprintln!("real node torn down in {:?}", t.elapsed());
    assert!(left.is_empty(), "teardown left: {left}");
    let again = Leftovers::check(&root, &pids, &before);
    assert!(again.is_empty(), "after teardown: {again}");
}
