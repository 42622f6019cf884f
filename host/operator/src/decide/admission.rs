//! Admission rules for ComposabilityRequest (docs/behaviour.md §6), on create and update.

/// What the rules need to know of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestSummary {
    pub(crate) name: String,
    pub(crate) device_type: String,
    pub(crate) model: String,
    pub(crate) differentnode: bool,
    pub(crate) target_node: Option<String>,
    /// The node of the request's first resource (`status.resources`), if any.
    pub(crate) first_resource_node: Option<String>,
}

impl RequestSummary {
    /// The node a samenode request is pinned to: its target, else where its devices are.
    /// None while it has neither, and then it collides with nobody.
    fn samenode_node(&self) -> Option<&str> {
        self.target_node
            .as_deref()
            .or(self.first_resource_node.as_deref())
            .filter(|n| !n.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// Checked when a request is created or its target changes: a request whose target
    /// node does not exist is deleted by the operator (the Go behaviour, docs/behaviour.md
    /// §3), so a typo must not get that far.
    #[error(
        "target_node {0} is not a Node of this cluster (check the name with `kubectl get nodes`)"
    )]
    UnknownTargetNode(String),
    #[error("allocation_policy differentnode cannot be used with target_node {0}")]
    DifferentNodeWithTarget(String),
    #[error(
        "ComposabilityRequest {other} already asks for {device_type} {model} with allocation_policy differentnode"
    )]
    DuplicateDifferentNode {
        other: String,
        device_type: String,
        model: String,
    },
    #[error(
        "ComposabilityRequest {other} already asks for {device_type} {model} on node {node} with allocation_policy samenode"
    )]
    DuplicateSameNode {
        other: String,
        device_type: String,
        model: String,
        node: String,
    },
}

/// The target node a create or update must prove to exist: set, and new or changed
/// (an unchanged target that disappeared later keeps the Go behaviour).
pub(crate) fn target_to_check<'a>(
    new: Option<&'a str>,
    old: Option<Option<&str>>,
) -> Option<&'a str> {
    let new = new.filter(|n| !n.is_empty())?;
    match old {
        Some(old) if old == Some(new) => None,
        _ => Some(new),
    }
}

/// Checks `request` against every other request in the cluster (`others` may contain
/// the request itself on update; it is skipped by name).
pub(crate) fn validate(request: &RequestSummary, others: &[RequestSummary]) -> Result<(), Refusal> {
    if request.differentnode
        && let Some(target) = request.target_node.as_deref().filter(|t| !t.is_empty())
    {
        return Err(Refusal::DifferentNodeWithTarget(target.to_owned()));
    }
    for other in others.iter().filter(|o| o.name != request.name) {
        if other.device_type != request.device_type || other.model != request.model {
            continue;
        }
        if request.differentnode && other.differentnode {
            return Err(Refusal::DuplicateDifferentNode {
                other: other.name.clone(),
                device_type: request.device_type.clone(),
                model: request.model.clone(),
            });
        }
        if !request.differentnode
            && !other.differentnode
            && let (Some(mine), Some(theirs)) = (request.samenode_node(), other.samenode_node())
            && mine == theirs
        {
            return Err(Refusal::DuplicateSameNode {
                other: other.name.clone(),
                device_type: request.device_type.clone(),
                model: request.model.clone(),
                node: mine.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        name: &str,
        model: &str,
        different: bool,
        target: Option<&str>,
        first: Option<&str>,
    ) -> RequestSummary {
        RequestSummary {
            name: name.into(),
            device_type: "gpu".into(),
            model: model.into(),
            differentnode: different,
            target_node: target.map(Into::into),
            first_resource_node: first.map(Into::into),
        }
    }

    #[test]
    fn rules_table() {
        let existing = vec![
            req("d", "A100", true, None, None),
            req("s-target", "A100", false, Some("n1"), None),
            req("s-placed", "A100", false, None, Some("n2")),
            req("s-fresh", "A100", false, None, None),
        ];
        struct Case {
            what: &'static str,
            request: RequestSummary,
            refused: bool,
        }
        let cases = [
            Case {
                what: "differentnode with target",
                request: req("x", "H100", true, Some("n1"), None),
                refused: true,
            },
            Case {
                what: "second differentnode same model",
                request: req("x", "A100", true, None, None),
                refused: true,
            },
            Case {
                what: "differentnode other model",
                request: req("x", "H100", true, None, None),
                refused: false,
            },
            Case {
                what: "samenode same target",
                request: req("x", "A100", false, Some("n1"), None),
                refused: true,
            },
            Case {
                what: "samenode target = other's device node",
                request: req("x", "A100", false, Some("n2"), None),
                refused: true,
            },
            Case {
                what: "samenode other node",
                request: req("x", "A100", false, Some("n3"), None),
                refused: false,
            },
            Case {
                what: "samenode unplaced",
                request: req("x", "A100", false, None, None),
                refused: false,
            },
            Case {
                what: "samenode same node other model",
                request: req("x", "H100", false, Some("n1"), None),
                refused: false,
            },
            Case {
                what: "update of itself",
                request: req("s-target", "A100", false, Some("n1"), None),
                refused: false,
            },
            Case {
                what: "update of differentnode itself",
                request: req("d", "A100", true, None, None),
                refused: false,
            },
        ];
        for case in cases {
            let got = validate(&case.request, &existing);
            assert_eq!(got.is_err(), case.refused, "{}: {got:?}", case.what);
        }
    }

    #[test]
    fn refusal_names_the_conflicting_request() {
        let existing = [req("first", "A100", false, Some("n1"), None)];
        let err = validate(&req("second", "A100", false, Some("n1"), None), &existing).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("first") && text.contains("n1"), "{text}");
    }
}

#[cfg(test)]
mod target_tests {
    use super::target_to_check;

    #[test]
    fn only_a_new_or_changed_target_is_checked() {
        // create
        assert_eq!(target_to_check(Some("n1"), None), Some("n1"));
        assert_eq!(target_to_check(None, None), None);
        assert_eq!(target_to_check(Some(""), None), None);
        // update: unchanged targets keep the Go behaviour when their node goes later
        assert_eq!(target_to_check(Some("n1"), Some(Some("n1"))), None);
        assert_eq!(target_to_check(Some("n2"), Some(Some("n1"))), Some("n2"));
        assert_eq!(target_to_check(Some("n2"), Some(None)), Some("n2"));
        assert_eq!(target_to_check(None, Some(Some("n1"))), None);
    }
}
