//! What preparing one claim means, decided from the claim alone (no I/O): which of its
//! allocated devices are cro's, whether each is attached and visible on this node (the
//! binding controller's `FabricDeviceReady` and the ids it wrote beside it), and the CDI
//! spec that hands the containers their GPUs.

use std::collections::{BTreeMap, BTreeSet};

use cro_api::{CONDITION_FABRIC_DEVICE_READY, DRA_DRIVER};
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use serde_json::{Value, json};

/// The CDI kind of cro's devices (`vendor/class`).
pub(crate) const CDI_KIND: &str = "cro.hpsys.ibm.ie.com/gpu";
/// The variable the NVIDIA container toolkit selects GPUs by (UUIDs, comma-separated).
pub(crate) const GPU_ENV: &str = "NVIDIA_VISIBLE_DEVICES";

/// Why a claim cannot be prepared (yet). The kubelet retries a failed prepare, so a
/// device still being attached is an error too, not a wait.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("the claim's uid is {found}, not {asked}: it was deleted and made again")]
    Replaced { asked: String, found: String },
    #[error("the claim is not allocated")]
    NotAllocated,
    #[error("device {device} has no FabricDeviceReady=True yet: cro is still attaching it")]
    NotReady { device: String },
    #[error("device {device} is attached to node {attached}, not to this node ({node})")]
    OtherNode {
        device: String,
        attached: String,
        node: String,
    },
    #[error("device {device}: cro's device status {problem}")]
    BadStatus { device: String, problem: String },
}

/// One allocated device of cro's, ready on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadyDevice {
    pub(crate) request: String,
    pub(crate) pool: String,
    pub(crate) device: String,
    /// The CDI device the containers using this device's request get; `None` for a
    /// device the container needs nothing for (CXL memory is onlined on the node).
    pub(crate) cdi_id: Option<String>,
}

/// A prepared claim: its devices, and the CDI spec to write (none without GPUs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) devices: Vec<ReadyDevice>,
    pub(crate) spec: Option<Value>,
}

/// Decides what preparing `claim` (asked for as `uid`) on `node` hands the containers.
pub(crate) fn plan(claim: &ResourceClaim, uid: &str, node: &str) -> Result<Plan, ClaimError> {
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != uid {
        return Err(ClaimError::Replaced {
            asked: uid.to_owned(),
            found: found.to_owned(),
        });
    }
    let status = claim.status.as_ref();
    let results = status
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or(ClaimError::NotAllocated)?
        .results
        .as_deref()
        .unwrap_or_default();
    let statuses = status
        .and_then(|s| s.devices.as_deref())
        .unwrap_or_default();

    // GPU UUIDs per request, in allocation order: one CDI device per request, so a
    // container using the request sees all of its GPUs in one variable.
    let mut gpus: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut devices = Vec::new();
    for r in results.iter().filter(|r| r.driver == DRA_DRIVER) {
        let st = statuses
            .iter()
            .find(|d| d.driver == r.driver && d.pool == r.pool && d.device == r.device)
            .ok_or_else(|| ClaimError::NotReady {
                device: r.device.clone(),
            })?;
        let ready = ready_on(st, node)?;
        if ready.kind == "gpu" {
            gpus.entry(r.request.as_str())
                .or_default()
                .push(ready.device_id);
        }
        devices.push(ReadyDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_id: None,
        });
    }
    // One CDI device per request with GPUs, numbered in the map's order.
    let names: BTreeMap<&str, String> = gpus
        .keys()
        .enumerate()
        .map(|(i, request)| (*request, format!("{uid}-{i}")))
        .collect();
    // Only the first device of a request names the CDI device: the kubelet hands a
    // container the CDI ids of every device of the requests it uses.
    let mut named = BTreeSet::new();
    for d in &mut devices {
        if let Some(name) = names.get(d.request.as_str())
            && named.insert(d.request.clone())
        {
            d.cdi_id = Some(format!("{CDI_KIND}={name}"));
        }
    }
    let spec = (!gpus.is_empty()).then(|| {
        let cdi_devices: Vec<Value> = gpus
            .iter()
            .map(|(request, uuids)| {
                json!({
                    // `names` holds every key of `gpus`.
                    "name": names[request],
                    "containerEdits": {"env": [format!("{GPU_ENV}={}", uuids.join(","))]},
                })
            })
            .collect();
        json!({"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": cdi_devices})
    });
    Ok(Plan { devices, spec })
}

struct Ready {
    kind: String,
    device_id: String,
}

/// The device's status as the binding controller writes it: `FabricDeviceReady=True` and
/// its data (`type`, `deviceId`, `node`).
fn ready_on(st: &AllocatedDeviceStatus, node: &str) -> Result<Ready, ClaimError> {
    let device = || st.device.clone();
    let ready = st
        .conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == CONDITION_FABRIC_DEVICE_READY && c.status == "True");
    if !ready {
        return Err(ClaimError::NotReady { device: device() });
    }
    let data = st.data.as_ref().map(|d| &d.0);
    let field = |key: &str| {
        data.and_then(|d| d.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ClaimError::BadStatus {
                device: device(),
                problem: format!("has no `{key}` in its data"),
            })
    };
    let attached = field("node")?;
    if attached != node {
        return Err(ClaimError::OtherNode {
            device: device(),
            attached: attached.to_owned(),
            node: node.to_owned(),
        });
    }
    let kind = field("type")?;
    if kind != "gpu" && kind != "cxlmemory" {
        return Err(ClaimError::BadStatus {
            device: device(),
            problem: format!("names type `{kind}`, which this plugin does not know"),
        });
    }
    let device_id = field("deviceId")?;
    // The id goes into a container's environment: refuse anything a GPU UUID never holds.
    if !device_id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        return Err(ClaimError::BadStatus {
            device: device(),
            problem: format!("has a deviceId {device_id:?} that is not a device id"),
        });
    }
    Ok(Ready {
        kind: kind.to_owned(),
        device_id: device_id.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-aaaa-bbbb-cccc-000000000001";

    fn claim(results: Value, devices: Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": UID},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {"devices": {"results": results}},
                "devices": devices,
            },
        }))
        .unwrap()
    }

    fn result(request: &str, device: &str) -> Value {
        json!({"request": request, "driver": DRA_DRIVER, "pool": "fti/fabric-1", "device": device})
    }

    fn ready(device: &str, kind: &str, id: &str, node: &str) -> Value {
        json!({
            "driver": DRA_DRIVER, "pool": "fti/fabric-1", "device": device,
            "conditions": [{"type": "FabricDeviceReady", "status": "True", "reason": "Attached",
                "message": "", "lastTransitionTime": "2026-12-04T00:00:00Z"}],
            "data": {"type": kind, "deviceId": id, "node": node},
        })
    }

    #[test]
    fn gpus_of_one_request_share_one_cdi_device_naming_their_uuids() {
        let c = claim(
            json!([
                result("gpu", "gpu-a100-x-0"),
                result("gpu", "gpu-a100-x-1"),
                result("mem", "cxlmemory-m-x-0")
            ]),
            json!([
                ready("gpu-a100-x-0", "gpu", "GPU-1111", "w1"),
                ready("gpu-a100-x-1", "gpu", "GPU-2222", "w1"),
                ready("cxlmemory-m-x-0", "cxlmemory", "mem-7", "w1"),
            ]),
        );
        let p = plan(&c, UID, "w1").unwrap();
        let ids: Vec<_> = p.devices.iter().map(|d| d.cdi_id.clone()).collect();
        assert_eq!(
            ids,
            [Some(format!("{CDI_KIND}={UID}-0")), None, None],
            "the first GPU names the request's CDI device; memory needs none"
        );
        assert_eq!(
            p.spec.unwrap(),
            json!({"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": [
                {"name": format!("{UID}-0"), "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-1111,GPU-2222"]}},
            ]})
        );
    }

    #[test]
    fn a_memory_only_claim_needs_no_spec_and_other_drivers_are_not_ours() {
        let mut other = result("x", "dev-0");
        other["driver"] = json!("gpu.nvidia.com");
        let c = claim(
            json!([result("mem", "cxlmemory-m-x-0"), other]),
            json!([ready("cxlmemory-m-x-0", "cxlmemory", "mem-7", "w1")]),
        );
        let p = plan(&c, UID, "w1").unwrap();
        assert_eq!(p.devices.len(), 1);
        assert_eq!(p.spec, None);
    }

    #[test]
    fn a_claim_not_ready_here_is_refused_with_the_reason() {
        let results = json!([result("gpu", "gpu-a100-x-0")]);
        assert_eq!(
            plan(&claim(results.clone(), json!([])), UID, "w1"),
            Err(ClaimError::NotReady {
                device: "gpu-a100-x-0".into()
            })
        );
        let mut not_true = ready("gpu-a100-x-0", "gpu", "GPU-1", "w1");
        not_true["conditions"][0]["status"] = json!("False");
        assert!(matches!(
            plan(&claim(results.clone(), json!([not_true])), UID, "w1"),
            Err(ClaimError::NotReady { .. })
        ));
        assert!(matches!(
            plan(
                &claim(
                    results.clone(),
                    json!([ready("gpu-a100-x-0", "gpu", "GPU-1", "w2")])
                ),
                UID,
                "w1"
            ),
            Err(ClaimError::OtherNode { .. })
        ));
        assert!(matches!(
            plan(
                &claim(
                    results.clone(),
                    json!([ready("gpu-a100-x-0", "gpu", "GPU-1; rm -rf /", "w1")])
                ),
                UID,
                "w1"
            ),
            Err(ClaimError::BadStatus { .. })
        ));
        assert!(matches!(
            plan(
                &claim(
                    results.clone(),
                    json!([ready("gpu-a100-x-0", "fpga", "F-1", "w1")])
                ),
                UID,
                "w1"
            ),
            Err(ClaimError::BadStatus { .. })
        ));
        assert!(matches!(
            plan(
                &claim(
                    results,
                    json!([ready("gpu-a100-x-0", "gpu", "GPU-1", "w1")])
                ),
                "another-uid",
                "w1"
            ),
            Err(ClaimError::Replaced { .. })
        ));
        let unallocated: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "uid": UID}, "spec": {"devices": {"requests": []}},
        }))
        .unwrap();
        assert_eq!(plan(&unallocated, UID, "w1"), Err(ClaimError::NotAllocated));
    }
}
