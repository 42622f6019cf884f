//! The `config` capability: the provider's own configuration, always granted (it is what
//! the administrator wrote for it). Nothing to budget: the host hands out bounded text it
//! owns, into guest memory the memory budget already bounds.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};

use crate::gate::{Capability, Gate};
use crate::wit::imports::config as wit;

/// One call's side (the map is the provider's, shared).
pub(crate) struct ConfigCall {
    config: Arc<BTreeMap<String, String>>,
    gate: Arc<Gate>,
}

impl ConfigCall {
    pub(crate) fn new(config: Arc<BTreeMap<String, String>>, gate: Arc<Gate>) -> ConfigCall {
        ConfigCall { config, gate }
    }
}

impl wit::Host for ConfigCall {
    fn get(&mut self, key: String) -> Option<String> {
        self.gate.check(Capability::Config).ok()?;
        self.config.get(&key).cloned()
    }

    fn entries(&mut self) -> Vec<(String, String)> {
        if self.gate.check(Capability::Config).is_err() {
            return Vec::new();
        }
        self.config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut ConfigCall,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, HasSelf<ConfigCall>>(linker, get)
}
