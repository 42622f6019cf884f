//! The controllers: ComposabilityRequests ([`request`]: allocation, creating and dropping
//! ComposableResources, mirroring their state, cleanup, node GC), ComposableResources
//! ([`resource`]: attach, health checks, detach with the drain sequence of
//! [`crate::nodeops`]) and the upstream sync of devices no resource claims ([`sync`],
//! docs/behaviour.md §5).

pub(crate) mod request;
pub(crate) mod resource;
pub(crate) mod sync;
