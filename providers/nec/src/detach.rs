//! Detach: a `disconnect` layout apply from the I/O adapter the GPU is connected to.
//! Idempotent: a GPU connected to nothing (or unknown to CDIM) is removed. The apply is
//! kept in `state` so the next call follows it instead of posting again.

use cro_provider_sdk::{ComposableResource, Host, LogLevel, ProviderError, RemoveOutcome};

use crate::attach::{self, IN_FLIGHT_PREFIX};
use crate::client::{Client, Phase, already_running, procedure};

const DETACH_PREFIX: &str = "nec/detach/";
const DETACH_TTL_MS: u64 = 24 * 3600 * 1000;

/// The GPU of the resource: its recorded fabric id, else the one its unfinished attach
/// chose.
fn gpu_of<H: Host + ?Sized>(host: &H, r: &ComposableResource) -> Option<(String, bool)> {
    if let Some(id) = r
        .fabric_device_id
        .as_deref()
        .map(str::trim)
        .filter(|id| !id.is_empty())
    {
        return Some((id.to_string(), false));
    }
    let key = host
        .state_get(&format!("{IN_FLIGHT_PREFIX}{}", r.name))
        .and_then(|k| String::from_utf8(k).ok())?;
    attach::load(host, &key).map(|a| (a.gpu, true))
}

pub fn remove<H: Host + ?Sized>(
    client: &Client<'_, H>,
    r: &ComposableResource,
    node: Option<&str>,
) -> Result<RemoveOutcome, ProviderError> {
    let host = client.host();
    let Some((gpu, in_flight)) = gpu_of(host, r) else {
        return Ok(RemoveOutcome::Removed);
    };
    let key = format!("{DETACH_PREFIX}{gpu}");
    if let Some(apply) = host.state_get(&key).and_then(|t| String::from_utf8(t).ok()) {
        match client.apply_state(&apply)? {
            None => host.state_remove(&key),
            Some(s) => match s.phase()? {
                Phase::Running => {
                    return Ok(RemoveOutcome::InProgress(format!(
                        "GPU {gpu} is being disconnected (layout apply {apply})"
                    )));
                }
                Phase::Completed => host.state_remove(&key),
                Phase::Failed | Phase::Suspended => {
                    host.state_remove(&key);
                    return Err(ProviderError::Fabric {
                        status: 500,
                        code: s.status.clone(),
                        message: format!(
                            "layout apply {apply} disconnecting GPU {gpu} ended with {}",
                            s.describe()
                        ),
                    });
                }
            },
        }
    }
    let Some(entry) = client.resource(&gpu)? else {
        attach::release(host, &r.name, &gpu);
        return Ok(RemoveOutcome::Removed);
    };
    let Some(io) = entry.device.connected_to().map(str::to_owned) else {
        if in_flight {
            // The attach that chose it may still be connecting it: wait for it rather
            // than leave a GPU connected for nobody.
            if let Some(outcome) = attach_running(client, r)? {
                return Ok(outcome);
            }
        }
        attach::release(host, &r.name, &gpu);
        return Ok(RemoveOutcome::Removed);
    };
    // A GPU now on another node is no longer this resource's: taking it away would
    // take another node's device.
    if let Some(node) = node
        && !entry.node_ids.is_empty()
        && !entry.node_ids.iter().any(|n| n.eq_ignore_ascii_case(node))
    {
        host.log(
            LogLevel::Warn,
            &format!(
                "GPU {gpu} of {} is connected to CDIM node(s) {:?}, not {node}: left alone",
                r.name, entry.node_ids
            ),
        );
        attach::release(host, &r.name, &gpu);
        return Ok(RemoveOutcome::Removed);
    }
    match client.apply(&procedure("disconnect", &io, &gpu)) {
        Ok(apply) => {
            // What an unfinished attach holds is released once the GPU is seen
            // disconnected: until then it is how the next call finds the GPU.
            host.state_set(&key, apply.as_bytes(), Some(DETACH_TTL_MS));
            Ok(RemoveOutcome::InProgress(format!(
                "GPU {gpu} is being disconnected from {io} (layout apply {apply})"
            )))
        }
        Err(e) if already_running(&e) => Ok(RemoveOutcome::InProgress(format!(
            "another layout apply is running on CDIM; GPU {gpu} is disconnected after it"
        ))),
        Err(e) => Err(e),
    }
}

/// `in-progress` while the resource's unfinished attach still has a layout apply
/// running.
fn attach_running<H: Host + ?Sized>(
    client: &Client<'_, H>,
    r: &ComposableResource,
) -> Result<Option<RemoveOutcome>, ProviderError> {
    let host = client.host();
    let Some(key) = host
        .state_get(&format!("{IN_FLIGHT_PREFIX}{}", r.name))
        .and_then(|k| String::from_utf8(k).ok())
    else {
        return Ok(None);
    };
    let Some(apply) = attach::load(host, &key).and_then(|a| a.apply) else {
        return Ok(None);
    };
    match client.apply_state(&apply)? {
        Some(s) if s.phase()? == Phase::Running => Ok(Some(RemoveOutcome::InProgress(format!(
            "the attach of {} is still connecting its GPU (layout apply {apply}); it is disconnected once that ends",
            r.name
        )))),
        _ => Ok(None),
    }
}
