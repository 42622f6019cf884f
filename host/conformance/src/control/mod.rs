//! The fabric simulator control protocol, `cro-fabric-sim/1` (docs/fabric-sim-protocol.md):
//! the calls the suite needs from any simulated fabric, over HTTP and JSON, so that a
//! vendor whose fabric cro does not simulate certifies against a simulator of its own.
//!
//! - [`wire`]: the messages, shared by both ends.
//! - [`serve`]: cro's own simulators (FTI, Redfish, NEC) speaking it, through their
//!   [`crate::Fabric`] drivers (`cro provider sim`).
//! - [`remote`]: the suite's side, a [`crate::Fabric`] over the protocol
//!   (`cro provider test --fabric-sim URL`).

pub mod remote;
pub mod serve;
pub mod wire;

pub use remote::RemoteFabric;
pub use serve::ControlServer;

/// The protocol and version a simulator answers with on `GET <base>`.
pub const PROTOCOL: &str = "cro-fabric-sim/1";
