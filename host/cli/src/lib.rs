//! cro
