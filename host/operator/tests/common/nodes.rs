//! The simulated GPU nodes of the end-to-end tests live in the `node-sim` crate, shared
//! with the demo and benchmarks; this module keeps the names the tests use.

#[allow(unused_imports)]
pub use node_sim::{
    DraNaming, DriverKind, Exposure, NodeOptions, NodeSetup, NodeSim, Quirks, SimNodes,
};
