//! fti-provider
