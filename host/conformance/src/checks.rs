//! The checks: each turns what the provider and the fabric did into a verdict.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, Claim, ComposableResource, DeviceType, ProviderError,
    ProviderInfo, RemoveOutcome,
};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricKind, FaultKind, Op};
use crate::report::{Report, Status};
use crate::run::*;
use crate::trace::{UseRecord, millis};

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

pub(crate) fn describe_verdict(
    info: Option<&ProviderInfo>,
    given: bool,
    kind: FabricKind,
) -> Verdict {
    match info {
        None => skip("contract 0.1.0 has no describe()"),
        Some(i) if i.devices.is_empty() => fail(format!("{} declares no device kinds", who(i))),
        Some(i) if i.name.trim().is_empty() || i.vendor.trim().is_empty() => {
            fail("describe() must name the provider and its vendor")
        }
        Some(i) => {
            let how = if given {
                "given with --fabric"
            } else {
                "chosen from describe()"
            };
            pass(format!("{}; fabric {} ({how})", who(i), kind.as_str()))
        }
    }
}

pub(crate) async fn denied_verdict(run: &mut Run, denied: &Subject, claims: &[Claim]) -> Verdict {
    let r = denied.provider.list(claims).await;
    run.note(&denied.recorder, "get-resources (no http grant)", &r, false);
    let traced = run
        .calls
        .last()
        .map(|c| c.uses.iter().any(UseRecord::denied))
        .unwrap_or(false);
    match r {
        Err(CallError::Provider(ProviderError::Denied(m))) if traced => {
            pass(format!("reported `denied` ({m})"))
        }
        Err(CallError::Provider(ProviderError::Denied(m))) => fail(format!(
            "reported `denied` ({m}) although the host refused nothing"
        )),
        Err(e) if traced => fail(format!(
            "the host refused a capability but the provider reported `{e}`, not `denied`"
        )),
        Err(e) => fail(format!(
            "with no HTTP grant the provider failed with `{e}` without asking for HTTP"
        )),
        Ok(devices) => fail(format!(
            "get-resources succeeded with no HTTP grant ({} devices): it did not ask the fabric",
            devices.len()
        )),
    }
}

/// The checks that need the first attached device.
pub(crate) async fn attached_checks(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    r1: &ComposableResource,
    dev1: &AttachedDevice,
    model: &str,
) {
    let held1 = with_device(r1, dev1);
    let claim1 = claim(r1, dev1);

    let t = Instant::now();
    let before = fabric.attached(machine);
    let mut verdict = pass("healthy three times in a row; the fabric unchanged");
    for i in 1..=3 {
        if let Err(e) = run.check(&held1).await {
            verdict = fail(format!(
                "check {i} of a healthy attached device failed: {e}"
            ));
            break;
        }
    }
    if verdict.0 == Status::Pass && fabric.attached(machine) != before {
        verdict = fail("checking changed what the fabric has attached");
    }
    run.record("check", t, verdict);

    let t = Instant::now();
    let verdict = match fabric.set_warning(&dev1.device_id, true) {
        Err(why) => skip(format!("the simulator cannot degrade the device: {why}")),
        Ok(()) => {
            let r = run.check(&held1).await;
            let _ = fabric.set_warning(&dev1.device_id, false);
            match r {
                Err(CallError::Provider(ProviderError::Warning(m))) => {
                    pass(format!("a degraded device is `warning` ({m})"))
                }
                Err(e) => fail(format!("a degraded device gave `{e}`, expected `warning`")),
                Ok(()) => fail("a degraded device was reported healthy"),
            }
        }
    };
    run.record("check-warning", t, verdict);

    let t = Instant::now();
    let verdict = match run.list(std::slice::from_ref(&claim1)).await {
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
    };
    run.record("get-resources", t, verdict);

    // in-progress: a fabric that takes its time.
    let t = Instant::now();
    let verdict = match fabric.set_slow(Some(Duration::from_millis(1500))) {
        Err(why) => skip(why),
        Ok(()) => {
            let v = in_progress(run, fabric, machine, &claim1, model, r1.device_type).await;
            let _ = fabric.set_slow(None);
            v
        }
    };
    run.record("in-progress", t, verdict);

    // lost reply: the fabric attaches, the reply never comes; the retry must find it.
    let t = Instant::now();
    let r3 = resource("conformance-dev-3", NODE, r1.device_type, model);
    let req3 = request(&r3, "attempt-3", vec![claim1.clone()]);
    let base = fabric.attached(machine).len();
    fabric.inject(FaultKind::LostReply, Op::Attach);
    let first = run.add(&req3).await;
    fabric.clear_faults();
    let mut dev3 = None;
    let verdict = match run.attach(&req3).await {
        Err(e) => fail(format!(
            "after a lost reply ({}), the retried attach failed: {e}",
            outcome_text(&first)
        )),
        Ok(d) => {
            let held = fabric.attached(machine).len();
            dev3 = Some(d.clone());
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
    };
    let verdict = for_contract(run.main.provider.contract_version(), verdict);
    run.record("lost-reply-retry", t, verdict);

    let t = Instant::now();
    let base = fabric.attached(machine).len();
    let verdict = match &dev3 {
        None => skip("needs the device of `lost-reply-retry`"),
        Some(d3) => {
            let held3 = with_device(&r3, d3);
            match run.detach(&held3).await {
                Err(e) => fail(format!("detach failed: {e}")),
                Ok(()) => {
                    let held = fabric.attached(machine);
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
    };
    let detached = verdict.0 == Status::Pass;
    run.record("detach", t, verdict);

    let t = Instant::now();
    let base = fabric.attached(machine);
    let verdict = match (&dev3, detached) {
        (Some(d3), true) => match run.remove(&with_device(&r3, d3)).await {
            Ok(RemoveOutcome::Removed) if fabric.attached(machine) == base => {
                pass("a second detach is `removed` and changes nothing")
            }
            Ok(RemoveOutcome::Removed) => fail("a second detach changed what the fabric holds"),
            Ok(RemoveOutcome::InProgress(w)) => fail(format!(
                "a second detach of a detached device is in progress ({w}), expected `removed`"
            )),
            Err(e) => fail(format!("a second detach of a detached device failed: {e}")),
        },
        _ => skip("needs a passing `detach`"),
    };
    run.record("detach-twice", t, verdict);

    for (name, fault) in [
        ("fault-5xx-check", FaultKind::ServerError),
        ("fault-malformed-check", FaultKind::MalformedBody),
        ("fault-lost-check", FaultKind::LostRequest),
    ] {
        let t = Instant::now();
        fabric.inject(fault, Op::First);
        let r = run.check(&held1).await;
        fabric.clear_faults();
        let verdict = match typed_for(fault, &r.map(|()| "healthy".to_string()), false) {
            Ok(why) => pass(why),
            Err(why) => fail(why),
        };
        run.record(name, t, verdict);
    }
}

pub(crate) async fn in_progress(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    claim1: &Claim,
    model: &str,
    device_type: DeviceType,
) -> Verdict {
    let r2 = resource("conformance-dev-2", NODE, device_type, model);
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

pub(crate) async fn fault_on_attach(
    run: &mut Run,
    fabric: &dyn Fabric,
    machine: &str,
    fault: FaultKind,
    name: &str,
    model: &str,
    dev1: Option<&AttachedDevice>,
) -> Verdict {
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

/// What `lost-reply-retry` (and a retry after a malformed reply, which the fabric
/// acted on) requires of a provider's contract. A contract 0.1.0 host
/// passes neither an attempt key nor the cluster's claims, so a provider cannot tell
/// the device a lost reply attached from one another resource holds: a second device
/// there is a limit of the contract, not a fault of the provider. Such a failure is
/// reported as a skip that says so (and what happened); a pass stays a pass.
pub(crate) fn for_contract(contract: &str, verdict: Verdict) -> Verdict {
    match verdict {
        (Status::Fail, why) if contract == "0.1.0" => skip(format!(
            "not required of a contract 0.1.0 provider: its host passes no attempt key or claims to recognise the device a lost reply attached (move to 0.2.0); {why}"
        )),
        v => v,
    }
}

pub(crate) fn wanted_type(run: &Run) -> DeviceType {
    wanted_device(run.info.as_ref()).0
}

/// `declared-capabilities` and `resources`, then the report.
pub(crate) fn finish(
    mut run: Run,
    component: &std::path::Path,
    fabric: String,
    contract: String,
    started: Instant,
) -> Result<Report, SuiteError> {
    let t = Instant::now();
    let verdict = declared_verdict(&run);
    run.record("declared-capabilities", t, verdict);
    let t = Instant::now();
    let verdict = resources_verdict(&run);
    run.record("resources", t, verdict);
    Ok(Report {
        component: component.display().to_string(),
        provider: run.info.as_ref().map(who),
        contract,
        fabric,
        checks: run.checks,
        duration_ms: millis(started.elapsed()),
    })
}

/// The origin a declared HTTP pattern names: `${key}` (or `{key}`, with or without a
/// path after it such as `${endpoint}/redfish/v1/*`) is the origin of configuration key
/// `key`; anything else is read as a URL.
pub(crate) fn declared_origin(
    pattern: &str,
    config: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let templated = pattern
        .strip_prefix("${")
        .or_else(|| pattern.strip_prefix('{'));
    match templated.and_then(|rest| rest.split_once('}')) {
        Some((key, _path)) => config.get(key).and_then(|v| origin(v)),
        None => origin(pattern),
    }
}

/// The origin (`scheme://host:port`) of a URL or of a configured endpoint (FTI's
/// `host:port/` means HTTPS).
pub(crate) fn origin(text: &str) -> Option<String> {
    let text = if text.contains("://") {
        text.to_string()
    } else {
        format!("https://{text}")
    };
    let url = url::Url::parse(&text).ok()?;
    Some(format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str()?,
        url.port_or_known_default()?
    ))
}

pub(crate) fn declared_verdict(run: &Run) -> Verdict {
    let Some(info) = &run.info else {
        return skip("contract 0.1.0 has no describe(): nothing declared to compare with");
    };
    let wants = &info.capabilities;
    let origins: Vec<String> = wants
        .http
        .iter()
        .filter_map(|p| declared_origin(p, &run.config))
        .collect();
    let mut undeclared = Vec::new();
    for u in &run.uses {
        let ok = match u.capability {
            cro_runtime::CapabilityKind::Http => u
                .target
                .split_once(' ')
                .and_then(|(_, url)| origin(url))
                .is_some_and(|o| origins.contains(&o)),
            cro_runtime::CapabilityKind::Secret => wants.secret_keys.contains(&u.target),
            cro_runtime::CapabilityKind::Lookup => {
                let mut parts = u.target.split(' ');
                let (api, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                wants
                    .lookup
                    .iter()
                    .any(|l| l.api_version == api && l.kind == kind)
            }
        };
        let line = u.line();
        if !ok
            && !undeclared
                .iter()
                .any(|l: &String| l.split(" -> ").next() == line.split(" -> ").next())
        {
            undeclared.push(line);
        }
    }
    if run.uses.is_empty() {
        return fail("the provider used no capability during the run: nothing reached the fabric");
    }
    if undeclared.is_empty() {
        pass(format!(
            "all {} capability uses were declared in describe()",
            run.uses.len()
        ))
    } else {
        fail(format!(
            "used but not declared in describe(): {}",
            undeclared
                .iter()
                .map(|l| l.split(" -> ").next().unwrap_or(l).to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }
}

pub(crate) fn resources_verdict(run: &Run) -> Verdict {
    if run.all_calls.is_empty() {
        return fail("no call completed");
    }
    let peak = run
        .all_calls
        .iter()
        .map(|c| c.peak_memory_bytes)
        .max()
        .unwrap_or(0);
    let mut per_op: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for c in &run.all_calls {
        per_op
            .entry(c.operation.as_str())
            .or_default()
            .push(c.duration_ms);
    }
    let times: Vec<String> = per_op
        .iter_mut()
        .map(|(op, ms)| {
            ms.sort_by(f64::total_cmp);
            let median = ms[ms.len() / 2];
            let max = ms[ms.len() - 1];
            format!(
                "{op} median {median:.1} ms max {max:.1} ms ({} calls)",
                ms.len()
            )
        })
        .collect();
    let summary = format!(
        "peak memory {:.1} MiB of {:.0} MiB; {}",
        peak as f64 / f64::from(1 << 20),
        run.memory_limit as f64 / f64::from(1 << 20),
        times.join("; ")
    );
    if run.over_budget.is_empty() {
        pass(summary)
    } else {
        fail(format!(
            "the sandbox stopped calls: {}; {summary}",
            run.over_budget.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_runtime::FabricError;

    #[test]
    fn a_lost_reply_failure_of_a_0_1_0_provider_is_a_skip_that_says_why() {
        let (status, why) = for_contract("0.1.0", fail("attached a second device"));
        assert_eq!(status, Status::Skip);
        assert!(why.contains("contract 0.1.0") && why.ends_with("attached a second device"));
        assert_eq!(
            for_contract("0.2.0", fail("attached a second device")).0,
            Status::Fail
        );
        assert_eq!(for_contract("0.1.0", pass("found it")).0, Status::Pass);
    }

    #[test]
    fn origins_of_urls_and_fti_endpoints() {
        assert_eq!(
            origin("https://h:8443/x/y").as_deref(),
            Some("https://h:8443")
        );
        assert_eq!(origin("h:8443/").as_deref(), Some("https://h:8443"));
        assert_eq!(
            origin("http://127.0.0.1/").as_deref(),
            Some("http://127.0.0.1:80")
        );
    }

    #[test]
    fn declared_patterns_resolve_against_the_config() {
        let config = BTreeMap::from([("endpoint".to_string(), "http://127.0.0.1:9/".to_string())]);
        for p in [
            "${endpoint}",
            "${endpoint}/redfish/v1/*",
            "{endpoint}/redfish/v1/*",
        ] {
            assert_eq!(
                declared_origin(p, &config).as_deref(),
                Some("http://127.0.0.1:9"),
                "{p}"
            );
        }
        assert_eq!(declared_origin("${other}", &config), None);
        assert_eq!(
            declared_origin("https://idm.example:8443", &config).as_deref(),
            Some("https://idm.example:8443")
        );
    }

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
