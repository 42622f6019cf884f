//! A container's PID 1: waits for SIGTERM/SIGINT (PID 1 gets no default signal
//! actions, so it must handle them to stop promptly), reaps orphans, and plays the
//! start of the software the pod stands in for: it announces the pod to the stand-in
//! service and becomes ready after a delay (a driver takes a while to build).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::http::{self, Url};

/// The file the readiness probe looks for.
pub const READY_FILE: &str = "/tmp/ready";
/// How long announcing keeps trying while the service is unreachable.
const ANNOUNCE_FOR: Duration = Duration::from_secs(30);
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(10);
pub const ROLES: [&str; 6] = [
    "driver",
    "agent",
    "dra-plugin",
    "device-plugin",
    "dcgm",
    "workload",
];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub ready_after: Option<Duration>,
    pub announce: Option<String>,
    pub print_env: Vec<String>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{arg} needs a value"))
            };
            match arg.as_str() {
                "--ready-after-ms" => {
                    let v = value()?;
                    let ms = v
                        .parse::<u64>()
                        .map_err(|_| format!("--ready-after-ms: {v:?} is not a number"))?;
                    options.ready_after = Some(Duration::from_millis(ms));
                }
                "--announce" => {
                    let role = value()?;
                    if !ROLES.contains(&role.as_str()) {
                        return Err(format!(
                            "--announce: unknown role {role:?} (one of {})",
                            ROLES.join(", ")
                        ));
                    }
                    options.announce = Some(role);
                }
                "--print-env" => options.print_env.push(value()?),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Ok(options)
    }
}

pub fn is_ready() -> bool {
    Path::new(READY_FILE).exists()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Announcement {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// The pod's uid (`POD_UID`, empty when not given): tells a re-created pod of the
    /// same name from the old one.
    pub uid: String,
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<String>>,
}

/// The devices the container runtime gave a workload (`NVIDIA_VISIBLE_DEVICES`):
/// comma-separated; empty, `void` and `none` mean none.
pub fn visible_gpus(value: Option<&str>) -> Vec<String> {
    let value = value.unwrap_or_default().trim();
    if value == "void" || value == "none" {
        return Vec::new();
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The announcement of this pod from its environment; the names of the variables
/// missing otherwise.
pub fn announcement(
    env: &dyn Fn(&str) -> Option<String>,
    role: &str,
) -> Result<Announcement, Vec<&'static str>> {
    let mut missing = Vec::new();
    let mut get = |name: &'static str| {
        env(name).filter(|v| !v.is_empty()).unwrap_or_else(|| {
            missing.push(name);
            String::new()
        })
    };
    let a = Announcement {
        namespace: get("POD_NAMESPACE"),
        pod: get("POD_NAME"),
        node: get("NODE_NAME"),
        uid: env("POD_UID").unwrap_or_default(),
        role: role.to_owned(),
        gpus: (role == "workload").then(|| visible_gpus(env("NVIDIA_VISIBLE_DEVICES").as_deref())),
    };
    if missing.is_empty() {
        Ok(a)
    } else {
        Err(missing)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Announces the pod, retrying with back-off while the service cannot be reached.
/// Never ends the process: a pod that could not announce still runs (the test sees
/// the missing announcement).
fn announce(role: &str) {
    let a = match announcement(&env, role) {
        Ok(a) => a,
        Err(missing) => {
            eprintln!(
                "node-standin pause: not announcing: {} not set",
                missing.join(", ")
            );
            return;
        }
    };
    let Some(url) = env("CRO_STANDIN_URL").filter(|u| !u.is_empty()) else {
        eprintln!("node-standin pause: not announcing: CRO_STANDIN_URL not set");
        return;
    };
    let url = match Url::parse(&url) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("node-standin pause: not announcing: CRO_STANDIN_URL: {e}");
            return;
        }
    };
    let body = match serde_json::to_vec(&a) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("node-standin pause: not announcing: {e}");
            return;
        }
    };
    let deadline = Instant::now() + ANNOUNCE_FOR;
    let mut pause = Duration::from_millis(100);
    loop {
        match http::post_json(&url, "/v1/started", &body, ANNOUNCE_TIMEOUT) {
            Ok(r) if (200..300).contains(&r.status) => return,
            // The service refused it: asking again will not help.
            Ok(r) if (400..500).contains(&r.status) => {
                eprintln!(
                    "node-standin pause: announcement refused ({}): {}",
                    r.status,
                    r.text()
                );
                return;
            }
            Ok(r) => eprintln!("node-standin pause: announcing: {} {}", r.status, r.text()),
            Err(e) => eprintln!("node-standin pause: announcing: {e}"),
        }
        if Instant::now() + pause > deadline {
            eprintln!("node-standin pause: gave up announcing after {ANNOUNCE_FOR:?}");
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(3));
    }
}

fn mark_ready(after: Duration, file: &Path) {
    std::thread::sleep(after);
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(file, b"") {
        eprintln!("node-standin pause: cannot create {}: {e}", file.display());
    }
}

/// Runs as PID 1 until SIGTERM or SIGINT.
pub fn run(options: &Options) -> ! {
    // Blocked before any thread starts, so every thread inherits the mask and the
    // signals wait for `sigwait` below.
    // SAFETY: sigset_t is plain data that sigemptyset initialises; these calls only
    // change this process's signal mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    for name in &options.print_env {
        println!("{name}={}", env(name).unwrap_or_default());
    }
    if let Some(after) = options.ready_after {
        std::thread::spawn(move || mark_ready(after, Path::new(READY_FILE)));
    }
    if let Some(role) = options.announce.clone() {
        std::thread::spawn(move || announce(&role));
    }
    loop {
        let mut signal = 0;
        // SAFETY: `set` is initialised; `signal` is a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            continue;
        }
        match signal {
            libc::SIGCHLD => reap(),
            libc::SIGTERM | libc::SIGINT => std::process::exit(0),
            _ => {}
        }
    }
}

/// Collects every exited child (orphans are re-parented to PID 1).
fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options() {
        let o = Options::parse(&args(&[
            "--announce",
            "workload",
            "--ready-after-ms",
            "1500",
            "--print-env",
            "NVIDIA_VISIBLE_DEVICES",
        ]))
        .unwrap();
        assert_eq!(
            o,
            Options {
                ready_after: Some(Duration::from_millis(1500)),
                announce: Some("workload".into()),
                print_env: vec!["NVIDIA_VISIBLE_DEVICES".into()],
            }
        );
        assert_eq!(Options::parse(&[]), Ok(Options::default()));
        assert!(Options::parse(&args(&["--announce", "kubelet"])).is_err());
        assert!(Options::parse(&args(&["--ready-after-ms"])).is_err());
        assert!(Options::parse(&args(&["--ready-after-ms", "soon"])).is_err());
        assert!(Options::parse(&args(&["--verbose"])).is_err());
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "POD_NAMESPACE" => Some("default".into()),
            "POD_NAME" => Some("gpu-job".into()),
            "NODE_NAME" => Some("127.0.0.1".into()),
            "POD_UID" => Some("u-1".into()),
            "NVIDIA_VISIBLE_DEVICES" => Some("GPU-a, GPU-b,".into()),
            _ => None,
        }
    }

    #[test]
    fn announcement_bodies() {
        let a = announcement(&env, "workload").unwrap();
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"namespace": "default", "pod": "gpu-job", "node": "127.0.0.1",
                "uid": "u-1", "role": "workload", "gpus": ["GPU-a", "GPU-b"]})
        );
        let a = announcement(&env, "driver").unwrap();
        assert!(serde_json::to_value(&a).unwrap().get("gpus").is_none());
        assert_eq!(
            announcement(&|_| None, "dcgm"),
            Err(vec!["POD_NAMESPACE", "POD_NAME", "NODE_NAME"])
        );
    }

    #[test]
    fn visible_devices() {
        assert!(visible_gpus(None).is_empty());
        assert!(visible_gpus(Some("")).is_empty());
        assert!(visible_gpus(Some("void")).is_empty());
        assert_eq!(visible_gpus(Some("GPU-x")), vec!["GPU-x".to_owned()]);
    }

    #[test]
    fn ready_file() {
        let dir = std::env::temp_dir().join(format!("node-standin-{}", std::process::id()));
        let file = dir.join("sub").join("ready");
        mark_ready(Duration::from_millis(1), &file);
        assert!(file.exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
