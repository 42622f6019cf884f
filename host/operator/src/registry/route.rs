//! Which provider serves a node: a pure decision over the node's labels and the
//! providers' selectors (docs/providers.md, "Routing").
//!
//! A provider whose `nodeSelector` matches the node serves it; when none matches, the
//! one default provider does. No provider, or more than one, is an error naming them,
//! never a guess: attaching a device through the wrong fabric would attach somebody
//! else's hardware.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// What routing needs to know of one provider.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RouteEntry {
    pub(crate) name: String,
    /// None selects no node (only `default` can then make it serve).
    pub(crate) selector: Option<LabelSelector>,
    pub(crate) default: bool,
}

/// Why no single provider serves a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RouteError {
    #[error(
        "no CdiProvider serves node {node}: no nodeSelector matches its labels and no provider is the default"
    )]
    NoProvider { node: String },
    #[error("more than one CdiProvider serves node {node}: {}", .providers.join(", "))]
    Ambiguous {
        node: String,
        providers: Vec<String>,
    },
    #[error(
        "node {node} is not known (not in the Node cache, and no resource on it is labelled with a provider serving here)"
    )]
    UnknownNode { node: String },
    #[error(
        "no call for node {node} is routed yet: the operator is still reading the CdiProvider objects (one read so far may not be the one serving it)"
    )]
    ProvidersUnread { node: String },
    #[error(
        "node {node} is now served by CdiProvider {serving}, but the resource is labelled with {labelled}: no device is attached to it through another provider's fabric (delete the resource; its request plans it again)"
    )]
    Relabelled {
        node: String,
        labelled: String,
        serving: String,
    },
}

/// What a routed call does with a node's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Attaches a device.
    Attach,
    /// Acts on a device a resource holds (detach, check).
    Held,
}

/// The provider a call on a resource goes to. The resource's provider label (`label`:
/// set when its node routed, then kept) names the fabric its device is on, and the
/// provider whose controller reconciles it: a call on a device it holds goes there while
/// that provider is among `providers`, wherever the node routes now (`routed`), unless
/// two providers claim the node: that is reported, as for any call there, until the
/// providers are fixed. An attach goes where the node routes, and only when that is the
/// labelled provider: a node moved to another provider's pool meanwhile is refused,
/// never attached through a fabric other than the one the resource belongs to.
pub(crate) fn for_call(
    node: &str,
    call: Call,
    label: Option<&str>,
    providers: &[RouteEntry],
    routed: impl FnOnce() -> Result<String, RouteError>,
) -> Result<String, RouteError> {
    match (call, label) {
        (Call::Held, Some(l)) if providers.iter().any(|p| p.name == l) => match routed() {
            Err(e @ RouteError::Ambiguous { .. }) => Err(e),
            _ => Ok(l.to_owned()),
        },
        (Call::Held, _) | (Call::Attach, None) => routed(),
        (Call::Attach, Some(l)) => {
            let serving = routed()?;
            if serving == l {
                Ok(serving)
            } else {
                Err(RouteError::Relabelled {
                    node: node.to_owned(),
                    labelled: l.to_owned(),
                    serving,
                })
            }
        }
    }
}

/// Whether `selector` selects a node with `labels` (Kubernetes label-selector semantics:
/// an empty selector selects every node; an invalid operator selects nothing).
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|r| requirement(r, labels))
}

fn requirement(r: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// The provider serving `node` (whose labels are `labels`) among `providers`.
pub(crate) fn route<'a>(
    node: &str,
    labels: &BTreeMap<String, String>,
    providers: &'a [RouteEntry],
) -> Result<&'a RouteEntry, RouteError> {
    let selected: Vec<&RouteEntry> = providers
        .iter()
        .filter(|p| p.selector.as_ref().is_some_and(|s| selects(s, labels)))
        .collect();
    let candidates = if selected.is_empty() {
        providers.iter().filter(|p| p.default).collect()
    } else {
        selected
    };
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(RouteError::NoProvider {
            node: node.to_owned(),
        }),
        many => Err(RouteError::Ambiguous {
            node: node.to_owned(),
            providers: many.iter().map(|p| p.name.clone()).collect(),
        }),
    }
}

/// The provider serving a node no Node shows any more (deleted, its devices still to
/// release), by the provider labels of the resources targeting it (`labels`, None for a
/// resource not labelled): each resource's label names the provider that serves it, so
/// they must all name one provider among `providers`. None labelled, or a label naming
/// no provider here, leaves the node unknown; two different labels are ambiguous.
pub(crate) fn by_resources<'a>(
    node: &str,
    labels: impl IntoIterator<Item = Option<String>>,
    providers: &'a [RouteEntry],
) -> Result<&'a RouteEntry, RouteError> {
    let named: std::collections::BTreeSet<String> = labels.into_iter().flatten().collect();
    let unknown = || RouteError::UnknownNode {
        node: node.to_owned(),
    };
    match named.len() {
        0 => Err(unknown()),
        1 => providers
            .iter()
            .find(|p| named.contains(&p.name))
            .ok_or_else(unknown),
        _ => Err(RouteError::Ambiguous {
            node: node.to_owned(),
            providers: named.into_iter().collect(),
        }),
    }
}

/// Whether two selectors overlap in the decidable sense admission uses: both only
/// `matchLabels`, and one's labels a subset of the other's (then every node the larger
/// selects, the smaller selects too). Selectors with `matchExpressions` are compared by
/// their labels only when their expressions are equal; otherwise they are taken to
/// overlap unless their `matchLabels` disagree on a key, which no node can satisfy both of.
pub(crate) fn overlap(a: &LabelSelector, b: &LabelSelector) -> bool {
    let empty = BTreeMap::new();
    let la = a.match_labels.as_ref().unwrap_or(&empty);
    let lb = b.match_labels.as_ref().unwrap_or(&empty);
    // A key both set to different values: no node is selected by both.
    if la.iter().any(|(k, v)| lb.get(k).is_some_and(|w| w != v)) {
        return false;
    }
    let ea = a.match_expressions.as_deref().unwrap_or_default();
    let eb = b.match_expressions.as_deref().unwrap_or_default();
    if ea.is_empty() && eb.is_empty() || ea == eb {
        let subset = |x: &BTreeMap<String, String>, y: &BTreeMap<String, String>| {
            x.iter().all(|(k, v)| y.get(k) == Some(v))
        };
        return subset(la, lb) || subset(lb, la);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }

    fn entry(name: &str, selector: Option<LabelSelector>, default: bool) -> RouteEntry {
        RouteEntry {
            name: name.into(),
            selector,
            default,
        }
    }

    #[test]
    fn the_matching_selector_wins_over_the_default() {
        let ps = [
            entry("a", Some(sel(&[("pool", "a")])), false),
            entry("b", Some(sel(&[("pool", "b")])), false),
            entry("d", None, true),
        ];
        assert_eq!(
            route("n", &labels(&[("pool", "b")]), &ps).unwrap().name,
            "b"
        );
        assert_eq!(
            route("n", &labels(&[("pool", "a")]), &ps).unwrap().name,
            "a"
        );
        assert_eq!(
            route("n", &labels(&[("pool", "c")]), &ps).unwrap().name,
            "d"
        );
        assert_eq!(route("n", &labels(&[]), &ps).unwrap().name, "d");
    }

    #[test]
    fn a_node_gone_is_served_by_the_provider_its_resources_name() {
        let ps = [
            entry("a", Some(sel(&[("pool", "a")])), false),
            entry("d", None, true),
        ];
        let named = |labels: &[Option<&str>]| {
            by_resources(
                "gone",
                labels
                    .iter()
                    .map(|l| l.map(str::to_owned))
                    .collect::<Vec<_>>(),
                &ps,
            )
            .map(|e| e.name.clone())
        };
        // Not the default: the resources say which fabric holds their devices.
        assert_eq!(named(&[Some("a"), None, Some("a")]), Ok("a".into()));
        assert_eq!(named(&[Some("d")]), Ok("d".into()));
        let unknown = Err(RouteError::UnknownNode {
            node: "gone".into(),
        });
        assert_eq!(named(&[]), unknown);
        assert_eq!(named(&[None]), unknown);
        // A provider that is not here (deleted) serves nothing.
        assert_eq!(named(&[Some("x")]), unknown);
        assert_eq!(
            named(&[Some("d"), Some("a")]),
            Err(RouteError::Ambiguous {
                node: "gone".into(),
                providers: vec!["a".into(), "d".into()],
            })
        );
    }

    #[test]
    fn a_resource_s_calls_follow_its_label_and_an_attach_elsewhere_is_refused() {
        let ps = [entry("a", None, false), entry("b", None, true)];
        let to = |name: &str| {
            let name = name.to_owned();
            move || Ok::<_, RouteError>(name)
        };
        // A device held: its labelled provider, wherever the node routes now (or if it
        // routes nowhere, or is gone) ...
        assert_eq!(
            for_call("n", Call::Held, Some("a"), &ps, to("b")),
            Ok("a".into())
        );
        let nowhere = || Err(RouteError::NoProvider { node: "n".into() });
        assert_eq!(
            for_call("n", Call::Held, Some("a"), &ps, nowhere),
            Ok("a".into())
        );
        let gone = || Err(RouteError::UnknownNode { node: "n".into() });
        assert_eq!(
            for_call("n", Call::Held, Some("a"), &ps, gone),
            Ok("a".into())
        );
        // Not labelled, or labelled with a provider no longer here: where the node routes.
        assert_eq!(
            for_call("n", Call::Held, None, &ps, to("b")),
            Ok("b".into())
        );
        assert_eq!(
            for_call("n", Call::Held, Some("x"), &ps, to("b")),
            Ok("b".into())
        );
        // An attach goes where the node routes, if that is the labelled provider.
        assert_eq!(
            for_call("n", Call::Attach, Some("a"), &ps, to("a")),
            Ok("a".into())
        );
        assert_eq!(
            for_call("n", Call::Attach, None, &ps, to("b")),
            Ok("b".into())
        );
        assert_eq!(
            for_call("n", Call::Attach, Some("a"), &ps, to("b")),
            Err(RouteError::Relabelled {
                node: "n".into(),
                labelled: "a".into(),
                serving: "b".into(),
            })
        );
        // A routing error is the attach's error; two providers claiming the node are
        // every call's (the providers need fixing first).
        let ambiguous = RouteError::Ambiguous {
            node: "n".into(),
            providers: vec!["a".into(), "b".into()],
        };
        for call in [Call::Attach, Call::Held] {
            assert_eq!(
                for_call("n", call, Some("a"), &ps, || Err(ambiguous.clone())),
                Err(ambiguous.clone())
            );
        }
    }

    #[test]
    fn none_or_several_is_an_error_naming_them() {
        let ps = [
            entry("a", Some(sel(&[("pool", "a")])), false),
            entry("a2", Some(sel(&[("rack", "1")])), false),
        ];
        assert_eq!(
            route("n", &labels(&[("pool", "x")]), &ps).unwrap_err(),
            RouteError::NoProvider { node: "n".into() }
        );
        let e = route("n", &labels(&[("pool", "a"), ("rack", "1")]), &ps).unwrap_err();
        assert_eq!(
            e,
            RouteError::Ambiguous {
                node: "n".into(),
                providers: vec!["a".into(), "a2".into()]
            }
        );
        assert!(e.to_string().contains("a, a2"));
        let defaults = [entry("d1", None, true), entry("d2", None, true)];
        assert!(matches!(
            route("n", &labels(&[]), &defaults),
            Err(RouteError::Ambiguous { .. })
        ));
        assert!(matches!(
            route("n", &labels(&[]), &[]),
            Err(RouteError::NoProvider { .. })
        ));
    }

    #[test]
    fn expressions_follow_kubernetes_semantics() {
        let req = |op: &str, values: Option<Vec<&str>>| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "pool".into(),
                operator: op.into(),
                values: values.map(|v| v.into_iter().map(str::to_owned).collect()),
            }]),
        };
        let a = labels(&[("pool", "a")]);
        let none = labels(&[]);
        assert!(selects(&req("In", Some(vec!["a", "b"])), &a));
        assert!(!selects(&req("In", Some(vec!["b"])), &a));
        assert!(!selects(&req("In", Some(vec!["a"])), &none));
        assert!(selects(&req("NotIn", Some(vec!["b"])), &a));
        assert!(selects(&req("NotIn", Some(vec!["b"])), &none));
        assert!(selects(&req("Exists", None), &a));
        assert!(!selects(&req("DoesNotExist", None), &a));
        assert!(!selects(&req("Bogus", None), &a));
        assert!(selects(&LabelSelector::default(), &a));
    }

    #[test]
    fn overlap_is_subset_of_labels() {
        assert!(overlap(&sel(&[("pool", "a")]), &sel(&[("pool", "a")])));
        assert!(overlap(
            &sel(&[("pool", "a")]),
            &sel(&[("pool", "a"), ("rack", "1")])
        ));
        assert!(!overlap(&sel(&[("pool", "a")]), &sel(&[("pool", "b")])));
        assert!(!overlap(&sel(&[("pool", "a")]), &sel(&[("rack", "1")])));
        assert!(overlap(&sel(&[]), &sel(&[("pool", "b")])));
    }
}
