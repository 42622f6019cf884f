//! The FTI provider component in the cro runtime against the fabric simulator.

mod cm;
mod conformance;
mod contract;
mod egress;
mod fm;
mod nec;
mod python;
mod redfish;
mod token;

use std::time::{Duration, Instant};

use cro_runtime::{AddOutcome, CallError, FabricError, ProviderError, RemoveOutcome};
use fabric_sim::RecordedRequest;
use provider_it::Fixture;

/// The provider's error of a failed call.
pub fn provider_error<T: std::fmt::Debug>(r: Result<T, CallError>) -> ProviderError {
    match r {
        Err(CallError::Provider(e)) => e,
        other => panic!("expected a provider error, got {other:?}"),
    }
}

pub fn fabric_error<T: std::fmt::Debug>(r: Result<T, CallError>) -> FabricError {
    match provider_error(r) {
        ProviderError::Fabric(f) => f,
        other => panic!("expected a fabric error, got {other:?}"),
    }
}

pub fn attached(outcome: Result<AddOutcome, CallError>) -> (String, String) {
    match outcome {
        Ok(AddOutcome::Attached(d)) => (d.device_id, d.fabric_device_id),
        other => panic!("expected an attached device, got {other:?}"),
    }
}

pub fn is_in_progress(outcome: &Result<AddOutcome, CallError>) -> bool {
    matches!(outcome, Ok(AddOutcome::InProgress(_)))
}

pub fn is_removing(outcome: &Result<RemoveOutcome, CallError>) -> bool {
    matches!(outcome, Ok(RemoveOutcome::InProgress(_)))
}

/// Bearer tokens of the fabric requests (all but the token requests).
pub fn bearers(requests: &[RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.route != Some(fabric_sim::Route::Token))
        .filter_map(|r| r.bearer().map(str::to_string))
        .collect()
}

/// Calls `attempt` until it returns `Some`, failing after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = attempt().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The device the simulator holds for a serial, with its machine.
pub fn sim_device(fx: &Fixture, serial: &str) -> fabric_sim::SimDevice {
    fx.sim
        .device(serial)
        .unwrap_or_else(|| panic!("the simulator does not know {serial}"))
}
