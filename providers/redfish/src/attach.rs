//! Attach: compose a free resource block of the wanted type and model into the node's
//! system.
//!
//! Crash- and retry-safe: before the PATCH the chosen block is recorded in `state` under
//! the request's attempt key (and reserved against the provider's other attempts), so a
//! retry after a lost reply, a `202` or a restart of the call finds the block it already
//! composed instead of composing a second one. When that record is lost too (the
//! operator restarted), a block of the type and model already composed into the system
//! that no claim holds is taken as this attempt's.

use serde::{Deserialize, Serialize};

use cro_provider_sdk::{AddOutcome, AddRequest, AttachedDevice, Host, LogLevel, ProviderError};

use crate::fabric::{Fabric, Recomposed, Slot};
use crate::resources::{Composition, Link, TaskOutcome};

const ATTEMPT_PREFIX: &str = "redfish/attempt/";
const RESERVED_PREFIX: &str = "redfish/reserved/";
/// Resource name -> the block its unfinished attach chose, so a detach of a resource
/// whose attach has not returned its ids yet still finds (and decomposes) the block.
pub const IN_FLIGHT_PREFIX: &str = "redfish/in-flight/";
/// An attempt's record outlives any sane retry loop of one attach.
const ATTEMPT_TTL_MS: u64 = 24 * 3600 * 1000;
/// A reservation only has to cover the window between choosing a block and the
/// service showing it composed; an abandoned one must not hide a block for long.
const RESERVED_TTL_MS: u64 = 10 * 60 * 1000;

/// Drops what an unfinished attach of `resource` holds on `block` (its in-flight record
/// and the block's reservation), once a detach has taken the block back.
pub fn release<H: Host + ?Sized>(host: &H, resource: &str, block: &str) {
    host.state_remove(&format!("{IN_FLIGHT_PREFIX}{resource}"));
    host.state_remove(&format!("{RESERVED_PREFIX}{block}"));
}

/// What an attempt has done so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Attempt {
    system: String,
    block: String,
    /// The composition task, when the service answered `202`.
    task: Option<String>,
}

/// Whether a device fits the request: its type, its model (trimmed, case-insensitive)
/// and, for memory with a size asked, enough capacity.
pub fn fits(slot: &Slot, req: &AddRequest) -> bool {
    let r = &req.resource;
    let Some(device) = &slot.device else {
        return false;
    };
    if slot.block.device_type() != Some(r.device_type)
        || !device.model().eq_ignore_ascii_case(r.model.trim())
    {
        return false;
    }
    match req.size_bytes {
        Some(want) => device
            .capacity_mib
            .is_some_and(|mib| mib.saturating_mul(1 << 20) >= want),
        None => true,
    }
}

/// Whether another ComposableResource holds the block (by block id or device id).
pub fn claimed(slot: &Slot, req: &AddRequest) -> bool {
    req.claimed_by_another(&slot.block.id)
        || slot
            .device
            .as_ref()
            .and_then(|d| d.device_id(&slot.block.id).ok())
            .is_some_and(|id| req.claimed_by_another(&id))
}

pub struct Attach<'f, 'a, H: Host + ?Sized> {
    pub fabric: &'f Fabric<'a, H>,
    pub req: &'f AddRequest,
    pub system: &'f str,
}

impl<H: Host + ?Sized> Attach<'_, '_, H> {
    fn host(&self) -> &H {
        self.fabric.client.host()
    }

    fn attempt_key(&self) -> String {
        format!("{ATTEMPT_PREFIX}{}", self.req.attempt_key)
    }

    fn load(&self) -> Option<Attempt> {
        let bytes = self.host().state_get(&self.attempt_key())?;
        serde_json::from_slice(&bytes).ok()
    }

    fn save(&self, a: &Attempt) {
        if let Ok(bytes) = serde_json::to_vec(a) {
            self.host()
                .state_set(&self.attempt_key(), &bytes, Some(ATTEMPT_TTL_MS));
        }
        self.host().state_set(
            &format!("{RESERVED_PREFIX}{}", a.block),
            self.req.attempt_key.as_bytes(),
            Some(RESERVED_TTL_MS),
        );
        self.host().state_set(
            &format!("{IN_FLIGHT_PREFIX}{}", self.req.resource.name),
            a.block.as_bytes(),
            Some(ATTEMPT_TTL_MS),
        );
    }

    fn forget(&self, a: &Attempt) {
        self.host().state_remove(&self.attempt_key());
        self.host()
            .state_remove(&format!("{IN_FLIGHT_PREFIX}{}", self.req.resource.name));
        let reserved = format!("{RESERVED_PREFIX}{}", a.block);
        if self.host().state_get(&reserved).as_deref() == Some(self.req.attempt_key.as_bytes()) {
            self.host().state_remove(&reserved);
        }
    }

    /// Another attempt of this provider has chosen the block and not finished.
    fn reserved_by_another(&self, block: &str) -> bool {
        self.host()
            .state_get(&format!("{RESERVED_PREFIX}{block}"))
            .is_some_and(|owner| owner != self.req.attempt_key.as_bytes())
    }

    fn usable(&self, slot: &Slot) -> bool {
        fits(slot, self.req)
            && !claimed(slot, self.req)
            && !self.reserved_by_another(&slot.block.id)
    }

    fn attached(&self, slot: &Slot) -> Result<AddOutcome, ProviderError> {
        let device = slot.device.as_ref().ok_or_else(|| {
            ProviderError::Other(format!("block {} has no device", slot.block.id))
        })?;
        Ok(AddOutcome::Attached(AttachedDevice {
            device_id: device.device_id(&slot.block.id)?,
            fabric_device_id: slot.block.id.clone(),
            machine_id: Some(self.system.to_string()),
        }))
    }

    fn composing(&self, block: &str, task: Option<&str>) -> AddOutcome {
        AddOutcome::InProgress(match task {
            Some(t) => format!(
                "resource block {block} is being composed into system {} (task {t})",
                self.system
            ),
            None => format!(
                "resource block {block} is being composed into system {}",
                self.system
            ),
        })
    }

    pub fn run(&self) -> Result<AddOutcome, ProviderError> {
        if let Some(outcome) = self.resume()? {
            return Ok(outcome);
        }
        if let Some(outcome) = self.adopt()? {
            return Ok(outcome);
        }
        self.compose_free()
    }

    /// Follows this attempt's record, if any: `None` when there is nothing to resume
    /// (no record, or the block it names is no longer on its way into the system).
    fn resume(&self) -> Result<Option<AddOutcome>, ProviderError> {
        let Some(a) = self.load() else {
            return Ok(None);
        };
        if a.system != self.system {
            self.forget(&a);
            return Ok(None);
        }
        let block = self.fabric.block(&a.block)?;
        match block {
            Some(b) if b.linked_to(self.system) && b.composition() == Composition::Composed => {
                let slot = self.fabric.slot(b)?;
                self.forget(&a);
                self.attached(&slot).map(Some)
            }
            Some(b) if b.linked_to(self.system) && b.composition() == Composition::Composing => {
                Ok(Some(self.composing(&a.block, a.task.as_deref())))
            }
            _ => {
                // Not (or no longer) on its way in: a failed task says why; otherwise the
                // PATCH never acted (or the block was taken back) and a new one is chosen.
                if let Some(task) = &a.task {
                    match self.fabric.task(task)?.outcome() {
                        TaskOutcome::Failed(code, message) => {
                            self.forget(&a);
                            return Err(ProviderError::Fabric {
                                status: 500,
                                code,
                                message: format!(
                                    "composing resource block {} into system {} failed: {message}",
                                    a.block, self.system
                                ),
                            });
                        }
                        TaskOutcome::Running => {
                            return Ok(Some(self.composing(&a.block, Some(task))));
                        }
                        TaskOutcome::Completed => {}
                    }
                }
                self.forget(&a);
                Ok(None)
            }
        }
    }

    /// A fitting block already composed into the system that nobody holds: this
    /// attempt's from before a lost reply and a lost record.
    fn adopt(&self) -> Result<Option<AddOutcome>, ProviderError> {
        let system = self.fabric.system(self.system)?;
        for slot in self.fabric.composed(&system)? {
            if self.usable(&slot) {
                self.host().log(
                    LogLevel::Info,
                    &format!(
                        "resource block {} is composed into system {} and held by no resource: taken for {}",
                        slot.block.id, self.system, self.req.resource.name
                    ),
                );
                return self.attached(&slot).map(Some);
            }
        }
        Ok(None)
    }

    /// Chooses an unused fitting block nobody holds and composes it into the system.
    fn compose_free(&self) -> Result<AddOutcome, ProviderError> {
        match self.choose_free()? {
            Choice::OnWayHere(slot) => {
                // Being composed into this system for nobody known: this attempt's,
                // from before a lost reply and a lost record.
                let a = Attempt {
                    system: self.system.to_string(),
                    block: slot.block.id.clone(),
                    task: None,
                };
                self.save(&a);
                Ok(self.composing(&a.block, None))
            }
            Choice::Unused(slot) => self.compose(&slot),
            Choice::None { looked } => Err(self.no_capacity(looked)),
        }
    }

    /// The first usable block of the wanted type that is unused or already on its way
    /// into this system, or how many candidates were looked at.
    fn choose_free(&self) -> Result<Choice, ProviderError> {
        let want = self.req.resource.device_type;
        let mut looked = 0;
        for link in self.fabric.all_blocks()? {
            let Some(block) = self.fabric.block_at(link.path()?)? else {
                continue;
            };
            if block.device_type() != Some(want) {
                continue;
            }
            let state = block.composition();
            let on_way_here = state == Composition::Composing && block.linked_to(self.system);
            if state != Composition::Unused && !on_way_here {
                continue;
            }
            looked += 1;
            let slot = self.fabric.slot(block)?;
            if !self.usable(&slot) {
                continue;
            }
            return Ok(if on_way_here {
                Choice::OnWayHere(slot)
            } else {
                Choice::Unused(slot)
            });
        }
        Ok(Choice::None { looked })
    }

    fn no_capacity(&self, looked: usize) -> ProviderError {
        let r = &self.req.resource;
        let size = self
            .req
            .size_bytes
            .map(|b| format!(" of at least {b} bytes"))
            .unwrap_or_default();
        ProviderError::NoCapacity(format!(
            "no unused {} resource block of model '{}'{size} that no resource holds ({looked} unused block(s) of that type looked at)",
            r.device_type, r.model
        ))
    }

    /// Records the plan, then PATCHes the system's links with the block added.
    fn compose(&self, slot: &Slot) -> Result<AddOutcome, ProviderError> {
        let a = Attempt {
            system: self.system.to_string(),
            block: slot.block.id.clone(),
            task: None,
        };
        // The plan is stored before acting.
        self.save(&a);
        let link = Link::to(Fabric::<H>::block_path(&a.block));
        let block_id = a.block.clone();
        let result = self.fabric.recompose(self.system, |current| {
            if current.iter().any(|l| l.last_segment() == block_id) {
                None
            } else {
                let mut next = current.to_vec();
                next.push(link.clone());
                Some(next)
            }
        });
        match result {
            Ok(Recomposed::Done | Recomposed::Unchanged) => {
                self.forget(&a);
                self.attached(slot)
            }
            Ok(Recomposed::Accepted { task }) => {
                let a = Attempt {
                    task: Some(task.clone()),
                    ..a
                };
                self.save(&a);
                Ok(self.composing(&a.block, Some(&task)))
            }
            // The service answered: nothing was composed, the record is void.
            Err(e @ ProviderError::Fabric { .. }) => {
                self.forget(&a);
                Err(e)
            }
            // No answer (or an unreadable one): the PATCH may have acted; the record
            // lets the retry find out.
            Err(e) => Err(e),
        }
    }
}

/// What [`Attach::choose_free`] found.
enum Choice {
    /// A block already being composed into this system, for no known attempt.
    OnWayHere(Slot),
    /// An unused block.
    Unused(Slot),
    /// None usable, of `looked` candidates.
    None { looked: usize },
}
