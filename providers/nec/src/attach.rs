//! Attach: connect a free GPU of the wanted model to the node's I/O adapter with a
//! layout apply, then follow the apply across calls (`in-progress` while it runs, where
//! the Go client polls inside one call).
//!
//! Crash- and retry-safe: before the `POST /layout-apply` the chosen GPU is recorded in
//! `state` under the request's attempt key (and reserved against the provider's other
//! attempts), so a retry after a lost reply finds the GPU it already asked for instead
//! of connecting a second one. When that record is lost too (the operator restarted), a
//! GPU of the model already connected to the node that no claim holds is taken as this
//! attempt's.

use serde::{Deserialize, Serialize};

use cro_provider_sdk::{AddOutcome, AddRequest, AttachedDevice, Host, LogLevel, ProviderError};

use crate::client::{Client, Entry, Phase, already_running, procedure};
use crate::node::Place;

const ATTEMPT_PREFIX: &str = "nec/attempt/";
const RESERVED_PREFIX: &str = "nec/reserved/";
/// Resource name -> the attempt key of its unfinished attach, so a detach of a resource
/// whose attach has not returned yet still finds the GPU.
pub const IN_FLIGHT_PREFIX: &str = "nec/in-flight/";
/// An attempt's record outlives any sane retry loop of one attach.
const ATTEMPT_TTL_MS: u64 = 24 * 3600 * 1000;
/// A reservation covers the window between choosing a GPU and CDIM showing it
/// connected; an abandoned one must not hide a GPU for long.
const RESERVED_TTL_MS: u64 = 10 * 60 * 1000;

/// What an attempt has done so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Attempt {
    pub node: String,
    pub io_adapter: String,
    pub gpu: String,
    /// The layout apply, once CDIM answered the POST.
    pub apply: Option<String>,
}

/// The record of attempt `key`.
pub fn load<H: Host + ?Sized>(host: &H, key: &str) -> Option<Attempt> {
    let bytes = host.state_get(&format!("{ATTEMPT_PREFIX}{key}"))?;
    serde_json::from_slice(&bytes).ok()
}

/// Drops what an unfinished attach of `resource` holds on `gpu`, once a detach has
/// taken the GPU back.
pub fn release<H: Host + ?Sized>(host: &H, resource: &str, gpu: &str) {
    if let Some(key) = host
        .state_get(&format!("{IN_FLIGHT_PREFIX}{resource}"))
        .and_then(|k| String::from_utf8(k).ok())
    {
        host.state_remove(&format!("{ATTEMPT_PREFIX}{key}"));
    }
    host.state_remove(&format!("{IN_FLIGHT_PREFIX}{resource}"));
    host.state_remove(&format!("{RESERVED_PREFIX}{gpu}"));
}

/// Whether a GPU fits the request: a GPU, detected, of the model (any when the request
/// names none; trimmed, case-insensitive as the Go client compares).
pub fn fits(e: &Entry, req: &AddRequest) -> bool {
    let model = req.resource.model.trim();
    e.detected
        && e.device.is_gpu()
        && !e.device.id.is_empty()
        && (model.is_empty() || e.device.model.trim().eq_ignore_ascii_case(model))
}

pub struct Attach<'c, 'a, H: Host + ?Sized> {
    pub client: &'c Client<'a, H>,
    pub req: &'c AddRequest,
    /// The CDIM node of the resource's target node.
    pub node: &'c str,
}

impl<H: Host + ?Sized> Attach<'_, '_, H> {
    fn host(&self) -> &H {
        self.client.host()
    }

    fn attempt_key(&self) -> String {
        format!("{ATTEMPT_PREFIX}{}", self.req.attempt_key)
    }

    fn save(&self, a: &Attempt) {
        if let Ok(bytes) = serde_json::to_vec(a) {
            self.host()
                .state_set(&self.attempt_key(), &bytes, Some(ATTEMPT_TTL_MS));
        }
        self.host().state_set(
            &format!("{RESERVED_PREFIX}{}", a.gpu),
            self.req.attempt_key.as_bytes(),
            Some(RESERVED_TTL_MS),
        );
        self.host().state_set(
            &format!("{IN_FLIGHT_PREFIX}{}", self.req.resource.name),
            self.req.attempt_key.as_bytes(),
            Some(ATTEMPT_TTL_MS),
        );
    }

    fn forget(&self, a: &Attempt) {
        self.host().state_remove(&self.attempt_key());
        self.host()
            .state_remove(&format!("{IN_FLIGHT_PREFIX}{}", self.req.resource.name));
        let reserved = format!("{RESERVED_PREFIX}{}", a.gpu);
        if self.host().state_get(&reserved).as_deref() == Some(self.req.attempt_key.as_bytes()) {
            self.host().state_remove(&reserved);
        }
    }

    /// Another attempt of this provider has chosen the GPU and not finished.
    fn reserved_by_another(&self, gpu: &str) -> bool {
        self.host()
            .state_get(&format!("{RESERVED_PREFIX}{gpu}"))
            .is_some_and(|owner| owner != self.req.attempt_key.as_bytes())
    }

    fn attached(&self, gpu: &str) -> AddOutcome {
        AddOutcome::Attached(AttachedDevice {
            device_id: self.client.cfg.device_id(gpu),
            fabric_device_id: gpu.to_string(),
            machine_id: Some(self.node.to_string()),
        })
    }

    fn connecting(&self, a: &Attempt) -> AddOutcome {
        AddOutcome::InProgress(match &a.apply {
            Some(id) => format!(
                "GPU {} is being connected to CDIM node {} (layout apply {id})",
                a.gpu, a.node
            ),
            None => format!(
                "another layout apply is running on CDIM; GPU {} is connected to node {} after it",
                a.gpu, a.node
            ),
        })
    }

    /// With the provisional UUID every GPU reports the same device id, so a second GPU on
    /// a node would be one the host cannot tell from the first: it refuses a device
    /// another resource already holds and asks again, and each ask would connect another
    /// GPU. So in that mode a node holds one GPU, and a second is refused before anything
    /// is connected (docs/nec-provider.md).
    fn one_gpu_per_node_when_provisional(&self) -> Result<(), ProviderError> {
        let Some(uuid) = &self.client.cfg.provisional_gpu_uuid else {
            return Ok(());
        };
        let holder = self.req.claims.iter().find(|c| {
            c.resource != self.req.resource.name
                && c.device_id
                    .as_deref()
                    .is_some_and(|d| d.eq_ignore_ascii_case(uuid))
        });
        match holder {
            None => Ok(()),
            Some(c) => Err(ProviderError::NoCapacity(format!(
                "node {} already has a GPU ({} holds it) and with NEC_PROVISIONAL_GPU_UUID \
                 every GPU reports {uuid}: one GPU per node in that mode",
                self.req.resource.target_node, c.resource
            ))),
        }
    }

    pub fn run(
        &self,
        place: impl FnOnce() -> Result<Place, ProviderError>,
    ) -> Result<AddOutcome, ProviderError> {
        if let Some(a) = load(self.host(), &self.req.attempt_key) {
            if a.node.eq_ignore_ascii_case(self.node) {
                if let Some(outcome) = self.follow(a)? {
                    return Ok(outcome);
                }
            } else {
                self.forget(&a);
            }
        }
        self.one_gpu_per_node_when_provisional()?;
        let place = place()?;
        let resources = self.client.resources()?;
        if let Some(outcome) = self.adopt(&place, &resources) {
            return Ok(outcome);
        }
        let gpu = self.choose(&resources)?;
        self.post(Attempt {
            node: place.node,
            io_adapter: place.io_adapter,
            gpu,
            apply: None,
        })
        .map(|o| {
            o.unwrap_or_else(|| {
                AddOutcome::InProgress(
                    "the layout apply ended without connecting the GPU; another is chosen".into(),
                )
            })
        })
    }

    /// Follows this attempt: `None` when there is nothing to follow any more (the GPU
    /// went elsewhere, or CDIM forgot the apply), so a GPU is chosen anew.
    fn follow(&self, a: Attempt) -> Result<Option<AddOutcome>, ProviderError> {
        if let Some(apply) = a.apply.clone() {
            let Some(state) = self.client.apply_state(&apply)? else {
                self.forget(&a);
                return Ok(None);
            };
            return match state.phase()? {
                Phase::Running => Ok(Some(self.connecting(&a))),
                Phase::Completed => self.connected(a),
                Phase::Failed => {
                    self.forget(&a);
                    Err(ProviderError::Fabric {
                        status: 500,
                        code: state.status.clone(),
                        message: format!(
                            "layout apply {apply} connecting GPU {} to CDIM node {} ended with {}",
                            a.gpu,
                            a.node,
                            state.describe()
                        ),
                    })
                }
                Phase::Suspended => {
                    self.forget(&a);
                    Err(ProviderError::Critical(format!(
                        "layout apply {apply} connecting GPU {} to CDIM node {} is SUSPENDED: CDIM takes no other apply until an administrator resumes or cancels it",
                        a.gpu, a.node
                    )))
                }
            };
        }
        // CDIM never answered the POST (or answered that another apply ran): the GPU
        // itself says whether it acted.
        let Some(gpu) = self.client.resource(&a.gpu)? else {
            self.forget(&a);
            return Ok(None);
        };
        match gpu.device.connected_to() {
            Some(io) if io.eq_ignore_ascii_case(&a.io_adapter) => {
                self.forget(&a);
                Ok(Some(self.attached(&a.gpu)))
            }
            Some(_) => {
                self.forget(&a);
                Ok(None)
            }
            None if gpu.detected && gpu.device.healthy() => self.post(a),
            None => {
                self.forget(&a);
                Ok(None)
            }
        }
    }

    /// An apply that completed: attached once CDIM shows the GPU on the I/O adapter.
    fn connected(&self, a: Attempt) -> Result<Option<AddOutcome>, ProviderError> {
        let linked = self
            .client
            .resource(&a.gpu)?
            .and_then(|g| g.device.connected_to().map(str::to_owned))
            .is_some_and(|io| io.eq_ignore_ascii_case(&a.io_adapter));
        self.forget(&a);
        Ok(linked.then(|| self.attached(&a.gpu)))
    }

    /// A fitting GPU already connected to the node that nobody holds: this attempt's
    /// from before a lost reply and a lost record.
    fn adopt(&self, place: &Place, resources: &[Entry]) -> Option<AddOutcome> {
        let found = resources.iter().find(|e| {
            fits(e, self.req)
                && e.device
                    .connected_to()
                    .is_some_and(|io| io.eq_ignore_ascii_case(&place.io_adapter))
                && !self.req.claimed_by_another(&e.device.id)
                && !self.reserved_by_another(&e.device.id)
        })?;
        self.host().log(
            LogLevel::Info,
            &format!(
                "GPU {} is connected to CDIM node {} and held by no resource: taken for {}",
                found.device.id, place.node, self.req.resource.name
            ),
        );
        Some(self.attached(&found.device.id))
    }

    /// The first free, healthy GPU of the model nobody holds, in CDIM's order (the Go
    /// client takes the first too).
    fn choose(&self, resources: &[Entry]) -> Result<String, ProviderError> {
        let mut looked = 0;
        for e in resources {
            if !fits(e, self.req) || e.device.connected_to().is_some() || !e.node_ids.is_empty() {
                continue;
            }
            looked += 1;
            if e.device.healthy()
                && !self.req.claimed_by_another(&e.device.id)
                && !self.reserved_by_another(&e.device.id)
            {
                return Ok(e.device.id.clone());
            }
        }
        Err(ProviderError::NoCapacity(format!(
            "no free, healthy GPU of model '{}' in CDIM's pool that no resource holds ({looked} free GPU(s) of the model looked at)",
            self.req.resource.model
        )))
    }

    /// Records the plan, then asks CDIM to connect the GPU.
    fn post(&self, a: Attempt) -> Result<Option<AddOutcome>, ProviderError> {
        // The plan is stored before acting.
        self.save(&a);
        match self
            .client
            .apply(&procedure("connect", &a.io_adapter, &a.gpu))
        {
            Ok(id) => {
                let a = Attempt {
                    apply: Some(id),
                    ..a
                };
                self.save(&a);
                self.follow(a)
            }
            // One apply at a time on CDIM: wait for the running one, as the Go client.
            Err(e) if already_running(&e) => Ok(Some(self.connecting(&a))),
            // CDIM answered: nothing was started, the record is void.
            Err(e @ ProviderError::Fabric { .. }) => {
                self.forget(&a);
                Err(e)
            }
            // No answer (or an unreadable one): the apply may have started; the record
            // lets the retry find out.
            Err(e) => Err(e),
        }
    }
}
