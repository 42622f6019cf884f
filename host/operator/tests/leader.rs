//! Leader election with a Lease on the real API server.

mod common;

use std::time::{Duration, Instant};

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_operator::config::LeaderElectionConfig;
use cro_operator::leader::{self, LeaderElector};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn config(identity: &str, lease: Duration) -> LeaderElectionConfig {
    let mut c = LeaderElectionConfig::new("default", identity);
    c.lease_name = "cro-test-leader".into();
    c.lease_duration = lease;
    c.renew_period = Duration::from_millis(200);
    c
}

async fn holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get("cro-test-leader")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_takeover_after_expiry_release_and_loss() {
    common::init_tracing();
    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let lease = Duration::from_secs(2);

    let mut a = LeaderElector::new(client.clone(), config("a", lease));
    let mut b = LeaderElector::new(client.clone(), config("b", lease));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&client).await.as_deref(), Some("a"));

    // a stops renewing: b takes over once it has seen the record unchanged for the
    // lease duration.
    let started = Instant::now();
    let b_leads = leader::acquire(client.clone(), config("b", lease), |_| {})
        .await
        .unwrap();
    assert!(
        started.elapsed() >= lease,
        "took over after {:?}",
        started.elapsed()
    );
    assert_eq!(holder(&client).await.as_deref(), Some("b"));
    let spec = Api::<Lease>::namespaced(client.clone(), "default")
        .get("cro-test-leader")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.lease_transitions, Some(1));
    // While b renews, a cannot take it even after the lease duration.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert!(!a.try_acquire_or_renew().await.unwrap());

    // Released: a takes over at once.
    b_leads.release().await;
    assert_eq!(holder(&client).await, None);
    assert!(a.try_acquire_or_renew().await.unwrap());

    // Another instance overwrites the Lease: the holder notices it lost.
    let mut c_leads = leader::acquire(client.clone(), config("c", lease), |_| {})
        .await
        .unwrap();
    assert!(!c_leads.is_lost());
    Api::<Lease>::namespaced(client.clone(), "default")
        .patch(
            "cro-test-leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder",
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now())}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(CONVERGE, c_leads.lost())
        .await
        .unwrap();
    assert!(c_leads.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_operator_reconciles_nothing_until_it_leads() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    let other = leader::acquire(
        env.client.clone(),
        config("other", Duration::from_secs(30)),
        |_| {},
    )
    .await
    .unwrap();
    env.config.leader_election = Some(config("operator", Duration::from_secs(30)));
    env.start_operator().await;

    env.create_request("waiting", gpu(1)).await;
    // The standby leaves it alone while the other instance leads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.request("waiting").await.unwrap().status, None);
    assert!(env.gpus_on(&m1).is_empty());

    other.release().await;
    env.wait_running("waiting", 1).await;
    assert_eq!(holder(&env.client).await.as_deref(), Some("operator"));
    eventually("one GPU attached", CONVERGE, || async {
        (env.gpus_on(&m1).len() == 1).then_some(())
    })
    .await;
    env.stop_operator().await.unwrap();
    // A graceful stop releases the Lease.
    assert_eq!(holder(&env.client).await, None);

    // Leading again, then another instance takes the Lease: the operator stops with an
    // error (so that its process restarts as a standby).
    env.start_operator().await;
    eventually("the operator leads again", CONVERGE, || async {
        (holder(&env.client).await.as_deref() == Some("operator")).then_some(())
    })
    .await;
    Api::<Lease>::namespaced(env.client.clone(), "default")
        .patch(
            "cro-test-leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder",
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now())}})),
        )
        .await
        .unwrap();
    let ended = env.operator_exit(CONVERGE).await;
    assert!(
        matches!(ended, Err(cro_operator::OperatorError::Leadership(_))),
        "{ended:?}"
    );
}
