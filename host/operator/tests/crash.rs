//! The operator is killed at seeded points of attach and detach (right after a provider
//! call or a node command took effect, before its result is used) and started again,
//! while the fabric loses replies after acting (dropped, or held past the call's
//! deadline). In the end the cluster and the simulator agree: no device leaked, none
//! held twice.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_operator::provider::{DeviceProvider, ProviderCounters, ProviderResult};
use cro_runtime::domain::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, RemoveOutcome,
};
use fabric_sim::{Fault, Route};
use futures::future::BoxFuture;
use kube::api::DeleteParams;
use tokio::sync::Notify;

/// Fires once its counter of effects reaches the armed value.
#[derive(Default)]
struct KillSwitch {
    count: AtomicUsize,
    at: AtomicUsize,
    fired: Notify,
    what: std::sync::Mutex<String>,
    /// Only effects whose description contains this count ("" counts all).
    only: std::sync::Mutex<String>,
}

impl KillSwitch {
    fn arm(&self, only: &str, at: usize) {
        *self.only.lock().unwrap() = only.to_owned();
        self.count.store(0, Ordering::SeqCst);
        self.at.store(at, Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.at.store(0, Ordering::SeqCst);
    }

    /// Counts one effect; true at the armed one, whose caller then never continues, so
    /// the operator dies with that effect done and its result not stored.
    fn effect(&self, what: &str) -> bool {
        if !what.contains(self.only.lock().unwrap().as_str()) {
            return false;
        }
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let fire = n == self.at.load(Ordering::SeqCst);
        if fire {
            *self.what.lock().unwrap() = what.to_owned();
            self.fired.notify_one();
        }
        fire
    }
}

/// The real provider, with the kill switch told after each call took effect.
struct Tripwire {
    inner: Arc<dyn DeviceProvider>,
    switch: Arc<KillSwitch>,
}

impl DeviceProvider for Tripwire {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        Box::pin(async move {
            let out = self.inner.add(request).await;
            if self.switch.effect("provider add_resource") {
                std::future::pending::<()>().await;
            }
            out
        })
    }

    fn remove<'a>(
        &'a self,
        r: &'a ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        Box::pin(async move {
            let out = self.inner.remove(r).await;
            if self.switch.effect("provider remove_resource") {
                std::future::pending::<()>().await;
            }
            out
        })
    }

    fn check<'a>(&'a self, r: &'a ComposableResource) -> BoxFuture<'a, ProviderResult<()>> {
        self.inner.check(r)
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        self.inner.list(claims)
    }

    fn pool<'a>(
        &'a self,
        query: &'a cro_runtime::PoolQuery,
    ) -> BoxFuture<'a, ProviderResult<cro_runtime::PoolOutcome>> {
        self.inner.pool(query)
    }

    fn counters(&self) -> Option<ProviderCounters> {
        self.inner.counters()
    }
}

/// Every device on the machine is held by exactly one resource, and every resource's
/// device is on the machine.
async fn assert_agree(env: &Env, machine: &str, request: &str) {
    let on_machine = env.gpus_on(machine);
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in env
        .resources()
        .list(&Default::default())
        .await
        .unwrap()
        .items
    {
        if let Some(id) = r.device_id() {
            holders
                .entry(id.to_owned())
                .or_default()
                .push(kube::ResourceExt::name_any(&r));
        }
    }
    for (id, names) in &holders {
        assert_eq!(names.len(), 1, "device {id} held by {names:?}");
        assert!(on_machine.contains(id), "{id} held but not attached");
    }
    for id in &on_machine {
        assert!(holders.contains_key(id), "{id} attached but held by nobody");
    }
    let held_by_request = env.resources_of(request).await.len();
    assert_eq!(on_machine.len(), held_by_request);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_seeded_points_the_operator_converges_without_leaks_or_doubles() {
    const SEED: u64 = 0x5eed_c0de_2026;
    const KILLS: usize = 20;
    const DEVICES: usize = 4;
    let mut env = Env::start().await;
    let machine = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    // A device attached by a call whose result was lost is released by the upstream sync.
    env.config.timings.orphan_grace = Duration::from_secs(2);
    let switch = Arc::new(KillSwitch::default());
    // A short call deadline, so that a reply held by the fabric outlives the call.
    env.provider = Arc::new(Tripwire {
        inner: common::fti::with_call_timeout(&env, "2s").await,
        switch: switch.clone(),
    });
    {
        let switch = switch.clone();
        env.nodes
            .set_hook(Some(Arc::new(move |command| switch.effect(command))));
    }

    // CRO_CRASH_SEED explores other kill points; the default keeps runs reproducible.
    let seed = std::env::var("CRO_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    eprintln!("crash test seed {seed}");
    let mut rng = common::Rng::new(seed);
    let sizes = [2i64, 0, 3, 1, 2, 0];
    env.create_request("chaos", gpu(sizes[0])).await;
    let mut kills = 0;
    let mut round = 0;
    while kills < KILLS {
        assert!(round < 200, "only {kills} kills in {round} rounds");
        let size = sizes[round % sizes.len()];
        env.set_request("chaos", &gpu(size)).await;
        // Kill at the n-th effect of a kind, or at the n-th effect of any kind (up to about
        // the number of effects one size change causes).
        let (only, at) = match round % 4 {
            0 => ("provider add_resource", 1 + rng.below(3) as usize),
            1 => ("provider remove_resource", 1 + rng.below(2) as usize),
            _ => ("", 1 + rng.below(12) as usize),
        };
        switch.arm(only, at);
        // Mixed in: the fabric acts and the reply is lost, on an attach or a detach.
        env.sim.clear_faults();
        let route = if rng.below(2) == 0 {
            Route::FmAttach
        } else {
            Route::FmDetach
        };
        match rng.below(3) {
            0 => {
                env.sim.inject(Fault::DropAfterProcessing.on(route));
            }
            1 => {
                env.sim
                    .inject(Fault::StallAfterProcessing(Duration::from_secs(3)).on(route));
            }
            _ => {}
        }
        env.start_operator().await;
        let converged = async {
            env.wait_running("chaos", size as usize).await;
        };
        tokio::select! {
            () = switch.fired.notified() => {
                env.kill_operator().await;
                kills += 1;
                let what = switch.what.lock().unwrap().clone();
                eprintln!("round {round}: size {size}, killed after effect {at}: {what} (kill {kills})");
            }
            () = converged => {
                env.stop_operator().await.unwrap();
            }
        }
        round += 1;
    }

    // Started once more without kills or faults, everything converges and agrees.
    switch.disarm();
    env.sim.clear_faults();
    env.start_operator().await;
    let final_size = sizes[(round - 1) % sizes.len()] as usize;
    env.wait_running("chaos", final_size).await;
    // Quiet: only the request's resources are left (orphans released, dropped ones gone),
    // all Online, and the fabric holds exactly their devices.
    eventually("the simulator and the cluster agree", CONVERGE, || async {
        let all = env.resources().list(&Default::default()).await.ok()?.items;
        let quiet = all.len() == final_size
            && all.iter().all(|r| {
                r.managed_by() == Some("chaos") && r.state() == cro_api::ResourceState::Online
            });
        (quiet
            && env.gpus_on(&machine).len() == final_size
            && env.sim.free_devices("gpu", MODEL) == DEVICES - final_size)
            .then_some(())
    })
    .await;
    assert_agree(&env, &machine, "chaos").await;

    env.requests()
        .delete("chaos", &DeleteParams::default())
        .await
        .unwrap();
    eventually("everything released", CONVERGE, || async {
        (env.request("chaos").await.is_none()
            && env
                .resources()
                .list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
            && env.sim.free_devices("gpu", MODEL) == DEVICES)
            .then_some(())
    })
    .await;
    assert!(env.gpus_on(&machine).is_empty());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}
