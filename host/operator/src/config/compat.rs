//! Running the shipped FTI and NEC components from a Go-operator deployment's
//! environment.
//!
//! The Go operator compiled its vendors in and chose one with `CDI_PROVIDER_TYPE`; its
//! FTI client read `FTI_CDI_API_TYPE`, `FTI_CDI_ENDPOINT`, `FTI_CDI_TENANT_ID`,
//! `FTI_CDI_CLUSTER_ID` and the Secret `credentials` in
//! `composable-resource-operator-system`; its NEC client read `NEC_CDIM_IP`,
//! `LAYOUT_APPLY_PORT`, `CONFIGURATION_MANAGER_PORT` and `NEC_PROVISIONAL_GPU_UUID`.
//! This module turns that environment into a [`ProviderSpec`] for the shipped component
//! with exactly the grants it needs, so such a deployment keeps working without a
//! provider spec file ([`spec_from_env`]).

use std::path::PathBuf;
use std::time::Duration;

use cro_runtime::grants::{
    CaPem, Grants, HttpGrant, HttpTarget, Limits, LookupGrant, ProviderSpec, SecretGrant, WasiGrant,
};

pub(crate) const GO_OPERATOR_NAMESPACE: &str = "composable-resource-operator-system";
pub const CREDENTIALS_SECRET: &str = "credentials";
pub(crate) const CREDENTIAL_KEYS: [&str; 5] = [
    "username",
    "password",
    "client_id",
    "client_secret",
    "realm",
];
/// The config keys the shipped FTI component reads (providers/fti/src/config.rs): what
/// the start-up check compares a spec's `config` with in the Go environment, until
/// providers describe their own keys.
pub(crate) const FTI_CONFIG_KEYS: [&str; 11] = [
    "api_type",
    "endpoint",
    "tenant_id",
    "cluster_id",
    "username_key",
    "password_key",
    "client_id_key",
    "client_secret_key",
    "realm_key",
    "timeout_ms",
    "no_capacity_codes",
];
/// The variable that says where the FTI component is in the Go environment.
pub(crate) const FTI_COMPONENT_VAR: &str = "CRO_FTI_COMPONENT";
/// Where the container image puts the shipped FTI component; `CRO_FTI_COMPONENT` overrides.
pub const DEFAULT_FTI_COMPONENT: &str = "/opt/cro/providers/fti_provider.wasm";
/// How long the Go operator's HTTP client waited for one fabric request: a slow but
/// working fabric manager answers within it, so each request here gets as long.
pub(crate) const GO_REQUEST_TIMEOUT: Duration = Duration::from_secs(180);
/// The deadline of one provider call in the Go environment: one fabric request of up to
/// [`GO_REQUEST_TIMEOUT`] plus the token and machine reads around it (an attach or a
/// detach makes up to three requests). `CRO_FTI_CALL_TIMEOUT` overrides it.
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(240);

/// The variable that says where the NEC component is in the Go environment.
pub(crate) const NEC_COMPONENT_VAR: &str = "CRO_NEC_COMPONENT";
/// Where the container image puts the shipped NEC component; `CRO_NEC_COMPONENT`
/// overrides.
pub const DEFAULT_NEC_COMPONENT: &str = "/opt/cro/providers/nec_provider.wasm";
/// The config keys the shipped NEC component reads (providers/nec/src/config.rs).
pub(crate) const NEC_CONFIG_KEYS: [&str; 4] = [
    "configuration_manager_endpoint",
    "layout_apply_endpoint",
    "provisional_gpu_uuid",
    "timeout_ms",
];
/// The Go NEC client's per-request timeout (`requestTimeout`).
const NEC_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// One NEC call makes up to six requests (nodes, the two adapters, the resources, the
/// apply and its status) where the Go client polled inside the call; each may take the
/// Go client's 30 s.
const NEC_CALL_TIMEOUT: Duration = Duration::from_secs(200);

/// The shipped component a Go-environment spec runs: the variable that overrides its
/// path, its default path, and the config keys it reads.
pub(crate) fn shipped_component(
    spec_name: &str,
) -> (&'static str, &'static str, &'static [&'static str]) {
    match spec_name {
        "nec" => (NEC_COMPONENT_VAR, DEFAULT_NEC_COMPONENT, &NEC_CONFIG_KEYS),
        _ => (FTI_COMPONENT_VAR, DEFAULT_FTI_COMPONENT, &FTI_CONFIG_KEYS),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompatError {
    #[error(
        "CDI_PROVIDER_TYPE={0} is not shipped as a component: write a provider spec (CRO_PROVIDER_SPEC) for it"
    )]
    UnsupportedProvider(String),
    /// Go's SUNFISH client is a stub that attaches nothing; a Sunfish service speaks
    /// Redfish, which the shipped Redfish provider does.
    #[error(
        "CDI_PROVIDER_TYPE=SUNFISH is refused: the Go operator's Sunfish client is a stub that attaches nothing. A Sunfish service speaks DMTF Redfish: run the Redfish provider (providers/redfish, docs/redfish-provider.md) with a provider spec (CRO_PROVIDER_SPEC) instead"
    )]
    Sunfish,
    #[error("{0} must be set when CDI_PROVIDER_TYPE=FTI_CDI")]
    Missing(&'static str),
    #[error("{0} must be set when CDI_PROVIDER_TYPE=NEC")]
    MissingNec(&'static str),
    #[error("{var}={value:?} is not usable: {why}")]
    BadNec {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error("FTI_CDI_API_TYPE must be FM or CM, not {0:?}")]
    BadApiType(String),
    #[error("FTI_CDI_ENDPOINT {endpoint:?} is not usable: {why}")]
    BadEndpoint { endpoint: String, why: String },
    #[error("CRO_FTI_CA_FILE {path}: {why}")]
    BadCaFile { path: String, why: String },
    #[error("CRO_FTI_CALL_TIMEOUT {value:?}: {why}")]
    BadCallTimeout { value: String, why: String },
    #[error("the provider spec built from the environment is invalid: {0}")]
    Invalid(String),
}

/// Builds the spec of the shipped component `CDI_PROVIDER_TYPE` names (`FTI_CDI`:
/// FTI, `NEC`: NEC CDIM) from Go-operator variables read through `env`, or None when
/// `CDI_PROVIDER_TYPE` is not set (the deployment uses a spec file instead).
pub fn spec_from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ProviderSpec>, CompatError> {
    match env("CDI_PROVIDER_TYPE").as_deref().map(str::trim) {
        Some("NEC") => nec_spec_from_env(env).map(Some),
        _ => fti_spec_from_env(env),
    }
}

/// The NEC CDIM spec: the two services at `http://$NEC_CDIM_IP:$PORT` (the Go client's
/// plain HTTP, no credentials), the Node lookup, and the provisional GPU UUID.
pub fn nec_spec_from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProviderSpec, CompatError> {
    let get = |k: &str| {
        env(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let ip = get("NEC_CDIM_IP").ok_or(CompatError::MissingNec("NEC_CDIM_IP"))?;
    let service = |var: &'static str| -> Result<HttpTarget, CompatError> {
        let port = get(var).ok_or(CompatError::MissingNec(var))?;
        let bad = |why: String| CompatError::BadNec {
            var,
            value: port.clone(),
            why,
        };
        let n: u16 = port.parse().map_err(|_| bad("not a port number".into()))?;
        if n == 0 {
            return Err(bad("not a port number".into()));
        }
        // An IPv6 address is bracketed in a URL, as Go's url.ParseRequestURI needs it.
        let host = if ip.contains(':') && !ip.starts_with('[') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        HttpTarget::try_from(format!("http://{host}:{n}")).map_err(|e| CompatError::BadNec {
            var: "NEC_CDIM_IP",
            value: ip.clone(),
            why: e.to_string(),
        })
    };
    let layout_apply = service("LAYOUT_APPLY_PORT")?;
    let configuration_manager = service("CONFIGURATION_MANAGER_PORT")?;
    let mut spec = ProviderSpec::new(
        "nec",
        get(NEC_COMPONENT_VAR).map_or_else(|| PathBuf::from(DEFAULT_NEC_COMPONENT), PathBuf::from),
    );
    spec.config.insert(
        "configuration_manager_endpoint".into(),
        configuration_manager.to_string(),
    );
    spec.config
        .insert("layout_apply_endpoint".into(), layout_apply.to_string());
    // Kept for compatibility: CDIM reports no GPU UUID, so the Go operator reported this
    // one for every GPU (docs/differences-from-go.md, NEC).
    if let Some(uuid) = get("NEC_PROVISIONAL_GPU_UUID") {
        spec.config.insert("provisional_gpu_uuid".into(), uuid);
    }
    spec.config.insert(
        "timeout_ms".into(),
        NEC_REQUEST_TIMEOUT.as_millis().to_string(),
    );
    spec.grants = Grants {
        http: vec![
            HttpGrant::new(configuration_manager),
            HttpGrant::new(layout_apply),
        ],
        secret: None,
        lookup: vec![LookupGrant::new("v1", "Node")],
        wasi: WasiGrant { clocks: false },
    };
    spec.limits = Limits {
        call_timeout_ms: u64::try_from(NEC_CALL_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
        ..Limits::default()
    };
    spec.validate()
        .map_err(|e| CompatError::Invalid(e.to_string()))?;
    Ok(spec)
}

/// Builds the FTI provider spec from Go-operator variables read through `env`, or None
/// when `CDI_PROVIDER_TYPE` is not set (the deployment uses a spec file instead).
pub fn fti_spec_from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ProviderSpec>, CompatError> {
    let get = |k: &str| {
        env(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let Some(provider) = get("CDI_PROVIDER_TYPE") else {
        return Ok(None);
    };
    if provider == "SUNFISH" {
        return Err(CompatError::Sunfish);
    }
    if provider != "FTI_CDI" {
        return Err(CompatError::UnsupportedProvider(provider));
    }
    let api_type = get("FTI_CDI_API_TYPE").unwrap_or_else(|| "FM".into());
    if api_type != "FM" && api_type != "CM" {
        return Err(CompatError::BadApiType(api_type));
    }
    let endpoint = get("FTI_CDI_ENDPOINT").ok_or(CompatError::Missing("FTI_CDI_ENDPOINT"))?;
    let tenant = get("FTI_CDI_TENANT_ID").ok_or(CompatError::Missing("FTI_CDI_TENANT_ID"))?;
    let cluster = get("FTI_CDI_CLUSTER_ID");
    if api_type == "CM" && cluster.is_none() {
        return Err(CompatError::Missing("FTI_CDI_CLUSTER_ID"));
    }

    let mut http = HttpGrant::new(endpoint_target(&endpoint)?);
    if let Some(path) = get("CRO_FTI_CA_FILE") {
        let bad = |why: String| CompatError::BadCaFile {
            path: path.clone(),
            why,
        };
        let pem = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        http.ca_pem = Some(CaPem::try_from(pem).map_err(bad)?);
    }

    let mut lookup = vec![LookupGrant::new("v1", "Node")];
    if cluster.is_some() {
        lookup.push(LookupGrant::new("machine.openshift.io/v1beta1", "Machine"));
        lookup.push(LookupGrant::new("metal3.io/v1alpha1", "BareMetalHost"));
    }
    let mut spec = ProviderSpec::new(
        "fti",
        get("CRO_FTI_COMPONENT")
            .map_or_else(|| PathBuf::from(DEFAULT_FTI_COMPONENT), PathBuf::from),
    );
    spec.config.insert("api_type".into(), api_type);
    spec.config.insert("endpoint".into(), endpoint);
    spec.config.insert("tenant_id".into(), tenant);
    if let Some(c) = cluster {
        spec.config.insert("cluster_id".into(), c);
    }
    spec.grants = Grants {
        http: vec![http],
        secret: Some(SecretGrant {
            namespace: get("CRO_CREDENTIALS_NAMESPACE")
                .unwrap_or_else(|| GO_OPERATOR_NAMESPACE.into()),
            name: CREDENTIALS_SECRET.into(),
            keys: CREDENTIAL_KEYS.iter().map(|k| k.to_string()).collect(),
        }),
        lookup,
        // The token cache compares the JWT's exp with the wall clock.
        wasi: WasiGrant { clocks: true },
    };
    let call_timeout = match get("CRO_FTI_CALL_TIMEOUT") {
        None => DEFAULT_CALL_TIMEOUT,
        Some(v) => call_timeout(&v)?,
    };
    spec.limits = Limits {
        call_timeout_ms: u64::try_from(call_timeout.as_millis()).unwrap_or(u64::MAX),
        ..Limits::default()
    };
    // Each fabric request may take as long as the Go operator allowed, within the call.
    let request = GO_REQUEST_TIMEOUT.min(call_timeout);
    spec.config
        .insert("timeout_ms".into(), request.as_millis().to_string());
    spec.validate()
        .map_err(|e| CompatError::Invalid(e.to_string()))?;
    Ok(Some(spec))
}

/// A duration (`300s`, `5m`, ...) within what the runtime accepts for a call.
fn call_timeout(value: &str) -> Result<Duration, CompatError> {
    let bad = |why: String| CompatError::BadCallTimeout {
        value: value.to_owned(),
        why,
    };
    let d = crate::config::parse_duration(value).map_err(|e| bad(e.to_string()))?;
    let max = Duration::from_millis(Limits::MAX_CALL_TIMEOUT_MS);
    if d.is_zero() || d > max {
        return Err(bad(format!("must be more than 0 and at most {max:?}")));
    }
    Ok(d)
}

/// `fabric.example:8443/` (the Go form, https implied) or a full URL → `scheme://host:port`.
fn endpoint_target(endpoint: &str) -> Result<HttpTarget, CompatError> {
    let bad = |why: String| CompatError::BadEndpoint {
        endpoint: endpoint.to_owned(),
        why,
    };
    let full = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("https://{endpoint}")
    };
    let url = url::Url::parse(&full).map_err(|e| bad(e.to_string()))?;
    let host = url.host_str().ok_or_else(|| bad("no host".into()))?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| bad("no port".into()))?;
    HttpTarget::try_from(format!("{}://{host}:{port}", url.scheme())).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const FM: &[(&str, &str)] = &[
        ("CDI_PROVIDER_TYPE", "FTI_CDI"),
        ("FTI_CDI_API_TYPE", "FM"),
        ("FTI_CDI_ENDPOINT", "fabric.example:8443/"),
        ("FTI_CDI_TENANT_ID", "tenant-1"),
    ];

    #[test]
    fn unset_provider_means_no_compat_spec() {
        assert_eq!(fti_spec_from_env(env(&[])), Ok(None));
    }

    #[test]
    fn go_fm_environment_maps_to_least_grants() {
        let spec = fti_spec_from_env(env(FM)).unwrap().unwrap();
        assert_eq!(spec.config["api_type"], "FM");
        assert_eq!(spec.config["endpoint"], "fabric.example:8443/");
        assert_eq!(spec.config["tenant_id"], "tenant-1");
        assert!(!spec.config.contains_key("cluster_id"));
        let allowed =
            url::Url::parse("https://fabric.example:8443/fabric_manager/api/v1/machines/x")
                .unwrap();
        assert!(spec.grants.http_grant_for(&allowed).is_some());
        for denied in [
            "http://fabric.example:8443/",
            "https://fabric.example:9443/",
            "https://other.example:8443/",
        ] {
            assert!(
                spec.grants
                    .http_grant_for(&url::Url::parse(denied).unwrap())
                    .is_none(),
                "{denied}"
            );
        }
        let secret = spec.grants.secret.as_ref().unwrap();
        assert_eq!(
            (secret.namespace.as_str(), secret.name.as_str()),
            (GO_OPERATOR_NAMESPACE, "credentials")
        );
        assert!(secret.allows("client_secret") && !secret.allows("token"));
        assert!(spec.grants.allows_lookup("v1", "Node"));
        assert!(
            !spec
                .grants
                .allows_lookup("metal3.io/v1alpha1", "BareMetalHost")
        );
        assert!(spec.grants.wasi.clocks);
        assert_eq!(spec.component, PathBuf::from(DEFAULT_FTI_COMPONENT));
    }

    #[test]
    fn a_slow_fabric_gets_at_least_the_go_operators_time() {
        let spec = fti_spec_from_env(env(FM)).unwrap().unwrap();
        // The Go operator waited 180 s for one fabric request; the call around it needs
        // time for the token and machine reads as well.
        assert!(spec.limits.call_timeout() > GO_REQUEST_TIMEOUT);
        assert_eq!(spec.config["timeout_ms"], "180000");

        let mut vars = FM.to_vec();
        vars.push(("CRO_FTI_CALL_TIMEOUT", "7m"));
        let spec = fti_spec_from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(spec.limits.call_timeout(), Duration::from_secs(420));
        assert_eq!(spec.config["timeout_ms"], "180000");
        // A shorter call deadline bounds each request too.
        vars.pop();
        vars.push(("CRO_FTI_CALL_TIMEOUT", "20s"));
        let spec = fti_spec_from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(spec.limits.call_timeout(), Duration::from_secs(20));
        assert_eq!(spec.config["timeout_ms"], "20000");
        for bad in ["0s", "11m", "soon"] {
            vars.pop();
            vars.push(("CRO_FTI_CALL_TIMEOUT", bad));
            assert!(
                matches!(
                    fti_spec_from_env(env(&vars)),
                    Err(CompatError::BadCallTimeout { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn cluster_id_grants_the_openshift_chain() {
        let mut vars = FM.to_vec();
        vars.push(("FTI_CDI_CLUSTER_ID", "cluster-9"));
        vars[1] = ("FTI_CDI_API_TYPE", "CM");
        let spec = fti_spec_from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(spec.config["cluster_id"], "cluster-9");
        assert!(
            spec.grants
                .allows_lookup("machine.openshift.io/v1beta1", "Machine")
        );
        assert!(
            spec.grants
                .allows_lookup("metal3.io/v1alpha1", "BareMetalHost")
        );
    }

    #[test]
    fn bad_environments_say_what_is_wrong() {
        let with = |k: &'static str, v: &'static str| {
            let mut vars = FM.to_vec();
            vars.retain(|(name, _)| *name != k);
            if !v.is_empty() {
                vars.push((k, v));
            }
            fti_spec_from_env(env(&vars))
        };
        assert_eq!(
            with("CDI_PROVIDER_TYPE", "SUNFISH"),
            Err(CompatError::Sunfish)
        );
        assert_eq!(
            with("CDI_PROVIDER_TYPE", "IBM"),
            Err(CompatError::UnsupportedProvider("IBM".into()))
        );
        assert_eq!(
            with("FTI_CDI_API_TYPE", "XX"),
            Err(CompatError::BadApiType("XX".into()))
        );
        assert_eq!(
            with("FTI_CDI_ENDPOINT", ""),
            Err(CompatError::Missing("FTI_CDI_ENDPOINT"))
        );
        assert_eq!(
            with("FTI_CDI_TENANT_ID", ""),
            Err(CompatError::Missing("FTI_CDI_TENANT_ID"))
        );
        assert_eq!(
            with("FTI_CDI_API_TYPE", "CM"),
            Err(CompatError::Missing("FTI_CDI_CLUSTER_ID"))
        );
        assert!(matches!(
            with("FTI_CDI_ENDPOINT", "ht!tp://"),
            Err(CompatError::BadEndpoint { .. })
        ));
        assert!(matches!(
            with("CRO_FTI_CA_FILE", "/nonexistent/ca.pem"),
            Err(CompatError::BadCaFile { .. })
        ));
    }

    const NEC: &[(&str, &str)] = &[
        ("CDI_PROVIDER_TYPE", "NEC"),
        ("NEC_CDIM_IP", "10.1.2.3"),
        ("LAYOUT_APPLY_PORT", "8003"),
        ("CONFIGURATION_MANAGER_PORT", "8080"),
        (
            "NEC_PROVISIONAL_GPU_UUID",
            "8f0e1d2c-0000-4000-8000-000000000001",
        ),
    ];

    /// The Go operator's NEC environment runs the shipped NEC component (it was refused
    /// before), granted the two CDIM services over plain HTTP and Node lookups only.
    #[test]
    fn go_nec_environment_runs_the_nec_component_with_least_grants() {
        let spec = spec_from_env(env(NEC)).unwrap().unwrap();
        assert_eq!(spec.name, "nec");
        assert_eq!(spec.component, PathBuf::from(DEFAULT_NEC_COMPONENT));
        assert_eq!(
            spec.config["configuration_manager_endpoint"],
            "http://10.1.2.3:8080"
        );
        assert_eq!(spec.config["layout_apply_endpoint"], "http://10.1.2.3:8003");
        assert_eq!(
            spec.config["provisional_gpu_uuid"],
            "8f0e1d2c-0000-4000-8000-000000000001"
        );
        assert_eq!(spec.config["timeout_ms"], "30000");
        for allowed in [
            "http://10.1.2.3:8080/cdim/api/v1/resources?detail=true",
            "http://10.1.2.3:8003/cdim/api/v1/layout-apply",
        ] {
            assert!(
                spec.grants
                    .http_grant_for(&url::Url::parse(allowed).unwrap())
                    .is_some(),
                "{allowed}"
            );
        }
        for denied in [
            "https://10.1.2.3:8080/",
            "http://10.1.2.3:9090/",
            "http://10.1.2.4:8003/",
        ] {
            assert!(
                spec.grants
                    .http_grant_for(&url::Url::parse(denied).unwrap())
                    .is_none(),
                "{denied}"
            );
        }
        assert!(spec.grants.secret.is_none());
        assert!(spec.grants.allows_lookup("v1", "Node"));
        assert!(!spec.grants.wasi.clocks);
        // Every key the spec sets is one the component reads.
        assert!(
            spec.config
                .keys()
                .all(|k| NEC_CONFIG_KEYS.contains(&k.as_str()))
        );
        assert_eq!(shipped_component("nec").0, NEC_COMPONENT_VAR);
        let mut vars = NEC.to_vec();
        vars.push((NEC_COMPONENT_VAR, "/x/nec.wasm"));
        vars.retain(|(k, _)| *k != "NEC_PROVISIONAL_GPU_UUID");
        let spec = spec_from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(spec.component, PathBuf::from("/x/nec.wasm"));
        assert!(!spec.config.contains_key("provisional_gpu_uuid"));
        // The FTI environment still goes to FTI.
        assert_eq!(spec_from_env(env(FM)).unwrap().unwrap().name, "fti");
        assert_eq!(spec_from_env(env(&[])), Ok(None));
    }

    #[test]
    fn bad_nec_environments_say_what_is_wrong() {
        let with = |k: &'static str, v: &'static str| {
            let mut vars = NEC.to_vec();
            vars.retain(|(name, _)| *name != k);
            if !v.is_empty() {
                vars.push((k, v));
            }
            spec_from_env(env(&vars))
        };
        for var in [
            "NEC_CDIM_IP",
            "LAYOUT_APPLY_PORT",
            "CONFIGURATION_MANAGER_PORT",
        ] {
            assert_eq!(with(var, ""), Err(CompatError::MissingNec(var)), "{var}");
        }
        for (var, value) in [
            ("LAYOUT_APPLY_PORT", "http"),
            ("CONFIGURATION_MANAGER_PORT", "0"),
            ("CONFIGURATION_MANAGER_PORT", "70000"),
            ("NEC_CDIM_IP", "cdim/evil"),
        ] {
            assert!(
                matches!(with(var, value), Err(CompatError::BadNec { .. })),
                "{var}={value}"
            );
        }
    }

    /// SUNFISH stays refused (Go's client is a stub), pointing at the Redfish provider.
    #[test]
    fn sunfish_is_refused_pointing_at_the_redfish_provider() {
        let e = spec_from_env(env(&[("CDI_PROVIDER_TYPE", "SUNFISH")])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("Redfish provider") && text.contains("docs/redfish-provider.md"),
            "{text}"
        );
    }
}
