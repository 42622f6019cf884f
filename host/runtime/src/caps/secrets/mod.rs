//! The `secrets` capability: one granted Secret ([`grant`]) and the `cro:provider/secrets`
//! host function. The Secret is read once per call and its keys served from that copy
//! (a provider asking for keys in a loop costs one API read); every read counts against
//! the call's cluster-read budget.

pub mod grant;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};

use super::reads::CallReads;
use crate::base::{quote, until_deadline};
use crate::cluster::{ClusterError, ClusterReader};
use crate::gate::{Capability, CapabilityKind, Gate, UseOutcome};
use crate::wit::imports::secrets as wit;

/// The provider's side.
pub(crate) struct Secrets {
    pub(crate) gate: Arc<Gate>,
    pub(crate) cluster: Arc<dyn ClusterReader>,
}

/// One call's side, with the call's copy of the Secret.
pub(crate) struct SecretsCall {
    shared: Arc<Secrets>,
    reads: Arc<CallReads>,
    deadline: Instant,
    cached: Option<Result<BTreeMap<String, Vec<u8>>, ClusterError>>,
}

impl SecretsCall {
    pub(crate) fn new(
        shared: Arc<Secrets>,
        reads: Arc<CallReads>,
        deadline: Instant,
    ) -> SecretsCall {
        SecretsCall {
            shared,
            reads,
            deadline,
            cached: None,
        }
    }
}

fn secret_error(e: &ClusterError) -> wit::SecretError {
    match e {
        ClusterError::NotFound(_) => wit::SecretError::NotFound(e.to_string()),
        _ => wit::SecretError::Other(e.to_string()),
    }
}

impl wit::Host for SecretsCall {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<String, wit::SecretError>> {
        let gate = self.shared.gate.clone();
        let started = gate.start();
        let got = self.read(&key).await;
        gate.used(started, || {
            let outcome = match &got {
                Ok(Ok(value)) => UseOutcome::Allowed {
                    status: None,
                    bytes: value.len() as u64,
                },
                Ok(Err(wit::SecretError::Denied(why))) => UseOutcome::Denied(why.clone()),
                Ok(Err(wit::SecretError::NotFound(why))) => {
                    UseOutcome::Failed(format!("not found: {why}"))
                }
                Ok(Err(wit::SecretError::Other(why))) => UseOutcome::Failed(why.clone()),
                Err(e) => UseOutcome::Failed(e.to_string()),
            };
            (CapabilityKind::Secret, key.clone(), outcome)
        });
        got
    }
}

impl SecretsCall {
    async fn read(&mut self, key: &str) -> wasmtime::Result<Result<String, wit::SecretError>> {
        let key = key.to_string();
        let shared = self.shared.clone();
        if let Err(denial) = shared.gate.check(Capability::SecretKey(&key)) {
            return Ok(Err(wit::SecretError::Denied(denial.0)));
        }
        let Some(grant) = shared.gate.grants().secret.as_ref() else {
            return Ok(Err(wit::SecretError::Denied("no secret grant".into())));
        };
        if self.cached.is_none() {
            self.reads.take(self.deadline).await?;
            let read = until_deadline(
                self.deadline,
                shared.cluster.get_secret(&grant.namespace, &grant.name),
            )
            .await?;
            self.cached = Some(read);
        }
        let data = match self.cached.as_ref() {
            Some(Ok(data)) => data,
            Some(Err(e)) => return Ok(Err(secret_error(e))),
            None => return Ok(Err(wit::SecretError::Other("no Secret was read".into()))),
        };
        let Some(value) = data.get(&key) else {
            return Ok(Err(wit::SecretError::NotFound(format!(
                "key `{}` is not in Secret {}/{}",
                quote(&key),
                grant.namespace,
                grant.name
            ))));
        };
        Ok(String::from_utf8(value.clone()).map_err(|_| {
            wit::SecretError::Other(format!("the value of key `{}` is not UTF-8", quote(&key)))
        }))
    }
}

pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut SecretsCall,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasSelf<SecretsCall>>(linker, get)
}
