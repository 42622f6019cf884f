//! Queries and the drain sequence for one GPU (docs/node-operations.md, "Draining one
//! GPU").

use std::sync::Arc;

use super::driver::{Driver, DriverSetup};
use super::smi::{self, BusId, ComputeApp, DrainState, Gpu};
use super::{CommandRunner, ExecOutput, NodeOpsError};

/// How the cluster is told about GPUs (docs/node-operations.md, "Making the cluster see
/// a GPU").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExposureMode {
    DevicePlugin,
    Dra,
}

impl ExposureMode {
    /// The `DEVICE_RESOURCE_TYPE` value that selects it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ExposureMode::DevicePlugin => "DEVICE_PLUGIN",
            ExposureMode::Dra => "DRA",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainOptions {
    pub(crate) mode: ExposureMode,
    pub(crate) force: bool,
}

const QUERY_GPUS: &[&str] = &[
    "--query-gpu=device_minor,gpu_uuid,pci.bus_id",
    "--format=csv,noheader,nounits",
];
const QUERY_APPS: &[&str] = &[
    "--query-compute-apps=gpu_uuid,process_name",
    "--format=csv,noheader,nounits",
];
const NO_DEVICES: &str = "No devices were found";
/// The kernel modules unloaded after a host driver's last GPU is gone. Never `nvidia`
/// or `nvidia_modeset`: the next attach needs them, and unloading them fails while
/// nvidia-persistenced runs.
pub(crate) const UNLOADED_AFTER_LAST_GPU: [&str; 2] = ["nvidia_drm", "nvidia_uvm"];
/// Stops the driver container's nvidia-persistenced through its pid file. Linux keeps
/// only 15 characters of a process name (`nvidia-persiste`), so matching the name
/// `nvidia-persistenced` (as `pkill -x` would) never finds it; the name check guards
/// against a stale pid file whose pid now belongs to another process.
pub(crate) const STOP_PERSISTENCED: &str = "pid=$(cat /var/run/nvidia-persistenced/nvidia-persistenced.pid 2>/dev/null) || exit 0; [ \"$(cat /proc/$pid/comm 2>/dev/null)\" = nvidia-persiste ] && kill $pid; exit 0";
/// Prints each GPU's proc information file, separated, for hosts whose nvidia-smi fails.
const PROC_INFORMATION: &str = "for f in /proc/driver/nvidia/gpus/*/information; do [ -f \"$f\" ] && cat \"$f\" && echo '%%'; done; true";

#[derive(Clone)]
pub(crate) struct GpuOps {
    runner: Arc<dyn CommandRunner>,
}

impl GpuOps {
    pub(crate) fn new(runner: Arc<dyn CommandRunner>) -> Self {
        Self { runner }
    }

    async fn run(&self, driver: &Driver, cmd: Vec<String>) -> Result<ExecOutput, NodeOpsError> {
        self.runner.run(&driver.pod, &cmd).await
    }

    async fn run_ok(&self, driver: &Driver, cmd: Vec<String>) -> Result<ExecOutput, NodeOpsError> {
        let out = self.run(driver, cmd.clone()).await?;
        if out.exit_code != 0 {
            return Err(failed(driver, &cmd, &out));
        }
        Ok(out)
    }

    fn parse_err(driver: &Driver, source: smi::SmiError) -> NodeOpsError {
        NodeOpsError::Parse {
            node: driver.pod.node.clone(),
            source,
        }
    }

    /// The node's GPUs. `No devices were found` is an empty list, not an error; a host
    /// driver whose nvidia-smi fails is read from its proc files instead.
    pub(crate) async fn list_gpus(&self, driver: &Driver) -> Result<Vec<Gpu>, NodeOpsError> {
        let out = self.run(driver, driver.smi(QUERY_GPUS)).await?;
        if out.stdout.contains(NO_DEVICES) {
            return Ok(Vec::new());
        }
        if out.exit_code == 0 {
            let answer = stdout_answer(driver, &driver.smi(QUERY_GPUS), &out)?;
            return smi::parse_gpus(answer).map_err(|e| Self::parse_err(driver, e));
        }
        if driver.setup == DriverSetup::Host {
            let script = driver.host_sh(PROC_INFORMATION);
            let proc = self.run_ok(driver, script.clone()).await?;
            return stdout_answer(driver, &script, &proc)?
                .split("%%")
                .filter(|block| !block.trim().is_empty())
                .map(|block| {
                    smi::parse_proc_information(block).map_err(|e| Self::parse_err(driver, e))
                })
                .collect();
        }
        Err(failed(driver, &driver.smi(QUERY_GPUS), &out))
    }

    pub(crate) async fn is_listed(
        &self,
        driver: &Driver,
        uuid: &str,
    ) -> Result<bool, NodeOpsError> {
        Ok(self.list_gpus(driver).await?.iter().any(|g| g.uuid == uuid))
    }

    pub(crate) async fn compute_apps(
        &self,
        driver: &Driver,
    ) -> Result<Vec<ComputeApp>, NodeOpsError> {
        let out = self.run(driver, driver.smi(QUERY_APPS)).await?;
        if out.stdout.contains(NO_DEVICES) {
            return Ok(Vec::new());
        }
        if out.exit_code != 0 {
            return Err(failed(driver, &driver.smi(QUERY_APPS), &out));
        }
        // Empty is "no work", but not when stderr says something instead.
        let answer = stdout_answer(driver, &driver.smi(QUERY_APPS), &out)?;
        smi::parse_compute_apps(answer).map_err(|e| Self::parse_err(driver, e))
    }

    /// Step 1: refuses while work runs (any GPU of the node in device-plugin mode, this
    /// GPU in DRA mode).
    pub(crate) async fn ensure_idle(
        &self,
        driver: &Driver,
        uuid: &str,
        mode: ExposureMode,
    ) -> Result<(), NodeOpsError> {
        let busy: Vec<ComputeApp> = self
            .compute_apps(driver)
            .await?
            .into_iter()
            .filter(|a| mode == ExposureMode::DevicePlugin || a.gpu_uuid == uuid)
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        Err(NodeOpsError::GpuBusy {
            node: driver.pod.node.clone(),
            gpu: uuid.to_owned(),
            processes: busy
                .iter()
                .map(|a| format!("{} on {}", a.process_name, a.gpu_uuid))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// DRA after attach: one nvidia-smi run makes the driver initialise the new GPU.
    pub(crate) async fn initialise(&self, driver: &Driver) -> Result<(), NodeOpsError> {
        self.run(driver, driver.smi(&[])).await.map(|_| ())
    }

    /// Steps 1 and 3–6 of the drain: every step may be repeated after a crash, and a GPU
    /// that is no longer listed counts as drained.
    pub(crate) async fn drain(
        &self,
        driver: &Driver,
        uuid: &str,
        opts: DrainOptions,
    ) -> Result<(), NodeOpsError> {
        if !opts.force {
            self.ensure_idle(driver, uuid, opts.mode).await?;
        }
        let gpus = self.list_gpus(driver).await?;
        let Some(gpu) = gpus.iter().find(|g| g.uuid == uuid) else {
            tracing::info!(node = %driver.pod.node, gpu = uuid, "GPU no longer listed: already drained");
            return Ok(());
        };
        let bus = drain_bus_arg(gpu.bus_id, opts.mode);

        let state = self.drain_state(driver, uuid, &bus, opts.mode).await?;
        if state == DrainState::NotDraining {
            self.run_ok(driver, driver.smi(&["-i", uuid, "-pm", "0"]))
                .await?;
            if driver.setup == DriverSetup::Container {
                // The driver container's persistence daemon keeps the device open.
                self.run_ok(driver, driver.pod_sh(STOP_PERSISTENCED))
                    .await?;
            }
        }
        self.ensure_unheld(driver, gpu).await?;
        if opts.mode == ExposureMode::Dra {
            self.run_ok(
                driver,
                driver.host_sh(&format!("rm -f /dev/nvidia{}", gpu.minor)),
            )
            .await?;
        }
        if state == DrainState::NotDraining {
            self.run_ok(driver, driver.smi(&["drain", "-p", &bus, "-m", "1"]))
                .await?;
        }
        let last_on_host = driver.setup == DriverSetup::Host && gpus.len() == 1;
        self.remove_from_node(driver, gpu, &bus, last_on_host, opts.mode)
            .await
    }

    /// Whether the GPU is draining already (a drain repeated after a crash).
    async fn drain_state(
        &self,
        driver: &Driver,
        uuid: &str,
        bus: &str,
        mode: ExposureMode,
    ) -> Result<DrainState, NodeOpsError> {
        let query_cmd = driver.smi(&["drain", "-p", bus, "-q"]);
        if mode == ExposureMode::DevicePlugin {
            // The Go operator never asked in device-plugin mode: a query that fails or an
            // answer this nvidia-smi words differently is no reason to stop there.
            let out = self.run(driver, query_cmd).await?;
            Ok(match smi::parse_drain_state(&out.stdout) {
                Ok(state) if out.exit_code == 0 => state,
                parsed => {
                    tracing::warn!(node = %driver.pod.node, gpu = uuid, code = out.exit_code,
                        output = ?first_words(&out.stdout), error = ?parsed.err(),
                        "unrecognised drain state; going on as not draining");
                    DrainState::NotDraining
                }
            })
        } else {
            let out = self.run_ok(driver, query_cmd.clone()).await?;
            let answer = stdout_answer(driver, &query_cmd, &out)?;
            smi::parse_drain_state(answer).map_err(|e| Self::parse_err(driver, e))
        }
    }

    /// Refuses while a process on the host still has the GPU's device file open.
    async fn ensure_unheld(&self, driver: &Driver, gpu: &Gpu) -> Result<(), NodeOpsError> {
        let holders = self
            .run_ok(driver, driver.host_sh(&holders_script(gpu.minor)))
            .await?;
        let holders = holders.stdout.trim();
        if !holders.is_empty() {
            return Err(NodeOpsError::DeviceHeld {
                node: driver.pod.node.clone(),
                minor: gpu.minor,
                processes: holders.lines().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(())
    }

    /// Takes the GPU off the PCI bus (on a VM, or the host driver's last GPU, with the
    /// modules unloaded first) or resets it.
    async fn remove_from_node(
        &self,
        driver: &Driver,
        gpu: &Gpu,
        bus: &str,
        last_on_host: bool,
        mode: ExposureMode,
    ) -> Result<(), NodeOpsError> {
        let on_vm = self
            .run(driver, driver.host_sh("grep -q hypervisor /proc/cpuinfo"))
            .await?
            .exit_code
            == 0;
        if last_on_host {
            self.unload_after_last_gpu(driver).await?;
        }
        if on_vm || last_on_host {
            let sysfs = gpu.bus_id.sysfs();
            self.run_ok(driver, driver.host_sh(&sysfs_remove_script(&sysfs)))
                .await?;
            return Ok(());
        }
        let reset = driver.smi(&["drain", "-p", bus, "-r"]);
        let out = self.run(driver, reset.clone()).await?;
        if out.exit_code != 0 {
            if mode != ExposureMode::DevicePlugin {
                return Err(failed(driver, &reset, &out));
            }
            // As in the Go operator: the fabric's detach takes the GPU away anyway.
            tracing::warn!(node = %driver.pod.node, gpu = gpu.uuid.as_str(), code = out.exit_code,
                stderr = ?first_words(&out.stderr), "GPU reset failed; detaching anyway");
        }
        Ok(())
    }
}

impl GpuOps {
    /// Unloads the modules of [`UNLOADED_AFTER_LAST_GPU`] that are loaded.
    async fn unload_after_last_gpu(&self, driver: &Driver) -> Result<(), NodeOpsError> {
        let lsmod = self.run_ok(driver, driver.host_cmd("lsmod", &[])).await?;
        let loaded = smi::parse_lsmod(&lsmod.stdout);
        for module in UNLOADED_AFTER_LAST_GPU {
            if loaded.iter().any(|m| m == module) {
                self.run_ok(driver, driver.host_cmd("modprobe", &["-r", module]))
                    .await?;
            }
        }
        Ok(())
    }
}

/// Removes the PCI device through sysfs, once.
fn sysfs_remove_script(sysfs: &str) -> String {
    format!(
        "if [ -e /sys/bus/pci/devices/{sysfs} ]; then echo 1 > /sys/bus/pci/devices/{sysfs}/remove; fi"
    )
}

/// `nvidia-smi drain -p` takes the upper-case bus id; the device-plugin path strips the
/// leading `0000` of nvidia-smi's eight-digit domain.
fn drain_bus_arg(bus: BusId, mode: ExposureMode) -> String {
    match mode {
        ExposureMode::Dra => bus.smi(),
        ExposureMode::DevicePlugin => bus.short_upper(),
    }
}

/// Lists `<pid> <command>` of every process holding `/dev/nvidia<minor>` open.
fn holders_script(minor: u32) -> String {
    format!(
        "for p in /proc/[0-9]*; do for f in \"$p\"/fd/*; do if [ \"$(readlink \"$f\" 2>/dev/null)\" = /dev/nvidia{minor} ]; then echo \"${{p#/proc/}} $(cat \"$p\"/comm 2>/dev/null)\"; break; fi; done; done; true"
    )
}

/// A command's non-zero exit as an error, with what it printed on stderr (on stdout when
/// stderr is empty: nvidia-smi prints some failures there, such as "NVIDIA-SMI has
/// failed because it couldn't communicate with the NVIDIA driver").
fn failed(driver: &Driver, cmd: &[String], out: &ExecOutput) -> NodeOpsError {
    NodeOpsError::CommandFailed {
        pod: driver.pod.to_string(),
        command: cmd.join(" "),
        code: out.exit_code,
        stderr: first_words(if out.stderr.trim().is_empty() {
            &out.stdout
        } else {
            &out.stderr
        }),
    }
}

/// The stdout of a command that exited 0, as the answer to parse; an empty stdout beside
/// a message on stderr is no answer (read as one it would be "no GPUs" or "no work",
/// and a drain could be skipped).
fn stdout_answer<'a>(
    driver: &Driver,
    cmd: &[String],
    out: &'a ExecOutput,
) -> Result<&'a str, NodeOpsError> {
    if out.stdout.trim().is_empty() && !out.stderr.trim().is_empty() {
        return Err(NodeOpsError::OnlyStderr {
            pod: driver.pod.to_string(),
            command: cmd.join(" "),
            stderr: first_words(&out.stderr),
        });
    }
    Ok(&out.stdout)
}

fn first_words(text: &str) -> String {
    let t = text.trim();
    let cut = crate::text::clip(t, 300);
    if cut.len() < t.len() {
        format!("{cut}…")
    } else {
        cut.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_arg_per_mode() {
        let b = BusId::parse("00000000:3B:00.0").unwrap();
        assert_eq!(drain_bus_arg(b, ExposureMode::Dra), "00000000:3B:00.0");
        assert_eq!(drain_bus_arg(b, ExposureMode::DevicePlugin), "0000:3B:00.0");
    }

    #[test]
    fn persistenced_is_stopped_by_pid_file_not_by_its_long_name() {
        assert!(STOP_PERSISTENCED.contains("/var/run/nvidia-persistenced/nvidia-persistenced.pid"));
        assert!(STOP_PERSISTENCED.contains("= nvidia-persiste ]"));
        assert!(!STOP_PERSISTENCED.contains("pkill"));
        assert_eq!("nvidia-persiste".len(), 15);
    }

    #[test]
    fn only_drm_and_uvm_are_unloaded() {
        assert_eq!(UNLOADED_AFTER_LAST_GPU, ["nvidia_drm", "nvidia_uvm"]);
    }

    #[test]
    fn holders_script_names_the_device() {
        assert!(holders_script(3).contains("= /dev/nvidia3 ]"));
    }

    /// A runner that answers every command with one output.
    struct Answer(ExecOutput);

    impl CommandRunner for Answer {
        fn run<'a>(
            &'a self,
            _pod: &'a super::super::PodRef,
            _command: &'a [String],
        ) -> futures::future::BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
            let out = self.0.clone();
            Box::pin(async move { Ok(out) })
        }
    }

    fn driver(setup: DriverSetup) -> Driver {
        Driver {
            setup,
            pod: super::super::PodRef {
                namespace: "gpu-operator".into(),
                name: "nvidia-driver-abc".into(),
                node: "n1".into(),
                container: None,
            },
        }
    }

    fn ops(stdout: &str, stderr: &str, exit_code: i32) -> GpuOps {
        GpuOps::new(Arc::new(Answer(ExecOutput {
            stdout: stdout.into(),
            stderr: stderr.into(),
            exit_code,
        })))
    }

    #[tokio::test]
    async fn stderr_alone_is_no_answer() {
        let warning = "Failed to initialize NVML: Unknown Error";
        for setup in [DriverSetup::Container, DriverSetup::Host] {
            let d = driver(setup);
            let e = ops("", warning, 0).list_gpus(&d).await.unwrap_err();
            assert!(
                matches!(e, NodeOpsError::OnlyStderr { ref stderr, .. } if stderr == warning),
                "{e:?}"
            );
            let e = ops("", warning, 0).compute_apps(&d).await.unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("exited 0 but printed nothing on stdout")
                    && text.contains(warning)
                    && text.contains("gpu-operator/nvidia-driver-abc"),
                "{text}"
            );
            // An empty answer without a word on stderr is still "none".
            assert!(ops("", "", 0).list_gpus(&d).await.unwrap().is_empty());
            assert!(ops("", "", 0).compute_apps(&d).await.unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn a_failure_names_what_the_command_printed() {
        let d = driver(DriverSetup::Container);
        let smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.";
        for e in [
            ops(smi, "", 9).list_gpus(&d).await.unwrap_err(),
            ops(smi, "", 9).compute_apps(&d).await.unwrap_err(),
        ] {
            assert!(
                matches!(e, NodeOpsError::CommandFailed { code: 9, ref stderr, .. } if stderr == smi),
                "{e:?}"
            );
        }
        let e = ops("", "nvidia-smi: not found", 127)
            .list_gpus(&d)
            .await
            .unwrap_err();
        assert!(
            e.to_string().ends_with("(exit 127): nvidia-smi: not found"),
            "{e}"
        );
    }

    #[test]
    fn long_errors_are_cut_on_a_char_boundary() {
        let long = "é".repeat(400);
        let cut = first_words(&long);
        assert_eq!(cut.chars().count(), 301);
    }
}
