//! cro-api
