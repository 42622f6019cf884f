//! The operator's resident memory: each stage runs in a fresh child process (this binary,
//! `memory-stage <stage>`) against the API server and fabric simulator the parent runs,
//! so simulators and harness do not count.
//!
//! Stages: `baseline` (tokio and a kube client, no operator), `operator-fti` (the operator
//! running idle with the FTI component loaded), `operator-3` (the same with two more
//! providers loaded: the testkit and a second FTI instance), `calls-16` (the FTI
//! component with 16 calls in flight, for the memory one concurrent call holds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cro_operator::config::{OperatorConfig, ProviderSource};
use cro_operator::nodeops::KubeExecRunner;
use cro_operator::{Operator, compat};
use cro_runtime::cluster::KubeCluster;
use cro_runtime::{ProviderSpec, Runtime, RuntimeOptions};
use fabric_sim::{Fault, Injection};
use serde_json::{Value, json};

use crate::common::{Env, OPERATOR_NS};
use crate::cro_process::go_environment;
use crate::rss::{breakdown, rss};

const STAGES: [&str; 4] = ["baseline", "operator-fti", "operator-3", "calls-16"];
/// Fabric latency while measuring calls in flight: long enough to catch all 16 at once.
const CALL_LATENCY: Duration = Duration::from_millis(400);
const IDLE: Duration = Duration::from_secs(3);

pub fn main() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(parent())?;
    println!("{result}");
    Ok(())
}

async fn parent() -> Result<Value> {
    let env = Env::start().await;
    env.sim.add_free_devices("gpu", crate::common::MODEL, 4);
    env.sim
        .inject(Injection::from(Fault::Latency(CALL_LATENCY)).always());
    let kubeconfig = env
        .harness
        .kubeconfig_path()
        .context("the harness wrote no kubeconfig")?
        .to_owned();
    let ca = tempfile::NamedTempFile::new()?;
    std::fs::write(ca.path(), env.sim.ca_pem())?;
    let component = cro_test_support::component("fti-provider");
    let testkit = cro_test_support::component("cro-testkit");
    let me = std::env::current_exe()?;
    let mut out = BTreeMap::new();
    for stage in STAGES {
        let child = tokio::process::Command::new(&me)
            .args(["memory-stage", stage])
            .env("KUBECONFIG", &kubeconfig)
            .envs(go_environment(&env.sim, ca.path(), &component))
            .env("CRO_BENCH_TESTKIT", &testkit)
            .output()
            .await?;
        if !child.status.success() {
            bail!(
                "memory stage {stage} failed: {}",
                String::from_utf8_lossy(&child.stderr)
            );
        }
        let line = String::from_utf8_lossy(&child.stdout);
        let v: Value = serde_json::from_str(line.trim())
            .with_context(|| format!("stage {stage} printed {line}"))?;
        out.insert(stage.to_owned(), v);
    }
    Ok(json!({"kind": "memory", "stages": out, "call_latency_ms": CALL_LATENCY.as_millis() as u64}))
}

pub fn stage(stage: &str) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let v = rt.block_on(run_stage(stage))?;
    println!("{v}");
    Ok(())
}

fn fti_spec(name: &str) -> Result<ProviderSpec> {
    let mut spec = compat::fti_spec_from_env(|k| std::env::var(k).ok())?
        .context("no FTI provider in the environment")?;
    spec.name = name.to_owned();
    Ok(spec)
}

async fn run_stage(stage: &str) -> Result<Value> {
    kube_harness::install_crypto_provider();
    let client = kube::Client::try_default().await?;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    nodes.list(&Default::default()).await?;
    if stage == "baseline" {
        tokio::time::sleep(IDLE).await;
        let (rss, hwm) = rss();
        return Ok(json!({"rss": rss, "hwm": hwm, "parts": breakdown()}));
    }
    let runtime = Runtime::new(RuntimeOptions::default())?;
    let cluster = Arc::new(KubeCluster::new(client.clone()));
    let fti = runtime.load(&fti_spec("fti")?, cluster.clone()).await?;
    if stage == "calls-16" {
        // One call first: the token is cached, the connection pool warm.
        fti.list(&[]).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (before, _) = rss();
        let calls: Vec<_> = (0..16).map(|_| fti.list(&[])).collect();
        let sampler = async {
            tokio::time::sleep(CALL_LATENCY / 2).await;
            rss().0
        };
        let (results, during) = futures::join!(futures::future::join_all(calls), sampler);
        for r in results {
            r?;
        }
        // What stays after the calls: the pool keeps the pages a call dirtied resident
        // in its slot (reset in place for the next call; see host/runtime/src/engine.rs).
        let (after, hwm) = rss();
        return Ok(
            json!({"rss_before": before, "rss_during": during, "rss_after": after, "hwm": hwm,
            "per_call": during.saturating_sub(before) / 16, "parts_after": breakdown()}),
        );
    }
    let mut extra = Vec::new();
    if stage == "operator-3" {
        let mut testkit = ProviderSpec::new(
            "testkit",
            std::env::var("CRO_BENCH_TESTKIT").context("CRO_BENCH_TESTKIT")?,
        );
        testkit.config.insert("mode".into(), "fake".into());
        extra.push(runtime.load(&testkit, cluster.clone()).await?);
        extra.push(runtime.load(&fti_spec("fti-b")?, cluster.clone()).await?);
    }
    let mut config = OperatorConfig::new(ProviderSource::GoEnvironment);
    config.namespace = OPERATOR_NS.to_owned();
    let operator = Operator::new(
        client.clone(),
        Arc::new(fti),
        Arc::new(KubeExecRunner::new(client)),
        config,
    );
    // Sampled while the operator runs idle, half a second before it is told to stop.
    let sampler = async {
        tokio::time::sleep(IDLE - Duration::from_millis(500)).await;
        (rss(), breakdown())
    };
    let (ran, ((rss, hwm), parts)) =
        futures::join!(operator.run_until(tokio::time::sleep(IDLE)), sampler);
    ran?;
    drop(extra);
    Ok(json!({"rss": rss, "hwm": hwm, "parts": parts}))
}
