//! provider-it
