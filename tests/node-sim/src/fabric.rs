//! What a simulated node's GPUs follow: a fabric that says which GPUs are attached to a
//! machine now. Two fabrics are simulated: the FTI fabric manager ([`FabricSim`]), whose
//! devices carry the GPU's UUID as their serial, and NEC CDI Manager ([`CdimNodes`] over
//! [`CdimSim`]), whose GPUs have a CDIM device id and no UUID at all.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cdim_sim::{ApplyStatus, CdimSim};
use fabric_sim::{DeviceStatus, FabricSim, Route};

/// Why [`CdimNodes::set_gpu_uuid`] refused.
#[derive(Debug, thiserror::Error)]
pub enum UuidError {
    #[error("CDIM has no GPU {0}")]
    UnknownGpu(String),
    #[error("{uuid} is the UUID of GPU {gpu} already")]
    Taken { uuid: String, gpu: String },
    #[error("GPU {gpu} was shown as {uuid} already")]
    AlreadyShown { gpu: String, uuid: String },
}

/// A fabric the simulated nodes' GPUs follow. A "machine" is the fabric's name for a
/// node's host (an FTI machine uuid, a CDIM node id).
pub trait NodeFabric: Send + Sync {
    /// The GPUs attached to `machine` now, by the UUID the node's driver shows for each
    /// (what `nvidia-smi --query-gpu=gpu_uuid` prints).
    fn gpus_on(&self, machine: &str) -> Vec<String>;

    /// A mark of the fabric's history now, for [`NodeFabric::detached_since`].
    fn mark(&self) -> u64;

    /// Whether GPU `uuid` (as [`NodeFabric::gpus_on`] names it) left its machine after
    /// `mark` (FTI: the fabric was asked to take it away): a GPU drained on the node and
    /// detached since then forgets its drain marks (it may come back, fresh). Until then
    /// a GPU removed on the node stays removed, though still attached.
    fn detached_since(&self, uuid: &str, mark: u64) -> bool;
}

/// FTI: a GPU is attached once its device is `ADD_COMPLETE` on the machine; its serial
/// is the UUID the node shows.
impl NodeFabric for FabricSim {
    fn gpus_on(&self, machine: &str) -> Vec<String> {
        self.machine_devices(machine)
            .into_iter()
            .filter(|d| d.res_type == "gpu" && d.status == DeviceStatus::AddComplete)
            .map(|d| d.serial)
            .collect()
    }

    fn mark(&self) -> u64 {
        self.last_seq()
    }

    fn detached_since(&self, uuid: &str, mark: u64) -> bool {
        let Some(device) = self.device(uuid) else {
            return true;
        };
        if device.machine.is_none() {
            return true;
        }
        self.any_request_since(mark, &[Route::FmDetach, Route::CmResize], |r| {
            let body = String::from_utf8_lossy(&r.body);
            body.contains(&device.res_uuid) || body.contains(uuid)
        })
    }
}

/// NEC CDIM as the nodes see it: a GPU is on a node once a layout apply has connected it
/// to the node's I/O adapter (the machine is the CDIM node id).
///
/// CDIM reports no GPU UUID (docs/nec-provider.md), but a node's driver shows one: each
/// GPU gets its own `GPU-<uuid>` here the first time it is looked at, unrelated to its
/// CDIM device id, as a real GPU's UUID is unrelated to CDIM's inventory. A test that
/// needs it (an administrator copying it from `nvidia-smi` into
/// `NEC_PROVISIONAL_GPU_UUID`) asks [`CdimNodes::gpu_uuid`].
pub struct CdimNodes {
    sim: CdimSim,
    /// CDIM device id → the UUID the node's driver shows.
    uuids: Mutex<BTreeMap<String, String>>,
}

impl CdimNodes {
    pub fn new(sim: CdimSim) -> Arc<CdimNodes> {
        Arc::new(CdimNodes {
            sim,
            uuids: Mutex::default(),
        })
    }

    pub fn sim(&self) -> &CdimSim {
        &self.sim
    }

    fn uuids(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.uuids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The UUID a node's driver shows for the GPU with CDIM device id `device_id`.
    pub fn gpu_uuid(&self, device_id: &str) -> String {
        self.uuids()
            .entry(device_id.to_owned())
            .or_insert_with(|| format!("GPU-{}", uuid::Uuid::new_v4()))
            .clone()
    }

    /// Gives the GPU with CDIM device id `device_id` the UUID `uuid` on the nodes (a
    /// test that must know a GPU's UUID before it is attached). A GPU already shown under
    /// another UUID, or a UUID another GPU has, is refused.
    pub fn set_gpu_uuid(&self, device_id: &str, uuid: &str) -> Result<(), UuidError> {
        if self.sim.gpu(device_id).is_none() {
            return Err(UuidError::UnknownGpu(device_id.to_owned()));
        }
        let mut uuids = self.uuids();
        if let Some((other, _)) = uuids
            .iter()
            .find(|(id, u)| u.as_str() == uuid && id.as_str() != device_id)
        {
            return Err(UuidError::Taken {
                uuid: uuid.to_owned(),
                gpu: other.clone(),
            });
        }
        match uuids.get(device_id) {
            Some(shown) if shown != uuid => Err(UuidError::AlreadyShown {
                gpu: device_id.to_owned(),
                uuid: shown.clone(),
            }),
            _ => {
                uuids.insert(device_id.to_owned(), uuid.to_owned());
                Ok(())
            }
        }
    }

    /// The CDIM device id of the GPU a node shows as `uuid`, if it was ever shown.
    pub fn device_id(&self, uuid: &str) -> Option<String> {
        self.uuids()
            .iter()
            .find(|(_, u)| u.as_str() == uuid)
            .map(|(id, _)| id.clone())
    }
}

impl NodeFabric for CdimNodes {
    fn gpus_on(&self, machine: &str) -> Vec<String> {
        self.sim
            .gpus_on(machine)
            .into_iter()
            .map(|g| self.gpu_uuid(&g.id))
            .collect()
    }

    /// The number of layout applies posted so far.
    fn mark(&self) -> u64 {
        u64::try_from(self.sim.applies().len()).unwrap_or(u64::MAX)
    }

    fn detached_since(&self, uuid: &str, mark: u64) -> bool {
        let Some(id) = self.device_id(uuid) else {
            return true;
        };
        if self.sim.gpu(&id).is_none_or(|g| g.node.is_none()) {
            return true;
        }
        // Left and came back: a disconnect posted after the mark that has completed. One
        // still running has not taken the GPU off the node yet (a drained GPU stays
        // removed from the driver until then).
        let skip = usize::try_from(mark).unwrap_or(usize::MAX);
        self.sim.applies().iter().skip(skip).any(|a| {
            a.status == ApplyStatus::Completed
                && a.procedures
                    .iter()
                    .any(|(op, _, gpu)| op == "disconnect" && *gpu == id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn cdim_gpus_follow_the_layout_applies_under_their_own_uuids() {
        let sim = CdimSim::start(cdim_sim::SimConfig {
            apply_delay: Duration::ZERO,
            ..cdim_sim::SimConfig::default()
        })
        .unwrap();
        let node = sim.add_node();
        let other = sim.add_node();
        let gpu = sim.add_gpu("NVIDIA-A100-PCIE-40GB");
        let fabric = CdimNodes::new(sim.clone());
        assert!(fabric.gpus_on(&node.id).is_empty());
        let mark = fabric.mark();
        sim.connect_directly(&node.id, &gpu).unwrap();
        let shown = fabric.gpus_on(&node.id);
        assert_eq!(shown.len(), 1);
        let uuid = shown[0].clone();
        // Its own UUID, stable, not the CDIM id.
        assert!(uuid.starts_with("GPU-") && !uuid.contains(&gpu), "{uuid}");
        assert_eq!(fabric.gpu_uuid(&gpu), uuid);
        assert_eq!(fabric.device_id(&uuid).as_deref(), Some(gpu.as_str()));
        assert!(fabric.gpus_on(&other.id).is_empty());
        // A UUID set before the GPU is shown is the one shown; no two GPUs share one.
        let second = sim.add_gpu("NVIDIA-A100-PCIE-40GB");
        assert!(matches!(
            fabric.set_gpu_uuid(&second, &uuid),
            Err(UuidError::Taken { .. })
        ));
        assert!(matches!(
            fabric.set_gpu_uuid(&gpu, "GPU-other"),
            Err(UuidError::AlreadyShown { .. })
        ));
        assert!(matches!(
            fabric.set_gpu_uuid("nope", "GPU-x"),
            Err(UuidError::UnknownGpu(_))
        ));
        fabric.set_gpu_uuid(&second, "GPU-second").unwrap();
        sim.connect_directly(&other.id, &second).unwrap();
        assert_eq!(fabric.gpus_on(&other.id), vec!["GPU-second".to_string()]);
        // Connected and nothing asked to disconnect it: not detached.
        assert!(!fabric.detached_since(&uuid, mark));
        assert!(fabric.detached_since("GPU-never-shown", mark));
        sim.shutdown();
    }
}
