//! The `secrets` capability: one granted Secret and its check ([`grant`]), the
//! `cro:provider/secrets` host function and its bindings (`wit`). The Secret is read once per call and its keys served from that copy
//! (a provider asking for keys in a loop costs one API read); every read counts against
//! the call's cluster-read budget.

pub mod grant;
pub(crate) mod wit;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use self::grant::{SecretGrant, SecretKey};
use super::capability::{CallSetup, Capability, Declared, Findings, Load, SetupError};
use super::reads::CallReads;
use crate::base::{FieldError, quote, until_deadline};
use crate::cluster::{ClusterError, ClusterReader};
use crate::gate::{CapabilityKind, Gate, UseOutcome};

/// The capability, as `crate::caps` registers it.
pub(crate) struct SecretsCap;

impl Capability for SecretsCap {
    const NAME: &'static str = "secrets";
    type Grant = Option<SecretGrant>;
    type Shared = Secrets;
    type Call = SecretsCall;

    fn validate(grant: &Option<SecretGrant>) -> Result<(), FieldError> {
        grant.as_ref().map_or(Ok(()), SecretGrant::validate)
    }

    fn load(grant: &Option<SecretGrant>, load: &Load<'_>) -> Result<Secrets, SetupError> {
        Ok(Secrets {
            grant: grant.clone(),
            gate: load.gate.clone(),
            cluster: load.cluster.clone(),
        })
    }

    fn call(shared: &Arc<Secrets>, setup: &CallSetup) -> SecretsCall {
        SecretsCall::new(shared.clone(), setup.reads.clone(), setup.deadline)
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut SecretsCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<SecretsCall>>(linker, get)
    }

    fn report(grant: &Option<SecretGrant>, declared: &Declared<'_>, findings: &mut Findings) {
        let wanted = &declared.info.capabilities.secret_keys;
        for key in wanted {
            if !grant.as_ref().is_some_and(|s| s.allows(key)) {
                findings
                    .wanted_not_granted
                    .push(format!("secret key {key}"));
            }
        }
        let Some(secret) = grant else {
            return;
        };
        for key in secret.keys.iter().filter(|k| !wanted.contains(k)) {
            findings.granted_not_wanted.push(format!(
                "secret key {key} (of {}/{})",
                secret.namespace, secret.name
            ));
        }
    }

    #[cfg(test)]
    fn example() -> Option<SecretGrant> {
        Some(SecretGrant {
            namespace: "ns".into(),
            name: "creds".into(),
            keys: vec!["username".into()],
        })
    }
}

/// The provider's side.
pub(crate) struct Secrets {
    grant: Option<SecretGrant>,
    gate: Arc<Gate>,
    cluster: Arc<dyn ClusterReader>,
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
        let check = SecretKey {
            grant: shared.grant.as_ref(),
            key: &key,
        };
        if let Err(denial) = shared.gate.check(&check) {
            return Ok(Err(wit::SecretError::Denied(denial.0)));
        }
        let Some(grant) = shared.grant.as_ref() else {
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
