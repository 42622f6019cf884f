//! A node command, forwarded to the stand-in service and finished as its answer says.

use std::io::Write;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::http::{self, Url};

/// The service may hold a reply on purpose (a command that runs long, or hangs until a
/// test releases it); the operator's own timeout is shorter than this, so this one
/// only ends a process whose service is long gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Exit code of a command that could not be forwarded (as `env` and `chroot` use 125
/// for their own failures), so it is not mistaken for the command's.
pub const FORWARD_FAILED: i32 = 125;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// "driver" or "agent": which pod image the command runs in.
    pub kind: String,
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExecReply {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    pub code: i32,
    /// The command was killed by this signal (after printing what it printed).
    #[serde(default)]
    pub signal: Option<i32>,
}

/// The request for `argv` from the pod's environment; the names of the variables
/// missing otherwise.
pub fn exec_request(
    env: &dyn Fn(&str) -> Option<String>,
    argv: &[String],
) -> Result<ExecRequest, Vec<&'static str>> {
    let mut missing = Vec::new();
    let mut get = |name: &'static str| {
        env(name).filter(|v| !v.is_empty()).unwrap_or_else(|| {
            missing.push(name);
            String::new()
        })
    };
    let request = ExecRequest {
        namespace: get("POD_NAMESPACE"),
        pod: get("POD_NAME"),
        node: get("NODE_NAME"),
        kind: get("CRO_STANDIN_KIND"),
        argv: argv.to_vec(),
    };
    if missing.is_empty() {
        Ok(request)
    } else {
        Err(missing)
    }
}

pub fn parse_reply(body: &[u8]) -> Result<ExecReply, String> {
    serde_json::from_slice(body).map_err(|e| format!("bad reply from the stand-in service: {e}"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn fail(argv0: &str, message: &str) -> ! {
    eprintln!("node-standin: {argv0}: {message}");
    std::process::exit(FORWARD_FAILED);
}

/// Forwards `argv` and ends this process as the answer says.
pub fn run(argv: &[String]) -> ! {
    let argv0 = argv.first().map(String::as_str).unwrap_or("?");
    let url = env("CRO_STANDIN_URL").filter(|u| !u.is_empty());
    let request = exec_request(&env, argv);
    let (url, request) = match (url, request) {
        (Some(url), Ok(request)) => (url, request),
        (url, request) => {
            let mut missing = request.err().unwrap_or_default();
            if url.is_none() {
                missing.insert(0, "CRO_STANDIN_URL");
            }
            fail(
                argv0,
                &format!(
                    "cannot forward the command: {} not set in the environment",
                    missing.join(", ")
                ),
            );
        }
    };
    let raw_url = url;
    let url =
        Url::parse(&raw_url).unwrap_or_else(|e| fail(argv0, &format!("CRO_STANDIN_URL: {e}")));
    let body = serde_json::to_vec(&request)
        .unwrap_or_else(|e| fail(argv0, &format!("encoding the request: {e}")));
    let response = http::post_json(&url, "/v1/exec", &body, REPLY_TIMEOUT).unwrap_or_else(|e| {
        fail(
            argv0,
            &format!("the stand-in service at {raw_url} is unreachable: {e}"),
        )
    });
    if response.status != 200 {
        fail(
            argv0,
            &format!(
                "the stand-in service answered {}: {}",
                response.status,
                response.text()
            ),
        );
    }
    let reply = parse_reply(&response.body).unwrap_or_else(|e| fail(argv0, &e));
    finish(&reply)
}

/// Prints the reply's output and exits with its code, or dies of its signal.
fn finish(reply: &ExecReply) -> ! {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(reply.stdout.as_bytes());
    let _ = out.flush();
    drop(out);
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(reply.stderr.as_bytes());
    let _ = err.flush();
    drop(err);
    if let Some(signal) = reply.signal {
        // SAFETY: resetting a signal to its default action and raising it have no
        // memory effects; for SIGKILL the reset fails harmlessly.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
        // A signal whose default is to be ignored (or an invalid one): exit as a shell
        // reports a killed command.
        std::process::exit(128 + signal);
    }
    std::process::exit(reply.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn pod_env(name: &str) -> Option<String> {
        match name {
            "POD_NAMESPACE" => Some("gpu-operator".into()),
            "POD_NAME" => Some("nvidia-driver-daemonset-ab12c".into()),
            "NODE_NAME" => Some("127.0.0.1".into()),
            "CRO_STANDIN_KIND" => Some("driver".into()),
            _ => None,
        }
    }

    #[test]
    fn request_body() {
        let req = exec_request(&pod_env, &argv(&["nvidia-smi", "drain", "-p", "x", "-q"])).unwrap();
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({
                "namespace": "gpu-operator",
                "pod": "nvidia-driver-daemonset-ab12c",
                "node": "127.0.0.1",
                "kind": "driver",
                "argv": ["nvidia-smi", "drain", "-p", "x", "-q"],
            })
        );
    }

    #[test]
    fn missing_environment_is_named() {
        let env = |name: &str| match name {
            "POD_NAME" => Some("p".to_owned()),
            "NODE_NAME" => Some(String::new()),
            _ => None,
        };
        assert_eq!(
            exec_request(&env, &argv(&["lsmod"])),
            Err(vec!["POD_NAMESPACE", "NODE_NAME", "CRO_STANDIN_KIND"])
        );
    }

    #[test]
    fn replies() {
        assert_eq!(
            parse_reply(br#"{"stdout":"a\n","stderr":"","code":6,"signal":null}"#),
            Ok(ExecReply {
                stdout: "a\n".into(),
                stderr: String::new(),
                code: 6,
                signal: None
            })
        );
        assert_eq!(
            parse_reply(br#"{"code":137,"signal":9}"#).map(|r| r.signal),
            Ok(Some(9))
        );
        assert!(parse_reply(br#"{"stdout":"x"}"#).is_err());
        assert!(parse_reply(b"not json").is_err());
    }
}
