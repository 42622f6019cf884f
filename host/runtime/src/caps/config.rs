//! The `config` capability: the provider's own configuration, always granted (it is what
//! the administrator wrote for it). Nothing to budget: the host hands out bounded text it
//! owns, into guest memory the memory budget already bounds.
//!
//! Its part of the capability report is the configuration keys: set but not accepted,
//! or required but not set.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use super::capability::{CallSetup, Capability, Declared, Findings, Load, NoGrant, SetupError};
use crate::base::FieldError;
use crate::gate::{CapabilityKind, Check, Gate};

/// The `cro:provider/config` import's bindings, as every served contract version imports
/// it (unchanged since 0.1.0; the version modules in `crate::wit` map it here).
pub(crate) mod wit {
    wasmtime::component::bindgen!({
        path: "../../wit/since_v0.1.0",
        inline: "
            package cro-host:config;
            world imports {
                import cro:provider/config@0.1.0;
            }
        ",
        world: "cro-host:config/imports",
    });

    pub(crate) use self::cro::provider::config::*;
}

/// The capability, as `crate::caps` registers it.
pub(crate) struct ConfigCap;

impl Capability for ConfigCap {
    const NAME: &'static str = "config";
    type Grant = NoGrant;
    type Shared = Config;
    type Call = ConfigCall;

    fn validate(_: &NoGrant) -> Result<(), FieldError> {
        Ok(())
    }

    fn load(_: &NoGrant, load: &Load<'_>) -> Result<Config, SetupError> {
        Ok(Config {
            config: load.config.clone(),
            gate: load.gate.clone(),
        })
    }

    fn call(shared: &Arc<Config>, _: &CallSetup) -> ConfigCall {
        ConfigCall {
            shared: shared.clone(),
        }
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut ConfigCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<ConfigCall>>(linker, get)
    }

    fn report(_: &NoGrant, declared: &Declared<'_>, findings: &mut Findings) {
        let accepted = &declared.info.config;
        for key in declared.config.keys() {
            if !accepted.iter().any(|k| &k.name == key) {
                findings.unknown_config.push(key.clone());
            }
        }
        for key in accepted {
            if key.required && !declared.config.contains_key(&key.name) {
                findings.missing_config.push(key.name.clone());
            }
        }
    }

    #[cfg(test)]
    fn example() -> NoGrant {
        NoGrant
    }
}

/// The provider's side: its configuration.
pub(crate) struct Config {
    config: BTreeMap<String, String>,
    gate: Arc<Gate>,
}

/// One call's side (the map is the provider's, shared).
pub(crate) struct ConfigCall {
    shared: Arc<Config>,
}

/// Reading the provider's own configuration: always allowed.
pub(crate) struct ReadConfig;

impl Check for ReadConfig {
    fn kind(&self) -> Option<CapabilityKind> {
        None
    }

    fn decide(&self) -> Result<(), String> {
        Ok(())
    }
}

impl wit::Host for ConfigCall {
    fn get(&mut self, key: String) -> Option<String> {
        let shared = &self.shared;
        shared.gate.check(&ReadConfig).ok()?;
        shared.config.get(&key).cloned()
    }

    fn entries(&mut self) -> Vec<(String, String)> {
        let shared = &self.shared;
        if shared.gate.check(&ReadConfig).is_err() {
            return Vec::new();
        }
        shared
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
