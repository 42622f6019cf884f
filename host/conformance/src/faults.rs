//! The simulated checks of faults: a typed error for every fault injected on a check or
//! an attach (and a retry that attaches one device), and the behaviour at the deadline.

use std::time::{Duration, Instant};

use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, Claim, ComposableResource, DeviceType, ProviderError,
};

use crate::attached::Target;
use crate::checks::for_contract;
use crate::fabric::{FaultKind, Op};
use crate::run::{
    DEADLINE_SLACK, NODE, Run, Subject, Verdict, claim, fail, pass, request, resource,
    wanted_device, with_device,
};

/// Whether `result` is the typed error a provider owes for `fault`; `Err` says why not.
///
/// `may_succeed`: the fabric acted before the fault (a mutation whose reply body the
/// provider need not read), so success is fine too; what matters then is the retry.
pub(crate) fn typed_for(
    fault: FaultKind,
    result: &Result<String, CallError>,
    may_succeed: bool,
) -> Result<String, String> {
    let e = match result {
        Ok(ok) if may_succeed => {
            return Ok(format!("{} still gave a result ({ok})", fault.describe()));
        }
        Ok(ok) => return Err(format!("succeeded despite {} ({ok})", fault.describe())),
        Err(e) => e,
    };
    let fits = match (fault, e) {
        (_, CallError::Provider(ProviderError::Other(m))) => {
            return Err(format!(
                "reported {} as the untyped `other` error ({m}); use fabric, malformed-reply or unavailable",
                fault.describe()
            ));
        }
        (FaultKind::ServerError, CallError::Provider(ProviderError::Fabric(f))) => {
            (500..600).contains(&f.status)
        }
        (FaultKind::ServerError, CallError::Provider(ProviderError::Unavailable(_))) => true,
        (FaultKind::MalformedBody, CallError::Provider(ProviderError::MalformedReply(_))) => true,
        (
            FaultKind::LostRequest | FaultKind::LostReply,
            CallError::Provider(ProviderError::Unavailable(_)),
        ) => true,
        (FaultKind::Slow(_), CallError::Timeout(_)) => true,
        (FaultKind::Slow(_), CallError::Provider(ProviderError::Unavailable(_))) => true,
        _ => false,
    };
    if fits {
        Ok(format!("{} gave `{e}`", fault.describe()))
    } else {
        Err(format!(
            "{} gave `{e}`; expected {}",
            fault.describe(),
            match fault {
                FaultKind::ServerError => "a fabric error with the 5xx status or unavailable",
                FaultKind::MalformedBody => "malformed-reply",
                FaultKind::LostRequest | FaultKind::LostReply => "unavailable",
                FaultKind::Slow(_) => "the call's deadline (or unavailable)",
            }
        ))
    }
}

/// `fault-*-check`: `fault` on the first request of a check of the attached device.
pub(crate) async fn fault_on_check(
    run: &mut Run,
    t: &Target,
    fault: FaultKind,
    dev1: &AttachedDevice,
) -> Verdict {
    t.fabric.inject(fault, Op::First);
    let r = run.check(&with_device(&t.r1, dev1)).await;
    t.fabric.clear_faults();
    match typed_for(fault, &r.map(|()| "healthy".to_string()), false) {
        Ok(why) => pass(why),
        Err(why) => fail(why),
    }
}

/// `fault-*-attach` (`name`): `fault` on the request that attaches; then the retry.
pub(crate) async fn fault_on_attach(
    run: &mut Run,
    t: &Target,
    fault: FaultKind,
    name: &str,
    dev1: Option<&AttachedDevice>,
) -> Verdict {
    let verdict = retried_after_fault(run, t, fault, name, dev1).await;
    t.fabric.clear_faults();
    verdict
}

/// The attach of `name`'s resource under `fault`, then its retry with the same attempt
/// key: one device attached, then detached.
async fn retried_after_fault(
    run: &mut Run,
    t: &Target,
    fault: FaultKind,
    name: &str,
    dev1: Option<&AttachedDevice>,
) -> Verdict {
    let (fabric, machine, model) = (t.fabric(), t.machine.as_str(), t.model.as_str());
    let r = resource(
        &format!("conformance-{name}"),
        NODE,
        wanted_type(run),
        model,
    );
    let claims: Vec<Claim> = dev1
        .map(|d| {
            claim(
                &resource("conformance-dev-1", NODE, r.device_type, model),
                d,
            )
        })
        .into_iter()
        .collect();
    let req = request(&r, &format!("attempt-{name}"), claims);
    let before = fabric.attached(machine).len();
    fabric.inject(fault, Op::Attach);
    let first = run.add(&req).await;
    fabric.clear_faults();
    let first = match first {
        Ok(AddOutcome::InProgress(w)) => Ok(format!("in progress ({w})")),
        Ok(AddOutcome::Attached(d)) => Ok(format!("attached {}", d.device_id)),
        Err(e) => Err(e),
    };
    let may_succeed = matches!(fault, FaultKind::MalformedBody | FaultKind::LostReply);
    let typed = match typed_for(fault, &first, may_succeed) {
        Ok(why) => why,
        Err(why) => return fail(why),
    };
    // The retry (same attempt key) attaches exactly one device, then it is detached.
    match run.attach(&req).await {
        Err(e) => fail(format!("{typed}, but the retry failed: {e}")),
        Ok(d) => {
            let after = fabric.attached(machine).len();
            let cleanup = run.detach(&with_device(&r, &d)).await;
            if after != before + 1 {
                let verdict = fail(format!(
                    "{typed}; the retry left {after} devices on the machine, {} expected",
                    before + 1
                ));
                // A reply that broke after the fabric acted is a lost reply.
                if may_succeed {
                    for_contract(run.main.provider.contract_version(), verdict)
                } else {
                    verdict
                }
            } else if let Err(e) = cleanup {
                fail(format!("{typed}; detaching the retried device failed: {e}"))
            } else {
                pass(format!("{typed}; the retry attached one device"))
            }
        }
    }
}

/// `failed-job` / `rolled-back-job`: the fabric accepts the attach, then its job fails
/// (or acts and is rolled back). The provider owes a typed error (not `attached`, not
/// `other`) and must leave nothing attached; the retry of the same attempt then attaches
/// exactly one device, which is detached.
pub(crate) async fn job_fails(
    run: &mut Run,
    t: &Target,
    rollback: bool,
    name: &str,
    dev1: Option<&AttachedDevice>,
) -> Verdict {
    let (fabric, machine, model) = (t.fabric(), t.machine.as_str(), t.model.as_str());
    let what = if rollback {
        "a rolled-back attach job"
    } else {
        "a failed attach job"
    };
    let r = resource(
        &format!("conformance-{name}"),
        NODE,
        wanted_type(run),
        model,
    );
    let claims: Vec<Claim> = dev1
        .map(|d| {
            claim(
                &resource("conformance-dev-1", NODE, r.device_type, model),
                d,
            )
        })
        .into_iter()
        .collect();
    let req = request(&r, &format!("attempt-{name}"), claims);
    let before = fabric.attached(machine).len();
    if let Err(why) = fabric.fail_next_job(rollback) {
        return crate::run::skip(why);
    }
    let end = Instant::now() + crate::run::SETTLE;
    let first = loop {
        match run.add(&req).await {
            Ok(AddOutcome::InProgress(_)) if Instant::now() < end => {
                tokio::time::sleep(crate::run::POLL).await;
            }
            other => break other,
        }
    };
    fabric.clear_faults();
    let typed = match first {
        Ok(AddOutcome::Attached(d)) => {
            let _ = run.detach(&with_device(&r, &d)).await;
            return fail(format!(
                "{what} was reported attached (device {})",
                d.device_id
            ));
        }
        Ok(AddOutcome::InProgress(w)) => {
            return fail(format!(
                "{what} was still in progress after {} s ({w})",
                crate::run::SETTLE.as_secs()
            ));
        }
        Err(CallError::Provider(ProviderError::Other(m))) => {
            return fail(format!(
                "{what} was reported as the untyped `other` error ({m}); use fabric or critical"
            ));
        }
        Err(e) => format!("{what} gave `{e}`"),
    };
    let left = fabric.attached(machine).len();
    if left != before {
        return fail(format!(
            "{typed}, but the machine holds {left} devices, {before} before"
        ));
    }
    match run.attach(&req).await {
        Err(e) => fail(format!("{typed}, but the retry failed: {e}")),
        Ok(d) => {
            let after = fabric.attached(machine).len();
            let cleanup = run.detach(&with_device(&r, &d)).await;
            if after != before + 1 {
                fail(format!(
                    "{typed}; the retry left {after} devices on the machine, {} expected",
                    before + 1
                ))
            } else if let Err(e) = cleanup {
                fail(format!("{typed}; detaching the retried device failed: {e}"))
            } else {
                pass(format!(
                    "{typed}; nothing was left attached and the retry attached one device"
                ))
            }
        }
    }
}

/// The device type the suite asks for.
fn wanted_type(run: &Run) -> DeviceType {
    wanted_device(run.info.as_ref()).0
}

/// `deadline`: `short`, the provider with the short `deadline`, checks `probe` against a
/// reply that comes later; `attached`: `probe` is an attached device, which the main
/// provider must still check after that.
pub(crate) async fn deadline(
    run: &mut Run,
    t: &Target,
    short: &Subject,
    probe: &ComposableResource,
    deadline: Duration,
    attached: bool,
) -> Verdict {
    let slow = FaultKind::Slow(deadline + Duration::from_millis(1500));
    t.fabric.inject(slow, Op::First);
    let called = Instant::now();
    let r = short.provider.check_resource(probe).await;
    let took = called.elapsed();
    run.note(
        &short.recorder,
        "check-resource (short deadline)",
        &r,
        false,
    );
    t.fabric.clear_faults();
    match typed_for(slow, &r.map(|()| "ok".to_string()), false) {
        Err(why) => fail(why),
        Ok(_) if took > deadline + DEADLINE_SLACK => fail(format!(
            "the call returned {} ms after it started; its deadline was {} ms",
            took.as_millis(),
            deadline.as_millis()
        )),
        Ok(why) => {
            // The provider must still work after a call that ran out of time.
            let after = if attached {
                run.check(probe).await.map(|_| ())
            } else {
                Ok(())
            };
            match after {
                Ok(()) => pass(format!(
                    "{why} after {} ms (deadline {} ms); the next call works",
                    took.as_millis(),
                    deadline.as_millis()
                )),
                Err(e) => fail(format!(
                    "after a call hit its deadline the next check failed: {e}"
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_runtime::FabricError;

    #[test]
    fn faults_need_their_typed_error() {
        let fabric = |status| {
            Err(CallError::Provider(ProviderError::Fabric(FabricError {
                status,
                code: String::new(),
                message: String::new(),
            })))
        };
        assert!(typed_for(FaultKind::ServerError, &fabric(503), false).is_ok());
        assert!(typed_for(FaultKind::ServerError, &fabric(404), false).is_err());
        let other = Err(CallError::Provider(ProviderError::Other("x".into())));
        let untyped = typed_for(FaultKind::MalformedBody, &other, true).unwrap_err();
        assert!(untyped.contains("untyped"), "{untyped}");
        let fine = Ok("fine".to_string());
        let succeeded = typed_for(FaultKind::LostRequest, &fine, false).unwrap_err();
        assert!(succeeded.contains("succeeded"), "{succeeded}");
        assert!(typed_for(FaultKind::MalformedBody, &fine, true).is_ok());
        let timeout = Err(CallError::Timeout(Duration::from_secs(1)));
        let slow = FaultKind::Slow(Duration::from_secs(2));
        assert!(typed_for(slow, &timeout, false).is_ok());
        assert!(typed_for(FaultKind::LostRequest, &timeout, false).is_err());
    }
}
