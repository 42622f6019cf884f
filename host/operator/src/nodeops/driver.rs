//! Which NVIDIA driver setup a node has, and how commands reach it
//! (docs/node-operations.md, "Which driver a node has").

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::{CommandRunner, NodeOpsError, PodRef};

pub(crate) const DRIVER_POD_LABEL: &str = "app.kubernetes.io/component=nvidia-driver";
/// The node agent for host drivers: a DaemonSet of this name in the operator's
/// namespace, whose pods carry [`AGENT_POD_LABEL`] and names starting with its name.
pub(crate) const AGENT_DAEMONSET: &str = "cro-node-agent";
pub(crate) const AGENT_POD_LABEL: &str = "app=cro-node-agent";
/// The host's driver root as the container driver mounts it.
const CONTAINER_DRIVER_ROOT: &str = "/run/nvidia/driver";
/// The host's root as the node agent mounts it.
pub(crate) const AGENT_HOST_ROOT: &str = "/host-root";
/// Where a chroot binary may live in a driver image; the first one present is used. The
/// Go operator's trusted paths: only absolute paths are tried, because a chroot found
/// through the container's PATH could be any binary the image put first on it, and it
/// would run as root with the host's driver root.
const CHROOT_CANDIDATES: &str = "/usr/sbin/chroot /usr/bin/chroot /sbin/chroot /bin/chroot \
/usr/local/sbin/chroot /usr/local/bin/chroot";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DriverSetup {
    /// The GPU operator's driver container.
    Container,
    /// A driver installed on the host, reached through the node agent.
    Host,
}

/// A node's driver and the pod commands run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Driver {
    pub(crate) setup: DriverSetup,
    pub(crate) pod: PodRef,
}

/// What [`discover`] found on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Discovery {
    /// A driver commands can run in now.
    Ready(Driver),
    /// The GPU operator manages the driver, but its pod on this node does not exist yet
    /// (`pod` None: the GPU operator schedules it only once the node has a GPU) or is
    /// not Ready yet. A fabric attach need not wait for it; node commands must.
    ContainerPending { pod: Option<String> },
}

impl Discovery {
    /// The driver, or the "still installing" error for a pending one.
    #[cfg(test)]
    pub(crate) fn ready(self, node: &str) -> Result<Driver, NodeOpsError> {
        match self {
            Discovery::Ready(d) => Ok(d),
            Discovery::ContainerPending { pod } => Err(NodeOpsError::DriverInstalling {
                node: node.to_owned(),
                pod: pod.unwrap_or_else(|| "(not scheduled yet)".into()),
            }),
        }
    }
}

impl Driver {
    /// `nvidia-smi <args>` where the driver's tools are.
    pub(crate) fn smi(&self, args: &[&str]) -> Vec<String> {
        self.tool("nvidia-smi", args)
    }

    /// `<program> <args>` run with the host's view: in the host root for a host driver,
    /// in the driver root of the driver container otherwise. Only plain words (no shell
    /// quoting is applied for the container's wrapper).
    pub(crate) fn host_cmd(&self, program: &str, args: &[&str]) -> Vec<String> {
        match self.setup {
            DriverSetup::Host => self.tool(program, args),
            DriverSetup::Container => {
                let mut script = program.to_owned();
                for a in args {
                    script.push(' ');
                    script.push_str(a);
                }
                self.host_sh(&script)
            }
        }
    }

    fn tool(&self, program: &str, args: &[&str]) -> Vec<String> {
        let mut cmd = match self.setup {
            DriverSetup::Container => vec![],
            DriverSetup::Host => vec!["chroot".into(), AGENT_HOST_ROOT.into()],
        };
        cmd.push(program.into());
        cmd.extend(args.iter().map(|a| a.to_string()));
        cmd
    }

    /// A shell script run with the host's view of devices, processes and sysfs.
    pub(crate) fn host_sh(&self, script: &str) -> Vec<String> {
        match self.setup {
            DriverSetup::Host => vec![
                "chroot".into(),
                AGENT_HOST_ROOT.into(),
                "sh".into(),
                "-c".into(),
                script.into(),
            ],
            DriverSetup::Container => {
                let wrapper = format!(
                    "for c in {CHROOT_CANDIDATES}; do if [ -x \"$c\" ]; then exec \"$c\" {CONTAINER_DRIVER_ROOT} sh -c \"$1\"; fi; done; echo 'no chroot in the trusted paths {CHROOT_CANDIDATES}, a chroot found only on PATH is not used' >&2; exit 127"
                );
                vec![
                    "sh".into(),
                    "-c".into(),
                    wrapper,
                    "sh".into(),
                    script.into(),
                ]
            }
        }
    }

    /// A shell script run in the pod itself (the driver container's own processes).
    pub(crate) fn pod_sh(&self, script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }
}

/// A node's driver pods as a watch cache shows them, for [`discover`].
pub(crate) enum CachedPods {
    /// The cache has not listed them: they are read from the API server.
    Missing,
    /// A Ready pod here is taken as is; anything else is read again from the API server
    /// (the cache may lag behind the change that woke the caller, and a detach that
    /// missed a pod there would skip the drain).
    ReadyOnly(Vec<Pod>),
    /// Taken as they are: the cache holds every driver pod change that woke a
    /// controller (`Caches::driver_pods_current`), and the caller, an attach, waits and
    /// looks again when it finds no Ready pod. Reading them again at every look was 3
    /// LISTs of pods per device at N = 100 (docs/BENCHMARKS.md).
    Current(Vec<Pod>),
}

impl CachedPods {
    /// [`CachedPods::ReadyOnly`] of what a cache has, or [`CachedPods::Missing`].
    pub(crate) fn ready_only(pods: Option<Vec<Pod>>) -> CachedPods {
        pods.map_or(CachedPods::Missing, CachedPods::ReadyOnly)
    }

    /// [`CachedPods::Current`] of what a current cache has, or [`CachedPods::Missing`].
    pub(crate) fn current(pods: Option<Vec<Pod>>) -> CachedPods {
        pods.map_or(CachedPods::Missing, CachedPods::Current)
    }
}

fn pod_ref(pod: &Pod, node: &str) -> Option<PodRef> {
    Some(PodRef {
        namespace: pod.metadata.namespace.clone()?,
        name: pod.metadata.name.clone()?,
        node: node.to_owned(),
        container: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone()),
    })
}

pub fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn pods_on_node(api: &Api<Pod>, label: &str, node: &str) -> Result<Vec<Pod>, NodeOpsError> {
    let params = ListParams::default()
        .labels(label)
        .fields(&format!("spec.nodeName={node}"));
    Ok(api.list(&params).await?.items)
}

/// How long an answer of the ClusterPolicy is taken as it is: an administrator's change of
/// the driver setting (or the GPU operator's installation) reaches attaches within it.
const CLUSTER_POLICY_KEPT_FOR: Duration = Duration::from_secs(10);

/// The last answer of the ClusterPolicy's driver flag and when it was read. Every look of
/// an attach waiting for its node's first driver pod listed the ClusterPolicies again:
/// 1.5 LISTs per device at N = 100 (docs/BENCHMARKS.md).
#[derive(Default)]
pub(crate) struct ClusterPolicyMemo(Mutex<Option<(Instant, Option<bool>)>>);

impl ClusterPolicyMemo {
    fn fresh(&self) -> Option<Option<bool>> {
        let last = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        last.filter(|(at, _)| at.elapsed() < CLUSTER_POLICY_KEPT_FOR)
            .map(|(_, answer)| answer)
    }

    fn keep(&self, answer: Option<bool>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), answer));
    }
}

/// `None`: no ClusterPolicy API or object; `Some(enabled)`: the driver flag of the first
/// (unset counts as enabled, as in the GPU operator). From `memo` when it is fresh.
async fn cluster_policy_driver(
    client: &kube::Client,
    memo: &ClusterPolicyMemo,
) -> Result<Option<bool>, NodeOpsError> {
    if let Some(answer) = memo.fresh() {
        return Ok(answer);
    }
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"),
    );
    let answer = match api.list(&ListParams::default()).await {
        Ok(list) => list.items.first().map(|p| {
            p.data
                .pointer("/spec/driver/enabled")
                .and_then(|v| v.as_bool())
                .unwrap_or(true)
        }),
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => return Err(e.into()),
    };
    memo.keep(answer);
    Ok(answer)
}

/// The node agent pod on `node`. Its DaemonSet is read only when no such pod is found,
/// to tell a missing DaemonSet from a pod not Ready yet: reading it first cost a GET per
/// node command of every attach and detach (docs/BENCHMARKS.md).
async fn agent_pod(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> Result<PodRef, NodeOpsError> {
    let agents: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let found = pods_on_node(&agents, AGENT_POD_LABEL, node)
        .await?
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(AGENT_DAEMONSET))
                && running_and_ready(p)
        })
        .find_map(|p| pod_ref(p, node));
    if let Some(pod) = found {
        return Ok(pod);
    }
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    if sets.get_opt(AGENT_DAEMONSET).await?.is_none() {
        return Err(NodeOpsError::NoAgentDaemonSet {
            namespace: namespace.to_owned(),
            name: AGENT_DAEMONSET.to_owned(),
        });
    }
    Err(NodeOpsError::NoAgent {
        node: node.to_owned(),
        agent: format!("{namespace}/{AGENT_DAEMONSET}"),
    })
}

/// Finds the node's driver (docs/node-operations.md, "Which driver a node has"):
/// a driver pod of the GPU operator on the node; else a ClusterPolicy that enables the
/// driver (its pod comes once the node has a GPU); else, with the driver disabled, a
/// host driver that `modinfo nvidia` finds through the node agent. `agent_namespace` is
/// the operator's namespace, where the node agent's DaemonSet lives. `cached`: the
/// node's driver pods from a watch cache, and how far they are taken as they are.
pub(crate) async fn discover(
    client: &kube::Client,
    runner: &dyn CommandRunner,
    node: &str,
    agent_namespace: &str,
    cached: CachedPods,
    policy: &ClusterPolicyMemo,
) -> Result<Discovery, NodeOpsError> {
    let driver_pods = match cached {
        CachedPods::Current(pods) => pods,
        CachedPods::ReadyOnly(pods)
            if let Some(ready) = pods.iter().find(|p| running_and_ready(p))
                && let Some(pod) = pod_ref(ready, node) =>
        {
            return Ok(Discovery::Ready(Driver {
                setup: DriverSetup::Container,
                pod,
            }));
        }
        CachedPods::ReadyOnly(_) | CachedPods::Missing => {
            let all_pods: Api<Pod> = Api::all(client.clone());
            pods_on_node(&all_pods, DRIVER_POD_LABEL, node).await?
        }
    };
    if let Some(ready) = driver_pods.iter().find(|p| running_and_ready(p))
        && let Some(pod) = pod_ref(ready, node)
    {
        return Ok(Discovery::Ready(Driver {
            setup: DriverSetup::Container,
            pod,
        }));
    }
    if let Some(pod) = driver_pods.first() {
        return Ok(Discovery::ContainerPending {
            pod: pod.metadata.name.clone(),
        });
    }
    match cluster_policy_driver(client, policy).await? {
        None => Err(NodeOpsError::NoGpuOperator(node.to_owned())),
        Some(true) => Ok(Discovery::ContainerPending { pod: None }),
        Some(false) => {
            let probe = Driver {
                setup: DriverSetup::Host,
                pod: agent_pod(client, agent_namespace, node).await?,
            };
            // The module file, not /proc/driver/nvidia: that only exists while the
            // module is loaded, which it is not on a node without a GPU.
            let out = runner
                .run(&probe.pod, &probe.host_cmd("modinfo", &["nvidia"]))
                .await?;
            if out.exit_code == 0 {
                Ok(Discovery::Ready(probe))
            } else {
                Err(NodeOpsError::NoDriver(node.to_owned()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            namespace: "gpu-operator".into(),
            name: "nvidia-driver-abc".into(),
            node: "n1".into(),
            container: Some("nvidia-driver-ctr".into()),
        }
    }

    /// Go parity (issue 29): the Go operator trusts six chroot paths and never one found
    /// only on PATH; the wrapper tries exactly those, by absolute path, in order.
    #[test]
    fn the_driver_wrapper_uses_only_trusted_chroot_paths() {
        let container = Driver {
            setup: DriverSetup::Container,
            pod: pod(),
        };
        let sh = container.host_sh("true");
        let wrapper = &sh[2];
        let trusted = [
            "/usr/sbin/chroot",
            "/usr/bin/chroot",
            "/sbin/chroot",
            "/bin/chroot",
            "/usr/local/sbin/chroot",
            "/usr/local/bin/chroot",
        ];
        assert!(
            wrapper.contains(&format!("for c in {}; do", trusted.join(" "))),
            "{wrapper}"
        );
        // Only the loop variable is executed: no bare `chroot` looked up on PATH.
        assert!(
            wrapper.contains("exec \"$c\" /run/nvidia/driver sh -c \"$1\""),
            "{wrapper}"
        );
        assert!(!wrapper.contains("command -v") && !wrapper.contains("which "));
        // When none is there, the error names the trusted paths and says PATH is not used.
        let error = wrapper
            .split("echo ")
            .nth(1)
            .unwrap_or_else(|| panic!("no error message in {wrapper}"));
        assert!(error.contains(&trusted.join(" ")), "{error}");
        assert!(
            error.contains("a chroot found only on PATH is not used"),
            "{error}"
        );
    }

    #[test]
    fn command_wrapping_per_setup() {
        let container = Driver {
            setup: DriverSetup::Container,
            pod: pod(),
        };
        assert_eq!(container.smi(&["-L"]), vec!["nvidia-smi", "-L"]);
        let sh = container.host_sh("ls /dev");
        assert_eq!(sh[0], "sh");
        assert!(sh[2].contains("/run/nvidia/driver") && sh[2].contains("/usr/sbin/chroot"));
        assert_eq!(sh.last().map(String::as_str), Some("ls /dev"));
        assert_eq!(
            container.host_cmd("lsmod", &[]).last().map(String::as_str),
            Some("lsmod")
        );

        let host = Driver {
            setup: DriverSetup::Host,
            pod: pod(),
        };
        assert_eq!(
            host.smi(&["-L"]),
            vec!["chroot", "/host-root", "nvidia-smi", "-L"]
        );
        assert_eq!(
            host.host_sh("ls"),
            vec!["chroot", "/host-root", "sh", "-c", "ls"]
        );
        assert_eq!(
            host.host_cmd("modinfo", &["nvidia"]),
            vec!["chroot", "/host-root", "modinfo", "nvidia"]
        );
    }

    #[test]
    fn a_cluster_policy_answer_is_kept_for_a_while_then_read_again() {
        let memo = ClusterPolicyMemo::default();
        assert_eq!(memo.fresh(), None, "nothing read yet");
        memo.keep(Some(false));
        assert_eq!(memo.fresh(), Some(Some(false)));
        memo.keep(None);
        assert_eq!(
            memo.fresh(),
            Some(None),
            "no ClusterPolicy is an answer too"
        );
        *memo.0.lock().unwrap() = Some((
            Instant::now() - CLUSTER_POLICY_KEPT_FOR - Duration::from_millis(1),
            Some(true),
        ));
        assert_eq!(memo.fresh(), None, "too old: read again");
    }

    #[test]
    fn a_pending_driver_is_still_installing() {
        let err = Discovery::ContainerPending { pod: None }
            .ready("n1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("still installing") && err.contains("n1"),
            "{err}"
        );
    }
}
