//! GPU work on a node (NODE_OPS.md).

pub mod smi;
