//! `cro provider test`'s suite (host/conformance) on real components: the providers of
//! the repository pass it, the misbehaving testkit fails it with the right reasons, and
//! its JUnit and JSON reports parse and say the same as the text.

use std::path::PathBuf;

use cro_conformance::{FabricKind, FtiApi, Report, Status, SuiteOptions, run_simulated};
use provider_it::{Build, component_file_of};

/// Runs the suite on `component` (against `fabric`, or the one its describe() names)
/// with extra provider config; a short call deadline keeps misbehaving runs quick.
async fn conformance(
    component: PathBuf,
    fabric: Option<FabricKind>,
    config: &[(&str, &str)],
) -> Report {
    conformance_on(component, fabric, None, config).await
}

/// [`conformance`] on a chosen FTI API (`None`: the one the suite picks).
async fn conformance_on(
    component: PathBuf,
    fabric: Option<FabricKind>,
    fti_api: Option<FtiApi>,
    config: &[(&str, &str)],
) -> Report {
    let mut opts = SuiteOptions::new(component);
    opts.fabric = fabric;
    opts.fti_api = fti_api;
    opts.call_timeout_ms = 5_000;
    opts.deadline_ms = 1_500;
    for (k, v) in config {
        opts.config.insert(k.to_string(), v.to_string());
    }
    match run_simulated(&opts).await {
        Ok(r) => r,
        Err(e) => panic!("the suite could not run: {e}"),
    }
}

/// The report passes, with every check's line shown when it does not.
fn assert_passes(report: &Report) {
    assert!(report.passed(), "{}", report.text(true));
}

/// The check `name` failed and says `why`.
fn assert_fails(report: &Report, name: &str, why: &str) {
    let check = report
        .check(name)
        .unwrap_or_else(|| panic!("no check {name}:\n{}", report.text(false)));
    assert_eq!(check.status, Status::Fail, "{}", report.text(true));
    assert!(
        check.why.contains(why),
        "check {name} failed for another reason (wanted {why:?}):\n{}",
        report.text(true)
    );
    assert!(!report.passed());
}

/// Every check the suite promises, in order.
const CHECKS: [&str; 22] = [
    "describe",
    "attach",
    "check",
    "check-warning",
    "get-resources",
    "pool",
    "pool-follows-fabric",
    "in-progress",
    "lost-reply-retry",
    "detach",
    "detach-twice",
    "fault-5xx-check",
    "fault-malformed-check",
    "fault-lost-check",
    "fault-5xx-pool",
    "fault-5xx-attach",
    "fault-malformed-attach",
    "fault-lost-attach",
    "deadline",
    "denied",
    "declared-capabilities",
    "resources",
];

/// The FTI provider supports both FTI APIs and passes the suite on each. The Cluster
/// Manager is the default for it (it declares `cluster_id`); the Fabric Manager run is
/// asked for, as `cro provider test --fti-api fm` does. On the Fabric Manager only
/// `in-progress` is skipped: that API attaches synchronously.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fti_provider_passes() {
    let component = component_file_of(Build::Current);
    for (api, fabric, synchronous) in [
        (None, "fti (Cluster Manager API)", false),
        (Some(FtiApi::Fm), "fti (Fabric Manager API)", true),
    ] {
        let report = conformance_on(component.clone(), None, api, &[]).await;
        assert_passes(&report);
        assert_eq!(report.fabric, fabric);
        assert_eq!(report.contract, "0.3.0");
        // The suite ran what it promises, not a subset.
        for name in CHECKS {
            let want = if synchronous && name == "in-progress" {
                Status::Skip
            } else {
                Status::Pass
            };
            assert_eq!(
                report.check(name).map(|c| c.status),
                Some(want),
                "{fabric} {name}:\n{}",
                report.text(true)
            );
        }
        let lost = report.check("lost-reply-retry").expect("lost-reply-retry");
        assert!(
            lost.why.contains("the retry found device"),
            "{fabric}: {}",
            lost.why
        );
    }
}

/// The contract 0.1.0 build of FTI (providers/test-components/fti-v0-1-0) on the Fabric Manager: its host
/// passes no attempt key or claims, so its retried attach after a lost reply attaches
/// a second device (so does its retry after a malformed attach reply, which the fabric
/// acted on). The suite says so as a skip naming the contract (a 0.2.0 provider doing
/// the same fails: `for_contract` in host/conformance); everything else passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fti_0_1_0_build_is_told_why_lost_reply_retry_does_not_apply() {
    let component = component_file_of(Build::V0_1);
    let report = conformance_on(component, Some(FabricKind::Fti), Some(FtiApi::Fm), &[]).await;
    assert_passes(&report);
    assert_eq!(report.contract, "0.1.0");
    for (name, what) in [
        ("lost-reply-retry", "attached a second device"),
        // The fabric attached before its reply broke: a lost reply too.
        ("fault-malformed-attach", "the retry left"),
    ] {
        let check = report.check(name).expect(name);
        assert_eq!(check.status, Status::Skip, "{}", report.text(true));
        assert!(
            check.why.contains("contract 0.1.0") && check.why.contains(what),
            "{name}: {}",
            check.why
        );
    }
    for (name, status) in [
        ("attach", Status::Pass),
        ("detach", Status::Pass),
        ("describe", Status::Skip),
        ("declared-capabilities", Status::Skip),
    ] {
        assert_eq!(
            report.check(name).map(|c| c.status),
            Some(status),
            "{name}:\n{}",
            report.text(true)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redfish_provider_passes() {
    let report = conformance(
        cro_test_support::component("cro-provider-redfish"),
        None,
        &[],
    )
    .await;
    assert_passes(&report);
    assert_eq!(report.fabric, "redfish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_provider_passes() {
    let component = provider_it::python::python_component();
    let report = conformance(component, None, &[]).await;
    assert_passes(&report);
    assert_eq!(report.fabric, "fti (Fabric Manager API)");
}

/// Each misbehaving mode of the testkit fails `attach` with its own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_components_fail_with_their_reason() {
    let testkit = cro_test_support::component("cro-testkit");
    for (mode, why) in [
        ("trap", "provider trapped"),
        ("exit", "the provider called exit("),
        ("membomb", "memory limit"),
        ("fake", "but the fabric holds no device"),
    ] {
        let report = conformance(testkit.clone(), Some(FabricKind::Fti), &[("mode", mode)]).await;
        assert_fails(&report, "attach", why);
        assert_eq!(report.contract, "0.1.0");
        assert_eq!(
            report.check("describe").map(|c| c.status),
            Some(Status::Skip)
        );
        if mode == "membomb" {
            assert_fails(&report, "resources", "memory limit");
        }
    }
    // A provider that spins runs into its deadline on every call.
    let report = conformance(testkit, Some(FabricKind::Fti), &[("mode", "loop")]).await;
    assert_fails(&report, "attach", "exceeded its deadline");
    assert_fails(&report, "fault-5xx-attach", "exceeded its deadline");
    assert_fails(&report, "denied", "exceeded its deadline");
}

/// The JUnit and JSON reports parse and agree with the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junit_and_json_reports_parse_and_agree() {
    let testkit = cro_test_support::component("cro-testkit");
    let report = conformance(testkit, Some(FabricKind::Fti), &[("mode", "trap")]).await;
    let summary = report.summary();
    assert!(
        summary.failed > 0 && summary.skipped > 0,
        "{}",
        report.text(false)
    );

    let json: serde_json::Value = serde_json::from_str(&report.json()).expect("JSON report");
    assert_eq!(json["passed"], false);
    assert_eq!(json["summary"]["failed"], summary.failed);
    assert_eq!(json["summary"]["passed"], summary.passed);
    let checks = json["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), report.checks.len());
    let attach = checks
        .iter()
        .find(|c| c["name"] == "attach")
        .expect("attach");
    assert_eq!(attach["status"], "fail");
    assert!(attach["why"].as_str().unwrap().contains("provider trapped"));
    let call = &attach["calls"][0];
    assert_eq!(call["operation"], "add-resource");
    assert!(call["peak_memory_bytes"].as_u64().unwrap() > 0, "{call}");

    let xml = report.junit();
    let doc = roxmltree::Document::parse(&xml).expect("JUnit XML");
    let suite = doc
        .descendants()
        .find(|n| n.has_tag_name("testsuite"))
        .expect("testsuite");
    assert_eq!(
        suite.attribute("tests"),
        Some(report.checks.len().to_string().as_str())
    );
    assert_eq!(
        suite.attribute("failures"),
        Some(summary.failed.to_string().as_str())
    );
    assert_eq!(
        suite.attribute("skipped"),
        Some(summary.skipped.to_string().as_str())
    );
    let cases: Vec<_> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(cases.len(), report.checks.len());
    let attach = cases
        .iter()
        .find(|c| c.attribute("name") == Some("attach"))
        .expect("attach case");
    let failure = attach
        .children()
        .find(|n| n.has_tag_name("failure"))
        .expect("a failure element");
    assert!(
        failure
            .attribute("message")
            .unwrap()
            .contains("provider trapped")
    );
    let skipped = cases
        .iter()
        .filter(|c| c.children().any(|n| n.has_tag_name("skipped")))
        .count();
    assert_eq!(skipped, summary.skipped);

    // A passing report has no failure elements.
    let fti = conformance(component_file_of(Build::Current), None, &[]).await;
    let doc_text = fti.junit();
    let doc = roxmltree::Document::parse(&doc_text).expect("JUnit XML");
    assert!(
        !doc.descendants().any(|n| n.has_tag_name("failure")),
        "{doc_text}"
    );
    // The trace of the attach shows the capability calls with their status.
    let attach = fti.check("attach").expect("attach");
    let uses = &attach.calls[0].uses;
    assert!(
        uses.iter()
            .any(|u| u.decision == "allowed" && u.status.is_some()),
        "{uses:?}"
    );
}

/// Against a "lab" fabric (here the simulator, driven only through the provider): the
/// non-destructive checks pass and the destructive ones are skipped; with attaching
/// allowed, a device is attached, checked and detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_fabric_gets_only_non_destructive_checks_unless_allowed() {
    use cro_conformance::fabric::Fabric as _;
    use cro_conformance::fti::{FtiApi, FtiFabric};

    let lab = FtiFabric::start(FtiApi::Fm).unwrap();
    lab.add_node("lab-0");
    let model = lab.add_free_devices(cro_runtime::DeviceType::Gpu, None, 2);
    let component = component_file_of(Build::Current);
    let spec = serde_json::json!({
        "name": "lab",
        "component": component,
        "config": lab.config(),
        "grants": lab.grants(),
    });
    let spec =
        cro_runtime::ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")).unwrap();
    let mut target = cro_conformance::LabTarget {
        spec,
        cluster: lab.cluster().clone(),
        endpoint: lab.sim().endpoint(),
        attach: None,
    };
    let opts = SuiteOptions::new(component);
    let report = cro_conformance::run_lab(&opts, &target).await.unwrap();
    assert_passes(&report);
    assert!(
        report.fabric.starts_with("lab https://127.0.0.1:"),
        "{}",
        report.fabric
    );
    for name in ["attach", "check", "detach", "detach-twice"] {
        assert_eq!(
            report.check(name).map(|c| c.status),
            Some(Status::Skip),
            "{name}"
        );
    }
    for name in [
        "get-resources",
        "denied",
        "declared-capabilities",
        "resources",
    ] {
        assert_eq!(
            report.check(name).map(|c| c.status),
            Some(Status::Pass),
            "{name}"
        );
    }
    assert!(
        lab.sim()
            .machine_devices(&lab.sim().machines()[0].uuid)
            .is_empty()
    );

    target.attach = Some(cro_conformance::suite_lab_attach(
        "lab-0",
        cro_runtime::DeviceType::Gpu,
        model,
    ));
    let report = cro_conformance::run_lab(&opts, &target).await.unwrap();
    assert_passes(&report);
    for name in ["attach", "check", "detach", "detach-twice"] {
        assert_eq!(
            report.check(name).map(|c| c.status),
            Some(Status::Pass),
            "{name}"
        );
    }
}

/// The Redfish driver follows the Redfish provider's conventions (docs/redfish-api.md):
/// a system per node named by `redfish://<system>`, the session credentials in the
/// granted Secret, the endpoint's origin granted; until that provider is merged this
/// checks the driver's side alone.
#[test]
fn the_redfish_driver_sets_up_what_the_redfish_provider_expects() {
    use cro_conformance::fabric::Fabric as _;
    use cro_conformance::redfish::RedfishFabric;
    use cro_runtime::cluster::ClusterReader as _;

    let fabric = RedfishFabric::start().unwrap();
    let system = fabric.add_node("worker-0");
    assert!(fabric.sim().system(&system).is_some());
    let model = fabric.add_free_devices(cro_runtime::DeviceType::Gpu, None, 2);
    assert_eq!(model, cro_conformance::redfish::DEFAULT_GPU_MODEL);
    assert!(fabric.attached(&system).is_empty());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let node = rt
        .block_on(fabric.cluster().get_object("v1", "Node", None, "worker-0"))
        .unwrap();
    assert_eq!(node["spec"]["providerID"], format!("redfish://{system}"));
    let grants = fabric.grants();
    let secret = rt
        .block_on(fabric.cluster().get_secret(
            grants["secret"]["namespace"].as_str().unwrap(),
            grants["secret"]["name"].as_str().unwrap(),
        ))
        .unwrap();
    let (user, password) = fabric.sim().credentials();
    assert_eq!(secret["username"], user.into_bytes());
    assert_eq!(secret["password"], password.into_bytes());
    let config = fabric.config();
    assert_eq!(config["endpoint"], fabric.sim().endpoint());
    let spec = serde_json::json!({
        "name": "redfish", "component": "x.wasm", "config": config, "grants": grants,
    });
    let spec =
        cro_runtime::ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")).unwrap();
    let url: url::Url = format!("{}/redfish/v1/Systems", fabric.sim().endpoint())
        .parse()
        .unwrap();
    assert!(spec.grants.http_grant_for(&url).is_some());
    assert!(fabric.set_warning("no-such-block", true).is_err());
}
