//! cro-test-support
