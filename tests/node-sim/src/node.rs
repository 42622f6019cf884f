//! One simulated GPU node: its GPUs (what the simulated fabric has attached to its
//! machine), their drain state, the processes on it, its kernel modules and
//! nvidia-persistenced; and the interpreter of the commands the operator runs there.
//!
//! A command the interpreter does not know is answered with exit code 127 and recorded
//! as unknown, so a test catches an operator that sends a wrong command. Commands it
//! knows behave as on a real node, including the quirks the operator must live with.

use std::collections::{BTreeMap, BTreeSet};

/// Where a command runs: which pod, and through which root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// The GPU operator's driver container: nvidia-smi at hand, the host's driver root
    /// mounted at `/run/nvidia/driver`, and the host's processes visible.
    Driver,
    /// cro's node agent: the host's root mounted at `/host-root`; nothing else.
    Agent,
}

/// How the node's driver is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    GpuOperator,
    Host,
}

/// What a node's owner can set.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// A virtual machine: `/proc/cpuinfo` mentions `hypervisor`.
    pub vm: bool,
    /// Host driver: whether the driver's kernel module is installed (`modinfo nvidia`).
    pub host_driver_installed: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            vm: false,
            host_driver_installed: true,
        }
    }
}

/// Behaviours of some nvidia-smi builds.
#[derive(Debug, Clone, Default)]
pub struct Quirks {
    /// `nvidia-smi drain -q` prints this instead of a drain state.
    pub drain_query_reply: Option<String>,
    /// `nvidia-smi drain -r` fails ("Not Supported"), as on some systems.
    pub reset_fails: bool,
}

pub const PERSISTENCED_PID_FILE: &str = "/var/run/nvidia-persistenced/nvidia-persistenced.pid";
/// Linux keeps 15 characters of a process name.
pub const PERSISTENCED_COMM: &str = "nvidia-persiste";
const MODULES: [&str; 4] = ["nvidia", "nvidia_modeset", "nvidia_uvm", "nvidia_drm"];

/// One GPU as the driver sees it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub uuid: String,
    pub minor: u32,
    pub bus: u8,
    pub persistence: bool,
}

impl Gpu {
    pub fn bus_smi(&self) -> String {
        format!("00000000:{:02X}:00.0", self.bus)
    }
    fn bus_short(&self) -> String {
        format!("0000:{:02X}:00.0", self.bus)
    }
    fn bus_sysfs(&self) -> String {
        format!("0000:{:02x}:00.0", self.bus)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
    /// The command is not one a real node would understand the way it was sent.
    pub unknown: bool,
}

fn ok(stdout: impl Into<String>) -> Output {
    Output {
        stdout: stdout.into(),
        stderr: String::new(),
        code: 0,
        unknown: false,
    }
}

fn fail(code: i32, stderr: impl Into<String>) -> Output {
    Output {
        stdout: String::new(),
        stderr: stderr.into(),
        code,
        unknown: false,
    }
}

fn unknown(what: impl Into<String>) -> Output {
    Output {
        stdout: String::new(),
        stderr: format!("node simulator: unknown command {}", what.into()),
        code: 127,
        unknown: true,
    }
}

/// nvidia-smi prints this on stdout and exits 6 on a node without GPUs.
fn no_devices() -> Output {
    Output {
        stdout: "No devices were found\n".into(),
        stderr: String::new(),
        code: 6,
        unknown: false,
    }
}

#[derive(Debug)]
pub struct NodeState {
    pub machine: String,
    pub driver: DriverKind,
    pub options: NodeOptions,
    pub quirks: Quirks,
    /// GPUs the driver lists, by uuid (refreshed from the fabric before each use).
    gpus: BTreeMap<String, Gpu>,
    next_slot: u32,
    /// GPUs in maintenance (`drain -m 1`) and reset or removed (`drain -r`, sysfs).
    maintenance: BTreeSet<String>,
    removed: BTreeSet<String>,
    /// GPU uuid → names of the compute processes on it.
    busy: BTreeMap<String, Vec<String>>,
    /// GPU uuid → `<pid> <comm>` of a process holding its device file.
    holders: BTreeMap<String, String>,
    /// Loaded kernel modules (host driver).
    modules: BTreeSet<String>,
    /// pid → process name (15 characters at most, as Linux keeps them).
    processes: BTreeMap<u32, String>,
    /// nvidia-persistenced's pid file, when written.
    pid_file: Option<u32>,
    next_pid: u32,
    /// Kernel modules unloaded so far, in order (for tests).
    pub unloaded: Vec<String>,
}

impl NodeState {
    pub fn new(machine: &str, driver: DriverKind, options: NodeOptions) -> Self {
        let mut node = Self {
            machine: machine.to_owned(),
            driver,
            options,
            quirks: Quirks::default(),
            gpus: BTreeMap::new(),
            next_slot: 0,
            maintenance: BTreeSet::new(),
            removed: BTreeSet::new(),
            busy: BTreeMap::new(),
            holders: BTreeMap::new(),
            modules: BTreeSet::new(),
            processes: BTreeMap::new(),
            pid_file: None,
            next_pid: 1200,
            unloaded: Vec::new(),
        };
        if driver == DriverKind::Host && node.options.host_driver_installed {
            // systemd starts the daemon at boot, GPU or not.
            node.start_persistenced();
        }
        node
    }

    /// Starts nvidia-persistenced (the driver pod does when it becomes Ready).
    pub fn start_persistenced(&mut self) {
        if self.persistenced_pid().is_some() {
            return;
        }
        self.next_pid += 1;
        let pid = self.next_pid;
        let comm: String = "nvidia-persistenced".chars().take(15).collect();
        self.processes.insert(pid, comm);
        self.pid_file = Some(pid);
    }

    pub fn persistenced_pid(&self) -> Option<u32> {
        let pid = self.pid_file?;
        (self.processes.get(&pid).map(String::as_str) == Some(PERSISTENCED_COMM)).then_some(pid)
    }

    pub fn modules(&self) -> Vec<String> {
        self.modules.iter().cloned().collect()
    }

    pub fn set_busy(&mut self, gpu: &str, processes: &[&str]) {
        if processes.is_empty() {
            self.busy.remove(gpu);
        } else {
            self.busy.insert(
                gpu.into(),
                processes.iter().map(|p| p.to_string()).collect(),
            );
        }
    }

    pub fn set_holder(&mut self, gpu: &str, holder: Option<&str>) {
        match holder {
            Some(h) => self.holders.insert(gpu.into(), h.into()),
            None => self.holders.remove(gpu),
        };
    }

    /// Takes the fabric's view of the machine: `attached` are the GPU serials on it now,
    /// `gone` those detached since their drain marks were made (they may be back, fresh).
    pub fn refresh(&mut self, attached: &[String], gone: &BTreeSet<String>) {
        for g in gone {
            self.maintenance.remove(g);
            self.removed.remove(g);
            self.gpus.remove(g);
        }
        self.gpus.retain(|uuid, _| attached.contains(uuid));
        self.maintenance.retain(|g| attached.contains(g));
        self.removed.retain(|g| attached.contains(g));
        let installed =
            self.driver == DriverKind::GpuOperator || self.options.host_driver_installed;
        for uuid in attached {
            if self.gpus.contains_key(uuid) || self.removed.contains(uuid) {
                continue;
            }
            let minor = self.next_slot;
            self.next_slot += 1;
            self.gpus.insert(
                uuid.clone(),
                Gpu {
                    uuid: uuid.clone(),
                    minor,
                    bus: 0x3b_u8.wrapping_add(minor as u8),
                    persistence: true,
                },
            );
            if installed && self.driver == DriverKind::Host {
                // udev loads the driver for a new NVIDIA PCI device.
                for m in MODULES {
                    self.modules.insert(m.to_owned());
                }
            }
        }
    }

    /// GPUs marked in maintenance or removed, for the caller's bookkeeping.
    pub fn drain_marks(&self) -> Vec<String> {
        self.maintenance
            .iter()
            .chain(&self.removed)
            .cloned()
            .collect()
    }

    /// GPUs the driver lists now, by minor number.
    pub fn listed(&self) -> Vec<Gpu> {
        if self.driver == DriverKind::Host && !self.modules.contains("nvidia") {
            return Vec::new();
        }
        let mut v: Vec<Gpu> = self
            .gpus
            .values()
            .filter(|g| !self.removed.contains(&g.uuid))
            .cloned()
            .collect();
        v.sort_by_key(|g| g.minor);
        v
    }

    fn gpu_by_bus(&self, bus: &str) -> Option<Gpu> {
        self.listed()
            .into_iter()
            .find(|g| bus == g.bus_smi() || bus == g.bus_short())
    }

    /// Processes holding `/dev/nvidia<minor>`, as `<pid> <comm>`.
    fn holders_of(&self, minor: u32) -> Vec<String> {
        let mut out = Vec::new();
        let Some(gpu) = self.listed().into_iter().find(|g| g.minor == minor) else {
            return out;
        };
        if let Some(h) = self.holders.get(&gpu.uuid) {
            out.push(h.clone());
        }
        if let Some(pid) = self.persistenced_pid() {
            // The driver container's daemon keeps every GPU open until it is stopped
            // (why the operator stops it); the host's lets go of a GPU whose
            // persistence mode is off.
            let holds = match self.driver {
                DriverKind::GpuOperator => true,
                DriverKind::Host => gpu.persistence,
            };
            if holds {
                out.push(format!("{pid} {PERSISTENCED_COMM}"));
            }
        }
        out
    }

    /// Runs `argv` in a pod of `kind` on this node.
    pub fn exec(&mut self, kind: PodKind, argv: &[String]) -> Output {
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        match (kind, args.as_slice()) {
            (PodKind::Agent, ["chroot", "/host-root", rest @ ..]) => self.host(rest),
            (PodKind::Agent, _) => unknown(format!(
                "{args:?} in the node agent (its image has no GPU tools; use chroot /host-root)"
            )),
            (PodKind::Driver, ["sh", "-c", wrapper, "sh", script])
                if wrapper.contains("exec \"$c\" /run/nvidia/driver sh -c \"$1\"")
                    && wrapper.contains("/usr/sbin/chroot") =>
            {
                self.host_script(script)
            }
            (PodKind::Driver, ["nvidia-smi", rest @ ..]) => self.smi(rest),
            (PodKind::Driver, ["sh", "-c", script]) => self.pod_script(script),
            _ => unknown(format!("{args:?}")),
        }
    }

    /// A command with the host's root.
    fn host(&mut self, args: &[&str]) -> Output {
        let installed = self.options.host_driver_installed;
        match args {
            ["nvidia-smi", rest @ ..] if installed => {
                if !self.gpus.is_empty() {
                    // nvidia-smi loads the module when it is not (nvidia-modprobe).
                    self.modules.insert("nvidia".into());
                }
                self.smi(rest)
            }
            ["nvidia-smi", ..] => fail(
                127,
                "chroot: failed to run command 'nvidia-smi': No such file or directory",
            ),
            ["modinfo", "nvidia"] if installed => ok(
                "filename:       /lib/modules/5.14.0/kernel/drivers/video/nvidia.ko\nversion:        550.54.15\nlicense:        NVIDIA\n",
            ),
            ["modinfo", "nvidia"] => fail(1, "modinfo: ERROR: Module nvidia not found.\n"),
            ["lsmod"] => {
                let mut text = String::from("Module                  Size  Used by\n");
                for m in self.modules.iter().rev() {
                    text.push_str(&format!("{m:<24}1540096  0\n"));
                }
                ok(text)
            }
            ["modprobe", "-r", modules @ ..] if !modules.is_empty() => {
                for m in modules {
                    if let Err(e) = self.unload(m) {
                        return fail(1, e);
                    }
                }
                ok("")
            }
            ["sh", "-c", script] => self.host_script(script),
            _ => unknown(format!("chroot /host-root {args:?}")),
        }
    }

    fn unload(&mut self, module: &str) -> Result<(), String> {
        if !MODULES.contains(&module) {
            return Err(format!("modprobe: FATAL: Module {module} not found.\n"));
        }
        if !self.modules.contains(module) {
            return Err(format!(
                "modprobe: FATAL: Module {module} is not in kernel.\n"
            ));
        }
        let in_use = match module {
            "nvidia_modeset" => self.modules.contains("nvidia_drm"),
            // nvidia-persistenced keeps /dev/nvidiactl open.
            "nvidia" => {
                self.modules.contains("nvidia_modeset")
                    || self.modules.contains("nvidia_uvm")
                    || self.persistenced_pid().is_some()
            }
            _ => false,
        };
        if in_use {
            return Err(format!("modprobe: FATAL: Module {module} is in use.\n"));
        }
        self.modules.remove(module);
        self.unloaded.push(module.to_owned());
        Ok(())
    }

    /// A script in the driver container itself (not chrooted).
    fn pod_script(&mut self, script: &str) -> Output {
        if let Some(rest) = script.split("pkill -x ").nth(1) {
            let name: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != ';' && *c != '|')
                .collect();
            let victims: Vec<u32> = self
                .processes
                .iter()
                .filter(|(_, comm)| **comm == name)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in &victims {
                self.processes.remove(pid);
            }
            let code = if victims.is_empty() && !script.contains("|| true") {
                1
            } else {
                0
            };
            return Output { code, ..ok("") };
        }
        if script.contains("/proc/$pid/comm") {
            // `pid=$(cat <pid file>) ...; [ "$(cat /proc/$pid/comm)" = <name> ] && kill $pid`
            let file = script
                .split("cat ")
                .nth(1)
                .map(|r| r.split([' ', ')']).next().unwrap_or_default())
                .unwrap_or_default();
            let name = script
                .split("\" = ")
                .nth(1)
                .map(|r| r.split_whitespace().next().unwrap_or_default())
                .unwrap_or_default();
            if !script.contains("kill $pid") {
                return unknown(format!("sh -c {script:?}"));
            }
            if file == PERSISTENCED_PID_FILE
                && let Some(pid) = self.pid_file
                && self.processes.get(&pid).map(String::as_str) == Some(name)
            {
                self.processes.remove(&pid);
            }
            return ok("");
        }
        unknown(format!("sh -c {script:?} in the driver container"))
    }

    /// A script with the host's view (chrooted into the host or driver root).
    fn host_script(&mut self, script: &str) -> Output {
        if script.contains("/proc/[0-9]*") && script.contains("readlink") {
            let Some(minor) = script
                .split("= /dev/nvidia")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|m| m.parse::<u32>().ok())
            else {
                return unknown(format!("sh -c {script:?}"));
            };
            let mut text = String::new();
            for h in self.holders_of(minor) {
                text.push_str(&h);
                text.push('\n');
            }
            return ok(text);
        }
        if let Some(minor) = script.strip_prefix("rm -f /dev/nvidia") {
            return if minor.parse::<u32>().is_ok() {
                ok("")
            } else {
                unknown(format!("sh -c {script:?}"))
            };
        }
        if script == "grep -q hypervisor /proc/cpuinfo" {
            return if self.options.vm { ok("") } else { fail(1, "") };
        }
        if script == "test -d /proc/driver/nvidia" {
            // Only while the module is loaded.
            let loaded = self.driver == DriverKind::GpuOperator || self.modules.contains("nvidia");
            return if loaded { ok("") } else { fail(1, "") };
        }
        if let Some(rest) = script.strip_prefix("if [ -e /sys/bus/pci/devices/") {
            let sysfs = rest.split(' ').next().unwrap_or_default();
            let expected = format!(
                "if [ -e /sys/bus/pci/devices/{sysfs} ]; then echo 1 > /sys/bus/pci/devices/{sysfs}/remove; fi"
            );
            if script != expected {
                return unknown(format!("sh -c {script:?}"));
            }
            if let Some(gpu) = self.listed().into_iter().find(|g| g.bus_sysfs() == sysfs) {
                self.removed.insert(gpu.uuid);
            }
            return ok("");
        }
        if script.starts_with("for f in /proc/driver/nvidia/gpus/*/information;") {
            let mut text = String::new();
            for g in self.listed() {
                text.push_str(&format!(
                    "Model: \t\t NVIDIA A100-PCIE-40GB\nGPU UUID: \t {}\nDevice Minor: \t {}\nBus Location: \t {}\n%%\n",
                    g.uuid,
                    g.minor,
                    g.bus_sysfs()
                ));
            }
            return ok(text);
        }
        unknown(format!("sh -c {script:?}"))
    }

    fn smi(&mut self, args: &[&str]) -> Output {
        match args {
            [] => self.smi_summary(),
            [query, format] if query.starts_with("--query-gpu=") && *format == SMI_FORMAT => {
                self.smi_query_gpus(query)
            }
            ["--query-compute-apps=gpu_uuid,process_name", format] if *format == SMI_FORMAT => {
                self.smi_compute_apps()
            }
            ["drain", "-p", bus, "-q"] => self.smi_drain_state(bus),
            ["drain", "-p", bus, "-m", "1"] => match self.gpu_by_bus(bus) {
                Some(g) => {
                    self.maintenance.insert(g.uuid);
                    ok(format!(
                        "Successfully set GPU {bus} drain state to: draining.\n"
                    ))
                }
                None => fail(6, format!("Unable to find device {bus}")),
            },
            ["drain", "-p", bus, "-r"] => self.smi_remove(bus),
            ["-i", uuid, "-pm", "0"] => {
                let Some(g) = self.gpus.get_mut(*uuid) else {
                    return fail(6, format!("No devices were found matching {uuid}"));
                };
                g.persistence = false;
                ok(format!(
                    "Disabled persistence mode for GPU {uuid}.\nAll done.\n"
                ))
            }
            _ => unknown(format!("nvidia-smi {args:?}")),
        }
    }

    /// `nvidia-smi`: the banner and the number of GPUs.
    fn smi_summary(&self) -> Output {
        let listed = self.listed();
        if listed.is_empty() {
            return no_devices();
        }
        ok(format!(
            "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |\n{} GPUs\n",
            listed.len()
        ))
    }

    /// `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`.
    fn smi_query_gpus(&self, query: &str) -> Output {
        let listed = self.listed();
        if listed.is_empty() {
            return no_devices();
        }
        let fields: Vec<&str> = query
            .strip_prefix("--query-gpu=")
            .unwrap_or_default()
            .split(',')
            .collect();
        let mut text = String::new();
        for g in &listed {
            let mut values = Vec::new();
            for f in &fields {
                values.push(match *f {
                    "device_minor" => g.minor.to_string(),
                    "gpu_uuid" => g.uuid.clone(),
                    "pci.bus_id" => g.bus_smi(),
                    other => {
                        return fail(
                            2,
                            format!("Field \"{other}\" is not a valid field to query."),
                        );
                    }
                });
            }
            text.push_str(&values.join(", "));
            text.push('\n');
        }
        ok(text)
    }

    /// `nvidia-smi --query-compute-apps=gpu_uuid,process_name`: the processes on GPUs.
    fn smi_compute_apps(&self) -> Output {
        let listed = self.listed();
        if listed.is_empty() {
            return no_devices();
        }
        let mut text = String::new();
        for g in &listed {
            for p in self.busy.get(&g.uuid).into_iter().flatten() {
                text.push_str(&format!("{}, {p}\n", g.uuid));
            }
        }
        ok(text)
    }

    /// `nvidia-smi drain -p <bus> -q`.
    fn smi_drain_state(&self, bus: &str) -> Output {
        match self.gpu_by_bus(bus) {
            Some(_) if self.quirks.drain_query_reply.is_some() => {
                ok(self.quirks.drain_query_reply.clone().unwrap_or_default())
            }
            Some(g) if self.maintenance.contains(&g.uuid) => {
                ok(format!("The current drain state of {bus} is: draining\n"))
            }
            Some(_) => ok(format!(
                "The current drain state of {bus} is: not draining\n"
            )),
            None => fail(6, format!("Unable to find device {bus}")),
        }
    }

    /// `nvidia-smi drain -p <bus> -r`: removes a drained GPU nobody holds.
    fn smi_remove(&mut self, bus: &str) -> Output {
        match self.gpu_by_bus(bus) {
            Some(_) if self.quirks.reset_fails => {
                fail(3, format!("Failed to remove GPU {bus}: Not Supported"))
            }
            Some(g) if self.maintenance.contains(&g.uuid) => {
                if !self.holders_of(g.minor).is_empty() {
                    return fail(
                        3,
                        format!("Failed to remove GPU {bus}: In use by another client"),
                    );
                }
                self.removed.insert(g.uuid);
                ok(format!("Successfully removed GPU {bus} from the system.\n"))
            }
            Some(_) => fail(
                3,
                format!("GPU {bus} must be in drain state before removal"),
            ),
            None => fail(6, format!("Unable to find device {bus}")),
        }
    }
}

/// The output format every `nvidia-smi` query the operator runs asks for.
const SMI_FORMAT: &str = "--format=csv,noheader,nounits";

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn host_node() -> NodeState {
        let mut n = NodeState::new("m", DriverKind::Host, NodeOptions::default());
        n.refresh(&["GPU-a".into()], &BTreeSet::new());
        n
    }

    #[test]
    fn pkill_never_finds_the_persistence_daemon_by_its_long_name() {
        let mut n = NodeState::new("m", DriverKind::GpuOperator, NodeOptions::default());
        n.start_persistenced();
        n.refresh(&["GPU-a".into()], &BTreeSet::new());
        let out = n.exec(
            PodKind::Driver,
            &argv(&["sh", "-c", "pkill -x nvidia-persistenced || true"]),
        );
        assert_eq!(out.code, 0);
        assert!(n.persistenced_pid().is_some());
        assert_eq!(
            n.holders_of(0),
            vec![format!("{} nvidia-persiste", n.persistenced_pid().unwrap())]
        );
        let script = "pid=$(cat /var/run/nvidia-persistenced/nvidia-persistenced.pid 2>/dev/null) || exit 0; [ \"$(cat /proc/$pid/comm 2>/dev/null)\" = nvidia-persiste ] && kill $pid; exit 0";
        assert_eq!(
            n.exec(PodKind::Driver, &argv(&["sh", "-c", script])).code,
            0
        );
        assert_eq!(n.persistenced_pid(), None);
        assert!(n.holders_of(0).is_empty());
    }

    #[test]
    fn host_modules_and_modinfo() {
        let mut n = host_node();
        let out = n.exec(
            PodKind::Agent,
            &argv(&["chroot", "/host-root", "modinfo", "nvidia"]),
        );
        assert_eq!(out.code, 0);
        // nvidia is in use while persistenced runs; drm and uvm are not.
        let out = n.exec(
            PodKind::Agent,
            &argv(&["chroot", "/host-root", "modprobe", "-r", "nvidia_drm"]),
        );
        assert_eq!(out.code, 0, "{out:?}");
        let out = n.exec(
            PodKind::Agent,
            &argv(&["chroot", "/host-root", "modprobe", "-r", "nvidia_uvm"]),
        );
        assert_eq!(out.code, 0);
        let out = n.exec(
            PodKind::Agent,
            &argv(&[
                "chroot",
                "/host-root",
                "modprobe",
                "-r",
                "nvidia_modeset",
                "nvidia",
            ]),
        );
        assert_eq!(out.code, 1);
        assert!(out.stderr.contains("nvidia is in use"), "{out:?}");
        // Without a GPU nothing is loaded after a reboot-like state: /proc/driver/nvidia
        // is gone, modinfo still finds the module.
        let mut bare = NodeState::new("m", DriverKind::Host, NodeOptions::default());
        let probe = argv(&[
            "chroot",
            "/host-root",
            "sh",
            "-c",
            "test -d /proc/driver/nvidia",
        ]);
        assert_eq!(bare.exec(PodKind::Agent, &probe).code, 1);
        let modinfo = argv(&["chroot", "/host-root", "modinfo", "nvidia"]);
        assert_eq!(bare.exec(PodKind::Agent, &modinfo).code, 0);
    }

    #[test]
    fn unknown_commands_fail_loudly() {
        let mut n = host_node();
        let out = n.exec(PodKind::Agent, &argv(&["nvidia-smi"]));
        assert!(out.unknown && out.code == 127);
        let out = n.exec(PodKind::Driver, &argv(&["nvidia-smi", "--bogus"]));
        assert!(out.unknown);
        let out = n.exec(
            PodKind::Agent,
            &argv(&["chroot", "/host-root", "sh", "-c", "rm -rf /"]),
        );
        assert!(out.unknown);
    }

    #[test]
    fn drain_sequence_removes_the_gpu() {
        let mut n = NodeState::new("m", DriverKind::GpuOperator, NodeOptions::default());
        n.refresh(&["GPU-a".into(), "GPU-b".into()], &BTreeSet::new());
        let bus = n.listed()[0].bus_smi();
        let q = n.exec(
            PodKind::Driver,
            &argv(&["nvidia-smi", "drain", "-p", &bus, "-q"]),
        );
        assert!(q.stdout.contains("not draining"));
        assert_eq!(
            n.exec(
                PodKind::Driver,
                &argv(&["nvidia-smi", "drain", "-p", &bus, "-r"])
            )
            .code,
            3
        );
        n.exec(
            PodKind::Driver,
            &argv(&["nvidia-smi", "drain", "-p", &bus, "-m", "1"]),
        );
        let r = n.exec(
            PodKind::Driver,
            &argv(&["nvidia-smi", "drain", "-p", &bus, "-r"]),
        );
        assert_eq!(r.code, 0);
        assert_eq!(n.listed().len(), 1);
    }
}
