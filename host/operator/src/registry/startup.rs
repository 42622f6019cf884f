//! Checks of the provider spec before the operator takes its first request: mistakes
//! that would otherwise surface only at the first fabric call, as an error on some
//! user's request (docs/troubleshooting.md, "Refused at start").
//!
//! Pure functions over the spec, so they are tested without a component or a cluster;
//! `check_loaded` applies the same checks to a loaded provider's own `describe()`.

use std::collections::BTreeMap;

use cro_runtime::ProviderSpec;
use url::Url;

use crate::error::OperatorError;

/// One mistake found in a spec; its text names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpecProblem {
    #[error(
        "provider config key {key:?} is not one the provider reads (known keys: {known}); check its spelling"
    )]
    UnknownConfigKey { key: String, known: String },
    #[error(
        "provider config {key} = {value:?} is not covered by any HTTP grant (granted: {granted}): every call to it would be refused; add it to grants.http"
    )]
    EndpointNotGranted {
        key: String,
        value: String,
        granted: String,
    },
    #[error(
        "provider config key {key:?} is not one the provider declares (it accepts: {accepted}); check its spelling"
    )]
    UndeclaredConfigKey { key: String, accepted: String },
    #[error("provider config key {key:?} is required by the provider and not set")]
    MissingConfigKey { key: String },
}

/// What a loaded provider's own `describe()` says is wrong with the configuration it
/// was given: keys it does not accept, keys it requires that are not set. Nothing for a
/// provider that declares nothing (contract 0.1.0).
pub(crate) fn check_declared(
    report: &cro_runtime::CapabilityReport,
    info: Option<&cro_runtime::domain::ProviderInfo>,
) -> Vec<SpecProblem> {
    if !report.declared {
        return Vec::new();
    }
    let accepted = info
        .map(|i| {
            i.config
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let unknown = report
        .unknown_config
        .iter()
        .map(|k| SpecProblem::UndeclaredConfigKey {
            key: k.clone(),
            accepted: accepted.clone(),
        });
    let missing = report
        .missing_config
        .iter()
        .map(|k| SpecProblem::MissingConfigKey { key: k.clone() });
    unknown.chain(missing).collect()
}

/// Config keys the provider does not read. `known` comes from the provider (its
/// `describe()`, or what the operator knows of the shipped component); without it
/// nothing can be said.
pub(crate) fn unknown_config_keys(
    config: &BTreeMap<String, String>,
    known: Option<&[&str]>,
) -> Vec<SpecProblem> {
    let Some(known) = known else {
        return Vec::new();
    };
    config
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| SpecProblem::UnknownConfigKey {
            key: k.clone(),
            known: known.join(", "),
        })
        .collect()
}

/// The URL a config value names, if it names one: a value with a scheme, or a
/// `host[:port][/path]` under a key called `endpoint` or ending in `_endpoint` or `_url`
/// (HTTPS implied, as the Go operator's `FTI_CDI_ENDPOINT`).
pub(crate) fn endpoint_of(key: &str, value: &str) -> Option<Url> {
    let value = value.trim();
    if value.contains("://") {
        let url = Url::parse(value).ok()?;
        return matches!(url.scheme(), "http" | "https").then_some(url);
    }
    let named = key == "endpoint" || key.ends_with("_endpoint") || key.ends_with("_url");
    if !named || value.is_empty() {
        return None;
    }
    Url::parse(&format!("https://{value}")).ok()
}

/// Endpoints in the config that no HTTP grant allows.
pub(crate) fn ungranted_endpoints(spec: &ProviderSpec) -> Vec<SpecProblem> {
    let granted = || {
        let list: Vec<String> = spec.grants.http.iter().map(|g| g.url.to_string()).collect();
        if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(", ")
        }
    };
    spec.config
        .iter()
        .filter_map(|(key, value)| {
            let url = endpoint_of(key, value)?;
            (!spec.grants.http.iter().any(|g| g.allows(&url))).then(|| {
                SpecProblem::EndpointNotGranted {
                    key: key.clone(),
                    value: value.clone(),
                    granted: granted(),
                }
            })
        })
        .collect()
}

/// Every problem of `spec`, given the config keys the provider is known to read.
pub(crate) fn check_spec(spec: &ProviderSpec, known_keys: Option<&[&str]>) -> Vec<SpecProblem> {
    let mut problems = unknown_config_keys(&spec.config, known_keys);
    problems.extend(ungranted_endpoints(spec));
    problems
}

/// Refuses a loaded provider whose configuration its own `describe()` rejects (keys it
/// does not accept, required keys not set), naming each key, before any request.
pub fn check_loaded(provider: &cro_runtime::Provider) -> Result<(), OperatorError> {
    let problems = check_declared(&provider.capability_report(), provider.info());
    if problems.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
    Err(OperatorError::Config(format!(
        "provider {}: {}",
        provider.name(),
        list.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_runtime::grants::{HttpGrant, HttpTarget};

    fn spec(endpoint: &str, grant: &str) -> ProviderSpec {
        let mut s = ProviderSpec::new("fti", "/x.wasm");
        s.config.insert("endpoint".into(), endpoint.into());
        s.config.insert("tenant_id".into(), "t".into());
        s.grants.http = vec![HttpGrant::new(grant.parse::<HttpTarget>().unwrap())];
        s
    }

    #[test]
    fn typos_in_config_keys_are_named_when_the_keys_are_known() {
        let mut s = spec("fm.example:8443/", "https://fm.example:8443");
        s.config.insert("tenant_idd".into(), "t".into());
        assert_eq!(unknown_config_keys(&s.config, None), vec![]);
        let problems = unknown_config_keys(&s.config, Some(&["endpoint", "tenant_id"]));
        assert_eq!(problems.len(), 1);
        let text = problems[0].to_string();
        assert!(
            text.contains("\"tenant_idd\"") && text.contains("tenant_id"),
            "{text}"
        );
    }

    #[test]
    fn an_endpoint_no_grant_covers_is_named() {
        assert_eq!(
            ungranted_endpoints(&spec("fm.example:8443/", "https://fm.example:8443")),
            vec![]
        );
        assert_eq!(
            ungranted_endpoints(&spec(
                "https://fm.example:8443/api",
                "https://fm.example:8443"
            )),
            vec![]
        );
        let problems = ungranted_endpoints(&spec("fm.example:9443/", "https://fm.example:8443"));
        assert_eq!(problems.len(), 1);
        let text = problems[0].to_string();
        assert!(
            text.contains("endpoint = \"fm.example:9443/\"") && text.contains("fm.example:8443"),
            "{text}"
        );
        // http vs https is a different grant.
        assert_eq!(
            ungranted_endpoints(&spec("http://fm.example:8443/", "https://fm.example:8443")).len(),
            1
        );
    }

    #[test]
    fn only_values_that_name_an_endpoint_are_read_as_urls() {
        assert_eq!(endpoint_of("tenant_id", "abc"), None);
        assert_eq!(endpoint_of("realm", "x.y:80"), None);
        assert!(endpoint_of("token_url", "id.example/realms/x").is_some());
        assert!(endpoint_of("anything", "https://a.example/").is_some());
        assert_eq!(endpoint_of("anything", "ftp://a.example/"), None);
    }
}
