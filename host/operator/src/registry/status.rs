//! A `CdiProvider`'s status as a pure function of what the registry knows of it.

use cro_api::{
    CONDITION_DEGRADED, CONDITION_READY, CallCounts, CapabilityReport, CdiProviderStatus,
    ProviderDescription, reasons,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// What the registry knows of one provider when it writes its status.
#[derive(Clone, Debug, Default)]
pub(crate) struct Observed {
    pub(crate) generation: Option<i64>,
    /// The component serving now (None: nothing loaded yet).
    pub(crate) serving: Option<Serving>,
    /// Why the newest spec could not be applied: (reason, message).
    pub(crate) failure: Option<(String, String)>,
    pub(crate) calls: CallCounts,
}

/// The component that serves.
#[derive(Clone, Debug, Default)]
pub(crate) struct Serving {
    pub(crate) digest: String,
    pub(crate) contract: String,
    pub(crate) describe: Option<ProviderDescription>,
    pub(crate) capabilities: CapabilityReport,
}

impl Serving {
    pub(crate) fn of(provider: &cro_runtime::Provider, digest: &str) -> Serving {
        let report = provider.capability_report();
        Serving {
            digest: digest.to_owned(),
            contract: provider.contract_version().to_owned(),
            describe: provider.info().map(|i| ProviderDescription {
                name: i.name.clone(),
                vendor: i.vendor.clone(),
                version: i.version.clone(),
            }),
            capabilities: CapabilityReport {
                wanted_not_granted: report.wanted_not_granted,
                granted_unwanted: report.granted_not_wanted,
            },
        }
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status does (Kubernetes' convention).
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status for `observed`; `previous` keeps condition transition times.
pub(crate) fn status(observed: &Observed, previous: &[Condition]) -> CdiProviderStatus {
    let g = observed.generation;
    let ready = match (&observed.serving, &observed.failure) {
        (Some(s), None) => condition(
            CONDITION_READY,
            true,
            reasons::LOADED,
            format!("component {} serves", s.digest),
            g,
            previous,
        ),
        (Some(s), Some((_, _))) => condition(
            CONDITION_READY,
            true,
            reasons::LOADED,
            format!(
                "the previous component {} keeps serving; the newest spec failed (see Degraded)",
                s.digest
            ),
            g,
            previous,
        ),
        (None, Some((reason, message))) => {
            condition(CONDITION_READY, false, reason, message.clone(), g, previous)
        }
        (None, None) => condition(
            CONDITION_READY,
            false,
            reasons::LOADING,
            "the component is being loaded".into(),
            g,
            previous,
        ),
    };
    let degraded = match &observed.failure {
        Some((reason, message)) => condition(
            CONDITION_DEGRADED,
            true,
            reason,
            message.clone(),
            g,
            previous,
        ),
        None => condition(
            CONDITION_DEGRADED,
            false,
            reasons::HEALTHY,
            "the newest spec is applied".into(),
            g,
            previous,
        ),
    };
    let serving = observed.serving.clone();
    CdiProviderStatus {
        observed_generation: g,
        loaded_digest: serving.as_ref().map(|s| s.digest.clone()),
        contract_version: serving.as_ref().map(|s| s.contract.clone()),
        describe: serving.as_ref().and_then(|s| s.describe.clone()),
        capabilities: serving.map(|s| s.capabilities),
        conditions: vec![ready, degraded],
        last_error: observed.failure.as_ref().map(|(_, m)| m.clone()),
        calls: Some(observed.calls.clone()),
        // The pool publisher writes its own part (controllers::pool); a merge patch
        // without it keeps it.
        pool: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving() -> Serving {
        Serving {
            digest: "sha256:aa".into(),
            contract: "0.2.0".into(),
            ..Serving::default()
        }
    }

    fn get<'a>(s: &'a CdiProviderStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_failed_reload_keeps_ready_and_says_degraded() {
        let o = Observed {
            generation: Some(3),
            serving: Some(serving()),
            failure: Some(("LoadFailed".into(), "no describe".into())),
            calls: CallCounts::default(),
        };
        let s = status(&o, &[]);
        assert_eq!(get(&s, CONDITION_READY).status, "True");
        assert_eq!(get(&s, CONDITION_DEGRADED).status, "True");
        assert_eq!(get(&s, CONDITION_DEGRADED).reason, "LoadFailed");
        assert_eq!(s.last_error.as_deref(), Some("no describe"));
        assert_eq!(s.loaded_digest.as_deref(), Some("sha256:aa"));
        assert_eq!(s.observed_generation, Some(3));
    }

    #[test]
    fn a_first_load_failure_is_not_ready() {
        let o = Observed {
            failure: Some(("FetchFailed".into(), "ConfigMap x/y not found".into())),
            ..Observed::default()
        };
        let s = status(&o, &[]);
        assert_eq!(get(&s, CONDITION_READY).status, "False");
        assert_eq!(get(&s, CONDITION_READY).reason, "FetchFailed");
        assert_eq!(s.loaded_digest, None);
        let ok = status(
            &Observed {
                serving: Some(serving()),
                ..Observed::default()
            },
            &s.conditions,
        );
        assert_eq!(get(&ok, CONDITION_READY).status, "True");
        assert_eq!(get(&ok, CONDITION_DEGRADED).reason, "Healthy");
        assert_eq!(ok.last_error, None);
    }
}
