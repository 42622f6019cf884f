//! The registration: every registered capability is in the grants schema, parses and
//! validates its grant, reports it, and links its interfaces (so the list cannot
//! silently skip one). And the gate deciding through each capability's own checks: what
//! is granted passes, the rest is denied with a message naming the missing grant, and
//! counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use url::Url;
use wasmtime::component::Linker;

use super::capability::{Declared, Findings};
use super::{GRANTED, Grants, NAMES, examples, report};
use crate::domain::{ProviderInfo, WantedCapabilities};

use super::config::ReadConfig;
use super::http::grant::{Header, HttpGrant, RequestTo};
use super::log::WriteLog;
use super::lookup::grant::{Kind, LookupGrant, ObjectName};
use super::secrets::grant::{SecretGrant, SecretKey};
use super::state::UseState;
use crate::gate::{Denial, DenialCounts, Gate};

/// A provider that wants nothing and accepts no configuration.
fn wants_nothing() -> ProviderInfo {
    ProviderInfo {
        name: "p".into(),
        vendor: "v".into(),
        version: "1".into(),
        devices: Vec::new(),
        capabilities: WantedCapabilities::default(),
        config: Vec::new(),
    }
}

#[test]
fn names_are_unique_and_every_grants_key_is_registered() {
    let names: BTreeSet<_> = NAMES.iter().collect();
    assert_eq!(names.len(), NAMES.len(), "{NAMES:?}");
    // The spec's schema: the keys `grants` accepts are exactly the registered ones.
    let schema = serde_json::to_value(Grants::default()).unwrap();
    let keys: BTreeSet<&str> = schema
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let registered: BTreeSet<&str> = GRANTED.iter().map(|(_, key)| *key).collect();
    assert_eq!(keys, registered);
    for (name, _) in GRANTED {
        assert!(NAMES.contains(name), "{name}");
    }
}

#[test]
fn every_grant_is_parsed_validated_and_reported() {
    let examples = examples();
    assert_eq!(examples.len(), GRANTED.len());
    let info = wants_nothing();
    let config = BTreeMap::new();
    let declared = Declared {
        info: &info,
        config: &config,
    };
    let mut none = Findings::default();
    report(&Grants::default(), &declared, &mut none);
    assert!(none.granted_not_wanted.is_empty(), "{none:?}");
    for ((name, key), (example_of, grants)) in GRANTED.iter().zip(examples) {
        assert_eq!(*name, example_of);
        assert_ne!(
            grants,
            Grants::default(),
            "{name}: the example grants nothing"
        );
        assert_eq!(grants.validate(), Ok(()), "{name}");
        // Parsed back from its own section of the spec.
        let json = serde_json::to_value(&grants).unwrap();
        let section = serde_json::json!({ *key: json[key].clone() });
        let parsed: Grants = serde_json::from_value(section).unwrap();
        assert_eq!(parsed, grants, "{name}");
        // What is granted but not wanted is in the report.
        let mut findings = Findings::default();
        report(&grants, &declared, &mut findings);
        assert!(
            !findings.granted_not_wanted.is_empty(),
            "{name}: an unwanted grant is missing from the report"
        );
    }
}

/// The functions of each interface of the 0.1.0 contract the host links.
fn contract_functions() -> Vec<(String, Vec<String>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit/since_v0.1.0");
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(&dir).unwrap();
    let (_, own) = crate::wit::OWN_INTERFACES
        .iter()
        .find(|(v, _)| *v == "0.1.0")
        .unwrap();
    resolve.packages[package]
        .interfaces
        .iter()
        .filter(|(name, _)| own.contains(&name.as_str()) && name.as_str() != "types")
        .map(|(name, id)| {
            let functions = resolve.interfaces[*id].functions.keys().cloned().collect();
            (format!("cro:provider/{name}@0.1.0"), functions)
        })
        .collect()
}

#[test]
fn every_capability_interface_of_the_contract_is_linked() {
    let engine = wasmtime::Engine::new(&crate::base::base_config()).unwrap();
    let mut linker = Linker::<crate::call::CallCtx>::new(&engine);
    crate::call::add_to_linker(&mut linker).unwrap();
    let interfaces = contract_functions();
    assert!(interfaces.len() >= 6, "{interfaces:?}");
    for (interface, functions) in interfaces {
        assert!(!functions.is_empty(), "{interface}");
        for function in functions {
            // Defining it again fails only when a capability already linked it.
            let mut instance = linker.instance(&interface).unwrap();
            let again = instance.func_wrap(&function, |_, (): ()| Ok(()));
            assert!(again.is_err(), "{interface}#{function} is not linked");
        }
    }
}

struct Granted {
    http: Vec<HttpGrant>,
    secret: Option<SecretGrant>,
    lookup: Vec<LookupGrant>,
}

impl Granted {
    fn some() -> Granted {
        Granted {
            http: vec![HttpGrant::new(
                "https://fabric.example:8443".parse().unwrap(),
            )],
            secret: Some(SecretGrant {
                namespace: "ns".into(),
                name: "creds".into(),
                keys: vec!["username".into()],
            }),
            lookup: vec![LookupGrant::new("v1", "Node")],
        }
    }

    fn none() -> Granted {
        Granted {
            http: Vec::new(),
            secret: None,
            lookup: Vec::new(),
        }
    }

    fn url<'a>(&'a self, url: &'a Url) -> RequestTo<'a> {
        RequestTo {
            grants: &self.http,
            url,
        }
    }

    fn key<'a>(&'a self, key: &'a str) -> SecretKey<'a> {
        SecretKey {
            grant: self.secret.as_ref(),
            key,
        }
    }

    fn kind<'a>(&'a self, api_version: &'a str, kind: &'a str) -> Kind<'a> {
        Kind {
            grants: &self.lookup,
            api_version,
            kind,
        }
    }
}

fn gate() -> Arc<Gate> {
    Arc::new(Gate::new("p"))
}

#[test]
fn allows_what_is_granted_and_counts_the_rest() {
    let (gate, granted) = (gate(), Granted::some());
    let good = Url::parse("https://fabric.example:8443/x").unwrap();
    let evil = Url::parse("https://evil.example/x").unwrap();
    assert_eq!(gate.check(&granted.url(&good)), Ok(()));
    assert_eq!(
        gate.check(&granted.url(&evil)),
        Err(Denial("no http grant for https://evil.example:443".into()))
    );
    assert_eq!(gate.check(&granted.key("username")), Ok(()));
    assert_eq!(
        gate.check(&granted.key("password")),
        Err(Denial(
            "no secret grant for key `password` of ns/creds".into()
        ))
    );
    assert_eq!(gate.check(&granted.kind("v1", "Node")), Ok(()));
    assert_eq!(
        gate.check(&granted.kind("v1", "Pod")),
        Err(Denial("no lookup grant for v1 Pod".into()))
    );
    assert_eq!(gate.check(&ReadConfig), Ok(()));
    assert_eq!(gate.check(&WriteLog), Ok(()));
    assert_eq!(gate.check(&UseState), Ok(()));
    assert_eq!(
        gate.denials(),
        DenialCounts {
            http: 1,
            secret: 1,
            lookup: 1
        }
    );
    assert_eq!(gate.denials().total(), 3);
}

#[test]
fn headers_and_names_are_checked_and_guest_text_is_clipped() {
    let (gate, granted) = (gate(), Granted::some());
    assert_eq!(gate.check(&Header("authorization")), Ok(()));
    let host = gate.check(&Header("Host")).unwrap_err();
    assert!(
        host.0.contains("`Host` is set by the host only"),
        "{}",
        host.0
    );
    assert_eq!(
        gate.check(&ObjectName {
            name: "worker-0",
            namespace: None
        }),
        Ok(())
    );
    let proxy = gate
        .check(&ObjectName {
            name: "worker-0/proxy",
            namespace: None,
        })
        .unwrap_err();
    assert!(
        proxy.0.contains("is not a Kubernetes object name"),
        "{}",
        proxy.0
    );
    let huge = "k\n".repeat(1 << 20);
    let denial = gate.check(&granted.key(&huge)).unwrap_err();
    assert!(denial.0.len() < 400, "{}", denial.0.len());
    assert!(!denial.0.contains('\n'), "{}", denial.0);
    assert_eq!(gate.denials().http, 1);
    assert_eq!(gate.denials().lookup, 1);
    assert_eq!(gate.denials().secret, 1);
}

#[test]
fn no_grants_deny_everything() {
    let (gate, granted) = (gate(), Granted::none());
    let url = Url::parse("http://127.0.0.1/").unwrap();
    assert!(gate.check(&granted.url(&url)).is_err());
    let denial = gate.check(&granted.key("k")).unwrap_err();
    assert_eq!(denial.0, "no secret grant (the provider asked for key `k`)");
    assert!(gate.check(&granted.kind("v1", "Node")).is_err());
    assert_eq!(gate.denials().total(), 3);
}
