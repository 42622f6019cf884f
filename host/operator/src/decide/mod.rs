//! The decisions of docs/behaviour.md §3 and §6 as plain functions, tested without an API
//! server: which devices a request keeps, drops and places ([`allocation`]), which
//! requests the webhook admits ([`admission`]), and the small views of Kubernetes objects
//! both decide on ([`views`], with [`quantity`] for resource quantities), and which
//! provider Leases a replica holds ([`shards`]).

pub(crate) mod admission;
pub(crate) mod allocation;
pub(crate) mod quantity;
pub(crate) mod shards;
pub(crate) mod slices;
pub(crate) mod views;
