//! The Cluster Manager API: attach and detach answer "in progress" until the fabric
//! finishes; the operator retries without reporting an error. Nodes resolve to machines
//! through the OpenShift Machine / Metal3 BareMetalHost annotations.

mod common;

use std::sync::{Arc, Mutex};

use common::{CONVERGE, Env, FabricApi, MODEL, eventually, gpu};
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};

fn count(metrics: &str, line_prefix: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_answers_are_retried_without_errors() {
    let mut env = Env::start_with(kube_harness::Harness::builder(), FabricApi::Cm).await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);

    // Every error any resource ever shows.
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorder = {
        let errors = errors.clone();
        let stream = watcher(env.resources(), watcher::Config::default()).applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(r)) = stream.next().await {
                if let Some(e) = r
                    .status
                    .as_ref()
                    .map(|s| s.error.clone())
                    .filter(|e| !e.is_empty())
                {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("{}: {e}", r.name_any()));
                }
            }
        })
    };
    env.start_operator().await;

    env.create_request("cm", gpu(2)).await;
    env.wait_running("cm", 2).await;
    assert_eq!(env.gpus_on(&m1).len(), 2);
    let metrics = env.metrics.as_ref().unwrap().encode();
    assert!(
        count(
            &metrics,
            "cro_provider_calls_total{operation=\"add_resource\",outcome=\"in_progress\"} "
        ) >= 2,
        "{metrics}"
    );

    env.set_request("cm", &gpu(0)).await;
    env.wait_running("cm", 0).await;
    eventually("devices back in the pool", CONVERGE, || async {
        (env.sim.free_devices("gpu", MODEL) == 2).then_some(())
    })
    .await;
    let metrics = env.metrics.as_ref().unwrap().encode();
    assert!(
        count(
            &metrics,
            "cro_provider_calls_total{operation=\"remove_resource\",outcome=\"in_progress\"} "
        ) >= 2,
        "{metrics}"
    );
    recorder.abort();
    assert_eq!(*errors.lock().unwrap(), Vec::<String>::new());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}
