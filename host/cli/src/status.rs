//! `cro status`: every ComposabilityRequest with its devices, their nodes and errors in
//! one table, plus ComposableResources no request claims.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cro_api::{ComposabilityRequest, ComposableResource, LABEL_MANAGED_BY};
use kube::ResourceExt;

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub request: String,
    pub request_state: String,
    pub want: String,
    pub resource: String,
    pub node: String,
    pub device: String,
    pub resource_state: String,
    pub error: String,
}

const NONE: &str = "-";

/// What `cro status` says when the cluster does not serve the cro kinds.
pub const CRDS_MISSING: &str = "the cro CRDs are not installed on this cluster (install them with `cro crds | kubectl apply -f -` or the chart)";

/// A failed list of `what`: a 404 means the cluster does not know the kind, so the CRDs
/// are missing, which says more than the API server's bare "404 page not found".
pub fn list_error(e: kube::Error, what: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(CRDS_MISSING),
        _ => anyhow::Error::new(e).context(format!("cannot list {what}")),
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        NONE.to_owned()
    } else {
        s.to_owned()
    }
}

/// The rows for `requests` and `resources`: per request one row per resource (or one
/// row when it has none), then resources of no existing request under `(none)`.
pub fn rows(requests: &[ComposabilityRequest], resources: &[ComposableResource]) -> Vec<Row> {
    let mut by_request: BTreeMap<String, Vec<&ComposableResource>> = BTreeMap::new();
    for r in resources {
        let owner = r
            .labels()
            .get(LABEL_MANAGED_BY)
            .cloned()
            .unwrap_or_default();
        by_request.entry(owner).or_default().push(r);
    }
    let mut out = Vec::new();
    let mut sorted: Vec<&ComposabilityRequest> = requests.iter().collect();
    sorted.sort_by_key(|r| r.name_any());
    for req in sorted {
        let name = req.name_any();
        let spec = &req.spec.resource;
        let want = format!("{} {}x {}", spec.resource_type, spec.size, spec.model);
        let (state, req_error) = req
            .status
            .as_ref()
            .map(|s| (s.state.as_str().to_owned(), s.error.clone()))
            .unwrap_or_default();
        let mut mine = by_request.remove(&name).unwrap_or_default();
        mine.sort_by_key(|r| r.name_any());
        if mine.is_empty() {
            out.push(Row {
                request: name.clone(),
                request_state: or_dash(&state),
                want: want.clone(),
                resource: NONE.into(),
                node: spec.target_node.clone().unwrap_or_else(|| NONE.into()),
                device: NONE.into(),
                resource_state: NONE.into(),
                error: or_dash(&req_error),
            });
        }
        for res in mine {
            out.push(resource_row(&name, &state, &want, &req_error, res));
        }
    }
    for (owner, list) in by_request {
        let label = if owner.is_empty() {
            "(none)".to_owned()
        } else {
            format!("({owner}: gone)")
        };
        let mut list = list;
        list.sort_by_key(|r| r.name_any());
        for res in list {
            out.push(resource_row(&label, NONE, NONE, "", res));
        }
    }
    out
}

fn resource_row(
    request: &str,
    request_state: &str,
    want: &str,
    request_error: &str,
    res: &ComposableResource,
) -> Row {
    let status = res.status.clone().unwrap_or_default();
    // The resource's own error says more about the device; the request's is the fallback.
    let error = if status.error.is_empty() {
        request_error
    } else {
        &status.error
    };
    Row {
        request: request.to_owned(),
        request_state: or_dash(request_state),
        want: want.to_owned(),
        resource: res.name_any(),
        node: or_dash(&res.spec.target_node),
        device: or_dash(&status.device_id),
        resource_state: or_dash(status.state.as_str()),
        error: or_dash(error),
    }
}

/// The rows as an aligned text table with a header line.
pub fn render(rows: &[Row]) -> String {
    let header = [
        "REQUEST",
        "STATE",
        "WANTS",
        "RESOURCE",
        "NODE",
        "DEVICE",
        "DEVICE STATE",
        "ERROR",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.request.clone(),
                r.request_state.clone(),
                r.want.clone(),
                r.resource.clone(),
                r.node.clone(),
                r.device.clone(),
                r.resource_state.clone(),
                // One line per row, whatever the error text holds.
                r.error.replace(['\n', '\r'], " "),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cols: Vec<&str>| {
        let mut text = String::new();
        for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
            if i + 1 == cols.len() {
                text.push_str(c);
            } else {
                let _ = write!(text, "{c:<w$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in &cells {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_404_on_the_kinds_says_the_crds_are_missing() {
        let api = |code: u16| {
            kube::Error::Api(Box::new(
                serde_json::from_value(serde_json::json!({
                    "status": "Failure", "code": code, "message": "404 page not found"
                }))
                .unwrap(),
            ))
        };
        let text = format!("{:#}", list_error(api(404), "ComposabilityRequests"));
        assert_eq!(text, CRDS_MISSING);
        let text = format!("{:#}", list_error(api(403), "ComposabilityRequests"));
        assert!(
            text.starts_with("cannot list ComposabilityRequests") && !text.contains("CRDs"),
            "{text}"
        );
    }
    use cro_api::{
        ComposabilityRequestSpec, ComposabilityRequestStatus, ComposableResourceSpec,
        ComposableResourceStatus, RequestState, ResourceState, ResourceType, ScalarResourceDetails,
    };

    fn request(name: &str, size: i64, state: RequestState, error: &str) -> ComposabilityRequest {
        let mut r = ComposabilityRequest::new(
            name,
            ComposabilityRequestSpec {
                resource: ScalarResourceDetails {
                    resource_type: ResourceType::Gpu,
                    model: "A100".into(),
                    size,
                    force_detach: false,
                    allocation_policy: Default::default(),
                    target_node: None,
                    other_spec: None,
                },
            },
        );
        r.status = Some(ComposabilityRequestStatus {
            state,
            error: error.into(),
            ..Default::default()
        });
        r
    }

    fn resource(
        name: &str,
        owner: Option<&str>,
        node: &str,
        device: &str,
        error: &str,
    ) -> ComposableResource {
        let mut r = ComposableResource::new(
            name,
            ComposableResourceSpec {
                resource_type: ResourceType::Gpu,
                model: "A100".into(),
                target_node: node.into(),
                force_detach: false,
            },
        );
        if let Some(o) = owner {
            r.metadata.labels = Some([(LABEL_MANAGED_BY.to_string(), o.to_string())].into());
        }
        r.status = Some(ComposableResourceStatus {
            state: ResourceState::Online,
            error: error.into(),
            device_id: device.into(),
            ..Default::default()
        });
        r
    }

    #[test]
    fn one_row_per_device_then_unclaimed_ones() {
        let requests = [
            request("train", 2, RequestState::Running, ""),
            request("empty", 1, RequestState::NodeAllocating, "no node has room"),
        ];
        let resources = [
            resource("gpu-b", Some("train"), "worker-2", "GPU-2", ""),
            resource(
                "gpu-a",
                Some("train"),
                "worker-1",
                "GPU-1",
                "fabric said no\nretrying",
            ),
            resource("gpu-x", None, "worker-3", "GPU-9", ""),
            resource("gpu-y", Some("deleted"), "worker-3", "", ""),
        ];
        let rows = rows(&requests, &resources);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.request.as_str(), r.resource.as_str(), r.node.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("empty", "-", "-"),
                ("train", "gpu-a", "worker-1"),
                ("train", "gpu-b", "worker-2"),
                ("(none)", "gpu-x", "worker-3"),
                ("(deleted: gone)", "gpu-y", "worker-3"),
            ]
        );
        assert_eq!(rows[0].error, "no node has room");
        assert_eq!(rows[0].want, "gpu 1x A100");
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6);
        assert!(lines[0].starts_with("REQUEST"));
        assert!(lines[2].contains("fabric said no retrying"));
        // Columns line up: DEVICE starts at the same offset in every line.
        let col = lines[0].find("DEVICE ").unwrap();
        assert_eq!(&lines[2][col..col + 5], "GPU-1");
        assert_eq!(&lines[4][col..col + 5], "GPU-9");
        assert_eq!(&lines[5][col..col + 1], "-");
    }

    #[test]
    fn nothing_is_just_the_header() {
        assert_eq!(render(&rows(&[], &[])).lines().count(), 1);
    }
}
