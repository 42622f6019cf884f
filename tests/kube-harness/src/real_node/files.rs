//! The real node's configuration files: containerd's, the CNI network, the kubelet's
//! configuration and the kubeconfigs of the node and the controllers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::{PAUSE_IMAGE, RealNodeError, io_err};
use crate::Harness;

/// Every path of one real node, under the harness directory.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub(crate) root: PathBuf,
    pub(crate) containerd_config: PathBuf,
    pub(crate) containerd_root: PathBuf,
    pub(crate) containerd_state: PathBuf,
    pub(crate) containerd_sock: PathBuf,
    pub(crate) cni_conf: PathBuf,
    /// The CDI spec directory containerd reads (the node's own, not the host's /var/run/cdi).
    pub(crate) cdi_dir: PathBuf,
    pub(crate) kubelet_root: PathBuf,
    pub(crate) kubelet_config: PathBuf,
    pub(crate) kubelet_kubeconfig: PathBuf,
    pub(crate) admin_kubeconfig: PathBuf,
    pub(crate) resolv_conf: PathBuf,
}

impl Paths {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            containerd_config: root.join("containerd.toml"),
            containerd_root: root.join("containerd/root"),
            containerd_state: root.join("containerd/state"),
            containerd_sock: root.join("containerd/containerd.sock"),
            cni_conf: root.join("cni"),
            cdi_dir: root.join("cdi"),
            kubelet_root: root.join("kubelet"),
            kubelet_config: root.join("kubelet.yaml"),
            kubelet_kubeconfig: root.join("kubelet.kubeconfig"),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            resolv_conf: root.join("resolv.conf"),
        }
    }

    pub(crate) fn log(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.log"))
    }
}

/// Loopback ports of the node's own listeners.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    pub(crate) kubelet: u16,
    pub(crate) kubelet_healthz: u16,
    pub(crate) controller_manager: u16,
    pub(crate) scheduler: u16,
}

impl Ports {
    /// Ports free right now (held together so they differ).
    pub(crate) fn pick() -> Result<Self, RealNodeError> {
        let listeners: Vec<TcpListener> = (0..4)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(io_err("cannot pick a free loopback port"))?;
        let port = |i: usize| -> Result<u16, RealNodeError> {
            Ok(listeners[i]
                .local_addr()
                .map_err(io_err("cannot read a bound port"))?
                .port())
        };
        Ok(Self {
            kubelet: port(0)?,
            kubelet_healthz: port(1)?,
            controller_manager: port(2)?,
            scheduler: port(3)?,
        })
    }
}

/// Writes every file the node's processes read.
pub(crate) fn write_all(
    paths: &Paths,
    harness: &Harness,
    ports: &Ports,
) -> Result<(), RealNodeError> {
    for dir in [
        &paths.root,
        &paths.containerd_root,
        &paths.containerd_state,
        &paths.cni_conf,
        &paths.cdi_dir,
        &paths.kubelet_root,
    ] {
        std::fs::create_dir_all(dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
    }
    let dir = harness
        .dir()
        .ok_or_else(|| RealNodeError::Prerequisite("a local control plane".into()))?;
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(io_err(format!("cannot write {}", path.display())))
    };
    write(&paths.containerd_config, &containerd_toml(paths))?;
    // Only the loopback plugin: enough for containerd to call the network ready; pods
    // use the host's network.
    write(
        &paths.cni_conf.join("10-loopback.conflist"),
        r#"{"cniVersion":"0.4.0","name":"loopback-only","plugins":[{"type":"loopback"}]}"#,
    )?;
    // No name server: nothing in the tier resolves names, and none may leave loopback.
    write(&paths.resolv_conf, "options ndots:1\n")?;
    write(
        &paths.kubelet_config,
        &kubelet_yaml(paths, ports, &dir.join("ca.crt")),
    )?;
    let server = harness.server_url();
    let ca = harness.ca_pem().unwrap_or_default();
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).map_err(io_err(format!("cannot read {name}")))
    };
    let credentials = (read("node.crt")?, read("node.key")?);
    write(
        &paths.kubelet_kubeconfig,
        &kubeconfig(
            &server,
            ca,
            serde_json::json!({
                "client-certificate-data": b64(&credentials.0),
                "client-key-data": b64(&credentials.1),
            }),
        ),
    )?;
    write(
        &paths.admin_kubeconfig,
        &kubeconfig(
            &server,
            ca,
            serde_json::json!({"token": harness.token().unwrap_or_default()}),
        ),
    )?;
    Ok(())
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn kubeconfig(server: &str, ca_pem: &str, user: serde_json::Value) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "real-node", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "real-node", "context": {"cluster": "real-node", "user": "user"}}],
        "current-context": "real-node",
    });
    // Serializing a JSON value cannot fail.
    serde_yaml::to_string(&doc).unwrap_or_default()
}

fn containerd_toml(p: &Paths) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{sock}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower the sandbox's OOM score.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # A DRA kubelet plugin hands a container its device as a CDI device (containerd 1.7+).
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = p.containerd_root.display(),
        state = p.containerd_state.display(),
        sock = p.containerd_sock.display(),
        pause = PAUSE_IMAGE,
        cni = p.cni_conf.display(),
        cdi = p.cdi_dir.display(),
    )
}

fn kubelet_yaml(p: &Paths, ports: &Ports, ca: &Path) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": ports.kubelet,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "readOnlyPort": 0,
        "containerRuntimeEndpoint": format!("unix://{}", p.containerd_sock.display()),
        "cgroupDriver": "cgroupfs",
        // 1.36 refuses cgroup v1 unless told; these machines mount v1.
        "failCgroupV1": false,
        "failSwapOn": false,
        // Leave the host's iptables alone.
        "makeIPTablesUtilChains": false,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": ca.display().to_string()},
        },
        "authorization": {"mode": "Webhook"},
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
            "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        // The imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": p.resolv_conf.display().to_string(),
        "serializeImagePulls": false,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "registerNode": true,
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}
