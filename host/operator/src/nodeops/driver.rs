//! Which NVIDIA driver setup a node has, and how commands reach it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::{CommandRunner, NodeOpsError, PodRef};

pub const DRIVER_POD_LABEL: &str = "app.kubernetes.io/component=nvidia-driver";
pub const AGENT_NAMESPACE: &str = "composable-resource-operator-system";
pub const AGENT_POD_LABEL: &str = "app.kubernetes.io/name=cro-node-agent";
/// The host's driver root as the container driver mounts it.
const CONTAINER_DRIVER_ROOT: &str = "/run/nvidia/driver";
/// The host's root as the node agent mounts it.
const AGENT_HOST_ROOT: &str = "/host-root";
/// Where a chroot binary may live in a driver image; the first one present is used.
const CHROOT_CANDIDATES: &str = "/usr/sbin/chroot /usr/bin/chroot /sbin/chroot /bin/chroot";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverSetup {
    /// The GPU operator's driver container.
    Container,
    /// A driver installed on the host, reached through the node agent.
    Host,
}

/// A node's driver and the pod commands run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    pub setup: DriverSetup,
    pub pod: PodRef,
}

impl Driver {
    /// `nvidia-smi <args>` where the driver's tools are.
    pub fn smi(&self, args: &[&str]) -> Vec<String> {
        let mut cmd = match self.setup {
            DriverSetup::Container => vec![],
            DriverSetup::Host => vec!["chroot".into(), AGENT_HOST_ROOT.into()],
        };
        cmd.push("nvidia-smi".into());
        cmd.extend(args.iter().map(|a| a.to_string()));
        cmd
    }

    /// A shell script run with the host's view of devices, processes and sysfs.
    pub fn host_sh(&self, script: &str) -> Vec<String> {
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
                    "for c in {CHROOT_CANDIDATES}; do if [ -x \"$c\" ]; then exec \"$c\" {CONTAINER_DRIVER_ROOT} sh -c \"$1\"; fi; done; echo 'no chroot binary found' >&2; exit 127"
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

fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
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

/// `None`: no ClusterPolicy API or object; `Some(enabled)`: the driver flag of the first.
async fn cluster_policy_driver(client: &kube::Client) -> Result<Option<bool>, NodeOpsError> {
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"),
    );
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items.first().map(|p| {
            p.data
                .pointer("/spec/driver/enabled")
                .and_then(|v| v.as_bool())
                .unwrap_or(true)
        })),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Finds the node's driver (NODE_OPS "Which driver setup a node has").
pub async fn discover(
    client: &kube::Client,
    runner: &dyn CommandRunner,
    node: &str,
) -> Result<Driver, NodeOpsError> {
    let all_pods: Api<Pod> = Api::all(client.clone());
    let driver_pods = pods_on_node(&all_pods, DRIVER_POD_LABEL, node).await?;
    if let Some(ready) = driver_pods.iter().find(|p| running_and_ready(p))
        && let Some(pod) = pod_ref(ready, node)
    {
        return Ok(Driver {
            setup: DriverSetup::Container,
            pod,
        });
    }
    if let Some(pod) = driver_pods.first() {
        return Err(NodeOpsError::DriverInstalling {
            node: node.to_owned(),
            pod: pod.metadata.name.clone().unwrap_or_default(),
        });
    }
    let policy = cluster_policy_driver(client).await?;
    if policy == Some(true) {
        // The GPU operator will schedule a driver pod here; until then there is nothing to run.
        return Err(NodeOpsError::DriverInstalling {
            node: node.to_owned(),
            pod: "(not scheduled yet)".into(),
        });
    }

    let agents: Api<Pod> = Api::namespaced(client.clone(), AGENT_NAMESPACE);
    let agent = pods_on_node(&agents, AGENT_POD_LABEL, node)
        .await?
        .iter()
        .filter(|p| running_and_ready(p))
        .find_map(|p| pod_ref(p, node));
    if let Some(agent) = agent {
        let probe = Driver {
            setup: DriverSetup::Host,
            pod: agent,
        };
        let out = runner
            .run(&probe.pod, &probe.host_sh("test -d /proc/driver/nvidia"))
            .await?;
        if out.exit_code == 0 {
            return Ok(probe);
        }
    }
    match policy {
        None => Err(NodeOpsError::NoGpuOperator(node.to_owned())),
        Some(_) => Err(NodeOpsError::NoDriver(node.to_owned())),
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
    }
}
