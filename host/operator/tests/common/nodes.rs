//! The one stand-in of the end-to-end tests: a `CommandRunner` whose nodes are the
//! fabric simulator's machines. A GPU the simulator has on a node's machine is what
//! nvidia-smi lists there; tests mark GPUs busy; drain commands act on per-GPU state.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use cro_operator::nodeops::{CommandRunner, ExecOutput, NodeOpsError, PodRef};
use fabric_sim::{DeviceStatus, FabricSim, Route};
use futures::future::BoxFuture;

/// See [`SimNodes::set_hook`].
pub type Hook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

#[derive(Default)]
struct GpuSlot {
    minor: u32,
    bus: u8,
}

#[derive(Default)]
struct State {
    machines: HashMap<String, String>,
    /// Stable minor number and bus per GPU uuid, assigned on first sight per node.
    slots: HashMap<String, GpuSlot>,
    next_slot: HashMap<String, u32>,
    /// GPU uuid → process names running on it.
    busy: BTreeMap<String, Vec<String>>,
    /// GPU uuid → `<pid> <command>` of a process holding its device file.
    holders: BTreeMap<String, String>,
    /// GPUs put in maintenance (`drain -m 1`) and reset/removed (`drain -r`), with the
    /// simulator's request count when marked: a detach after that means the GPU left
    /// the machine (and may be back), so the mark no longer applies.
    maintenance: BTreeMap<String, u64>,
    removed: BTreeMap<String, u64>,
    commands: Vec<(String, Vec<String>)>,
    unknown: Vec<String>,
    /// Called after each command took effect; when it returns true the command never
    /// returns (a test kills the operator there).
    hook: Option<Hook>,
}

#[derive(Clone)]
pub struct SimNodes {
    sim: FabricSim,
    state: Arc<Mutex<State>>,
}

fn out(stdout: impl Into<String>) -> ExecOutput {
    ExecOutput {
        stdout: stdout.into(),
        stderr: String::new(),
        exit_code: 0,
    }
}

fn fail(code: i32, stderr: impl Into<String>) -> ExecOutput {
    ExecOutput {
        stdout: String::new(),
        stderr: stderr.into(),
        exit_code: code,
    }
}

/// nvidia-smi prints this on stdout and exits 6 on a node without GPUs.
fn no_devices() -> ExecOutput {
    ExecOutput {
        stdout: "No devices were found\n".into(),
        stderr: String::new(),
        exit_code: 6,
    }
}

impl SimNodes {
    pub fn new(sim: FabricSim) -> Self {
        Self {
            sim,
            state: Arc::default(),
        }
    }

    pub fn add_node(&self, node: &str, machine: &str) {
        self.state
            .lock()
            .unwrap()
            .machines
            .insert(node.into(), machine.into());
    }

    pub fn set_busy(&self, gpu: &str, processes: &[&str]) {
        let mut s = self.state.lock().unwrap();
        if processes.is_empty() {
            s.busy.remove(gpu);
        } else {
            s.busy.insert(
                gpu.into(),
                processes.iter().map(|p| p.to_string()).collect(),
            );
        }
    }

    /// Makes a process hold the GPU's `/dev/nvidia<minor>` (None: nobody).
    pub fn set_holder(&self, gpu: &str, holder: Option<&str>) {
        let mut s = self.state.lock().unwrap();
        match holder {
            Some(h) => s.holders.insert(gpu.into(), h.into()),
            None => s.holders.remove(gpu),
        };
    }

    /// GPUs nvidia-smi lists on `node` now.
    pub fn listed(&self, node: &str) -> Vec<String> {
        let mut s = self.state.lock().unwrap();
        self.gpus(&mut s, node)
            .into_iter()
            .map(|(_, uuid, _)| uuid)
            .collect()
    }

    pub fn set_hook(&self, hook: Option<Hook>) {
        self.state.lock().unwrap().hook = hook;
    }

    pub fn commands(&self) -> Vec<(String, Vec<String>)> {
        self.state.lock().unwrap().commands.clone()
    }

    /// Commands the runner did not recognise (each a test failure).
    pub fn unknown_commands(&self) -> Vec<String> {
        self.state.lock().unwrap().unknown.clone()
    }

    /// GPUs nvidia-smi on `node` lists now, with minor and bus id.
    fn gpus(&self, s: &mut State, node: &str) -> Vec<(u32, String, u8)> {
        let Some(machine) = s.machines.get(node).cloned() else {
            return Vec::new();
        };
        let attached: Vec<String> = self
            .sim
            .machine_devices(&machine)
            .into_iter()
            .filter(|d| d.res_type == "gpu" && d.status == DeviceStatus::AddComplete)
            .map(|d| d.serial)
            .collect();
        // A GPU that left the machine forgets its drain state (it may come back later).
        let marked: Vec<(String, u64)> = s
            .removed
            .iter()
            .chain(s.maintenance.iter())
            .map(|(g, seq)| (g.clone(), *seq))
            .collect();
        for (g, seq) in marked {
            if !attached.contains(&g) || self.detached_since(&g, seq) {
                s.removed.remove(&g);
                s.maintenance.remove(&g);
                s.slots.remove(&g);
            }
        }
        let mut list = Vec::new();
        for uuid in attached {
            if s.removed.contains_key(&uuid) {
                continue;
            }
            if !s.slots.contains_key(&uuid) {
                let n = s.next_slot.entry(node.into()).or_insert(0);
                let slot = GpuSlot {
                    minor: *n,
                    bus: 0x3b + (*n as u8),
                };
                *n += 1;
                s.slots.insert(uuid.clone(), slot);
            }
            let slot = &s.slots[&uuid];
            list.push((slot.minor, uuid, slot.bus));
        }
        list
    }

    fn answer(&self, node: &str, cmd: &[String]) -> ExecOutput {
        let mut s = self.state.lock().unwrap();
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        match args.as_slice() {
            [
                "nvidia-smi",
                "--query-gpu=device_minor,gpu_uuid,pci.bus_id",
                _fmt,
            ] => {
                let gpus = self.gpus(&mut s, node);
                if gpus.is_empty() {
                    return no_devices();
                }
                out(gpus
                    .iter()
                    .map(|(minor, uuid, bus)| format!("{minor}, {uuid}, 00000000:{bus:02X}:00.0\n"))
                    .collect::<String>())
            }
            [
                "nvidia-smi",
                "--query-compute-apps=gpu_uuid,process_name",
                _fmt,
            ] => {
                let gpus = self.gpus(&mut s, node);
                if gpus.is_empty() {
                    return no_devices();
                }
                let mut text = String::new();
                for (_, uuid, _) in &gpus {
                    for p in s.busy.get(uuid).into_iter().flatten() {
                        text.push_str(&format!("{uuid}, {p}\n"));
                    }
                }
                out(text)
            }
            ["nvidia-smi"] => {
                let n = self.gpus(&mut s, node).len();
                if n == 0 {
                    return no_devices();
                }
                out(format!(
                    "+-----------------------------------------------------------------------------+\n| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n{n} GPUs\n"
                ))
            }
            ["nvidia-smi", "drain", "-p", bus, "-q"] => match self.gpu_by_bus(&mut s, node, bus) {
                Some(uuid) if s.maintenance.contains_key(&uuid) => {
                    out(format!("The current drain state of {bus} is: draining\n"))
                }
                Some(_) => out(format!(
                    "The current drain state of {bus} is: not draining\n"
                )),
                None => fail(6, format!("Unable to find device {bus}")),
            },
            ["nvidia-smi", "drain", "-p", bus, "-m", "1"] => {
                match self.gpu_by_bus(&mut s, node, bus) {
                    Some(uuid) => {
                        let seq = self.last_request();
                        s.maintenance.insert(uuid, seq);
                        out(format!(
                            "Successfully set GPU {bus} drain state to: draining.\n"
                        ))
                    }
                    None => fail(6, format!("Unable to find device {bus}")),
                }
            }
            ["nvidia-smi", "drain", "-p", bus, "-r"] => match self.gpu_by_bus(&mut s, node, bus) {
                Some(uuid) if s.maintenance.contains_key(&uuid) => {
                    let seq = self.last_request();
                    s.removed.insert(uuid, seq);
                    out(format!("Successfully removed GPU {bus} from the system.\n"))
                }
                Some(_) => fail(
                    3,
                    format!("GPU {bus} must be in drain state before removal"),
                ),
                None => fail(6, format!("Unable to find device {bus}")),
            },
            ["nvidia-smi", "-i", uuid, "-pm", "0"] => out(format!(
                "Disabled persistence mode for GPU {uuid}.\nAll done.\n"
            )),
            ["sh", "-c", "pkill -x nvidia-persistenced || true"] => out(""),
            // host_sh: the chroot wrapper with the script as its last argument.
            ["sh", "-c", wrapper, "sh", script] if wrapper.contains("/run/nvidia/driver") => {
                host_script(&s, script)
            }
            _ => fail(127, format!("test runner: unknown command {args:?}")),
        }
    }

    fn last_request(&self) -> u64 {
        self.sim.requests().last().map_or(0, |r| r.seq)
    }

    /// Whether the fabric was asked to detach `gpu` after request `seq`.
    fn detached_since(&self, gpu: &str, seq: u64) -> bool {
        let Some(device) = self.sim.device(gpu) else {
            return true;
        };
        [Route::FmDetach, Route::CmResize].into_iter().any(|route| {
            self.sim.requests_to(route).iter().any(|r| {
                let body = String::from_utf8_lossy(&r.body);
                r.seq > seq && (body.contains(&device.res_uuid) || body.contains(gpu))
            })
        })
    }

    fn gpu_by_bus(&self, s: &mut State, node: &str, bus: &str) -> Option<String> {
        self.gpus(s, node).into_iter().find_map(|(_, uuid, b)| {
            let smi = format!("00000000:{b:02X}:00.0");
            let short = format!("0000:{b:02X}:00.0");
            (bus == smi || bus == short).then_some(uuid)
        })
    }
}

fn host_script(s: &State, script: &str) -> ExecOutput {
    if script.contains("/proc/[0-9]*") {
        // The holders of /dev/nvidia<minor>: the script names the device file.
        let held = s.holders.iter().find_map(|(uuid, holder)| {
            let minor = s.slots.get(uuid)?.minor;
            script
                .contains(&format!("= /dev/nvidia{minor} ]"))
                .then(|| format!("{holder}\n"))
        });
        out(held.unwrap_or_default())
    } else if script.starts_with("rm -f /dev/nvidia") {
        out("")
    } else if script == "grep -q hypervisor /proc/cpuinfo" {
        // A bare-metal node.
        fail(1, "")
    } else if script == "test -d /proc/driver/nvidia" {
        out("")
    } else {
        fail(127, format!("test runner: unknown script {script:?}"))
    }
}

impl CommandRunner for SimNodes {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(async move {
            let hook = {
                let mut s = self.state.lock().unwrap();
                s.commands.push((pod.node.clone(), command.to_vec()));
                s.hook.clone()
            };
            let answer = self.answer(&pod.node, command);
            if answer.exit_code == 127 {
                self.state
                    .lock()
                    .unwrap()
                    .unknown
                    .push(answer.stderr.clone());
            }
            if let Some(hook) = hook
                && hook(&command.join(" ").chars().take(60).collect::<String>())
            {
                std::future::pending::<()>().await;
            }
            Ok(answer)
        })
    }
}
