//! The Kubernetes plumbing both controllers stand on: the watch caches ([`cache`]), what
//! wakes a controller besides its own objects ([`triggers`]), writes to the API server
//! ([`patch`]), the Ready condition ([`conditions`]), what surrounds one reconciliation
//! ([`reconcile`]) and what every reconciliation is given ([`context`]).

pub(crate) mod cache;
pub(crate) mod conditions;
pub(crate) mod context;
pub(crate) mod patch;
pub(crate) mod reconcile;
pub(crate) mod triggers;
