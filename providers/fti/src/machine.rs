//! From a Kubernetes Node to the fabric's machine uuid.
//!
//! Without a cluster id the Node's `spec.providerID` is `fsas-cdi://<machine uuid>`.
//! With one (OpenShift), the Node's annotation `machine.openshift.io/machine` names a
//! Machine, whose annotation `metal3.io/BareMetalHost` names a BareMetalHost, whose
//! annotation `cluster-manager.cdi.io/machine` is the machine uuid.

use serde::Deserialize;
use std::collections::BTreeMap;

use crate::config::Config;
use crate::host::{Host, LookupError};
use crate::model::ProviderError;

pub const PROVIDER_ID_PREFIX: &str = "fsas-cdi://";
pub const NODE_MACHINE_ANNOTATION: &str = "machine.openshift.io/machine";
pub const MACHINE_BMH_ANNOTATION: &str = "metal3.io/BareMetalHost";
pub const BMH_MACHINE_ANNOTATION: &str = "cluster-manager.cdi.io/machine";
pub const MACHINE_API_VERSION: &str = "machine.openshift.io/v1beta1";
pub const BMH_API_VERSION: &str = "metal3.io/v1alpha1";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineError {
    /// The node carries no (usable) link to a fabric machine.
    #[error("{0}")]
    NotOnFabric(String),
    /// A lookup failed or returned something unreadable.
    #[error(transparent)]
    Lookup(ProviderError),
}

impl From<MachineError> for ProviderError {
    fn from(e: MachineError) -> Self {
        match e {
            MachineError::NotOnFabric(m) => ProviderError::NotFound(m),
            MachineError::Lookup(e) => e,
        }
    }
}

#[derive(Deserialize, Default)]
struct Object {
    metadata: Option<Metadata>,
    spec: Option<NodeSpec>,
}

#[derive(Deserialize, Default)]
struct Metadata {
    name: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct NodeSpec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
}

impl Object {
    fn parse(json: &str, what: &str) -> Result<Self, MachineError> {
        serde_json::from_str(json).map_err(|e| {
            MachineError::Lookup(ProviderError::Other(format!(
                "the host returned an unreadable {what}: {e}"
            )))
        })
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .get(key)
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
    }
}

/// The machine uuid of the node named `node`.
pub fn of_node<H: Host + ?Sized>(
    host: &H,
    cfg: &Config,
    node: &str,
) -> Result<String, MachineError> {
    let json = host
        .get_node(node)
        .map_err(|e| lookup_failure(e, &format!("Node {node}")))?;
    of_node_json(host, cfg, node, &json)
}

/// The machine uuid of a node given as its JSON; returns the node's name too.
pub fn of_listed_node<H: Host + ?Sized>(
    host: &H,
    cfg: &Config,
    json: &str,
) -> Result<(String, Result<String, MachineError>), ProviderError> {
    let obj = Object::parse(json, "Node").map_err(ProviderError::from)?;
    let name = obj
        .metadata
        .as_ref()
        .and_then(|m| m.name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ProviderError::Other("the host listed a Node without a name".into()))?;
    let machine = from_node(host, cfg, &name, &obj);
    Ok((name, machine))
}

fn of_node_json<H: Host + ?Sized>(
    host: &H,
    cfg: &Config,
    node: &str,
    json: &str,
) -> Result<String, MachineError> {
    let obj = Object::parse(json, &format!("Node {node}"))?;
    from_node(host, cfg, node, &obj)
}

fn from_node<H: Host + ?Sized>(
    host: &H,
    cfg: &Config,
    node: &str,
    obj: &Object,
) -> Result<String, MachineError> {
    if cfg.cluster_id.is_none() {
        let provider_id = obj
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or("");
        return match provider_id.strip_prefix(PROVIDER_ID_PREFIX) {
            Some(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
            _ => Err(MachineError::NotOnFabric(format!(
                "Node {node} has providerID '{provider_id}', not '{PROVIDER_ID_PREFIX}<machine uuid>'"
            ))),
        };
    }

    let (ns, name) = reference(obj, NODE_MACHINE_ANNOTATION, &format!("Node {node}"))?;
    let machine_json = host
        .get_object(MACHINE_API_VERSION, "Machine", Some(ns), name)
        .map_err(|e| lookup_failure(e, &format!("Machine {ns}/{name}")))?;
    let machine = Object::parse(&machine_json, "Machine")?;

    let what = format!("Machine {ns}/{name}");
    let (bns, bname) = reference(&machine, MACHINE_BMH_ANNOTATION, &what)?;
    let bmh_json = host
        .get_object(BMH_API_VERSION, "BareMetalHost", Some(bns), bname)
        .map_err(|e| lookup_failure(e, &format!("BareMetalHost {bns}/{bname}")))?;
    let bmh = Object::parse(&bmh_json, "BareMetalHost")?;
    bmh.annotation(BMH_MACHINE_ANNOTATION)
        .map(str::to_string)
        .ok_or_else(|| {
            MachineError::NotOnFabric(format!(
                "BareMetalHost {bns}/{bname} has no annotation '{BMH_MACHINE_ANNOTATION}'"
            ))
        })
}

/// A `namespace/name` annotation.
fn reference<'o>(
    obj: &'o Object,
    key: &str,
    what: &str,
) -> Result<(&'o str, &'o str), MachineError> {
    let value = obj.annotation(key).unwrap_or("");
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(MachineError::NotOnFabric(format!(
            "{what} has annotation '{key}' = '{value}', not 'namespace/name'"
        ))),
    }
}

fn lookup_failure(e: LookupError, what: &str) -> MachineError {
    match e {
        LookupError::Denied(m) => {
            MachineError::Lookup(ProviderError::Denied(format!("looking up {what}: {m}")))
        }
        LookupError::NotFound(m) => {
            MachineError::Lookup(ProviderError::NotFound(format!("{what} not found: {m}")))
        }
        LookupError::Other(m) => {
            MachineError::Lookup(ProviderError::Other(format!("looking up {what}: {m}")))
        }
    }
}
