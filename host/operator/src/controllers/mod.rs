//! The controllers: ComposabilityRequests ([`request`]: allocation, creating and dropping
//! ComposableResources, mirroring their state, cleanup, node GC), ComposableResources
//! ([`resource`]: attach, health checks, detach with the drain sequence of
//! [`crate::nodeops`]), the upstream sync of devices no resource claims ([`sync`],
//! docs/behaviour.md §5) and the free pool published to the scheduler ([`pool`],
//! docs/dra.md).

pub(crate) mod binding;
pub(crate) mod pool;
pub(crate) mod request;
pub(crate) mod resource;
pub(crate) mod routing;
pub(crate) mod sync;
