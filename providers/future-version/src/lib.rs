//! future-version-provider
