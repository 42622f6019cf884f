//! `cro before-uninstall`: what must happen before the operator's objects are deleted,
//! so that an uninstall loses nothing (docs/deploying.md, "Uninstalling").
//!
//! Devices attached through cro belong to requests; deleting the operator while they
//! exist leaves them attached on the fabric with finalizers nobody removes. So this step
//! either refuses, listing what is live (the default: a workload may be using those
//! GPUs), or, with `--detach`, deletes every request and device and waits while the
//! running operator detaches them. Then it scales the operator to zero and waits for its
//! pods, which release the leader Lease while their RBAC still exists (deleting
//! everything at once made the release fail and the next install wait out the Lease).
//! The chart runs it as a pre-delete hook; kustomize users run it by hand.

use std::io::Write;
use std::time::Duration;

use cro_api::{ComposabilityRequest, ComposableResource, LABEL_MANAGED_BY};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tokio::time::Instant;

use crate::status;

/// How often the waits look again.
const POLL: Duration = Duration::from_secs(1);
/// A progress line at least this often while waiting, so a hook's log shows it is alive.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct BeforeUninstallArgs {
    /// Delete every ComposabilityRequest and ComposableResource and wait until the
    /// operator has detached their devices. Without it, live requests or devices make
    /// the command refuse (exit 1), listing them.
    #[arg(long)]
    pub detach: bool,
    /// The operator's namespace (its Deployment and leader Lease).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "composable-resource-operator-system"
    )]
    pub namespace: String,
    /// The operator's Deployment: scaled to zero once nothing is live, and its pods
    /// waited for, so they release the leader Lease. Without it, only the requests are
    /// looked at.
    #[arg(long)]
    pub deployment: Option<String>,
    /// The leader election Lease (the operator's --leader-election-id).
    #[arg(long, env = "CRO_LEADER_ELECTION_ID", default_value = cro_operator::config::DEFAULT_LEASE_NAME)]
    pub lease: String,
    /// How long to wait in all (detaching, then the pods going). Keep it below helm's
    /// `--timeout` (5m by default) so this step, not helm, says what is stuck.
    #[arg(long, default_value = "4m", value_parser = parse_timeout)]
    pub timeout: Duration,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    cro_operator::config::parse_duration(text).map_err(|e| e.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("{0}")]
    Api(String),
    #[error("the Deployment {namespace}/{name} does not exist")]
    NoDeployment { namespace: String, name: String },
}

impl UninstallError {
    fn api(what: &str, e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) if s.code == 404 && what.starts_with("list") => {
                UninstallError::Api(status::CRDS_MISSING.to_owned())
            }
            _ => UninstallError::Api(format!("cannot {what}: {e}")),
        }
    }
}

/// How the step ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing live, the operator's pods gone: the objects may be deleted.
    Ready,
    /// Live requests or devices and no `--detach`: nothing was changed.
    Refused,
    /// The deadline passed with something still live or running: the uninstall must
    /// stop here (the operator keeps running, or is at zero replicas with nothing lost).
    TimedOut,
}

/// What is live: every request and device, whatever its state.
struct Live {
    requests: Vec<ComposabilityRequest>,
    resources: Vec<ComposableResource>,
}

impl Live {
    fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.resources.is_empty()
    }

    fn counts(&self) -> String {
        format!(
            "{} ComposabilityRequest(s) and {} ComposableResource(s)",
            self.requests.len(),
            self.resources.len()
        )
    }

    fn table(&self) -> String {
        status::render(&status::rows(&self.requests, &self.resources))
    }
}

/// Runs the step, writing what it does to `out` as it goes (the hook's log, which helm
/// prints when the hook fails).
pub async fn before_uninstall(
    client: kube::Client,
    args: &BeforeUninstallArgs,
    out: &mut dyn Write,
) -> Result<Outcome, UninstallError> {
    let deadline = Instant::now() + args.timeout;
    let live = live_work(&client).await?;
    if !live.is_empty() {
        if !args.detach {
            refuse(&live, out);
            return Ok(Outcome::Refused);
        }
        delete_all(&client, &live, out).await?;
        if !wait_until_detached(&client, deadline, out).await? {
            return Ok(Outcome::TimedOut);
        }
    }
    let _ = writeln!(out, "no ComposabilityRequest or ComposableResource left");
    if let Some(name) = &args.deployment {
        scale_to_zero(&client, &args.namespace, name, out).await?;
        if !wait_for_pods_gone(&client, &args.namespace, name, deadline, out).await? {
            return Ok(Outcome::TimedOut);
        }
        settle_lease(&client, &args.namespace, &args.lease, out).await?;
        delete_shard_leases(&client, &args.namespace, &args.lease, out).await?;
        // Only once no replica is left to publish them again.
        withdraw_slices(&client, out).await?;
    }
    Ok(Outcome::Ready)
}

/// Deletes the ResourceSlices cro published for the fabric's free pool: left behind, the
/// scheduler would go on allocating devices nobody attaches, and each Pod would wait
/// out the binding timeout. Without the DRA API, or without the right to list them (the
/// chart grants it with `pool.devices`), there is nothing of cro's to delete.
async fn withdraw_slices(client: &kube::Client, out: &mut dyn Write) -> Result<(), UninstallError> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let api = Api::<ResourceSlice>::all(client.clone());
    let selector = format!("{LABEL_MANAGED_BY}=cro");
    let slices = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => return Ok(()),
        Err(e) => {
            return Err(UninstallError::Api(format!(
                "cannot list cro's ResourceSlices: {e}"
            )));
        }
    };
    for slice in &slices {
        delete_if_present(&api, &slice.name_any()).await?;
    }
    if !slices.is_empty() {
        let _ = writeln!(
            out,
            "deleted cro's {} ResourceSlices of the free pool",
            slices.len()
        );
    }
    Ok(())
}

async fn live_work(client: &kube::Client) -> Result<Live, UninstallError> {
    let params = ListParams::default();
    let requests = Api::<ComposabilityRequest>::all(client.clone())
        .list(&params)
        .await
        .map_err(|e| UninstallError::api("list ComposabilityRequests", e))?
        .items;
    let resources = Api::<ComposableResource>::all(client.clone())
        .list(&params)
        .await
        .map_err(|e| UninstallError::api("list ComposableResources", e))?
        .items;
    Ok(Live {
        requests,
        resources,
    })
}

fn refuse(live: &Live, out: &mut dyn Write) {
    let _ = write!(
        out,
        "cro: refusing to uninstall: {} exist, and their devices stay attached on the \
         fabric until the operator detaches them:\n{}\
         Delete them first (`kubectl delete composabilityrequests --all`: the operator, \
         still running, detaches each device and removes its finalizer), then uninstall \
         again. To have the uninstall do that itself, set uninstall.liveRequests=detach \
         in the chart's values (kustomize: `cro before-uninstall --detach`).\n",
        live.counts(),
        live.table()
    );
}

/// Deletes every request, then every device no request owns (a request's devices go
/// with it, through the request controller's own drain).
async fn delete_all(
    client: &kube::Client,
    live: &Live,
    out: &mut dyn Write,
) -> Result<(), UninstallError> {
    let _ = writeln!(
        out,
        "detaching: deleting {}; the operator detaches each device",
        live.counts()
    );
    let requests = Api::<ComposabilityRequest>::all(client.clone());
    for r in &live.requests {
        delete_if_present(&requests, &r.name_any()).await?;
    }
    let names: Vec<String> = live.requests.iter().map(|r| r.name_any()).collect();
    let resources = Api::<ComposableResource>::all(client.clone());
    for r in &live.resources {
        let owned = r
            .labels()
            .get(LABEL_MANAGED_BY)
            .is_some_and(|owner| names.contains(owner));
        if !owned {
            delete_if_present(&resources, &r.name_any()).await?;
        }
    }
    Ok(())
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), UninstallError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(UninstallError::api(&format!("delete {name}"), e)),
    }
}

/// Waits until no request or device is left. False when the deadline passed (what is
/// left, with its errors, is written out).
async fn wait_until_detached(
    client: &kube::Client,
    deadline: Instant,
    out: &mut dyn Write,
) -> Result<bool, UninstallError> {
    let mut said = Instant::now();
    let mut last = String::new();
    loop {
        let live = live_work(client).await?;
        if live.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            let _ = write!(
                out,
                "cro: {} still exist at the deadline; the uninstall stops here so that \
                 the operator can finish (`cro status` shows why each is waiting):\n{}",
                live.counts(),
                live.table()
            );
            return Ok(false);
        }
        let now = live.counts();
        if now != last || said.elapsed() >= PROGRESS_EVERY {
            let _ = writeln!(out, "waiting: {now} left");
            said = Instant::now();
            last = now;
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn scale_to_zero(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    out: &mut dyn Write,
) -> Result<(), UninstallError> {
    let api = Api::<Deployment>::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"spec": {"replicas": 0}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            let _ = writeln!(out, "scaled {namespace}/{name} to 0 replicas");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Err(UninstallError::NoDeployment {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        Err(e) => Err(UninstallError::api(&format!("scale {name}"), e)),
    }
}

/// The Deployment's pods: those its selector matches.
async fn deployment_pods(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, UninstallError> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| UninstallError::api(&format!("read {name}"), e))?;
    let labels = deployment.spec.selector.match_labels.unwrap_or_default();
    if labels.is_empty() {
        // A Deployment always has a selector; without matchLabels there is nothing this
        // step can match safely, and listing every pod would wait on strangers.
        return Err(UninstallError::Api(format!(
            "the Deployment {namespace}/{name} has no matchLabels selector"
        )));
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| UninstallError::api("list the operator's pods", e))?;
    Ok(pods.items.iter().map(|p| p.name_any()).collect())
}

async fn wait_for_pods_gone(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    deadline: Instant,
    out: &mut dyn Write,
) -> Result<bool, UninstallError> {
    loop {
        let pods = deployment_pods(client, namespace, name).await?;
        if pods.is_empty() {
            let _ = writeln!(out, "the operator's pods are gone");
            return Ok(true);
        }
        if Instant::now() >= deadline {
            let _ = writeln!(
                out,
                "cro: the operator's pods are still there at the deadline: {}",
                pods.join(", ")
            );
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// With no replica left, a Lease still naming a holder is one whose pod was killed
/// before it could release it: it is deleted, so the next install leads at once.
async fn settle_lease(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    out: &mut dyn Write,
) -> Result<(), UninstallError> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let lease = api
        .get_opt(name)
        .await
        .map_err(|e| UninstallError::api(&format!("read the Lease {name}"), e))?;
    let holder = lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty());
    match holder {
        None => {
            let _ = writeln!(out, "the leader Lease {name} is released");
        }
        Some(holder) => {
            delete_if_present(&api, name).await?;
            let _ = writeln!(
                out,
                "the leader Lease {name} still named {holder}, whose pod is gone: deleted"
            );
        }
    }
    Ok(())
}

/// The Leases the replicas shared the providers with (one per provider and per
/// replica): with no replica left they only hold up the next install's replicas, which
/// would wait for a killed holder's to expire.
async fn delete_shard_leases(
    client: &kube::Client,
    namespace: &str,
    leader: &str,
    out: &mut dyn Write,
) -> Result<(), UninstallError> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={}",
        cro_api::LABEL_LEASES_OF,
        cro_operator::leases_of(leader)
    );
    let leases = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| UninstallError::api("list the replicas' Leases", e))?;
    for lease in &leases.items {
        delete_if_present(&api, &lease.name_any()).await?;
    }
    if !leases.items.is_empty() {
        let _ = writeln!(
            out,
            "{} Leases of the replicas' providers deleted",
            leases.items.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_each_live_request_and_both_ways_on() {
        let request: ComposabilityRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
            "kind": "ComposabilityRequest",
            "metadata": {"name": "gpus-for-training"},
            "spec": {"resource": {"type": "gpu", "model": "A100 40G", "size": 2}},
        }))
        .unwrap();
        let live = Live {
            requests: vec![request],
            resources: vec![],
        };
        let mut bytes = Vec::new();
        refuse(&live, &mut bytes);
        let out = String::from_utf8(bytes).unwrap();
        assert!(out.starts_with("cro: refusing to uninstall: 1 ComposabilityRequest(s)"));
        assert!(out.contains("gpus-for-training"), "{out}");
        assert!(
            out.contains("kubectl delete composabilityrequests"),
            "{out}"
        );
        assert!(out.contains("uninstall.liveRequests=detach"), "{out}");
        assert!(out.contains("then uninstall again"), "{out}");
    }

    #[test]
    fn the_timeout_needs_a_unit() {
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_timeout("90").is_err());
    }
}
