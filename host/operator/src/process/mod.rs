//! The operator process: its parts started and stopped ([`run`]), the signals it stops on
//! ([`signals`]), and leader election ([`leader`]).

pub mod leader;
pub(crate) mod run;
pub(crate) mod shards;
pub(crate) mod signals;
