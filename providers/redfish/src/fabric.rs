//! The composition service as the provider uses it: blocks with their devices, systems,
//! tasks, and the one way to change a system's blocks (a PATCH of its
//! `Links.ResourceBlocks` under its ETag).

use serde_json::json;

use cro_provider_sdk::{Host, Method, ProviderError};

use crate::client::{Client, error_of, expect, header};
use crate::resources::{BLOCKS, Block, Collection, Device, Link, SYSTEMS, System, Task};

/// A block with its device (none for a compute block).
#[derive(Debug, Clone)]
pub struct Slot {
    pub block: Block,
    pub device: Option<Device>,
}

/// What a PATCH of a system's blocks did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recomposed {
    /// The system already had the wanted blocks; nothing was sent.
    Unchanged,
    /// Done (`200`/`204`).
    Done,
    /// Accepted (`202`): the task to watch (a service path).
    Accepted { task: String },
}

pub struct Fabric<'a, H: Host + ?Sized> {
    pub client: Client<'a, H>,
}

impl<'a, H: Host + ?Sized> Fabric<'a, H> {
    pub fn new(client: Client<'a, H>) -> Self {
        Fabric { client }
    }

    pub fn system_path(id: &str) -> String {
        format!("{SYSTEMS}/{id}")
    }

    pub fn block_path(id: &str) -> String {
        format!("{BLOCKS}/{id}")
    }

    pub fn system(&self, id: &str) -> Result<System, ProviderError> {
        self.client.get(&Self::system_path(id))
    }

    /// The block at `path`; `None` when the service does not know it (404).
    pub fn block_at(&self, path: &str) -> Result<Option<Block>, ProviderError> {
        let reply = self.client.send(Method::Get, path, &[], None)?;
        if reply.status == 404 {
            return Ok(None);
        }
        expect(&reply, path).map(Some)
    }

    pub fn block(&self, id: &str) -> Result<Option<Block>, ProviderError> {
        self.block_at(&Self::block_path(id))
    }

    pub fn device(&self, block: &Block) -> Result<Device, ProviderError> {
        self.client.get(block.device_link()?.path()?)
    }

    /// A block with its device read.
    pub fn slot(&self, block: Block) -> Result<Slot, ProviderError> {
        let device = match block.device_type() {
            Some(_) => Some(self.device(&block)?),
            None => None,
        };
        Ok(Slot { block, device })
    }

    /// Every block the composition service has.
    pub fn all_blocks(&self) -> Result<Vec<Link>, ProviderError> {
        Ok(self.client.get::<Collection>(BLOCKS)?.members)
    }

    pub fn systems(&self) -> Result<Vec<Link>, ProviderError> {
        Ok(self.client.get::<Collection>(SYSTEMS)?.members)
    }

    /// The non-compute blocks composed into `system`, with their devices. A block that
    /// vanished between the two reads is left out.
    pub fn composed(&self, system: &System) -> Result<Vec<Slot>, ProviderError> {
        let mut out = Vec::new();
        for link in &system.links.blocks {
            let Some(block) = self.block_at(link.path()?)? else {
                continue;
            };
            if block.device_type().is_some() {
                out.push(self.slot(block)?);
            }
        }
        Ok(out)
    }

    pub fn task(&self, path: &str) -> Result<Task, ProviderError> {
        self.client.get(path)
    }

    /// Sets system `id`'s blocks to what `change` makes of the current list (`None`:
    /// no change needed). The PATCH names the ETag read; when another change came in
    /// between (`412`), the system is read again and the change retried once.
    pub fn recompose(
        &self,
        id: &str,
        change: impl Fn(&[Link]) -> Option<Vec<Link>>,
    ) -> Result<Recomposed, ProviderError> {
        let path = Self::system_path(id);
        let mut tries = 0;
        loop {
            tries += 1;
            let system = self.system(id)?;
            let Some(blocks) = change(&system.links.blocks) else {
                return Ok(Recomposed::Unchanged);
            };
            let refs: Vec<_> = blocks.iter().map(|l| json!({"@odata.id": l.id})).collect();
            let body = json!({"Links": {"ResourceBlocks": refs}});
            let if_match: Vec<(&str, &str)> = match system.etag.as_deref() {
                Some(etag) => vec![("if-match", etag)],
                None => Vec::new(),
            };
            let reply = self
                .client
                .send(Method::Patch, &path, &if_match, Some(&body))?;
            match reply.status {
                200 | 204 => return Ok(Recomposed::Done),
                202 => {
                    return Ok(Recomposed::Accepted {
                        task: task_of(&reply)?,
                    });
                }
                412 if tries < 2 => continue,
                _ => return Err(error_of(&reply)),
            }
        }
    }
}

/// The task of a `202`: the body's `@odata.id` (a Task, kept after it ends), else the
/// `Location` header (its task monitor).
fn task_of(reply: &cro_provider_sdk::HttpResponse) -> Result<String, ProviderError> {
    let from_body = serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("@odata.id")?.as_str().map(str::to_string));
    let path = from_body
        .or_else(|| header(reply, "location").map(str::to_string))
        .ok_or_else(|| {
            ProviderError::malformed(
                "the service accepted the composition (202) but named no task or task monitor",
            )
        })?;
    Ok(crate::resources::service_path(&path)?.to_string())
}
