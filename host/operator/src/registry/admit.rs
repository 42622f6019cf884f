//! Admission rules of `CdiProvider` (docs/providers.md, "Admission"): pure functions
//! over the new object's routing and the others'.
//!
//! Overlap is decided on the selectors alone (crate::registry::route::overlap): two
//! selectors overlap when one's `matchLabels` are a subset of the other's (equal sets
//! included) and their `matchExpressions` are equal, or when either has expressions and
//! their `matchLabels` do not contradict each other. This refuses every pair that can
//! select a common node among `matchLabels`-only selectors sharing keys; pairs that
//! could still meet on a node (`pool=a` and `rack=1` on a node with both labels) are
//! caught at routing time, as a status error on the resource.

use super::route::{RouteEntry, overlap};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProviderRefusal {
    #[error("nodeSelector overlaps CdiProvider {other}'s: a node would be served by both")]
    Overlap { other: String },
    #[error("CdiProvider {other} is already the default provider: there can be only one")]
    SecondDefault { other: String },
    #[error(
        "the name is {len} characters long: a CdiProvider's name is a label value on its resources and slices (cro.hpsys.ibm.ie.com/provider), at most 63"
    )]
    NameTooLong { len: usize },
}

/// The longest label value Kubernetes accepts.
const LABEL_VALUE_MAX: usize = 63;

/// Whether `new` may join `others` (itself, by name, is skipped: an update).
pub(crate) fn validate(new: &RouteEntry, others: &[RouteEntry]) -> Result<(), ProviderRefusal> {
    if new.name.len() > LABEL_VALUE_MAX {
        return Err(ProviderRefusal::NameTooLong {
            len: new.name.len(),
        });
    }
    for o in others.iter().filter(|o| o.name != new.name) {
        if new.default && o.default {
            return Err(ProviderRefusal::SecondDefault {
                other: o.name.clone(),
            });
        }
        if let (Some(a), Some(b)) = (&new.selector, &o.selector)
            && overlap(a, b)
        {
            return Err(ProviderRefusal::Overlap {
                other: o.name.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn entry(name: &str, pool: Option<&str>, default: bool) -> RouteEntry {
        RouteEntry {
            name: name.into(),
            selector: pool.map(|p| LabelSelector {
                match_labels: Some(BTreeMap::from([("pool".to_string(), p.to_string())])),
                match_expressions: None,
            }),
            default,
        }
    }

    #[test]
    fn overlapping_selectors_and_a_second_default_are_refused() {
        let others = [entry("a", Some("a"), false), entry("d", None, true)];
        assert_eq!(validate(&entry("b", Some("b"), false), &others), Ok(()));
        assert_eq!(
            validate(&entry("a2", Some("a"), false), &others),
            Err(ProviderRefusal::Overlap { other: "a".into() })
        );
        assert_eq!(
            validate(&entry("d2", None, true), &others),
            Err(ProviderRefusal::SecondDefault { other: "d".into() })
        );
        // An update of itself is not an overlap with itself.
        assert_eq!(validate(&entry("a", Some("a"), true), &others[..1]), Ok(()));
    }

    #[test]
    fn a_name_longer_than_a_label_value_is_refused() {
        let long = "p".repeat(64);
        assert_eq!(
            validate(&entry(&long, Some("x"), false), &[]),
            Err(ProviderRefusal::NameTooLong { len: 64 })
        );
        assert_eq!(
            validate(&entry(&"p".repeat(63), Some("x"), false), &[]),
            Ok(())
        );
    }
}
