//! The `secrets` capability's grant: one Secret and the keys of it a provider may read;
//! and the gate's check of a key ([`SecretKey`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::base::{FieldError, is_dns_label, is_dns_subdomain, quote};
use crate::gate::{CapabilityKind, Check};

/// The keys of one Secret a provider may read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretGrant {
    pub namespace: String,
    pub name: String,
    pub keys: Vec<String>,
}

impl SecretGrant {
    pub fn allows(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }

    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        if !is_dns_label(&self.namespace) {
            return Err(FieldError::new(
                "grants.secret.namespace",
                format!("`{}` is not a namespace name", self.namespace),
            ));
        }
        if !is_dns_subdomain(&self.name) {
            return Err(FieldError::new(
                "grants.secret.name",
                format!("`{}` is not a Secret name", self.name),
            ));
        }
        if self.keys.is_empty() {
            return Err(FieldError::new(
                "grants.secret.keys",
                "list the keys the provider may read (an empty list grants nothing)",
            ));
        }
        let mut seen = BTreeSet::new();
        for key in &self.keys {
            let ok = !key.is_empty()
                && key.len() <= 253
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(FieldError::new(
                    "grants.secret.keys",
                    format!("`{key}` is not a Secret key"),
                ));
            }
            if !seen.insert(key) {
                return Err(FieldError::new(
                    "grants.secret.keys",
                    format!("`{key}` is listed twice"),
                ));
            }
        }
        Ok(())
    }
}

/// Reading one key of the granted Secret (if one is granted).
pub(crate) struct SecretKey<'a> {
    pub(crate) grant: Option<&'a SecretGrant>,
    pub(crate) key: &'a str,
}

impl Check for SecretKey<'_> {
    fn kind(&self) -> Option<CapabilityKind> {
        Some(CapabilityKind::Secret)
    }

    fn decide(&self) -> Result<(), String> {
        match self.grant {
            Some(secret) if secret.allows(self.key) => Ok(()),
            Some(secret) => Err(format!(
                "no secret grant for key `{}` of {}/{}",
                quote(self.key),
                secret.namespace,
                secret.name
            )),
            None => Err(format!(
                "no secret grant (the provider asked for key `{}`)",
                quote(self.key)
            )),
        }
    }
}
