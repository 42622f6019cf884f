//! fabric-sim
