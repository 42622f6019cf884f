//! A small YAML/JSON description of a simulator (what the `fabric-sim` binary reads):
//!
//! ```yaml
//! tenant_id: 0b6f7c1e-3a55-4c1b-9a43-6d0f2f6f4f10   # optional, random otherwise
//! cluster_id: 5d1d2c3b-...                          # optional
//! realm: fti                                        # optional
//! credentials: {username: u, password: p, client_id: c, client_secret: s}  # optional
//! token_ttl_secs: 300
//! cm_delay_ms: 500
//! https_port: 0
//! http_port: 0
//! machines:
//!   - uuid: 7a0d...            # optional, random otherwise
//!     name: worker-0
//!     fabric_id: 1             # optional, 1 otherwise
//!     devices: [{type: gpu, model: "A100 40G", count: 1}]
//! pools:
//!   - {type: gpu, model: "A100 40G", count: 4}              # fabric 1
//!   - {type: gpu, model: "A100 40G", count: 2, fabric_id: 2}
//! ```

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Credentials, FabricSim, SimConfig, SimError};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {message}")]
    Parse { path: String, message: String },
    #[error(transparent)]
    Sim(#[from] SimError),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub cluster_id: Option<String>,
    #[serde(default)]
    pub realm: Option<String>,
    #[serde(default)]
    pub credentials: Option<Credentials>,
    #[serde(default)]
    pub token_ttl_secs: Option<u64>,
    #[serde(default)]
    pub cm_delay_ms: Option<u64>,
    #[serde(default)]
    pub https_port: Option<u16>,
    #[serde(default)]
    pub http_port: Option<u16>,
    #[serde(default)]
    pub machines: Vec<MachineSetup>,
    #[serde(default)]
    pub pools: Vec<DeviceSetup>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSetup {
    #[serde(default)]
    pub uuid: Option<String>,
    pub name: String,
    /// The fabric the machine is on (1 when absent).
    #[serde(default)]
    pub fabric_id: Option<u64>,
    /// Devices attached from the start.
    #[serde(default)]
    pub devices: Vec<DeviceSetup>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSetup {
    #[serde(rename = "type")]
    pub res_type: String,
    pub model: String,
    #[serde(default = "one")]
    pub count: usize,
    /// A pool's fabric (1 when absent); ignored for a machine's devices, which are on
    /// the machine's fabric.
    #[serde(default)]
    pub fabric_id: Option<u64>,
}

fn one() -> usize {
    1
}

impl Setup {
    /// Parses YAML (a superset of JSON, so JSON files work too).
    pub fn parse(text: &str, origin: &str) -> Result<Setup, SetupError> {
        serde_yaml::from_str(text).map_err(|e| SetupError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })
    }

    pub fn load(path: &Path) -> Result<Setup, SetupError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::Read {
            path: shown.clone(),
            source,
        })?;
        Setup::parse(&text, &shown)
    }

    /// The server settings, defaults where the file is silent.
    pub fn config(&self) -> SimConfig {
        let mut c = SimConfig::default();
        if let Some(v) = &self.tenant_id {
            c.tenant_id = v.clone();
        }
        if let Some(v) = &self.cluster_id {
            c.cluster_id = v.clone();
        }
        if let Some(v) = &self.realm {
            c.realm = v.clone();
        }
        if let Some(v) = &self.credentials {
            c.credentials = v.clone();
        }
        if let Some(v) = self.token_ttl_secs {
            c.token_ttl = Duration::from_secs(v);
        }
        if let Some(v) = self.cm_delay_ms {
            c.cm_delay = Duration::from_millis(v);
        }
        c.https_port = self.https_port.unwrap_or(0);
        c.http_port = self.http_port.unwrap_or(0);
        c
    }

    /// Seeds machines, attached devices and pools into a running simulator.
    pub fn apply(&self, sim: &FabricSim) -> Result<(), SetupError> {
        for m in &self.machines {
            let uuid = m
                .uuid
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            sim.add_machine(&uuid, &m.name);
            if let Some(fabric) = m.fabric_id {
                sim.set_machine_fabric(&uuid, fabric)?;
            }
            for d in &m.devices {
                for _ in 0..d.count {
                    sim.attach_directly(&uuid, &d.res_type, &d.model)?;
                }
            }
        }
        for p in &self.pools {
            let fabric = p.fabric_id.unwrap_or(crate::DEFAULT_FABRIC);
            sim.add_free_devices_on(fabric, &p.res_type, &p.model, p.count);
        }
        Ok(())
    }

    /// Starts a simulator with this setup.
    pub fn start(&self) -> Result<FabricSim, SetupError> {
        let sim = FabricSim::start(self.config())?;
        self.apply(&sim)?;
        Ok(sim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_parse_alike() {
        let yaml = "tenant_id: t1\nmachines:\n  - uuid: m1\n    name: w0\n    devices: [{type: gpu, model: A100}]\npools:\n  - {type: gpu, model: A100, count: 3}\n";
        let json = r#"{"tenant_id": "t1", "machines": [{"uuid": "m1", "name": "w0",
            "devices": [{"type": "gpu", "model": "A100"}]}],
            "pools": [{"type": "gpu", "model": "A100", "count": 3}]}"#;
        let a = Setup::parse(yaml, "a.yaml").unwrap();
        assert_eq!(a, Setup::parse(json, "a.json").unwrap());
        assert_eq!(a.machines[0].devices[0].count, 1);
        assert_eq!(a.config().tenant_id, "t1");
        assert!(Setup::parse("machines: [{name: w, colour: red}]", "b").is_err());
    }
}
