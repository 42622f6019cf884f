//! cro-runtime
