//! cro-testkit
