//! The operator: decisions of SPEC §3–§6 kept as plain functions over small views of the
//! cluster, so they are tested without an API server; the controllers map Kubernetes
//! objects onto these views and carry the decisions out.

pub mod admission;
pub mod allocation;
pub mod nodeops;
