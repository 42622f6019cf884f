//! Credential failures that name where the credentials come from.
//!
//! A provider reports that the fabric refused its credentials in its own words; it does
//! not know (or say) which Secret they were read from. The operator does: the provider
//! spec grants exactly one Secret and its keys. [`NamingSecret`] wraps the provider so
//! every failure that is about credentials also names that Secret and its keys, in
//! `status.error`, Events and logs alike (docs/troubleshooting.md).

use std::sync::Arc;

use cro_runtime::CallError;
use cro_runtime::domain::{
    self, AddOutcome, AddRequest, Claim, DeviceInfo, PoolOutcome, PoolQuery, ProviderError,
    RemoveOutcome,
};
use futures::future::BoxFuture;

use crate::provider::{DeviceProvider, ProviderCounters, ProviderResult};

/// The Secret the provider spec grants (namespace, name, keys).
pub(crate) type SecretRef = cro_runtime::grants::SecretGrant;

/// Whether `e` is about the credentials: the identity manager or fabric refused them
/// (HTTP 401), or a credential or Secret key could not be read.
pub(crate) fn is_credential_failure(e: &ProviderError) -> bool {
    match e {
        ProviderError::Fabric(f) => f.status == 401,
        ProviderError::Config(m) | ProviderError::Denied(m) | ProviderError::Other(m) => {
            let m = m.to_ascii_lowercase();
            m.contains("credential") || m.contains("secret") || m.contains("http 401")
        }
        _ => false,
    }
}

/// `e` with the Secret named when it is a credential failure; anything else unchanged.
pub(crate) fn name_the_secret(e: CallError, secret: &SecretRef) -> CallError {
    let CallError::Provider(p) = e else {
        return e;
    };
    if !is_credential_failure(&p) {
        return CallError::Provider(p);
    }
    // A Secret that does not exist is the first thing to say (a new cluster's usual
    // case), not a key missing from it.
    let missing = format!("Secret {}/{} not found", secret.namespace, secret.name);
    let lead = |m: String| {
        format!(
            "{missing}: create it with the provider's credentials (keys {}) ({m})",
            secret.keys.join(", ")
        )
    };
    match p {
        // The error's kind is kept (it labels metrics); its message starts with the Secret.
        ProviderError::Config(m) if m.contains(&missing) => {
            return CallError::Provider(ProviderError::Config(lead(m)));
        }
        ProviderError::Other(m) if m.contains(&missing) => {
            return CallError::Provider(ProviderError::Other(lead(m)));
        }
        _ => {}
    }
    let hint = format!(
        "; the provider's credentials are read from Secret {}/{} (keys {}): check their values",
        secret.namespace,
        secret.name,
        secret.keys.join(", ")
    );
    CallError::Provider(match p {
        ProviderError::Fabric(mut f) => {
            f.message.push_str(&hint);
            ProviderError::Fabric(f)
        }
        ProviderError::Config(m) => ProviderError::Config(m + &hint),
        ProviderError::Denied(m) => ProviderError::Denied(m + &hint),
        ProviderError::Other(m) => ProviderError::Other(m + &hint),
        other => other,
    })
}

/// A provider whose credential failures name the granted Secret.
pub(crate) struct NamingSecret {
    inner: Arc<dyn DeviceProvider>,
    secret: SecretRef,
}

impl NamingSecret {
    pub(crate) fn new(inner: Arc<dyn DeviceProvider>, secret: SecretRef) -> Self {
        Self { inner, secret }
    }
}

impl NamingSecret {
    /// `call`'s failure with the Secret named when it is about credentials.
    async fn naming<T>(&self, call: BoxFuture<'_, ProviderResult<T>>) -> ProviderResult<T> {
        call.await.map_err(|e| name_the_secret(e, &self.secret))
    }
}

/// Every call goes through to the wrapped provider unchanged (the whole request, the
/// whole claim list); only a failure's text changes.
impl DeviceProvider for NamingSecret {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        Box::pin(self.naming(self.inner.add(request)))
    }

    fn remove<'a>(
        &'a self,
        r: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        Box::pin(self.naming(self.inner.remove(r)))
    }

    fn check<'a>(&'a self, r: &'a domain::ComposableResource) -> BoxFuture<'a, ProviderResult<()>> {
        Box::pin(self.naming(self.inner.check(r)))
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        Box::pin(self.naming(self.inner.list(claims)))
    }

    fn pool<'a>(&'a self, query: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>> {
        Box::pin(self.naming(self.inner.pool(query)))
    }

    fn counters(&self) -> Option<ProviderCounters> {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> SecretRef {
        SecretRef {
            namespace: "cro".into(),
            name: "credentials".into(),
            keys: vec!["username".into(), "password".into()],
        }
    }

    #[test]
    fn credential_failures_name_the_secret_and_its_keys() {
        let e = CallError::Provider(ProviderError::Config(
            "credentials rejected by the identity manager (HTTP 401): invalid_grant".into(),
        ));
        let text = name_the_secret(e, &secret()).to_string();
        assert!(
            text.contains("invalid_grant")
                && text.contains("Secret cro/credentials (keys username, password)"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_secret_leads_the_message() {
        // What the FTI component reports when the runtime cannot read the Secret.
        let e = CallError::Provider(ProviderError::Config(
            "credential key 'username' is missing from the granted Secret: Secret cro/credentials not found"
                .into(),
        ));
        let text = name_the_secret(e, &secret()).to_string();
        let lead = text
            .find("Secret cro/credentials not found: create it with the provider's credentials (keys username, password)")
            .unwrap_or_else(|| panic!("{text}"));
        // Only the error kind's own prefix comes before it.
        assert_eq!(&text[..lead], "provider configuration: ", "{text}");
    }

    #[test]
    fn other_failures_are_left_alone() {
        for e in [
            ProviderError::NotFound("device GPU-1".into()),
            ProviderError::Config("endpoint is not a URL".into()),
            ProviderError::Unavailable("fabric down".into()),
        ] {
            let before = CallError::Provider(e.clone()).to_string();
            let after = name_the_secret(CallError::Provider(e), &secret()).to_string();
            assert_eq!(after, before);
        }
    }
}
