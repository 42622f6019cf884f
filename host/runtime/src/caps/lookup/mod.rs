//! The `lookup` capability: granted kinds ([`grant`]) and the `cro:provider/lookup` host
//! functions. Names and namespaces are checked as Kubernetes names by the gate before
//! any request (they become part of the API server's URL); every read counts against
//! the call's cluster-read budget.

pub mod grant;

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};

use super::reads::CallReads;
use crate::base::until_deadline;
use crate::cluster::{ClusterError, ClusterReader};
use crate::gate::{Capability, Gate};
use crate::wit::imports::lookup as wit;

/// The provider's side.
pub(crate) struct Lookup {
    pub(crate) gate: Arc<Gate>,
    pub(crate) cluster: Arc<dyn ClusterReader>,
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
        let gate = &self.shared.gate;
        gate.check(Capability::Lookup { api_version, kind })
            .map_err(|d| wit::LookupError::Denied(d.0))?;
        if let Some((name, namespace)) = name {
            gate.check(Capability::ObjectName { name, namespace })
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

impl wit::Host for LookupCall {
    async fn get_node(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
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

    async fn list_nodes(&mut self) -> wasmtime::Result<Result<Vec<String>, wit::LookupError>> {
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

    async fn get_object(
        &mut self,
        api_version: String,
        kind: String,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<String, wit::LookupError>> {
        if let Err(e) = self.check(&api_version, &kind, Some((&name, namespace.as_deref()))) {
            return Ok(Err(e));
        }
        self.reads.take(self.deadline).await?;
        let shared = self.shared.clone();
        let found = until_deadline(
            self.deadline,
            shared
                .cluster
                .get_object(&api_version, &kind, namespace.as_deref(), &name),
        )
        .await?;
        Ok(found.map_err(lookup_error).and_then(|v| json_text(&v)))
    }
}

pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut LookupCall,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasSelf<LookupCall>>(linker, get)
}
