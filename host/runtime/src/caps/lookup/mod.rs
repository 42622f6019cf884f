//! The `lookup` capability: granted kinds and their checks ([`grant`]), the
//! `cro:provider/lookup` host functions and their bindings (`wit`). Names and namespaces are checked as Kubernetes names by the gate before
//! any request (they become part of the API server's URL); every read counts against
//! the call's cluster-read budget.

pub mod grant;
pub(crate) mod wit;

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use self::grant::{Kind, LookupGrant, ObjectName};
use super::capability::{CallSetup, Capability, Declared, Findings, Load, SetupError};
use super::reads::CallReads;
use crate::base::{FieldError, until_deadline};
use crate::cluster::{ClusterError, ClusterReader};
use crate::gate::{CapabilityKind, Gate, UseOutcome};

/// The capability, as `crate::caps` registers it.
pub(crate) struct LookupCap;

impl Capability for LookupCap {
    const NAME: &'static str = "lookup";
    type Grant = Vec<LookupGrant>;
    type Shared = Lookup;
    type Call = LookupCall;

    fn validate(grant: &Vec<LookupGrant>) -> Result<(), FieldError> {
        grant::validate(grant)
    }

    fn load(grant: &Vec<LookupGrant>, load: &Load<'_>) -> Result<Lookup, SetupError> {
        Ok(Lookup {
            grants: grant.clone(),
            gate: load.gate.clone(),
            cluster: load.cluster.clone(),
        })
    }

    fn call(shared: &Arc<Lookup>, setup: &CallSetup) -> LookupCall {
        LookupCall::new(shared.clone(), setup.reads.clone(), setup.deadline)
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut LookupCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<LookupCall>>(linker, get)
    }

    fn report(grant: &Vec<LookupGrant>, declared: &Declared<'_>, findings: &mut Findings) {
        // A kind wanted only with some configuration key is not wanted without it.
        let wanted: Vec<_> = declared
            .info
            .capabilities
            .lookup
            .iter()
            .filter(|l| {
                l.when_config
                    .as_ref()
                    .is_none_or(|k| declared.config.contains_key(k))
            })
            .collect();
        for l in &wanted {
            if !grant.iter().any(|g| g.allows(&l.api_version, &l.kind)) {
                findings
                    .wanted_not_granted
                    .push(format!("lookup {} {}", l.api_version, l.kind));
            }
        }
        for g in grant {
            if !wanted.iter().any(|l| g.allows(&l.api_version, &l.kind)) {
                findings
                    .granted_not_wanted
                    .push(format!("lookup {} {}", g.api_version, g.kind));
            }
        }
    }

    #[cfg(test)]
    fn example() -> Vec<LookupGrant> {
        vec![LookupGrant::new("v1", "Node")]
    }
}

/// The provider's side.
pub(crate) struct Lookup {
    grants: Vec<LookupGrant>,
    gate: Arc<Gate>,
    cluster: Arc<dyn ClusterReader>,
}

/// One call's side.
pub(crate) struct LookupCall {
    shared: Arc<Lookup>,
    reads: Arc<CallReads>,
    deadline: Instant,
}

impl LookupCall {
    pub(crate) fn new(shared: Arc<Lookup>, reads: Arc<CallReads>, deadline: Instant) -> LookupCall {
        LookupCall {
            shared,
            reads,
            deadline,
        }
    }

    fn check(
        &self,
        api_version: &str,
        kind: &str,
        name: Option<(&str, Option<&str>)>,
    ) -> Result<(), wit::LookupError> {
        let shared = &self.shared;
        let granted = Kind {
            grants: &shared.grants,
            api_version,
            kind,
        };
        shared
            .gate
            .check(&granted)
            .map_err(|d| wit::LookupError::Denied(d.0))?;
        if let Some((name, namespace)) = name {
            shared
                .gate
                .check(&ObjectName { name, namespace })
                .map_err(|d| wit::LookupError::Denied(d.0))?;
        }
        Ok(())
    }
}

fn lookup_error(e: ClusterError) -> wit::LookupError {
    match e {
        ClusterError::NotFound(_) => wit::LookupError::NotFound(e.to_string()),
        _ => wit::LookupError::Other(e.to_string()),
    }
}

fn json_text(v: &serde_json::Value) -> Result<String, wit::LookupError> {
    serde_json::to_string(v).map_err(|e| wit::LookupError::Other(e.to_string()))
}

/// Tells the gate's observer (if any) how a lookup ended.
fn observed<T>(
    gate: &Gate,
    started: Option<Instant>,
    target: impl FnOnce() -> String,
    result: &wasmtime::Result<Result<T, wit::LookupError>>,
    bytes: impl FnOnce(&T) -> u64,
) {
    gate.used(started, || {
        let outcome = match result {
            Ok(Ok(v)) => UseOutcome::Allowed {
                status: None,
                bytes: bytes(v),
            },
            Ok(Err(wit::LookupError::Denied(why))) => UseOutcome::Denied(why.clone()),
            Ok(Err(wit::LookupError::NotFound(why))) => {
                UseOutcome::Failed(format!("not found: {why}"))
            }
            Ok(Err(wit::LookupError::Other(why))) => UseOutcome::Failed(why.clone()),
            Err(e) => UseOutcome::Failed(e.to_string()),
        };
        (CapabilityKind::Lookup, target(), outcome)
    });
}

impl wit::Host for LookupCall {
    async fn get_node(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
        let gate = self.shared.gate.clone();
        let started = gate.start();
        let target = || format!("v1 Node {name}");
        let result = self.get_node_inner(&name).await;
        observed(&gate, started, target, &result, |v| v.len() as u64);
        result
    }

    async fn list_nodes(&mut self) -> wasmtime::Result<Result<Vec<String>, wit::LookupError>> {
        let gate = self.shared.gate.clone();
        let started = gate.start();
        let result = self.list_nodes_inner().await;
        observed(
            &gate,
            started,
            || "v1 Node (list)".into(),
            &result,
            |v| v.iter().map(|n| n.len() as u64).sum(),
        );
        result
    }

    async fn get_object(
        &mut self,
        api_version: String,
        kind: String,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
        let gate = self.shared.gate.clone();
        let started = gate.start();
        let result = self
            .get_object_inner(&api_version, &kind, namespace.as_deref(), &name)
            .await;
        let target = || match &namespace {
            Some(ns) => format!("{api_version} {kind} {ns}/{name}"),
            None => format!("{api_version} {kind} {name}"),
        };
        observed(&gate, started, target, &result, |v| v.len() as u64);
        result
    }
}

impl LookupCall {
    async fn get_node_inner(
        &mut self,
        name: &str,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
        let name = name.to_string();
        if let Err(e) = self.check("v1", "Node", Some((&name, None))) {
            return Ok(Err(e));
        }
        self.reads.take(self.deadline).await?;
        let shared = self.shared.clone();
        let found = until_deadline(
            self.deadline,
            shared.cluster.get_object("v1", "Node", None, &name),
        )
        .await?;
        Ok(found.map_err(lookup_error).and_then(|v| json_text(&v)))
    }

    async fn list_nodes_inner(
        &mut self,
    ) -> wasmtime::Result<Result<Vec<String>, wit::LookupError>> {
        if let Err(e) = self.check("v1", "Node", None) {
            return Ok(Err(e));
        }
        self.reads.take(self.deadline).await?;
        let shared = self.shared.clone();
        let found =
            until_deadline(self.deadline, shared.cluster.list_objects("v1", "Node")).await?;
        Ok(found
            .map_err(lookup_error)
            .and_then(|nodes| nodes.iter().map(json_text).collect()))
    }

    async fn get_object_inner(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
        if let Err(e) = self.check(api_version, kind, Some((name, namespace))) {
            return Ok(Err(e));
        }
        self.reads.take(self.deadline).await?;
        let shared = self.shared.clone();
        let found = until_deadline(
            self.deadline,
            shared
                .cluster
                .get_object(api_version, kind, namespace, name),
        )
        .await?;
        Ok(found.map_err(lookup_error).and_then(|v| json_text(&v)))
    }
}
