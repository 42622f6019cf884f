//! The simulated checks of attaching and of a device once attached: `attach`, `check`,
//! `check-warning`, `get-resources`, `in-progress`, `lost-reply-retry`, `detach` and
//! `detach-twice`. Each turns what the provider and the fabric did into a verdict.

use std::time::{Duration, Instant};

use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, Claim, ComposableResource, ProviderError, RemoveOutcome,
};

use crate::checks::for_contract;
use crate::fabric::{Fabric, FaultKind, Op};
use crate::run::{
    NODE, POLL, Run, SETTLE, Verdict, claim, describe_held, fail, outcome_text, pass, request,
    resource, skip, with_device,
};

/// The simulated fabric the checks run against: the machine behind [`NODE`], the model
/// of the free devices seeded on it and the suite's first resource (which `attach`
/// attaches).
pub(crate) struct Target {
    pub(crate) fabric: Box<dyn Fabric>,
    pub(crate) machine: String,
    pub(crate) model: String,
    pub(crate) r1: ComposableResource,
}

impl Target {
    pub(crate) fn fabric(&self) -> &dyn Fabric {
        self.fabric.as_ref()
    }

    /// The resource `lost-reply-retry` attaches and `detach` detaches.
    pub(crate) fn r3(&self) -> ComposableResource {
        resource("conformance-dev-3", NODE, self.r1.device_type, &self.model)
    }
}

/// `attach`: the first resource, attached to the machine and nothing else; the device
/// when the check passed.
pub(crate) async fn attach(run: &mut Run, t: &Target) -> (Verdict, Option<AttachedDevice>) {
    match run.attach(&request(&t.r1, "attempt-1", vec![])).await {
        Err(e) => (fail(format!("attach failed: {e}")), None),
        Ok(d) => {
            let verdict = attached_verdict(t, &d);
            let passed = verdict.0 == crate::report::Status::Pass;
            (verdict, passed.then_some(d))
        }
    }
}

/// Whether the fabric holds what the provider reported attached.
fn attached_verdict(t: &Target, d: &AttachedDevice) -> Verdict {
    let machine = &t.machine;
    let held = t.fabric.attached(machine);
    if !held.iter().any(|f| f.is(d) && f.ready) {
        fail(format!(
            "the provider reported device {} (fabric id {}) attached, but the fabric holds {} on machine {machine}",
            d.device_id,
            d.fabric_device_id,
            describe_held(&held)
        ))
    } else if held.len() != 1 {
        fail(format!(
            "one attach left {} devices on the machine",
            held.len()
        ))
    } else if d.machine_id.as_deref().is_some_and(|m| m != machine) {
        fail(format!(
            "the provider reported machine {:?}; the fabric attached the device to {machine}",
            d.machine_id
        ))
    } else {
        pass(format!(
            "device {} attached to machine {machine}",
            d.device_id
        ))
    }
}

/// `check`: the attached device is healthy three times, and checking changes nothing.
pub(crate) async fn healthy(run: &mut Run, t: &Target, dev1: &AttachedDevice) -> Verdict {
    let held1 = with_device(&t.r1, dev1);
    let before = t.fabric.attached(&t.machine);
    let since = last_seq(t);
    for i in 1..=3 {
        if let Err(e) = run.check(&held1).await {
            return fail(format!(
                "check {i} of a healthy attached device failed: {e}"
            ));
        }
    }
    if t.fabric.attached(&t.machine) != before {
        return fail("checking changed what the fabric has attached");
    }
    if let Some(why) = changed_since(t, since) {
        return fail(format!("checking {why}"));
    }
    pass("healthy three times in a row; the fabric unchanged")
}

/// The newest request the fabric has received.
pub(crate) fn last_seq(t: &Target) -> u64 {
    t.fabric.received().last().map_or(0, |c| c.seq)
}

/// Whether a request after `since` asked the fabric to attach or detach: what a read
/// must never do, even when it puts things back as they were.
pub(crate) fn changed_since(t: &Target, since: u64) -> Option<String> {
    let calls = t.fabric.received();
    let changing: Vec<String> = calls
        .iter()
        .filter(|c| c.seq > since && c.changes)
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    (!changing.is_empty()).then(|| {
        format!(
            "sent the fabric {} request(s) that attach or detach: {}",
            changing.len(),
            changing.join(", ")
        )
    })
}

/// `check-warning`: a degraded device is reported as `warning`.
pub(crate) async fn warning(run: &mut Run, t: &Target, dev1: &AttachedDevice) -> Verdict {
    let held1 = with_device(&t.r1, dev1);
    match t.fabric.set_warning(&dev1.device_id, true) {
        Err(why) => skip(format!("the simulator cannot degrade the device: {why}")),
        Ok(()) => {
            let r = run.check(&held1).await;
            let _ = t.fabric.set_warning(&dev1.device_id, false);
            match r {
                Err(CallError::Provider(ProviderError::Warning(m))) => {
                    pass(format!("a degraded device is `warning` ({m})"))
                }
                Err(e) => fail(format!("a degraded device gave `{e}`, expected `warning`")),
                Ok(()) => fail("a degraded device was reported healthy"),
            }
        }
    }
}

/// `get-resources`: the attached device is listed, on its node, as its type.
pub(crate) async fn listed(run: &mut Run, t: &Target, dev1: &AttachedDevice) -> Verdict {
    let r1 = &t.r1;
    let claim1 = claim(r1, dev1);
    let since = last_seq(t);
    let listed = run.list(std::slice::from_ref(&claim1)).await;
    if let Some(why) = changed_since(t, since) {
        return fail(format!("listing {why}"));
    }
    match listed {
        Err(e) => fail(format!("get-resources failed: {e}")),
        Ok(devices) => {
            match devices.iter().find(|d| {
                d.device_id == dev1.device_id || d.fabric_device_id == dev1.fabric_device_id
            }) {
                None => fail(format!(
                    "the attached device {} is not listed ({} devices listed)",
                    dev1.device_id,
                    devices.len()
                )),
                Some(d) if d.node != NODE => fail(format!(
                    "device {} is listed on node {:?}, not {NODE}",
                    dev1.device_id, d.node
                )),
                Some(d) if d.device_type != r1.device_type => fail(format!(
                    "device {} is listed as {:?}, not {:?}",
                    dev1.device_id, d.device_type, r1.device_type
                )),
                Some(_) => pass(format!(
                    "{} devices listed, the attached one on {NODE}",
                    devices.len()
                )),
            }
        }
    }
}

/// `in-progress`: a fabric that takes its time.
pub(crate) async fn in_progress(run: &mut Run, t: &Target, dev1: &AttachedDevice) -> Verdict {
    match t.fabric.set_slow(Some(Duration::from_millis(1500))) {
        Err(why) => skip(why),
        Ok(()) => {
            let v = attach_while_slow(run, t, &claim(&t.r1, dev1)).await;
            let _ = t.fabric.set_slow(None);
            v
        }
    }
}

/// A second resource attached and detached on a slow fabric: asked again while in
/// progress, the provider attaches nothing more.
async fn attach_while_slow(run: &mut Run, t: &Target, claim1: &Claim) -> Verdict {
    let (fabric, machine) = (t.fabric(), t.machine.as_str());
    let r2 = resource("conformance-dev-2", NODE, t.r1.device_type, &t.model);
    let req2 = request(&r2, "attempt-2", vec![claim1.clone()]);
    let base = fabric.attached(machine).len();
    let first = run.add(&req2).await;
    let mut said_in_progress = matches!(first, Ok(AddOutcome::InProgress(_)));
    if let Err(e) = &first {
        return fail(format!("an attach on a slow fabric failed: {e}"));
    }
    // Asked again while the fabric works: nothing more may be attached.
    let mut dev2 = None;
    let end = Instant::now() + SETTLE;
    while dev2.is_none() {
        if fabric.attached(machine).len() > base + 1 {
            return fail("asking again while the attach was in progress attached another device");
        }
        match run.add(&req2).await {
            Ok(AddOutcome::Attached(d)) => dev2 = Some(d),
            Ok(AddOutcome::InProgress(_)) if Instant::now() < end => {
                said_in_progress = true;
                tokio::time::sleep(POLL).await;
            }
            Ok(AddOutcome::InProgress(w)) => {
                return fail(format!(
                    "still in progress after {} s ({w})",
                    SETTLE.as_secs()
                ));
            }
            Err(e) => return fail(format!("asking again while in progress failed: {e}")),
        }
    }
    let Some(dev2) = dev2 else {
        return fail("no device");
    };
    let held = fabric.attached(machine);
    if held.len() != base + 1 || !held.iter().any(|f| f.is(&dev2) && f.ready) {
        return fail(format!(
            "after the in-progress attach the fabric holds {}, expected the first device and {}",
            describe_held(&held),
            dev2.device_id
        ));
    }
    if let Err(e) = run.detach(&with_device(&r2, &dev2)).await {
        return fail(format!("detaching on a slow fabric failed: {e}"));
    }
    let held = fabric.attached(machine);
    if held.iter().any(|f| f.is(&dev2)) {
        return fail(format!(
            "detach said removed but the fabric still holds {}",
            dev2.device_id
        ));
    }
    pass(if said_in_progress {
        "in progress while the fabric worked, then attached and detached once".to_string()
    } else {
        "the provider waited for the fabric inside the call; one device attached".to_string()
    })
}

/// `lost-reply-retry`: the fabric attaches, the reply never comes; the retry must find
/// the device. Returns the device the retry reported, whatever the verdict (`detach`
/// detaches it).
pub(crate) async fn lost_reply_retry(
    run: &mut Run,
    t: &Target,
    dev1: &AttachedDevice,
) -> (Verdict, Option<AttachedDevice>) {
    let r3 = t.r3();
    let req3 = request(&r3, "attempt-3", vec![claim(&t.r1, dev1)]);
    let base = t.fabric.attached(&t.machine).len();
    t.fabric.inject(FaultKind::LostReply, Op::Attach);
    let first = run.add(&req3).await;
    t.fabric.clear_faults();
    let (verdict, dev3) = match run.attach(&req3).await {
        Err(e) => (
            fail(format!(
                "after a lost reply ({}), the retried attach failed: {e}",
                outcome_text(&first)
            )),
            None,
        ),
        Ok(d) => (retried_verdict(t, base, dev1, &d), Some(d)),
    };
    let verdict = for_contract(run.main.provider.contract_version(), verdict);
    (verdict, dev3)
}

/// Whether the retry after a lost reply found the device that reply attached (`base`:
/// the devices on the machine before).
fn retried_verdict(t: &Target, base: usize, dev1: &AttachedDevice, d: &AttachedDevice) -> Verdict {
    let held = t.fabric.attached(&t.machine).len();
    if held != base + 1 {
        fail(format!(
            "the retried attach after a lost reply attached a second device: the fabric holds {held} devices on the machine, {} expected (use the attempt key and the claims to find the device the lost reply attached)",
            base + 1
        ))
    } else if d.device_id == dev1.device_id {
        fail("the retried attach returned the first resource's (claimed) device")
    } else {
        pass(format!(
            "the retry found device {} the lost reply attached",
            d.device_id
        ))
    }
}

/// `detach`: the device of `lost-reply-retry` detached, and only it.
pub(crate) async fn detach(run: &mut Run, t: &Target, d3: &AttachedDevice) -> Verdict {
    let base = t.fabric.attached(&t.machine).len();
    let held3 = with_device(&t.r3(), d3);
    match run.detach(&held3).await {
        Err(e) => fail(format!("detach failed: {e}")),
        Ok(()) => {
            let held = t.fabric.attached(&t.machine);
            if held.iter().any(|f| f.is(d3)) {
                fail(format!(
                    "detach said removed but the fabric still holds {}",
                    d3.device_id
                ))
            } else if held.len() + 1 != base {
                fail(format!(
                    "the machine held {base} devices before the detach and {} after, one fewer expected",
                    held.len()
                ))
            } else {
                pass(format!("device {} detached", d3.device_id))
            }
        }
    }
}

/// `detach-twice`: detaching the detached device again is `removed` and changes nothing.
pub(crate) async fn detach_twice(run: &mut Run, t: &Target, d3: &AttachedDevice) -> Verdict {
    let base = t.fabric.attached(&t.machine);
    match run.remove(&with_device(&t.r3(), d3)).await {
        Ok(RemoveOutcome::Removed) if t.fabric.attached(&t.machine) == base => {
            pass("a second detach is `removed` and changes nothing")
        }
        Ok(RemoveOutcome::Removed) => fail("a second detach changed what the fabric holds"),
        Ok(RemoveOutcome::InProgress(w)) => fail(format!(
            "a second detach of a detached device is in progress ({w}), expected `removed`"
        )),
        Err(e) => fail(format!("a second detach of a detached device failed: {e}")),
    }
}
