//! The verdicts both suites share: what `describe()` says, a denied capability, the
//! capabilities used against those declared, what the calls cost; and what a contract
//! 0.1.0 provider is not held to.

use std::collections::BTreeMap;

use cro_runtime::{CallError, Claim, ProviderError, ProviderInfo};

use crate::report::Status;
use crate::run::{Run, Subject, Verdict, fail, pass, skip, who};
use crate::trace::UseRecord;

/// `fabric`: the fabric the suite ran against; `how`: how it was chosen.
pub(crate) fn describe_verdict(info: Option<&ProviderInfo>, fabric: &str, how: &str) -> Verdict {
    match info {
        None => skip("contract 0.1.0 has no describe()"),
        Some(i) if i.devices.is_empty() => fail(format!("{} declares no device kinds", who(i))),
        Some(i) if i.name.trim().is_empty() || i.vendor.trim().is_empty() => {
            fail("describe() must name the provider and its vendor")
        }
        Some(i) => pass(format!("{}; fabric {fabric} ({how})", who(i))),
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
}
