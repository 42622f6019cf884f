//! The free pool (contract 0.3.0 `get-pool`) through the Fabric Manager: which fabric
//! each node's machine is on (`GET fabric_manager/api/v1/machines`, one call for the
//! tenant), then, per fabric and per asked kind, how many devices are free there
//! (`GET machines/<any machine of the fabric>/available-reserved-resources` with a
//! `model eq` condition). A machine can take devices only from its own fabric, so
//! each fabric is one pool reaching the nodes on it (docs/fti-fabric-api.md, "Free
//! pool").

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use crate::encode;
use crate::fabric::Fabric;
use crate::host::{Host, LogLevel, Method};
use crate::lenient::{self, present};
use crate::model::{FabricPool, FreeDevices, PoolKind, PoolOutcome, ProviderError};

#[derive(Deserialize, Default, Debug)]
struct MachineList {
    data: Option<MachineListData>,
}

#[derive(Deserialize, Default, Debug)]
struct MachineListData {
    #[serde(default, deserialize_with = "lenient::list")]
    machines: Vec<ListedMachine>,
}

#[derive(Deserialize, Default, Debug)]
struct ListedMachine {
    #[serde(default, deserialize_with = "lenient::string")]
    mach_uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    fabric_id: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
struct Available {
    #[serde(default, deserialize_with = "lenient::string")]
    fabric_id: Option<String>,
    #[serde(default, deserialize_with = "lenient::count")]
    reserved_res_num_per_fabric: Option<u64>,
}

/// The pools reaching `nodes` (node name, machine uuid), with the free devices of
/// each of `kinds`.
pub fn read<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    nodes: &[(String, String)],
    kinds: &[PoolKind],
) -> Result<PoolOutcome, ProviderError> {
    let fabric_of = fabric_of_machines(f)?;
    let fabrics = group_by_fabric(f, nodes, &fabric_of);
    let mut pools = Vec::with_capacity(fabrics.len());
    for (fabric_id, members) in fabrics {
        // Any machine of a fabric answers for the whole fabric.
        let (_, machine) = &members[0];
        let mut free = Vec::with_capacity(kinds.len());
        for kind in kinds {
            let count = available(f, machine, &fabric_id, kind)?;
            free.push(FreeDevices {
                kind: kind.clone(),
                count,
                sizes: Vec::new(),
            });
        }
        pools.push(FabricPool {
            id: fabric_id,
            nodes: members.into_iter().map(|(node, _)| node).collect(),
            free,
        });
    }
    Ok(PoolOutcome::Pools(pools))
}

/// Machine uuid → fabric id, for every machine of the tenant.
fn fabric_of_machines<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
) -> Result<BTreeMap<String, String>, ProviderError> {
    let path = format!(
        "fabric_manager/api/v1/machines?tenant_uuid={}",
        encode::component(&f.config().tenant_id)
    );
    let reply: MachineList = f.call_json(Method::Get, &path, None, "machine list")?;
    let data = reply
        .data
        .ok_or_else(|| ProviderError::malformed("machine list has no 'data'"))?;
    let mut out = BTreeMap::new();
    for m in data.machines {
        match (present(&m.mach_uuid), present(&m.fabric_id)) {
            (Some(uuid), Some(fabric)) => {
                out.insert(uuid.to_string(), fabric.to_string());
            }
            (Some(uuid), None) => f.host().log(
                LogLevel::Warn,
                &format!("the fabric lists machine {uuid} without a fabric_id; it is in no pool"),
            ),
            _ => {
                return Err(ProviderError::malformed(
                    "machine list has a machine without mach_uuid",
                ));
            }
        }
    }
    Ok(out)
}

/// Fabric id → its nodes (name, machine), in order; nodes whose machine the fabric
/// does not list are in no pool (logged).
fn group_by_fabric<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    nodes: &[(String, String)],
    fabric_of: &BTreeMap<String, String>,
) -> BTreeMap<String, Vec<(String, String)>> {
    let mut fabrics: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (node, machine) in nodes {
        match fabric_of.get(machine) {
            Some(fabric) => fabrics
                .entry(fabric.clone())
                .or_default()
                .push((node.clone(), machine.clone())),
            None => f.host().log(
                LogLevel::Warn,
                &format!(
                    "node {node}: the fabric does not list its machine {machine}; it is in no pool"
                ),
            ),
        }
    }
    fabrics
}

/// Free devices of `kind` on `machine`'s fabric.
fn available<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    machine: &str,
    fabric_id: &str,
    kind: &PoolKind,
) -> Result<u32, ProviderError> {
    let condition = json!({"column": "model", "operator": "eq", "value": kind.model});
    let path = format!(
        "fabric_manager/api/v1/machines/{}/available-reserved-resources?tenant_uuid={}&res_type={}&condition={}",
        encode::component(machine),
        encode::component(&f.config().tenant_id),
        encode::component(kind.device_type.as_fabric_str()),
        encode::component(&condition.to_string()),
    );
    let reply: Available = f.call_json(Method::Get, &path, None, "available resources")?;
    let count = reply.reserved_res_num_per_fabric.ok_or_else(|| {
        ProviderError::malformed(format!(
            "available resources of {} '{}' on machine {machine} has no reserved_res_num_per_fabric",
            kind.device_type, kind.model
        ))
    })?;
    if let Some(answered) = present(&reply.fabric_id)
        && answered != fabric_id
    {
        return Err(ProviderError::malformed(format!(
            "machine {machine} is listed on fabric {fabric_id} but its available resources are fabric {answered}'s"
        )));
    }
    // More than u32::MAX free devices is no fabric this side of the century: saturate
    // rather than fail.
    Ok(u32::try_from(count).unwrap_or(u32::MAX))
}
