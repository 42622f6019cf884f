//! What a provider's free pool looks like to the scheduler (docs/dra.md): the
//! ResourceSlices of driver [`DRA_DRIVER`] that publish it, as a pure function of the
//! pools the provider reported and the devices claims already hold.
//!
//! One ResourcePool per fabric pool, `<provider>/<pool>`; its devices are named
//! `<type>-<model>-<hash>-<n>` (the hash tells apart two models that read the same once
//! made a DNS label). A device a claim was allocated keeps its name for as long as the
//! claim holds it: the scheduler counts allocated devices by name, so a name that
//! vanished while its device is being attached would let it hand out one device twice,
//! and one that stays while the device is attached (no longer free on the fabric) would
//! hide a free one. So a kind with `free` devices on the fabric and claims holding
//! `pending` not yet attached is published as the claimed names plus `free - pending`
//! new ones.

use std::collections::{BTreeMap, BTreeSet};

use cro_api::{
    CONDITION_FABRIC_DEVICE_FAILED, CONDITION_FABRIC_DEVICE_READY,
    CONDITION_FABRIC_DEVICE_RESCHEDULE, DRA_DRIVER,
};
use cro_runtime::{DeviceType, FabricPool, PoolKind};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Devices one ResourceSlice may list (the API's limit).
pub(crate) const DEVICES_PER_SLICE: usize = 128;

/// A device some claim's allocation names, in one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The device name the allocation gave.
    pub(crate) device: String,
    /// Not attached yet: the fabric still counts it free.
    pub(crate) pending: bool,
}

/// One ResourceSlice to exist: its object name and spec (the pool's generation is 0
/// here; the caller sets it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DesiredSlice {
    pub(crate) name: String,
    pub(crate) spec: ResourceSliceSpec,
}

/// The ResourcePool name of `provider`'s pool `id`.
pub(crate) fn pool_name(provider: &str, id: &str) -> String {
    format!("{provider}/{}", label(id, 63))
}

/// The device-name prefix of a kind: `gpu-a100-40g-1a2b`.
pub(crate) fn kind_prefix(kind: &PoolKind) -> String {
    let t = match kind.device_type {
        DeviceType::Gpu => "gpu",
        DeviceType::CxlMemory => "cxlmemory",
    };
    // The model part is cut so that `<prefix>-<n>` stays a DNS label (63).
    format!(
        "{t}-{}-{}",
        label(&kind.model, 36),
        short_hash(t, &kind.model)
    )
}

/// The slices publishing `provider`'s `pools`, given what claims hold (`held`, by pool
/// name). A pool reaching no node is not published.
pub(crate) fn desired(
    provider: &str,
    pools: &[FabricPool],
    held: &BTreeMap<String, Vec<Held>>,
) -> Vec<DesiredSlice> {
    let mut out = Vec::new();
    for pool in pools {
        if pool.nodes.is_empty() {
            continue;
        }
        let name = pool_name(provider, &pool.id);
        let none = Vec::new();
        let held_here = held.get(&name).unwrap_or(&none);
        let devices = pool_devices(provider, pool, held_here);
        let chunks: Vec<&[Device]> = devices.chunks(DEVICES_PER_SLICE).collect();
        // An empty pool is still published (one slice, no devices): the scheduler then
        // knows the pool is empty rather than unknown.
        let count = chunks.len().max(1);
        for i in 0..count {
            let devices = chunks.get(i).map(|c| c.to_vec()).unwrap_or_default();
            out.push(DesiredSlice {
                name: slice_name(provider, &pool.id, i),
                spec: ResourceSliceSpec {
                    driver: DRA_DRIVER.to_owned(),
                    pool: ResourcePool {
                        name: name.clone(),
                        generation: 0,
                        resource_slice_count: count as i64,
                    },
                    node_selector: Some(nodes_selector(&pool.nodes)),
                    devices: Some(devices),
                    ..ResourceSliceSpec::default()
                },
            });
        }
    }
    out
}

/// Every device of one pool: per kind, the held names and as many new ones as are free
/// and not pending.
fn pool_devices(provider: &str, pool: &FabricPool, held: &[Held]) -> Vec<Device> {
    let mut devices = Vec::new();
    for free in &pool.free {
        let prefix = kind_prefix(&free.kind);
        let mine: Vec<&Held> = held
            .iter()
            .filter(|h| index_of(&h.device, &prefix).is_some())
            .collect();
        let pending = mine.iter().filter(|h| h.pending).count();
        let taken: BTreeSet<u64> = mine
            .iter()
            .filter_map(|h| index_of(&h.device, &prefix))
            .collect();
        let fresh = (free.count as usize).saturating_sub(pending);
        let mut names: Vec<u64> = taken.iter().copied().collect();
        names.extend((0u64..).filter(|i| !taken.contains(i)).take(fresh));
        names.sort_unstable();
        let mut sizes = free.sizes.iter();
        for i in names {
            let size = if taken.contains(&i) {
                None
            } else {
                sizes.next().copied()
            };
            devices.push(device(provider, &pool.id, &free.kind, &prefix, i, size));
        }
    }
    devices
}

/// `<prefix>-<n>`'s `n`, when `device` is a name of that prefix.
fn index_of(device: &str, prefix: &str) -> Option<u64> {
    device.strip_prefix(prefix)?.strip_prefix('-')?.parse().ok()
}

fn device(
    provider: &str,
    pool: &str,
    kind: &PoolKind,
    prefix: &str,
    index: u64,
    size: Option<u64>,
) -> Device {
    let text = |s: &str| DeviceAttribute {
        string: Some(s.to_owned()),
        ..DeviceAttribute::default()
    };
    let type_name = match kind.device_type {
        DeviceType::Gpu => "gpu",
        DeviceType::CxlMemory => "cxlmemory",
    };
    let attributes = BTreeMap::from([
        ("type".to_owned(), text(type_name)),
        ("model".to_owned(), text(&kind.model)),
        ("provider".to_owned(), text(provider)),
        ("fabricPool".to_owned(), text(pool)),
    ]);
    let capacity = size.map(|bytes| {
        BTreeMap::from([(
            "memory".to_owned(),
            DeviceCapacity {
                value: Quantity(bytes.to_string()),
                ..DeviceCapacity::default()
            },
        )])
    });
    Device {
        name: format!("{prefix}-{index}"),
        attributes: Some(attributes),
        capacity,
        binds_to_node: Some(true),
        binding_conditions: Some(vec![CONDITION_FABRIC_DEVICE_READY.to_owned()]),
        binding_failure_conditions: Some(vec![
            CONDITION_FABRIC_DEVICE_RESCHEDULE.to_owned(),
            CONDITION_FABRIC_DEVICE_FAILED.to_owned(),
        ]),
        ..Device::default()
    }
}

/// Only the named nodes (a fabric reaches the machines it reaches, whatever their
/// labels).
fn nodes_selector(nodes: &[String]) -> NodeSelector {
    let mut values: Vec<String> = nodes.to_vec();
    values.sort();
    values.dedup();
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_owned(),
                operator: "In".to_owned(),
                values: Some(values),
            }]),
            ..NodeSelectorTerm::default()
        }],
    }
}

/// The object name of a pool's `index`th slice: `cro-<provider>-<pool>-<hash>-<index>`.
/// The hash of the exact provider and pool keeps two pairs that read alike once made
/// DNS labels (provider `a-b` pool `1`, provider `a` pool `b-1`) from sharing a name;
/// the readable part is cut so the name stays a DNS subdomain.
pub(crate) fn slice_name(provider: &str, pool: &str, index: usize) -> String {
    let mut base = format!("cro-{}-{}", label(provider, 150), label(pool, 63));
    base.truncate(200);
    let base = base.trim_end_matches('-');
    format!("{base}-{}-{index}", short_hash(provider, pool))
}

/// `text` as a DNS label part: lowercase letters, digits and `-`, at most `max`
/// characters, never empty, no leading or trailing `-`.
fn label(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    out.truncate(max);
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() { "x".to_owned() } else { out }
}

/// Four hex digits of FNV-1a over the two parts: stable across runs and builds.
fn short_hash(a: &str, b: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for byte in a.bytes().chain([0u8]).chain(b.bytes()) {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{:04x}", h & 0xffff)
}

#[cfg(test)]
mod tests {
    use cro_runtime::FreeDevices;

    use super::*;

    fn gpu(model: &str) -> PoolKind {
        PoolKind {
            device_type: DeviceType::Gpu,
            model: model.into(),
        }
    }

    fn pool(id: &str, nodes: &[&str], free: &[(PoolKind, u32)]) -> FabricPool {
        FabricPool {
            id: id.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            free: free
                .iter()
                .map(|(k, n)| FreeDevices {
                    kind: k.clone(),
                    count: *n,
                    sizes: Vec::new(),
                })
                .collect(),
        }
    }

    fn names(slices: &[DesiredSlice]) -> Vec<String> {
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect()
    }

    #[test]
    fn one_pool_per_fabric_with_the_free_devices_bound_to_its_nodes() {
        let a100 = gpu("A100 40G");
        let slices = desired(
            "fti",
            &[
                pool("1", &["w1", "w0"], &[(a100.clone(), 2)]),
                pool("2", &["w2"], &[(a100.clone(), 1)]),
                pool("3", &[], &[(a100.clone(), 5)]),
            ],
            &BTreeMap::new(),
        );
        assert_eq!(slices.len(), 2, "a pool reaching no node is not published");
        let s = &slices[0];
        assert_eq!(s.name, slice_name("fti", "1", 0));
        assert_eq!(s.spec.driver, DRA_DRIVER);
        assert_eq!(s.spec.pool.name, "fti/1");
        assert_eq!(s.spec.pool.resource_slice_count, 1);
        let term = &s.spec.node_selector.as_ref().unwrap().node_selector_terms[0];
        let field = &term.match_fields.as_ref().unwrap()[0];
        assert_eq!(field.key, "metadata.name");
        assert_eq!(
            field.values.as_deref(),
            Some(&["w0".to_string(), "w1".to_string()][..])
        );
        let devices = s.spec.devices.as_ref().unwrap();
        let prefix = kind_prefix(&a100);
        assert!(prefix.starts_with("gpu-a100-40g-"), "{prefix}");
        assert_eq!(
            devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(),
            [format!("{prefix}-0"), format!("{prefix}-1")]
        );
        let d = &devices[0];
        assert_eq!(d.binds_to_node, Some(true));
        assert_eq!(
            d.binding_conditions.as_deref(),
            Some(&[CONDITION_FABRIC_DEVICE_READY.to_string()][..])
        );
        assert_eq!(d.binding_failure_conditions.as_ref().unwrap().len(), 2);
        let attrs = d.attributes.as_ref().unwrap();
        assert_eq!(attrs["model"].string.as_deref(), Some("A100 40G"));
        assert_eq!(attrs["type"].string.as_deref(), Some("gpu"));
    }

    #[test]
    fn held_names_stay_and_pending_ones_count_against_the_free() {
        let a100 = gpu("A100 40G");
        let prefix = kind_prefix(&a100);
        // Fabric: 3 free. Claims hold -1 (attached: not free any more) and -4 (not
        // attached yet: still counted free).
        let held = BTreeMap::from([(
            "fti/1".to_string(),
            vec![
                Held {
                    device: format!("{prefix}-1"),
                    pending: false,
                },
                Held {
                    device: format!("{prefix}-4"),
                    pending: true,
                },
                Held {
                    device: "another-model-0".into(),
                    pending: true,
                },
            ],
        )]);
        let slices = desired("fti", &[pool("1", &["w0"], &[(a100, 3)])], &held);
        assert_eq!(
            names(&slices),
            [0, 1, 2, 4]
                .iter()
                .map(|i| format!("{prefix}-{i}"))
                .collect::<Vec<_>>(),
            "held -1 and -4, and 3 - 1 pending = 2 new ones"
        );
    }

    #[test]
    fn large_pools_are_split_and_an_empty_one_is_still_published() {
        let a100 = gpu("A100");
        let slices = desired(
            "p",
            &[pool("1", &["w0"], &[(a100.clone(), 300)])],
            &BTreeMap::new(),
        );
        assert_eq!(slices.len(), 3);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));
        assert_eq!(names(&slices).len(), 300);
        assert_eq!(names(&slices).iter().collect::<BTreeSet<_>>().len(), 300);
        let empty = desired("p", &[pool("1", &["w0"], &[(a100, 0)])], &BTreeMap::new());
        assert_eq!(empty.len(), 1);
        assert!(empty[0].spec.devices.as_ref().unwrap().is_empty());
    }

    #[test]
    fn names_are_dns_labels_and_models_that_read_alike_stay_apart() {
        let a = kind_prefix(&gpu("A100 40G"));
        let b = kind_prefix(&gpu("A100-40G"));
        assert_ne!(a, b);
        let long = kind_prefix(&gpu(&"NVIDIA H100 SXM5 80GB HBM3 ".repeat(5)));
        assert!(format!("{long}-1000").len() <= 63, "{long}");
        for name in [&a, &b, &long] {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        assert_eq!(pool_name("fti", "Fabric #1"), "fti/fabric-1");
        let name = slice_name("fti", "Fabric #1", 2);
        assert!(
            name.starts_with("cro-fti-fabric-1-") && name.ends_with("-2"),
            "{name}"
        );
        assert_ne!(slice_name("a-b", "1", 0), slice_name("a", "b-1", 0));
        assert!(slice_name(&"p".repeat(250), "1", 0).len() <= 253);
    }
}
