//! `cro provider inspect` on real files.

mod compile_bounds;
mod templates;

use std::process::{Command, Output};

fn cro(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cro"))
        .args(args)
        .output()
        .unwrap()
}

fn inspect(file: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["provider".as_ref(), "inspect".as_ref()];
    args.push(file.as_os_str());
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let out = cro(&args);
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn inspects_a_real_provider() {
    let testkit = cro_test_support::component("cro-testkit");
    let (ok, stdout, stderr) = inspect(&testkit, &[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("world:     cro:provider/provider-world@0.1.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("contract:  cro:provider@0.1.0 (supported)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "cro:provider/provider@0.1.0: add-resource, remove-resource, check-resource, get-resources"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("cro:provider/http@0.1.0: send"), "{stdout}");
    assert!(
        stdout.contains("cro:provider/secrets@0.1.0: get"),
        "{stdout}"
    );
    assert!(stdout.contains("\n  wasi:cli/environment@0.2."), "{stdout}");
    assert!(!stdout.contains("not provided"), "{stdout}");
    let (_, verbose, _) = inspect(&testkit, &["--verbose"]);
    assert!(
        verbose
            .lines()
            .any(|l| l.contains("wasi:cli/environment@0.2.")
                && l.ends_with(": get-environment, get-arguments")),
        "{verbose}"
    );

    let (ok, json, _) = inspect(&testkit, &["--json"]);
    assert!(ok);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["contract_version"], "0.1.0");
    assert_eq!(value["exports"][0]["name"], "cro:provider/provider@0.1.0");
    assert_eq!(value["capability_report"]["declared"], false);
    assert!(
        stdout.contains("capabilities: not declared"),
        "a 0.1.0 component has no describe: {stdout}"
    );
}

#[test]
fn prints_the_capability_report_of_the_fti_component() {
    let fti = cro_test_support::component("fti-provider");
    // Nothing granted: everything FTI wants is missing.
    let (ok, stdout, stderr) = inspect(&fti, &[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("contract:  cro:provider@0.3.0 (supported)"),
        "{stdout}"
    );
    assert!(stdout.contains("provider:  fti "), "{stdout}");
    assert!(stdout.contains("endpoint (required)"), "{stdout}");
    assert!(
        stdout.contains(
            "wanted but not granted: http ${endpoint}: configuration key `endpoint` is not set, \
             secret key username"
        ),
        "{stdout}"
    );

    // A spec granting a little too much and too little.
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("fti.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: fti\ncomponent: {}\nconfig: {{api_type: CM, endpoint: \"fabric.example:8443/\", tenant_id: t, cluster_id: c1, tennant: typo}}\n\
             grants:\n  http: [{{url: \"https://fabric.example:8443\"}}, {{url: \"https://elsewhere.example\"}}]\n\
             \x20 secret: {{namespace: cro-system, name: credentials, keys: [username, password, client_id, client_secret, realm]}}\n\
             \x20 lookup: [{{api_version: v1, kind: Node}}]\n",
            fti.display()
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = inspect(&fti, &["--spec", spec.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(
            "wanted but not granted: lookup machine.openshift.io/v1beta1 Machine, \
             lookup metal3.io/v1alpha1 BareMetalHost, clocks"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("granted but never wanted: http https://elsewhere.example:443"),
        "{stdout}"
    );
    assert!(
        stdout.contains("config keys not accepted: tennant"),
        "{stdout}"
    );

    let (_, json, _) = inspect(&fti, &["--json", "--spec", spec.to_str().unwrap()]);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["provider"]["name"], "fti");
    assert_eq!(value["capability_report"]["unknown_config"][0], "tennant");
}

#[test]
fn refuses_what_this_host_cannot_load() {
    let future = cro_test_support::component("future-version-provider");
    let (ok, stdout, stderr) = inspect(&future, &[]);
    assert!(!ok);
    assert!(
        stdout.contains("cro:provider@0.9.0 (NOT supported"),
        "{stdout}"
    );
    assert!(
        stderr.contains("it targets cro:provider@0.9.0; this host supports 0.1.0, 0.2.0, 0.3.0"),
        "{stderr}"
    );

    let other = cro_test_support::example_component("future-version-provider", "other_world");
    let (ok, stdout, stderr) = inspect(&other, &[]);
    assert!(!ok);
    assert!(stdout.contains("world:     unknown"), "{stdout}");
    assert!(stderr.contains("a component of another world"), "{stderr}");

    let extra = cro_test_support::example_component("future-version-provider", "extra_import");
    let (ok, stdout, stderr) = inspect(&extra, &[]);
    assert!(!ok);
    assert!(
        stdout.contains("acme:extra/backdoor@1.0.0  [not provided by this host]"),
        "{stdout}"
    );
    assert!(stderr.contains("acme:extra/backdoor@1.0.0"), "{stderr}");
}

#[test]
fn clear_errors_for_a_core_module_and_a_random_file() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("module.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let (ok, stdout, stderr) = inspect(&module, &[]);
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("module.wasm: this is a core WebAssembly module, not a component"),
        "{stderr}"
    );

    let random = dir.path().join("notes.txt");
    std::fs::write(&random, "just some text").unwrap();
    let (ok, _, stderr) = inspect(&random, &[]);
    assert!(!ok);
    assert!(
        stderr.contains("notes.txt: not a WebAssembly file"),
        "{stderr}"
    );

    let (ok, _, stderr) = inspect(&dir.path().join("missing.wasm"), &[]);
    assert!(!ok);
    assert!(stderr.contains("cannot read"), "{stderr}");
}

#[test]
fn help_reads_well() {
    let out = cro(&["--help".as_ref()]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("sandboxed"), "{help}");
    assert!(help.contains("provider"), "{help}");
    let out = cro(&["provider".as_ref(), "inspect".as_ref(), "--help".as_ref()]);
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("world, contract version, imports and exports"),
        "{help}"
    );
    assert!(help.contains("--json"), "{help}");
    // No subcommand: usage on stderr, non-zero exit.
    let out = cro(&[]);
    assert!(!out.status.success());
}

/// The executable's relative relocations are packed (build.rs) when this machine's glibc
/// loads them, and not otherwise: unpacked they are about 2 MB the loader reads at every
/// start and keeps resident (docs/BENCHMARKS.md, "Packed relocations").
#[test]
fn the_executable_packs_its_relocations_where_glibc_loads_them() {
    // SAFETY: glibc returns a pointer to a static NUL-terminated string.
    let glibc = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let glibc = glibc.to_str().unwrap();
    let mut parts = glibc.split('.').map(|p| p.parse::<u32>().unwrap());
    let loads_relr = (parts.next().unwrap(), parts.next().unwrap()) >= (2, 36);
    let forced = std::env::var("CRO_PACK_RELOCS").ok();
    let expected = match forced.as_deref() {
        Some("0") => false,
        Some("1") => true,
        _ => loads_relr,
    };
    let out = Command::new("readelf")
        .args(["--dynamic", "--wide", env!("CARGO_BIN_EXE_cro")])
        .output()
        .expect("readelf (binutils) reads the executable's dynamic section");
    assert!(out.status.success(), "{out:?}");
    let dynamic = String::from_utf8(out.stdout).unwrap();
    let entry = |tag: &str| {
        dynamic
            .lines()
            .find(|l| l.contains(&format!("({tag})")))
            .map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap())
    };
    assert_eq!(
        entry("RELRSZ").is_some(),
        expected,
        "glibc {glibc}, CRO_PACK_RELOCS {forced:?}:\n{dynamic}"
    );
    if expected {
        // What stays unpacked is the few relocations RELR cannot express.
        let unpacked = entry("RELASZ").unwrap_or(0);
        assert!(
            unpacked < 64 * 1024,
            "{unpacked} bytes of RELA left:\n{dynamic}"
        );
    }
}

/// Runs `cmd` in a process group of its own, reading its output as it comes (a full pipe
/// would stall it), for at most `limit`: then the whole group is killed, a job it left
/// in the background included. (exit status, or None when killed; stdout; stderr.)
fn run_bounded(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String, String) {
    use std::os::unix::process::CommandExt as _;
    let mut child = cmd
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let group = child.id();
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait());
    });
    let status = match exited.recv_timeout(limit) {
        Ok(status) => Some(status.unwrap()),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{group}")])
                .status();
            None
        }
    };
    (
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// Runs `cro` with string arguments; (success, stdout, stderr).
fn cro_str(args: &[&str]) -> (bool, String, String) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let out = cro(&args);
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn provider_call_prints_the_outcome_and_the_capability_trace() {
    let fti = cro_test_support::component("fti-provider");
    let sim = fabric_sim::FabricSim::start(fabric_sim::SimConfig::default()).unwrap();
    let machine = "0b1c2d3e-0000-4000-8000-0000000c0001";
    sim.add_machine(machine, "worker-0");
    sim.add_free_devices("gpu", "A100 40G", 1);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, sim.ca_pem()).unwrap();
    let creds = sim.credentials();
    let origin = format!("https://{}", sim.https_addr());
    let endpoint = format!("endpoint={}", sim.endpoint());
    let tenant = format!("tenant_id={}", sim.tenant_id());
    let http = format!("http={origin},ca={}", ca.display());
    let node = format!("worker-0=fsas-cdi://{machine}");
    let secrets = [
        format!("username={}", creds.username),
        format!("password={}", creds.password),
        format!("client_id={}", creds.client_id),
        format!("client_secret={}", creds.client_secret),
        "realm=fti".to_string(),
    ];
    let mut args = vec![
        "provider",
        "call",
        fti.to_str().unwrap(),
        "add",
        "--config",
        "api_type=FM",
        "--config",
        &endpoint,
        "--config",
        &tenant,
        "--grant",
        "secret=ns/creds:username,password,client_id,client_secret,realm",
        // No `--grant lookup=v1/Node`: `--node` implies it.
        "--grant",
        "clocks",
        "--node",
        &node,
        "--name",
        "gpu-1",
        "--model",
        "A100 40G",
        "--target-node",
        "worker-0",
    ];
    // The Secret granted but given no value: the command says which flag gives it one.
    let (_, stdout, stderr) = cro_str(&args);
    assert!(
        stderr.contains("grants Secret ns/creds but no --secret gives it a value")
            && stderr.contains("--secret KEY=VALUE")
            && stderr.contains("username, password, client_id, client_secret, realm"),
        "{stdout}{stderr}"
    );
    for s in &secrets {
        args.extend(["--secret", s.as_str()]);
    }
    // Without the HTTP grant: the denial is in the trace and the exit code says error.
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stderr.is_empty() || !stdout.is_empty(), "{stderr}");
    assert!(
        stdout.contains("add-resource: error (denied)"),
        "{stdout}{stderr}"
    );
    assert!(
        stdout.contains(&format!("http POST {origin}/id_manager/realms/fti/protocol/openid-connect/token -> DENIED: no http grant for {origin}")),
        "{stdout}"
    );
    assert!(stdout.contains("secret client_secret -> ok"), "{stdout}");
    assert!(sim.machine_devices(machine).is_empty());

    args.extend(["--grant", http.as_str()]);
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    let serial = &sim.machine_devices(machine)[0].serial;
    assert!(stdout.contains("add-resource: ok"), "{stdout}");
    assert!(stdout.contains(serial.as_str()), "{stdout}");
    assert!(stdout.contains("lookup v1 Node worker-0 -> ok"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "http PATCH {origin}/fabric_manager/api/v1/machines/{machine}/update"
        )),
        "{stdout}"
    );
    assert!(stdout.contains(" -> 200, "), "{stdout}");
    assert!(stdout.contains("cost: "), "{stdout}");

    // The same as JSON, for a check of this device given as a resource file.
    let resource = dir.path().join("gpu.json");
    std::fs::write(
        &resource,
        serde_json::json!({"name": "gpu-1", "device_type": "gpu", "model": "A100 40G",
            "target_node": "worker-0", "device_id": serial})
        .to_string(),
    )
    .unwrap();
    let resource = resource.to_str().unwrap().to_string();
    let at = args.iter().position(|a| *a == "add").unwrap();
    args[at] = "check";
    args.extend(["--resource", resource.as_str()]);

    // With the exchanges shown: headers and bodies, every credential taken out.
    let mut bodies = args.clone();
    bodies.push("--trace-bodies");
    let (ok, stdout, stderr) = cro_str(&bodies);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("    > authorization: <redacted>"),
        "{stdout}"
    );
    let token_request = stdout
        .lines()
        .find(|l| l.contains("grant_type=password"))
        .unwrap_or_else(|| panic!("no token request body in\n{stdout}"));
    for field in ["username", "password", "client_id", "client_secret"] {
        assert!(
            token_request.contains(&format!("{field}=<redacted>")),
            "{token_request}"
        );
    }
    assert!(
        stdout.contains(r#""access_token":"<redacted>""#),
        "{stdout}"
    );
    assert!(stdout.contains("    < "), "{stdout}");
    for secret in [&creds.password, &creds.client_secret, &creds.username] {
        assert!(
            !stdout.contains(secret.as_str()),
            "{secret} shown:\n{stdout}"
        );
    }

    args.push("--json");
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["ok"], "healthy");
    assert_eq!(v["operation"], "check-resource");
    // The capability report rides along: every capability FTI wants is granted here.
    let report = &v["capability_report"];
    assert_eq!(report["declared"], true, "{v}");
    assert_eq!(
        report["wanted_not_granted"],
        serde_json::json!([]),
        "{report}"
    );
    let uses = v["trace"]["uses"].as_array().unwrap();
    assert!(
        uses.iter()
            .any(|u| u["capability"] == "http" && u["status"] == 200),
        "{v}"
    );
}

/// What the provider logged during the call is in the trace, quoted and escaped, in
/// the text and the JSON output.
#[test]
fn provider_call_shows_what_the_provider_logged() {
    let testkit = cro_test_support::component("cro-testkit");
    let testkit = testkit.to_str().unwrap();
    let mut args = vec![
        "provider",
        "call",
        testkit,
        "add",
        "--config",
        "mode=log",
        "--config",
        "message=attaching \u{1b}[31mgpu-1",
        "--name",
        "gpu-1",
        "--model",
        "A100",
    ];
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("provider log (5 lines):"), "{stdout}");
    for level in ["trace", "debug", "info", "warn", "error"] {
        assert!(
            stdout.contains(&format!("  {level} \"attaching \\u{{1b}}[31mgpu-1\"")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");

    args.push("--json");
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let logs = v["trace"]["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 5, "{v}");
    assert_eq!(logs[2]["level"], "info");
}

#[test]
fn provider_test_reports_and_exits_by_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let (junit, json) = (dir.path().join("r.xml"), dir.path().join("r.json"));
    let fti = cro_test_support::component("fti-provider");
    let (ok, stdout, stderr) = cro_str(&[
        "provider",
        "test",
        fti.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("PASS lost-reply-retry"), "{stdout}");
    assert!(stdout.contains("PASSED: 22 passed, 0 failed"), "{stdout}");
    // The Cluster Manager API reports no free devices: the provider says so.
    assert!(
        stdout.contains("PASS pool") && stdout.contains("does not report free devices"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert!(
        std::fs::read_to_string(&junit)
            .unwrap()
            .contains("failures=\"0\"")
    );
    assert!(
        stdout.contains("against fti (Cluster Manager API)"),
        "{stdout}"
    );

    // The FTI provider supports the Fabric Manager API too: certified with a run on it,
    // the lost-reply retry included (only `in-progress` does not apply: synchronous).
    let (ok, stdout, stderr) =
        cro_str(&["provider", "test", fti.to_str().unwrap(), "--fti-api", "fm"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("against fti (Fabric Manager API)"),
        "{stdout}"
    );
    assert!(stdout.contains("PASS lost-reply-retry"), "{stdout}");
    assert!(stdout.contains("PASS pool-follows-fabric"), "{stdout}");
    assert!(
        stdout.contains("PASSED: 21 passed, 0 failed, 1 skipped"),
        "{stdout}"
    );
    let (ok, _, stderr) = cro_str(&["provider", "test", fti.to_str().unwrap(), "--fti-api", "xm"]);
    assert!(!ok);
    assert!(stderr.contains("--fti-api must be fm or cm"), "{stderr}");

    // A provider that traps fails, with the reason on its line and a failing exit code.
    let testkit = cro_test_support::component("cro-testkit");
    let (ok, stdout, _) = cro_str(&[
        "provider",
        "test",
        testkit.to_str().unwrap(),
        "--fabric",
        "fti",
        "--config",
        "mode=trap",
    ]);
    assert!(!ok, "{stdout}");
    assert!(stdout.contains("FAIL attach"), "{stdout}");
    assert!(
        stdout.contains("provider trapped") && stdout.contains("testkit trap"),
        "{stdout}"
    );
    // 0.1.0 without --fabric: refused with what to do.
    let (ok, _, stderr) = cro_str(&["provider", "test", testkit.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("--fabric-sim URL for a simulator of its own fabric"),
        "{stderr}"
    );
}

/// The NEC CDIM component is certified against the CDIM simulator: every check of the
/// suite, lost replies included, and the two checks of a fabric whose attaches are jobs
/// (a failed and a rolled-back layout apply), which only such a fabric runs.
#[test]
fn provider_test_certifies_the_nec_component_against_the_cdim_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("nec.json");
    let nec = cro_test_support::component("nec-provider");
    let (ok, stdout, stderr) = cro_str(&[
        "provider",
        "test",
        nec.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains(" against nec"), "{stdout}");
    for check in [
        "lost-reply-retry",
        "fault-lost-attach",
        "failed-job",
        "rolled-back-job",
        "in-progress",
    ] {
        assert!(
            stdout.contains(&format!("PASS {check} ")),
            "{check}: {stdout}"
        );
    }
    assert!(
        stdout.contains("PASSED: 24 passed, 0 failed, 0 skipped"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    // The fabric can be named too; FTI's API option is refused for it.
    let (ok, _, stderr) = cro_str(&[
        "provider",
        "test",
        nec.to_str().unwrap(),
        "--fabric",
        "nec",
        "--fti-api",
        "fm",
    ]);
    assert!(!ok);
    assert!(stderr.contains("FTI only"), "{stderr}");
}

/// The shell commands of the marked block of docs/vendors.md.
fn guide_commands() -> Vec<String> {
    let root = cro_test_support::workspace_root();
    let guide = std::fs::read_to_string(root.join("docs/vendors.md")).unwrap();
    let begin = guide
        .find("<!-- vendor-guide:begin -->")
        .expect("docs/vendors.md has no vendor-guide:begin marker");
    let end = guide
        .find("<!-- vendor-guide:end -->")
        .expect("docs/vendors.md has no vendor-guide:end marker");
    let block = &guide[begin..end];
    let body = block
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the marked block holds a ```sh block");
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Follows docs/vendors.md literally: scaffold, unit tests, build, conformance report.
/// Builds resolve offline from the local registry cache.
#[test]
fn the_vendor_guide_runs_as_written() {
    let commands = guide_commands();
    assert!(
        commands.iter().any(|c| c.starts_with("cro provider new"))
            && commands.iter().any(|c| c.starts_with("cro provider test")),
        "{commands:?}"
    );
    // The scaffold resolves its dependencies offline: building a workspace component
    // first puts the SDK's wasm dependencies (wit-bindgen and the rest) into the cache.
    cro_test_support::component("fti-provider");
    let work = tempfile::tempdir().unwrap();
    let cro_dir = std::path::Path::new(env!("CARGO_BIN_EXE_cro"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(cro_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    // One shell runs them all (the guide's `cd` carries over), stopping at the first
    // failure, with each command echoed so a failure shows where it happened; a
    // simulator the guide started in the background is stopped however the shell ends
    // (it would hold the output pipes open).
    let script = format!(
        "set -euxo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{}\n",
        commands.join("\n")
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(work.path())
        .env("PATH", path)
        // A target of its own: cargo keys a path package's build by its path relative
        // to its workspace, so an `acme-gpu` built from another directory (an earlier
        // run, another template) would count as fresh in a shared one.
        .env("CARGO_TARGET_DIR", work.path().join("target"))
        .env("CARGO_NET_OFFLINE", "true");
    let (status, stdout, stderr) = run_bounded(&mut cmd, std::time::Duration::from_secs(900));
    let status = status.unwrap_or_else(|| {
        panic!("the guide's commands did not finish within 15 minutes\n{stdout}\n{stderr}")
    });
    assert!(
        status.success(),
        "a command of the guide failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("PASSED: "), "{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    assert!(stdout.contains("PASS lost-reply-retry"), "{stdout}");
    let report = work.path().join("acme-gpu/report.json");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["provider"], "acme-gpu 0.1.0 by Acme");
    assert!(work.path().join("acme-gpu/report.xml").is_file());
}

#[test]
fn provider_test_against_a_lab_endpoint_is_non_destructive_unless_allowed() {
    let sim = fabric_sim::FabricSim::start(fabric_sim::SimConfig::default()).unwrap();
    let machine = "0b1c2d3e-0000-4000-8000-0000000c0002";
    sim.add_machine(machine, "lab-0");
    sim.add_free_devices("gpu", "A100 40G", 1);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, sim.ca_pem()).unwrap();
    // What the provider looks up, as a file of objects.
    let objects = dir.path().join("objects.yaml");
    std::fs::write(
        &objects,
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: lab-0}}\nspec: {{providerID: 'fsas-cdi://{machine}'}}\n"
        ),
    )
    .unwrap();
    let creds = sim.credentials();
    let fti = cro_test_support::component("fti-provider");
    let (endpoint, tenant) = (sim.endpoint(), format!("tenant_id={}", sim.tenant_id()));
    let http = format!("http=https://{},ca={}", sim.https_addr(), ca.display());
    let secrets = [
        format!("username={}", creds.username),
        format!("password={}", creds.password),
        format!("client_id={}", creds.client_id),
        format!("client_secret={}", creds.client_secret),
        "realm=fti".to_string(),
    ];
    let mut args = vec![
        "provider",
        "test",
        fti.to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--config",
        "api_type=FM",
        "--config",
        &tenant,
        "--grant",
        &http,
        "--grant",
        "secret=ns/creds:username,password,client_id,client_secret,realm",
        "--grant",
        "lookup=v1/Node",
        "--grant",
        "clocks",
        "--objects",
        objects.to_str().unwrap(),
    ];
    for s in &secrets {
        args.extend(["--secret", s.as_str()]);
    }
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("SKIP attach"), "{stdout}");
    // The skip names the flags that allow it.
    assert!(
        stdout.contains("pass --allow-attach and --target-node"),
        "{stdout}"
    );
    assert!(stdout.contains("PASS get-resources"), "{stdout}");
    assert!(sim.machine_devices(machine).is_empty(), "nothing attached");

    args.extend([
        "--allow-attach",
        "--target-node",
        "lab-0",
        "--model",
        "A100 40G",
    ]);
    let (ok, stdout, stderr) = cro_str(&args);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("PASS attach"), "{stdout}");
    // The fabric's word, not the provider's: listed where attached, the same attempt
    // asked again adds nothing, gone once detached.
    for check in ["listed-after-attach", "retried-attach", "gone-after-detach"] {
        assert!(stdout.contains(&format!("PASS {check}")), "{stdout}");
    }
    assert_eq!(
        sim.requests_to(fabric_sim::Route::FmAttach).len(),
        1,
        "the retried attach attached nothing"
    );
    assert!(stdout.contains("PASS detach-twice"), "{stdout}");
    assert!(sim.machine_devices(machine).is_empty(), "detached again");
}
