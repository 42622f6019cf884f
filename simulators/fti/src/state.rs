//! The simulated fabric: machines, the devices attached to them, free pools per
//! (fabric, type, model), Cluster Manager specs and the changes still in progress.
//!
//! Like the real Fabric Manager, a machine belongs to one fabric (`fabric_id`, 1 unless
//! set) and can only take devices from that fabric's pools.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Cluster Manager status of an attached device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceStatus {
    AddInProgress,
    AddComplete,
    AddFailed,
    RemoveInProgress,
    RemoveFailed,
}

impl DeviceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceStatus::AddInProgress => "ADD_IN_PROGRESS",
            DeviceStatus::AddComplete => "ADD_COMPLETE",
            DeviceStatus::AddFailed => "ADD_FAILED",
            DeviceStatus::RemoveInProgress => "REMOVE_IN_PROGRESS",
            DeviceStatus::RemoveFailed => "REMOVE_FAILED",
        }
    }

    /// Whether the Cluster Manager counts the device in its spec's `device_count`.
    fn counts(self) -> bool {
        matches!(
            self,
            DeviceStatus::AddInProgress | DeviceStatus::AddComplete | DeviceStatus::RemoveFailed
        )
    }
}

/// A device as the simulator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDevice {
    /// Fabric device id (`res_uuid`).
    pub res_uuid: String,
    /// Device id (`res_serial_num` / CM `device_id`): `GPU-<uuid>` for `gpu`, otherwise
    /// the upper-cased type, a dash and a uuid.
    pub serial: String,
    pub res_type: String,
    pub model: String,
    pub res_name: String,
    /// `res_op_status`: `"0"` ok, `"1"` warning, `"2"` critical, anything else unknown.
    pub op_status: String,
    /// Cluster Manager status; FM attaches and seeded devices are `AddComplete`.
    pub status: DeviceStatus,
    pub status_reason: String,
    /// Machine uuid when attached, `None` in a free pool.
    pub machine: Option<String>,
    /// The fabric whose pool the device belongs to.
    pub fabric_id: u64,
}

/// The fabric a machine or device belongs to unless set otherwise.
pub const DEFAULT_FABRIC: u64 = 1;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("machine {0} not found")]
    UnknownMachine(String),
    #[error("resource {id} not found on machine {machine}")]
    UnknownDevice { machine: String, id: String },
    #[error("resource spec {0} not found")]
    UnknownSpec(String),
    #[error("no free resource of type {res_type}, model {model} (available: {available})")]
    NoFreeDevice {
        res_type: String,
        model: String,
        available: usize,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
}

struct Pending {
    /// `None` when the delay is too large to represent: never settles by itself.
    due: Option<Instant>,
    fail_reason: Option<String>,
}

struct Slot {
    device: SimDevice,
    pending: Option<Pending>,
}

pub(crate) struct Machine {
    pub uuid: String,
    pub name: String,
    pub mach_id: u64,
    pub fabric_id: u64,
    slots: Vec<Slot>,
}

impl Machine {
    pub fn devices(&self) -> impl Iterator<Item = &SimDevice> {
        self.slots.iter().map(|s| &s.device)
    }

    /// Whether a CM change is still running on this machine.
    pub fn busy(&self) -> bool {
        self.slots.iter().any(|s| s.pending.is_some())
    }
}

pub(crate) type SpecKey = (String, String);

/// A free pool: (fabric, type, model).
type PoolKey = (u64, String, String);

/// What an attach should do differently (from injected faults).
#[derive(Default)]
pub(crate) struct AttachOptions {
    pub no_free: bool,
    pub op_status: Option<String>,
    pub fail_reason: Option<String>,
}

pub(crate) struct Fabric {
    machines: Vec<Machine>,
    pools: BTreeMap<PoolKey, VecDeque<SimDevice>>,
    specs: BTreeMap<SpecKey, String>,
    next_mach_id: u64,
    next_res_seq: u64,
    pub cm_delay: Duration,
    pub max_per_spec: u32,
}

impl Fabric {
    pub fn new(cm_delay: Duration, max_per_spec: u32) -> Self {
        Self {
            machines: Vec::new(),
            pools: BTreeMap::new(),
            specs: BTreeMap::new(),
            next_mach_id: 1,
            next_res_seq: 1,
            cm_delay,
            max_per_spec,
        }
    }

    /// Adds a machine on the default fabric, or renames it when it exists.
    pub fn add_machine(&mut self, uuid: &str, name: &str) {
        if let Some(m) = self.machines.iter_mut().find(|m| m.uuid == uuid) {
            m.name = name.to_string();
            return;
        }
        self.machines.push(Machine {
            uuid: uuid.to_string(),
            name: name.to_string(),
            mach_id: self.next_mach_id,
            fabric_id: DEFAULT_FABRIC,
            slots: Vec::new(),
        });
        self.next_mach_id += 1;
    }

    /// Moves a machine to another fabric (its attached devices stay attached).
    pub fn set_machine_fabric(&mut self, uuid: &str, fabric_id: u64) -> Result<(), FabricError> {
        self.machine_mut(uuid)?.fabric_id = fabric_id;
        Ok(())
    }

    pub fn machine(&self, uuid: &str) -> Option<&Machine> {
        self.machines.iter().find(|m| m.uuid == uuid)
    }

    fn machine_mut(&mut self, uuid: &str) -> Result<&mut Machine, FabricError> {
        self.machines
            .iter_mut()
            .find(|m| m.uuid == uuid)
            .ok_or_else(|| FabricError::UnknownMachine(uuid.to_string()))
    }

    pub fn machines(&self) -> impl Iterator<Item = &Machine> {
        self.machines.iter()
    }

    /// The CM spec uuid of (type, model), created on first use.
    pub fn spec_uuid(&mut self, res_type: &str, model: &str) -> String {
        self.specs
            .entry((res_type.to_string(), model.to_string()))
            .or_insert_with(|| uuid::Uuid::new_v4().to_string())
            .clone()
    }

    pub fn specs(&self) -> impl Iterator<Item = (&SpecKey, &String)> {
        self.specs.iter()
    }

    fn spec_by_uuid(&self, spec_uuid: &str) -> Result<SpecKey, FabricError> {
        self.specs
            .iter()
            .find(|(_, u)| *u == spec_uuid)
            .map(|(k, _)| k.clone())
            .ok_or_else(|| FabricError::UnknownSpec(spec_uuid.to_string()))
    }

    fn new_device(&mut self, fabric_id: u64, res_type: &str, model: &str) -> SimDevice {
        self.spec_uuid(res_type, model);
        let id = uuid::Uuid::new_v4();
        let prefix = if res_type.eq_ignore_ascii_case("gpu") {
            "GPU".to_string()
        } else {
            res_type.to_ascii_uppercase()
        };
        let seq = self.next_res_seq;
        self.next_res_seq += 1;
        SimDevice {
            res_uuid: uuid::Uuid::new_v4().to_string(),
            serial: format!("{prefix}-{id}"),
            res_type: res_type.to_string(),
            model: model.to_string(),
            res_name: format!("{res_type}-{seq:04}"),
            op_status: "0".into(),
            status: DeviceStatus::AddComplete,
            status_reason: String::new(),
            machine: None,
            fabric_id,
        }
    }

    /// `n` new free devices of (type, model) in `fabric_id`'s pool.
    pub fn add_free(
        &mut self,
        fabric_id: u64,
        res_type: &str,
        model: &str,
        n: usize,
    ) -> Vec<SimDevice> {
        let created: Vec<SimDevice> = (0..n)
            .map(|_| self.new_device(fabric_id, res_type, model))
            .collect();
        self.pools
            .entry((fabric_id, res_type.to_string(), model.to_string()))
            .or_default()
            .extend(created.iter().cloned());
        created
    }

    /// Free devices of (type, model) in every fabric.
    pub fn free_count(&self, res_type: &str, model: &str) -> usize {
        self.pools
            .iter()
            .filter(|((_, t, m), _)| t == res_type && m == model)
            .map(|(_, p)| p.len())
            .sum()
    }

    /// Free devices of (type, model) in one fabric.
    pub fn free_in(&self, fabric_id: u64, res_type: &str, model: &str) -> usize {
        self.pools
            .get(&(fabric_id, res_type.to_string(), model.to_string()))
            .map_or(0, VecDeque::len)
    }

    /// Removes up to `n` free devices of (type, model) from `fabric_id`'s pool, as if
    /// another tenant or tool took them; returns how many went.
    pub fn take_free_away(
        &mut self,
        fabric_id: u64,
        res_type: &str,
        model: &str,
        n: usize,
    ) -> usize {
        let Some(pool) = self
            .pools
            .get_mut(&(fabric_id, res_type.to_string(), model.to_string()))
        else {
            return 0;
        };
        let n = n.min(pool.len());
        pool.drain(..n).count()
    }

    /// Seeds a new device, attached and complete, without touching the pool.
    pub fn attach_new(
        &mut self,
        machine: &str,
        res_type: &str,
        model: &str,
    ) -> Result<SimDevice, FabricError> {
        let fabric_id = self.machine_mut(machine)?.fabric_id;
        let mut device = self.new_device(fabric_id, res_type, model);
        device.machine = Some(machine.to_string());
        self.machine_mut(machine)?.slots.push(Slot {
            device: device.clone(),
            pending: None,
        });
        Ok(device)
    }

    pub fn device_mut(&mut self, id: &str) -> Option<&mut SimDevice> {
        let attached = self
            .machines
            .iter_mut()
            .flat_map(|m| m.slots.iter_mut().map(|s| &mut s.device));
        let free = self.pools.values_mut().flat_map(|p| p.iter_mut());
        attached
            .chain(free)
            .find(|d| d.serial == id || d.res_uuid == id)
    }

    /// Applies CM changes whose delay has passed (all of them with `None`).
    pub fn settle(&mut self, now: Option<Instant>) {
        let mut freed = Vec::new();
        for machine in &mut self.machines {
            machine.slots.retain_mut(|slot| {
                let Some(pending) = &slot.pending else {
                    return true;
                };
                if now.is_some_and(|now| pending.due.is_none_or(|due| due > now)) {
                    return true;
                }
                let fail = pending.fail_reason.clone();
                slot.pending = None;
                let d = &mut slot.device;
                match (d.status, fail) {
                    (DeviceStatus::AddInProgress, None) => d.status = DeviceStatus::AddComplete,
                    (DeviceStatus::AddInProgress, Some(reason)) => {
                        d.status = DeviceStatus::AddFailed;
                        d.status_reason = reason;
                    }
                    (DeviceStatus::RemoveInProgress, Some(reason)) => {
                        d.status = DeviceStatus::RemoveFailed;
                        d.status_reason = reason;
                    }
                    (DeviceStatus::RemoveInProgress, None) => {
                        freed.push(d.clone());
                        return false;
                    }
                    _ => {}
                }
                true
            });
        }
        for device in freed {
            self.return_to_pool(device);
        }
    }

    fn return_to_pool(&mut self, mut device: SimDevice) {
        device.machine = None;
        device.status = DeviceStatus::AddComplete;
        device.status_reason.clear();
        self.pools
            .entry((
                device.fabric_id,
                device.res_type.clone(),
                device.model.clone(),
            ))
            .or_default()
            .push_back(device);
    }

    /// `n` free devices of (type, model) from the pool of `machine`'s fabric.
    fn take_free(
        &mut self,
        machine: &str,
        res_type: &str,
        model: &str,
        n: usize,
        opts: &AttachOptions,
    ) -> Result<Vec<SimDevice>, FabricError> {
        let fabric_id = self.machine_mut(machine)?.fabric_id;
        let available = if opts.no_free {
            0
        } else {
            self.free_in(fabric_id, res_type, model)
        };
        if available < n {
            return Err(FabricError::NoFreeDevice {
                res_type: res_type.to_string(),
                model: model.to_string(),
                available,
            });
        }
        let pool = self
            .pools
            .entry((fabric_id, res_type.to_string(), model.to_string()))
            .or_default();
        let mut taken: Vec<SimDevice> = pool.drain(..n).collect();
        if let Some(op) = &opts.op_status {
            for d in &mut taken {
                d.op_status = op.clone();
            }
        }
        Ok(taken)
    }

    /// FM attach: `n` devices of (type, model) from the pool, complete at once.
    pub fn fm_attach(
        &mut self,
        machine: &str,
        res_type: &str,
        model: &str,
        n: usize,
        opts: &AttachOptions,
    ) -> Result<Vec<SimDevice>, FabricError> {
        let mut taken = self.take_free(machine, res_type, model, n, opts)?;
        for d in &mut taken {
            d.machine = Some(machine.to_string());
            d.status = DeviceStatus::AddComplete;
        }
        let m = self.machine_mut(machine)?;
        m.slots.extend(taken.iter().map(|d| Slot {
            device: d.clone(),
            pending: None,
        }));
        Ok(taken)
    }

    /// FM detach by fabric device id: the device goes back to its pool at once.
    pub fn fm_detach(
        &mut self,
        machine: &str,
        res_uuid: &str,
        res_type: Option<&str>,
    ) -> Result<SimDevice, FabricError> {
        let m = self.machine_mut(machine)?;
        let pos = m
            .slots
            .iter()
            .position(|s| s.device.res_uuid == res_uuid)
            .ok_or_else(|| FabricError::UnknownDevice {
                machine: machine.to_string(),
                id: res_uuid.to_string(),
            })?;
        if let Some(t) = res_type
            && t != m.slots[pos].device.res_type
        {
            return Err(FabricError::BadRequest(format!(
                "resource {res_uuid} is of type {}, not {t}",
                m.slots[pos].device.res_type
            )));
        }
        let slot = m.slots.remove(pos);
        self.return_to_pool(slot.device.clone());
        Ok(slot.device)
    }

    /// Takes a device (by serial or `res_uuid`) off its machine and back to its pool,
    /// whatever CM change it was in.
    pub fn detach_any(&mut self, id: &str) -> Option<SimDevice> {
        let slot = self.machines.iter_mut().find_map(|m| {
            let pos = m
                .slots
                .iter()
                .position(|s| s.device.serial == id || s.device.res_uuid == id)?;
            Some(m.slots.remove(pos))
        })?;
        self.return_to_pool(slot.device.clone());
        Some(slot.device)
    }

    /// The CM `device_count` of a spec on a machine.
    pub fn cm_count(&self, machine: &Machine, key: &SpecKey) -> u32 {
        let n = machine
            .devices()
            .filter(|d| d.res_type == key.0 && d.model == key.1 && d.status.counts())
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn cm_current(&self, machine: &str, key: &SpecKey) -> Result<u32, FabricError> {
        let m = self
            .machine(machine)
            .ok_or_else(|| FabricError::UnknownMachine(machine.to_string()))?;
        Ok(self.cm_count(m, key))
    }

    /// CM `increase_resource_count`: new devices start `ADD_IN_PROGRESS`.
    pub fn cm_increase(
        &mut self,
        machine: &str,
        spec_uuid: &str,
        device_count: u32,
        opts: &AttachOptions,
        now: Instant,
    ) -> Result<Vec<SimDevice>, FabricError> {
        let key = self.spec_by_uuid(spec_uuid)?;
        let current = self.cm_current(machine, &key)?;
        if device_count <= current {
            return Err(FabricError::BadRequest(format!(
                "device_count {device_count} must be greater than the current count {current}"
            )));
        }
        if device_count > self.max_per_spec {
            return Err(FabricError::BadRequest(format!(
                "device_count {device_count} exceeds max_resspec_count {}",
                self.max_per_spec
            )));
        }
        let n = usize::try_from(device_count - current).unwrap_or(usize::MAX);
        let mut taken = self.take_free(machine, &key.0, &key.1, n, opts)?;
        let due = now.checked_add(self.cm_delay);
        for d in &mut taken {
            d.machine = Some(machine.to_string());
            d.status = DeviceStatus::AddInProgress;
        }
        let m = self.machine_mut(machine)?;
        m.slots.extend(taken.iter().map(|d| Slot {
            device: d.clone(),
            pending: Some(Pending {
                due,
                fail_reason: opts.fail_reason.clone(),
            }),
        }));
        Ok(taken)
    }

    /// CM `remove_resources`: listed devices go `REMOVE_IN_PROGRESS`.
    ///
    /// `device_count` must be the current count minus the listed devices it counts;
    /// current minus all listed devices is accepted too, because listed `ADD_FAILED`
    /// devices are not counted yet the Go operator always sends current − 1.
    pub fn cm_remove(
        &mut self,
        machine: &str,
        spec_uuid: &str,
        device_count: u32,
        device_ids: &[String],
        fail_reason: Option<String>,
        now: Instant,
    ) -> Result<Vec<SimDevice>, FabricError> {
        let key = self.spec_by_uuid(spec_uuid)?;
        let current = self.cm_current(machine, &key)?;
        if device_ids.is_empty() {
            return Err(FabricError::BadRequest(
                "remove_resources.devices is empty".into(),
            ));
        }
        let due = now.checked_add(self.cm_delay);
        let m = self.machine_mut(machine)?;
        let mut positions = Vec::new();
        for id in device_ids {
            let pos = m
                .slots
                .iter()
                .position(|s| {
                    s.device.serial == *id && s.device.res_type == key.0 && s.device.model == key.1
                })
                .ok_or_else(|| FabricError::UnknownDevice {
                    machine: machine.to_string(),
                    id: id.clone(),
                })?;
            if positions.contains(&pos) {
                return Err(FabricError::BadRequest(format!(
                    "device {id} is listed twice"
                )));
            }
            if m.slots[pos].pending.is_some() {
                return Err(FabricError::Conflict(format!(
                    "device {id} is {}",
                    m.slots[pos].device.status.as_str()
                )));
            }
            positions.push(pos);
        }
        let counted = positions
            .iter()
            .filter(|p| m.slots[**p].device.status.counts())
            .count();
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let exact = current.saturating_sub(to_u32(counted));
        let all = current.saturating_sub(to_u32(positions.len()));
        if device_count != exact && device_count != all {
            return Err(FabricError::BadRequest(format!(
                "device_count {device_count} does not match removing {} of {current} devices",
                positions.len()
            )));
        }
        let mut marked = Vec::new();
        for pos in positions {
            let slot = &mut m.slots[pos];
            slot.device.status = DeviceStatus::RemoveInProgress;
            slot.device.status_reason.clear();
            slot.pending = Some(Pending {
                due,
                fail_reason: fail_reason.clone(),
            });
            marked.push(slot.device.clone());
        }
        Ok(marked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric() -> Fabric {
        let mut f = Fabric::new(Duration::from_secs(10), 8);
        f.add_machine("m1", "node-1");
        f.add_free(DEFAULT_FABRIC, "gpu", "A100", 2);
        f
    }

    #[test]
    fn fm_attach_detach_moves_between_pool_and_machine() {
        let mut f = fabric();
        let got = f
            .fm_attach("m1", "gpu", "A100", 1, &AttachOptions::default())
            .unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].serial.starts_with("GPU-"));
        assert_eq!(f.free_count("gpu", "A100"), 1);
        let err = f
            .fm_attach("m1", "gpu", "A100", 2, &AttachOptions::default())
            .unwrap_err();
        assert!(matches!(
            err,
            FabricError::NoFreeDevice { available: 1, .. }
        ));
        f.fm_detach("m1", &got[0].res_uuid, Some("gpu")).unwrap();
        assert_eq!(f.free_count("gpu", "A100"), 2);
        assert!(f.fm_detach("m1", &got[0].res_uuid, None).is_err());
        assert!(
            f.fm_attach("nope", "gpu", "A100", 1, &AttachOptions::default())
                .is_err()
        );
    }

    #[test]
    fn cm_changes_settle_after_delay() {
        let mut f = fabric();
        let spec = f.spec_uuid("gpu", "A100");
        let t0 = Instant::now();
        let added = f
            .cm_increase("m1", &spec, 1, &AttachOptions::default(), t0)
            .unwrap();
        assert_eq!(added[0].status, DeviceStatus::AddInProgress);
        f.settle(Some(t0 + Duration::from_secs(5)));
        assert!(f.machine("m1").unwrap().busy());
        f.settle(Some(t0 + Duration::from_secs(10)));
        let m = f.machine("m1").unwrap();
        assert!(!m.busy());
        assert_eq!(
            m.devices().next().unwrap().status,
            DeviceStatus::AddComplete
        );
        assert!(
            f.cm_increase("m1", &spec, 1, &AttachOptions::default(), t0)
                .is_err()
        );

        let id = added[0].serial.clone();
        assert!(
            f.cm_remove("m1", &spec, 1, std::slice::from_ref(&id), None, t0)
                .is_err()
        );
        f.cm_remove(
            "m1",
            &spec,
            0,
            std::slice::from_ref(&id),
            Some("stuck".into()),
            t0,
        )
        .unwrap();
        f.settle(None);
        let d = f.machine("m1").unwrap().devices().next().unwrap().clone();
        assert_eq!(
            (d.status, d.status_reason.as_str()),
            (DeviceStatus::RemoveFailed, "stuck")
        );
        f.cm_remove("m1", &spec, 0, &[id], None, t0).unwrap();
        f.settle(None);
        assert_eq!(f.machine("m1").unwrap().devices().count(), 0);
        assert_eq!(f.free_count("gpu", "A100"), 2);
    }
}
