//! `cro provider new` as a vendor of any fabric uses it: each template generated, built
//! with its own toolchain and certified by `cro provider test` (the REST ones against
//! the reference simulator they ship with, over the control protocol); a build of the
//! REST template with three deliberate bugs failed on each, with the reason; and cro's
//! own simulators driven through the same protocol.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cro_conformance::FabricKind;
use cro_conformance::control::{ControlServer, serve};
use cro_conformance::fti::FtiApi;

use super::{cro_str, run_bounded};

/// A simulator that says where its control protocol is on its first line of output
/// (the reference simulator, `cro provider sim`), running; killed when dropped, however
/// the test ends.
struct Announced {
    child: Child,
    url: String,
}

impl Announced {
    fn start(cmd: &mut Command) -> Announced {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let mut sim = Announced {
            child,
            url: String::new(),
        };
        read.unwrap();
        sim.url = line
            .trim()
            .strip_prefix("control protocol at ")
            .unwrap_or_else(|| panic!("the simulator's first line: {line:?}"))
            .to_string();
        sim
    }

    /// The reference simulator a REST scaffold ships with.
    fn reference(scaffold: &Path) -> Announced {
        Announced::start(
            Command::new("python3")
                .arg("fabric_sim.py")
                .args(["--port", "0"])
                .current_dir(scaffold),
        )
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cro provider new NAME ARGS` in `work`; the scaffold's directory.
fn scaffold(work: &Path, name: &str, args: &[&str]) -> PathBuf {
    let dir = work.join(name);
    let mut all = vec!["provider", "new", name, "--vendor", "Acme", "--dir"];
    all.push(dir.to_str().unwrap());
    all.extend(args);
    let (ok, stdout, stderr) = cro_str(&all);
    assert!(ok, "{stdout}{stderr}");
    dir
}

/// Runs `cmd` to completion within 15 minutes; panics with its output on failure.
fn run(cmd: &mut Command, what: &str) {
    let (status, stdout, stderr) = run_bounded(cmd, Duration::from_secs(900));
    let status = status.unwrap_or_else(|| panic!("{what}: not done in 15 minutes"));
    assert!(status.success(), "{what} failed:\n{stdout}\n{stderr}");
}

/// Builds a Rust scaffold as its README says, offline, into `target` (a directory of
/// the test's own: cargo keys a path package's build by its path relative to its
/// workspace, so a scaffold of the same name built from another directory earlier
/// would count as fresh in a shared one); the component's path.
fn build_rust(dir: &Path, name: &str, target: &Path) -> PathBuf {
    // Puts the SDK's wasm dependencies into cargo's cache first.
    cro_test_support::component("fti-provider");
    run(
        Command::new("cargo")
            .args([
                "build",
                "--target",
                "wasm32-wasip2",
                "--profile",
                "component",
            ])
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", target)
            .env("CARGO_NET_OFFLINE", "true"),
        &format!("building {name}"),
    );
    target.join(format!(
        "wasm32-wasip2/component/{}.wasm",
        name.replace('-', "_")
    ))
}

/// The path `scripts/setup.sh` gives a tool after installing it (a no-op when there).
fn setup_tool(install: &str, var: &str) -> PathBuf {
    let root = cro_test_support::workspace_root();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source scripts/setup.sh && {install} && echo \"${var}\""
        ))
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{install}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(path.lines().last().unwrap_or_default().trim())
}

/// `cro provider test COMPONENT ARGS`: (passed, stdout).
fn certify(component: &Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["provider", "test", component.to_str().unwrap()];
    all.extend(args);
    let (ok, stdout, stderr) = cro_str(&all);
    assert!(
        stdout.contains("conformance of "),
        "the suite did not run: {stdout}{stderr}"
    );
    (ok, stdout)
}

fn assert_certified(passed: bool, report: &str, what: &str) {
    assert!(passed, "{what}:\n{report}");
    assert!(report.contains("PASSED: "), "{what}:\n{report}");
    assert!(report.contains(" 0 failed"), "{what}:\n{report}");
    for check in [
        "lost-reply-retry",
        "check-warning",
        "fault-5xx-check",
        "in-progress",
    ] {
        assert!(
            report.contains(&format!("PASS {check}")),
            "{what}: {check}\n{report}"
        );
    }
}

/// Replaces `from` (which must be there) with `to` in a generated file.
fn patch(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(
        text.contains(from),
        "{} no longer holds {from:?}: update the bug",
        file.display()
    );
    std::fs::write(file, text.replace(from, to)).unwrap();
}

/// The line of `check` in a report.
fn line<'a>(report: &'a str, check: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no line for {check}:\n{report}"))
}

#[test]
fn the_rest_template_certifies_and_a_build_with_three_bugs_fails_on_each() {
    let work = tempfile::tempdir().unwrap();
    let good = scaffold(work.path(), "acme-rest", &[]);
    let target = work.path().join("target");
    let wasm = build_rust(&good, "acme-rest", &target);
    let sim = Announced::reference(&good);
    let (passed, report) = certify(&wasm, &["--fabric-sim", &sim.url]);
    assert_certified(passed, &report, "the REST template as generated");
    assert_pool_read(&report, "the REST template as generated");
    assert!(
        report.contains("against restfabric (simulator at "),
        "{report}"
    );

    // The same template with three bugs a vendor could write.
    let buggy = scaffold(work.path(), "acme-buggy", &[]);
    let lib = buggy.join("src/lib.rs");
    // 1. The attempt key is not sent: a retried attach attaches a second device.
    patch(
        &lib,
        "Some(&body), Some(&req.attempt_key))",
        "Some(&body), None)",
    );
    // 2. A 5xx reply is reported as the untyped `other`.
    patch(
        &lib,
        "send(self.host, \"fabric\", method, &url, &headers, body, None)",
        "send(self.host, \"fabric\", method, &url, &headers, body, None).and_then(|r| if r.status >= 500 { Err(ProviderError::Other(format!(\"HTTP {}\", r.status))) } else { Ok(r) })",
    );
    // 3. The device's health is ignored.
    patch(
        &lib,
        "        health(&device)\n",
        "        let _ = health;\n        let _ = device;\n        Ok(())\n",
    );
    // And a read that writes: listing "tidies up" with a detach (of nothing).
    patch(
        &lib,
        "        let api = Api::new(&self.host)?;\n        let mut all = Vec::new();\n",
        "        let api = Api::new(&self.host)?;\n        let _ = api.send(Method::Delete, \"machines/none/devices/none\", None, None);\n        let mut all = Vec::new();\n",
    );
    // And a pool cached for good: the first read's counts, whatever the fabric does.
    patch(
        &lib,
        "        let reply = api.send(Method::Get, \"free\", None, None)?;\n        let listed: Free = expect_json(&reply, \"free devices\")?;\n",
        "        let listed: Free = match self.host.state_get(\"free\") {\n            Some(b) => serde_json::from_slice(&b).map_err(|e| ProviderError::malformed(e.to_string()))?,\n            None => {\n                let reply = api.send(Method::Get, \"free\", None, None)?;\n                self.host.state_set(\"free\", &reply.body, None);\n                expect_json(&reply, \"free devices\")?\n            }\n        };\n",
    );
    let wasm = build_rust(&buggy, "acme-buggy", &target);
    let (passed, report) = certify(&wasm, &["--fabric-sim", &sim.url]);
    assert!(!passed, "the buggy build passed:\n{report}");
    let retry = line(&report, "lost-reply-retry");
    assert!(
        retry.starts_with("FAIL") && retry.contains("attached a second device"),
        "{report}"
    );
    let busy = line(&report, "fault-5xx-check");
    assert!(
        busy.starts_with("FAIL") && busy.contains("untyped `other`"),
        "{report}"
    );
    let health = line(&report, "check-warning");
    assert!(
        health.starts_with("FAIL") && health.contains("reported healthy"),
        "{report}"
    );
    let listed = line(&report, "get-resources");
    assert!(
        listed.starts_with("FAIL") && listed.contains("that attach or detach"),
        "{report}"
    );
    let follows = line(&report, "pool-follows-fabric");
    assert!(
        follows.starts_with("FAIL") && follows.contains("where the fabric holds"),
        "{report}"
    );
    // What works in the buggy build still passes.
    assert!(line(&report, "attach").starts_with("PASS"), "{report}");
    assert!(line(&report, "pool").starts_with("PASS"), "{report}");
}

#[test]
fn the_fti_python_and_javascript_templates_certify_as_generated() {
    let work = tempfile::tempdir().unwrap();

    // Rust, FTI: against the built-in FTI simulator.
    let fti = scaffold(work.path(), "acme-fti", &["--template", "fti"]);
    let wasm = build_rust(&fti, "acme-fti", &work.path().join("target"));
    let (passed, report) = certify(&wasm, &[]);
    assert!(passed && report.contains(" 0 failed"), "{report}");

    // Python: componentize-py as the README says, against its reference simulator.
    let py = scaffold(work.path(), "acme-py", &["--lang", "python"]);
    let componentize_py = setup_tool("ensure_componentize_py", "COMPONENTIZE_PY");
    run(
        Command::new(&componentize_py)
            .args(["-d", "wit", "-w", "provider-world", "componentize", "app"])
            .args(["-o", "acme_py.wasm"])
            .current_dir(&py),
        "componentize-py",
    );
    let sim = Announced::reference(&py);
    let (passed, report) = certify(&py.join("acme_py.wasm"), &["--fabric-sim", &sim.url]);
    assert_certified(passed, &report, "the Python template");
    assert_pool_read(&report, "the Python template");
    drop(sim);

    // JavaScript: `node build.mjs` with componentize-js (setup's install stands in for
    // `npm install`, which would fetch the same pinned package).
    let js = scaffold(work.path(), "acme-js", &["--lang", "javascript"]);
    let modules = setup_tool("ensure_componentize_js", "COMPONENTIZE_JS_MODULES");
    std::os::unix::fs::symlink(&modules, js.join("node_modules")).unwrap();
    run(
        Command::new("node").arg("build.mjs").current_dir(&js),
        "node build.mjs",
    );
    let sim = Announced::reference(&js);
    let (passed, report) = certify(&js.join("acme_js.wasm"), &["--fabric-sim", &sim.url]);
    assert_certified(passed, &report, "the JavaScript template");
    assert_pool_read(&report, "the JavaScript template");
}

/// The template reads its fabric's pool (contract 0.3.0): the pool checks ran and
/// passed on a count, not skipped or passed on `not-supported`.
fn assert_pool_read(report: &str, what: &str) {
    for check in ["pool", "pool-follows-fabric", "fault-5xx-pool"] {
        assert!(line(report, check).starts_with("PASS"), "{what}: {report}");
    }
    assert!(
        line(report, "pool").contains("as the fabric holds"),
        "{what}: {report}"
    );
}

#[test]
fn cro_simulators_speak_the_control_protocol() {
    // FTI (Cluster Manager: asynchronous) and NEC (jobs that fail) through the
    // protocol get the same checks as through the built-in path.
    let cases = [
        (FabricKind::Fti, FtiApi::Cm, "fti-provider", 0),
        (FabricKind::Nec, FtiApi::Fm, "nec-provider", 2),
    ];
    for (kind, api, package, jobs) in cases {
        let server = ControlServer::start(serve::factory(kind, api), 0).unwrap();
        let wasm = cro_test_support::component(package);
        let mut args = vec!["--fabric-sim", ""];
        let url = server.url();
        args[1] = &url;
        if kind == FabricKind::Fti {
            args.extend(["--config", "api_type=CM"]);
        }
        let (passed, report) = certify(&wasm, &args);
        assert!(passed && report.contains(" 0 failed"), "{report}");
        assert!(report.contains("PASS in-progress"), "{report}");
        let job_checks = report
            .lines()
            .filter(|l| l.starts_with("PASS failed-job") || l.starts_with("PASS rolled-back-job"))
            .count();
        assert_eq!(job_checks, jobs, "{report}");
    }

    // Redfish through `cro provider sim`, as a vendor runs it.
    let sim = Announced::start(
        Command::new(env!("CARGO_BIN_EXE_cro")).args(["provider", "sim", "--fabric", "redfish"]),
    );
    let redfish = cro_test_support::component("cro-provider-redfish");
    let (passed, report) = certify(&redfish, &["--fabric-sim", &sim.url]);
    drop(sim);
    assert!(passed && report.contains(" 0 failed"), "{report}");
    assert!(
        report.contains("against redfish (simulator at "),
        "{report}"
    );

    // Nothing listening: a clear error, not a report.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", free.local_addr().unwrap());
    drop(free);
    let fti = cro_test_support::component("fti-provider");
    let (ok, stdout, stderr) = cro_str(&[
        "provider",
        "test",
        fti.to_str().unwrap(),
        "--fabric-sim",
        &url,
    ]);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("cannot start the simulator") && stderr.contains("reset"),
        "{stderr}"
    );
}
