//! Running a command in a pod through the Kubernetes exec API, and telling an exit code
//! from an exec that failed (docs/node-operations.md, "When exec fails").
//!
//! A command's outcome is an [`ExecOutput`] only when the stream carried its exit status
//! (0, or a non-zero exit code other than a kill). Everything else is a [`NodeOpsError`]
//! that names what happened: the container or pod was not there to run it, the pod was
//! deleted or the stream ended while it ran, it took too long, or a signal killed it.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::NodeOpsError;

/// Output beyond this is dropped (and the rest read and discarded, so the stream can
/// still deliver the exit status); nvidia-smi's answers are a few lines.
const MAX_OUTPUT: usize = 1 << 20;
/// How much of a command an error message shows.
const COMMAND_IN_ERRORS: usize = 120;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// The node the pod runs on (a stand-in runner answers per node).
    pub node: String,
    /// The first container of the pod; None lets the API server choose.
    pub container: Option<String>,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// The single seam between the operator and a node.
pub trait CommandRunner: Send + Sync + 'static {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>>;
}

/// Runs commands through `pods/exec` of the API server.
#[derive(Clone)]
pub struct KubeExecRunner {
    client: kube::Client,
    timeout: Duration,
}

impl KubeExecRunner {
    /// How long one command may take, from the exec request to its exit status, unless
    /// [`KubeExecRunner::with_timeout`] says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The same runner with another limit per command ([`NodeOpsError::ExecTimeout`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn exec(&self, pod: &PodRef, command: &[String]) -> Result<ExecOutput, NodeOpsError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let mut params = AttachParams::default()
            .stdin(false)
            .stdout(true)
            .stderr(true);
        if let Some(c) = &pod.container {
            params = params.container(c.clone());
        }
        let mut process = api
            .exec(&pod.name, command.to_vec(), &params)
            .await
            .map_err(|e| refused(pod, &e))?;
        let (Some(stdout), Some(stderr), Some(status)) =
            (process.stdout(), process.stderr(), process.take_status())
        else {
            return Err(NodeOpsError::Exec {
                pod: pod.to_string(),
                message: "the exec stream has no stdout, stderr or status".into(),
            });
        };
        let reading = async { tokio::try_join!(read_capped(stdout), read_capped(stderr)) };
        tokio::pin!(reading);
        tokio::pin!(status);
        // The status resolves once the stream delivered one, or ended without (its sender
        // dropped). Output is read meanwhile, or the stream would stall on a full pipe.
        let (output, status) = tokio::select! {
            output = &mut reading => (Some(output), status.await),
            status = &mut status => (None, status),
        };
        let outcome = match status {
            Some(status) => match exit_status(pod, command, &status) {
                // After a status kube closes both pipes: the output is complete.
                Ok(code) => match output {
                    Some(output) => output.map(|o| (o, code)),
                    None => reading.await.map(|o| (o, code)),
                }
                .map_err(|e| interrupted(pod, command, format!("reading its output: {e}"))),
                Err(e) => Err(e),
            },
            // Without a status the output may never end (kube leaves the pipes open when
            // the stream breaks): it is not read any further.
            None => Err(interrupted(
                pod,
                command,
                match process.join().await {
                    Err(e) => format!("the stream broke: {e}"),
                    Ok(()) => "the stream was closed".to_owned(),
                },
            )),
        };
        match outcome {
            Ok(((stdout, stderr), exit_code)) => Ok(ExecOutput {
                stdout,
                stderr,
                exit_code,
            }),
            // A command cut short by its pod's deletion says so.
            Err(e @ (NodeOpsError::Interrupted { .. } | NodeOpsError::Killed { .. })) => {
                if self.pod_deleted(pod).await {
                    Err(NodeOpsError::PodDeleted {
                        pod: pod.to_string(),
                        command: command_text(command),
                    })
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the pod is gone or being deleted (false when that cannot be read).
    async fn pod_deleted(&self, pod: &PodRef) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api.get_opt(&pod.name).await {
            Ok(None) => true,
            Ok(Some(p)) => p.metadata.deletion_timestamp.is_some(),
            Err(e) => {
                tracing::debug!(pod = %pod, error = %e, "cannot tell whether the pod was deleted");
                false
            }
        }
    }
}

/// Reads a pipe to its end, keeping the first [`MAX_OUTPUT`] bytes.
async fn read_capped(mut pipe: impl AsyncRead + Unpin) -> std::io::Result<String> {
    let mut kept = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let room = MAX_OUTPUT.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..n.min(room)]);
    }
    Ok(String::from_utf8_lossy(&kept).into_owned())
}

/// A command as error messages show it: its words, cut after [`COMMAND_IN_ERRORS`]
/// characters.
pub(crate) fn command_text(command: &[String]) -> String {
    let text = command.join(" ");
    let cut = crate::text::clip(&text, COMMAND_IN_ERRORS);
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        text
    }
}

/// The name of signal `n`, as [`NodeOpsError::Killed`] shows it.
pub(crate) fn signal_name(n: i32) -> String {
    match n {
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Exit codes that mean "killed by a signal" (128 + N), with N. Only the two signals a
/// command gets from outside (a deleted pod's container, the OOM killer, a timeout):
/// other codes above 128 stay exit codes.
fn killed_by(code: i32) -> Option<i32> {
    match code {
        137 => Some(9),
        143 => Some(15),
        _ => None,
    }
}

fn interrupted(pod: &PodRef, command: &[String], detail: String) -> NodeOpsError {
    NodeOpsError::Interrupted {
        pod: pod.to_string(),
        command: command_text(command),
        detail,
    }
}

/// Why the API server (or the kubelet behind it) would not run a command, read from a
/// status: structured fields first (the API server's NotFound of the pod, the 404
/// code), then the words both are known to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The container is not there to run commands.
    Container,
    /// The pod is not there.
    Pod,
    /// Anything else.
    Other,
}

/// What the container cases say (lower case): the kubelet's `container not found ("x")`
/// (also behind kubectl's and the API server's "unable to upgrade connection: …"), the
/// API server's `container x is not valid for pod y` and `pod y does not have a host
/// assigned`, `… is not running`, and the container runtimes' words for a container
/// that exited or was never started.
const CONTAINER_WORDS: [&str; 8] = [
    "container not found",
    "is not valid for pod",
    "does not have a host assigned",
    "not running",
    "container not ready",
    "container_exited",
    "container_created",
    "container is not created or running",
];
fn refusal(code: u16, reason: &str, kind: &str, message: &str) -> Refusal {
    if reason == "NotFound" && kind == "pods" {
        return Refusal::Pod;
    }
    let text = message.to_ascii_lowercase();
    if CONTAINER_WORDS.iter().any(|w| text.contains(w)) {
        return Refusal::Container;
    }
    // The kubelet's `pod does not exist`, the API server's `pods "x" not found` (not
    // any "not found": a missing program is one too).
    let pod_gone = text.contains("pod does not exist")
        || (text.contains("pods \"") && text.contains("\" not found"));
    if code == 404 || reason == "NotFound" || pod_gone {
        return Refusal::Pod;
    }
    Refusal::Other
}

/// A refusal in words: the message, the HTTP code and a reason the API server gave
/// (not kube's "Failed to parse error data" for a plain-text answer).
fn refusal_detail(code: u16, reason: &str, message: &str) -> String {
    let mut text = if message.is_empty() {
        "no message".to_owned()
    } else {
        message.to_owned()
    };
    if code != 0 {
        text.push_str(&format!(" (HTTP {code}"));
        if !reason.is_empty() && !reason.contains(' ') {
            text.push_str(&format!(", {reason}"));
        }
        text.push(')');
    }
    text
}

fn refusal_error(pod: &PodRef, refusal: Refusal, detail: String) -> NodeOpsError {
    match refusal {
        Refusal::Container => NodeOpsError::ContainerNotRunning {
            pod: pod.to_string(),
            container: pod
                .container
                .clone()
                .unwrap_or_else(|| "(the default one)".into()),
            detail,
        },
        Refusal::Pod => NodeOpsError::PodNotFound {
            pod: pod.to_string(),
            detail,
        },
        Refusal::Other => NodeOpsError::Exec {
            pod: pod.to_string(),
            message: detail,
        },
    }
}

/// The exec request failed before a stream was open. kube 5 turns the API server's
/// 4xx/5xx answer into `Error::Api` with its Status (a plain-text answer, as the
/// kubelet's, becomes the message); a non-101 answer without an error code is
/// `UpgradeConnectionError::ProtocolSwitch`.
fn refused(pod: &PodRef, e: &kube::Error) -> NodeOpsError {
    use kube::client::UpgradeConnectionError;
    match e {
        kube::Error::Api(s) => {
            let kind = s.details.as_ref().map(|d| d.kind.as_str()).unwrap_or("");
            refusal_error(
                pod,
                refusal(s.code, &s.reason, kind, &s.message),
                refusal_detail(s.code, &s.reason, &s.message),
            )
        }
        kube::Error::UpgradeConnection(UpgradeConnectionError::ProtocolSwitch(code)) => {
            let detail =
                format!("the API server answered HTTP {code} instead of switching protocols");
            let refusal = match code.as_u16() {
                404 => Refusal::Pod,
                _ => Refusal::Other,
            };
            refusal_error(pod, refusal, detail)
        }
        other => NodeOpsError::Exec {
            pod: pod.to_string(),
            message: crate::text::kube_error(other),
        },
    }
}

/// The exit code a stream's status carries, or what else it says. The API server sends
/// `Success`, or a `NonZeroExitCode` Failure with the code as the cause `ExitCode`; any
/// other Failure is an error that kept the command from running (or finishing), never
/// an exit code.
fn exit_status(pod: &PodRef, command: &[String], status: &Status) -> Result<i32, NodeOpsError> {
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let reason = status.reason.as_deref().unwrap_or("");
    let message = status.message.as_deref().unwrap_or("");
    if reason == "NonZeroExitCode" {
        let code = status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|causes| {
                causes
                    .iter()
                    .find(|c| c.reason.as_deref() == Some("ExitCode"))
                    .and_then(|c| c.message.as_deref())
                    .and_then(|m| m.trim().parse::<i32>().ok())
            });
        return match code {
            Some(code) => match killed_by(code) {
                Some(signal) => Err(NodeOpsError::Killed {
                    pod: pod.to_string(),
                    command: command_text(command),
                    signal,
                }),
                None => Ok(code),
            },
            None => Err(interrupted(
                pod,
                command,
                format!("a non-zero exit without its code: {message}"),
            )),
        };
    }
    let code = status.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0);
    let kind = status
        .details
        .as_ref()
        .and_then(|d| d.kind.as_deref())
        .unwrap_or("");
    let detail = refusal_detail(code, reason, message);
    match refusal(code, reason, kind, message) {
        Refusal::Other => Err(NodeOpsError::Exec {
            pod: pod.to_string(),
            message: format!("the kubelet reported an error instead of an exit status: {detail}"),
        }),
        r => Err(refusal_error(pod, r, detail)),
    }
}

impl CommandRunner for KubeExecRunner {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.exec(pod, command))
                .await
                .unwrap_or_else(|_| {
                    Err(NodeOpsError::ExecTimeout {
                        pod: pod.to_string(),
                        command: command_text(command),
                        limit: self.timeout,
                    })
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    fn pod() -> PodRef {
        PodRef {
            namespace: "gpu-operator".into(),
            name: "nvidia-driver-abc".into(),
            node: "n1".into(),
            container: Some("nvidia-driver-ctr".into()),
        }
    }

    fn cmd() -> Vec<String> {
        vec!["nvidia-smi".into(), "-L".into()]
    }

    fn exit(code: &str) -> Status {
        Status {
            status: Some("Failure".into()),
            message: Some(format!(
                "command terminated with non-zero exit code: error executing command [nvidia-smi -L], exit code {code}"
            )),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some(code.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn internal(message: &str) -> Status {
        Status {
            status: Some("Failure".into()),
            message: Some(format!("Internal error occurred: {message}")),
            reason: Some("InternalError".into()),
            code: Some(500),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    message: Some(message.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn api_error(code: u16, reason: &str, kind: &str, message: &str) -> kube::Error {
        let mut status = kube::core::Status::failure(message, reason).with_code(code);
        if !kind.is_empty() {
            status.details = serde_json::from_value(serde_json::json!({"kind": kind})).ok();
        }
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn exit_statuses() {
        let (p, c) = (pod(), cmd());
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_status(&p, &c, &ok).unwrap(), 0);
        assert_eq!(exit_status(&p, &c, &exit("6")).unwrap(), 6);
        // 128+N for other signals stays an exit code.
        assert_eq!(exit_status(&p, &c, &exit("139")).unwrap(), 139);
        for (code, signal, name) in [("137", 9, "SIGKILL"), ("143", 15, "SIGTERM")] {
            let e = exit_status(&p, &c, &exit(code)).unwrap_err();
            assert!(
                matches!(e, NodeOpsError::Killed { signal: s, .. } if s == signal),
                "{e:?}"
            );
            let text = e.to_string();
            assert!(
                text.starts_with(
                    "`nvidia-smi -L` in pod gpu-operator/nvidia-driver-abc was killed by"
                ) && text.contains(name)
                    && text.contains(&format!("exit {code}")),
                "{text}"
            );
        }
        // A NonZeroExitCode without a readable code is no exit code either.
        let mut garbled = exit("x");
        garbled.details = None;
        assert!(matches!(
            exit_status(&p, &c, &garbled),
            Err(NodeOpsError::Interrupted { .. })
        ));
    }

    #[test]
    fn failures_on_the_stream_are_not_exit_codes() {
        let (p, c) = (pod(), cmd());
        // The API server's stream translator reports the kubelet's refusal on the stream.
        for message in [
            "unable to upgrade connection: container not found (\"nvidia-driver-ctr\")",
            "error executing command in container: failed to exec in container: container is in CONTAINER_EXITED state",
        ] {
            let e = exit_status(&p, &c, &internal(message)).unwrap_err();
            assert!(
                matches!(e, NodeOpsError::ContainerNotRunning { .. }),
                "{message}: {e:?}"
            );
            assert!(
                e.to_string().starts_with(
                    "container nvidia-driver-ctr of pod gpu-operator/nvidia-driver-abc is not running"
                ),
                "{e}"
            );
        }
        let e = exit_status(
            &p,
            &c,
            &internal("unable to upgrade connection: pod does not exist"),
        )
        .unwrap_err();
        assert!(matches!(e, NodeOpsError::PodNotFound { .. }), "{e:?}");
        let e = exit_status(
            &p,
            &c,
            &internal("error executing command in container: exec: \"nvidia-smi\": executable file not found in $PATH"),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, NodeOpsError::Exec { .. }), "{e:?}");
        assert!(
            text.contains("instead of an exit status")
                && text.contains("executable file not found"),
            "{text}"
        );
    }

    #[test]
    fn refusals_before_the_stream() {
        let p = pod();
        // The API server's own 404 for the pod: structured (reason, details.kind).
        let e = refused(
            &p,
            &api_error(
                404,
                "NotFound",
                "pods",
                "pods \"nvidia-driver-abc\" not found",
            ),
        );
        assert!(matches!(e, NodeOpsError::PodNotFound { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "pod gpu-operator/nvidia-driver-abc does not exist (any more), so the command could not start: pods \"nvidia-driver-abc\" not found (HTTP 404, NotFound)"
        );
        // The kubelet's plain-text 404 (kube: "Failed to parse error data").
        let e = refused(
            &p,
            &api_error(404, "Failed to parse error data", "", "pod does not exist"),
        );
        assert!(matches!(e, NodeOpsError::PodNotFound { .. }), "{e:?}");
        assert!(!e.to_string().contains("parse"), "{e}");
        for (code, reason, message) in [
            (
                500,
                "Failed to parse error data",
                "container not found (\"nvidia-driver-ctr\")",
            ),
            (
                500,
                "InternalError",
                "Internal error occurred: unable to upgrade connection: container not found (\"nvidia-driver-ctr\")",
            ),
            (
                400,
                "BadRequest",
                "container nvidia-driver-ctr is not valid for pod nvidia-driver-abc",
            ),
            (400, "BadRequest", "pod nvidia-driver-abc is not running"),
            (
                400,
                "BadRequest",
                "pod nvidia-driver-abc does not have a host assigned",
            ),
            // A CRI NotFound for the container is a container, not a pod, case.
            (
                404,
                "Failed to parse error data",
                "rpc error: code = NotFound desc = container not found",
            ),
        ] {
            let e = refused(&p, &api_error(code, reason, "", message));
            assert!(
                matches!(e, NodeOpsError::ContainerNotRunning { ref container, .. } if container == "nvidia-driver-ctr"),
                "{message}: {e:?}"
            );
            assert!(e.is_transient());
        }
        // Anything else keeps the API server's words.
        let e = refused(
            &p,
            &api_error(
                403,
                "Forbidden",
                "pods",
                "pods \"nvidia-driver-abc\" is forbidden: User \"x\" cannot create resource \"pods/exec\"",
            ),
        );
        assert!(
            matches!(e, NodeOpsError::Exec { ref message, .. } if message.contains("pods/exec") && message.contains("HTTP 403")),
            "{e:?}"
        );
        let e = refused(
            &p,
            &api_error(
                500,
                "Failed to parse error data",
                "",
                "error dialing backend: dial tcp 10.0.0.7:10250: connect: connection refused",
            ),
        );
        assert!(matches!(e, NodeOpsError::Exec { .. }), "{e:?}");
        let e = refused(
            &p,
            &kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
                hyper::StatusCode::NOT_FOUND,
            )),
        );
        assert!(matches!(e, NodeOpsError::PodNotFound { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn output_beyond_the_cap_is_read_and_dropped() {
        let long = vec![b'x'; MAX_OUTPUT + 5000];
        let kept = read_capped(&long[..]).await.unwrap();
        assert_eq!(kept.len(), MAX_OUTPUT);
    }

    #[test]
    fn commands_in_errors_are_cut() {
        let long = vec!["sh".to_string(), "-c".to_string(), "x".repeat(500)];
        let text = command_text(&long);
        assert_eq!(text.chars().count(), COMMAND_IN_ERRORS + 1);
        assert!(text.ends_with('…'));
        assert_eq!(command_text(&cmd()), "nvidia-smi -L");
    }

    #[test]
    fn which_errors_clear_by_themselves() {
        let e = |m: &str| NodeOpsError::Exec {
            pod: "p".into(),
            message: m.into(),
        };
        assert!(e("x").is_transient());
        assert!(
            NodeOpsError::ExecTimeout {
                pod: "p".into(),
                command: "c".into(),
                limit: Duration::from_secs(1)
            }
            .is_transient()
        );
        assert!(!NodeOpsError::NoGpuOperator("n".into()).is_transient());
        assert!(
            !NodeOpsError::OnlyStderr {
                pod: "p".into(),
                command: "c".into(),
                stderr: "s".into()
            }
            .is_transient()
        );
    }

    /// A stand-in API server on a local socket that answers one exec as scripted and the
    /// pod lookup after a failed one, so the runner's whole path runs as against a real
    /// one: kube's request, its WebSocket handshake and message loop.
    mod fake {
        use base64::Engine;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        use tokio::net::{TcpListener, TcpStream};

        /// What the exec request gets.
        #[derive(Clone)]
        pub(super) enum Exec {
            /// An HTTP error answer: code, content type, body.
            Refuse(u16, &'static str, String),
            /// No answer at all.
            Silent,
            /// The WebSocket upgrade, these (channel, bytes) frames, then `End`.
            Stream(Vec<(u8, Vec<u8>)>, End),
        }

        #[derive(Clone, Copy)]
        pub(super) enum End {
            /// A close frame (the stream ends cleanly).
            Close,
            /// The socket is dropped without a close frame (a broken connection).
            Drop,
            /// Nothing more, the socket kept open.
            Hang,
        }

        /// What the pod lookup after a failure finds.
        #[derive(Clone, Copy)]
        pub(super) enum PodNow {
            Running,
            Deleting,
            Gone,
        }

        pub(super) async fn client(exec: Exec, pod: PodNow) -> kube::Client {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(serve(socket, exec.clone(), pod));
                }
            });
            let config = kube::Config::new(url.parse().unwrap());
            kube::Client::try_from(config).unwrap()
        }

        async fn serve(socket: TcpStream, exec: Exec, pod: PodNow) {
            let mut reader = BufReader::new(socket);
            let mut request_line = String::new();
            reader.read_line(&mut request_line).await.unwrap();
            let mut key = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).await.unwrap() == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("sec-websocket-key")
                {
                    key = value.trim().to_owned();
                }
            }
            let mut socket = reader.into_inner();
            if !request_line.contains("/exec?") {
                let (code, body) = match pod {
                    PodNow::Gone => (404, not_found()),
                    PodNow::Running => (200, pod_json(false)),
                    PodNow::Deleting => (200, pod_json(true)),
                };
                respond(&mut socket, code, "application/json", &body).await;
                return;
            }
            match exec {
                Exec::Refuse(code, content_type, body) => {
                    respond(&mut socket, code, content_type, &body).await
                }
                Exec::Silent => std::future::pending().await,
                Exec::Stream(frames, end) => {
                    let accept = base64::engine::general_purpose::STANDARD.encode(super::sha1(
                        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
                    ));
                    let head = format!(
                        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
                    );
                    socket.write_all(head.as_bytes()).await.unwrap();
                    for (channel, data) in frames {
                        let mut payload = vec![channel];
                        payload.extend_from_slice(&data);
                        let mut frame = vec![0x82];
                        if payload.len() < 126 {
                            frame.push(payload.len() as u8);
                        } else {
                            frame.push(126);
                            frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
                        }
                        frame.extend_from_slice(&payload);
                        socket.write_all(&frame).await.unwrap();
                    }
                    match end {
                        End::Close => {
                            // A close frame; once the client's answers it, the server
                            // closes the connection.
                            let _ = socket.write_all(&[0x88, 0x00]).await;
                            let mut answer = [0u8; 16];
                            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut answer).await;
                        }
                        End::Drop => drop(socket),
                        End::Hang => std::future::pending().await,
                    }
                }
            }
        }

        async fn respond(socket: &mut TcpStream, code: u16, content_type: &str, body: &str) {
            let head = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            socket.write_all(head.as_bytes()).await.unwrap();
            socket.write_all(body.as_bytes()).await.unwrap();
            let _ = socket.shutdown().await;
        }

        pub(super) fn not_found() -> String {
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "pods \"nvidia-driver-abc\" not found", "reason": "NotFound",
                "details": {"name": "nvidia-driver-abc", "kind": "pods"}, "code": 404})
            .to_string()
        }

        fn pod_json(deleting: bool) -> String {
            let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "nvidia-driver-abc", "namespace": "gpu-operator"}});
            if deleting {
                pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
            }
            pod.to_string()
        }

        pub(super) fn status(status: &super::Status) -> (u8, Vec<u8>) {
            (3, serde_json::to_vec(status).unwrap())
        }
    }

    /// SHA-1, for the fake server's WebSocket handshake (RFC 6455 asks for it).
    fn sha1(data: &[u8]) -> [u8; 20] {
        let mut h: [u32; 5] = [
            0x6745_2301,
            0xEFCD_AB89,
            0x98BA_DCFE,
            0x1032_5476,
            0xC3D2_E1F0,
        ];
        let mut msg = data.to_vec();
        msg.push(0x80);
        while msg.len() % 64 != 56 {
            msg.push(0);
        }
        msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
        for block in msg.chunks(64) {
            let mut w = [0u32; 80];
            for (word, bytes) in w.iter_mut().zip(block.chunks(4)) {
                *word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
            for i in 16..80 {
                w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
            }
            let [mut a, mut b, mut c, mut d, mut e] = h;
            for (i, word) in w.iter().enumerate() {
                let (f, k) = match i {
                    0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                    20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                    40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                    _ => (b ^ c ^ d, 0xCA62_C1D6),
                };
                let t = a
                    .rotate_left(5)
                    .wrapping_add(f)
                    .wrapping_add(e)
                    .wrapping_add(k)
                    .wrapping_add(*word);
                (e, d, c, b, a) = (d, c, b.rotate_left(30), a, t);
            }
            for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
                *x = x.wrapping_add(y);
            }
        }
        let mut out = [0u8; 20];
        for (chunk, word) in out.chunks_mut(4).zip(h) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    #[test]
    fn the_fake_servers_handshake_is_rfc_6455s() {
        use base64::Engine;
        let accept = base64::engine::general_purpose::STANDARD.encode(sha1(
            b"dGhlIHNhbXBsZSBub25jZQ==258EAFA5-E914-47DA-95CA-C5AB0DC85B11",
        ));
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    async fn run(exec: fake::Exec, pod_now: fake::PodNow) -> Result<ExecOutput, NodeOpsError> {
        let client = fake::client(exec, pod_now).await;
        let runner = KubeExecRunner::new(client).with_timeout(Duration::from_secs(5));
        runner.run(&pod(), &cmd()).await
    }

    #[tokio::test]
    async fn a_finished_command_is_its_output_and_exit_code() {
        use fake::{End, Exec, PodNow};
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        let out = run(
            Exec::Stream(
                vec![
                    (1, b"GPU 0: A100\n".to_vec()),
                    (2, b"warning\n".to_vec()),
                    fake::status(&ok),
                ],
                End::Close,
            ),
            PodNow::Running,
        )
        .await
        .unwrap();
        assert_eq!(
            out,
            ExecOutput {
                stdout: "GPU 0: A100\n".into(),
                stderr: "warning\n".into(),
                exit_code: 0
            }
        );
        // A non-zero exit with output stays output, for the caller to read.
        let out = run(
            Exec::Stream(
                vec![
                    (1, b"No devices were found\n".to_vec()),
                    fake::status(&exit("6")),
                ],
                End::Close,
            ),
            PodNow::Running,
        )
        .await
        .unwrap();
        assert_eq!(
            (out.stdout.as_str(), out.exit_code),
            ("No devices were found\n", 6)
        );
    }

    #[tokio::test]
    async fn a_killed_command_is_no_answer() {
        use fake::{End, Exec, PodNow};
        let frames = vec![(1, b"GPU 0: A1".to_vec()), fake::status(&exit("137"))];
        let e = run(Exec::Stream(frames.clone(), End::Close), PodNow::Running)
            .await
            .unwrap_err();
        assert!(matches!(e, NodeOpsError::Killed { signal: 9, .. }), "{e:?}");
        // Killed because its pod is being deleted: that says more.
        let e = run(Exec::Stream(frames, End::Close), PodNow::Deleting)
            .await
            .unwrap_err();
        assert!(matches!(e, NodeOpsError::PodDeleted { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "pod gpu-operator/nvidia-driver-abc was deleted while `nvidia-smi -L` ran in it; its output was discarded"
        );
    }

    #[tokio::test]
    async fn a_stream_without_an_exit_status_is_interrupted() {
        use fake::{End, Exec, PodNow};
        // The connection breaks mid-output (kube leaves the pipes open then: this must
        // not wait for the timeout).
        let started = std::time::Instant::now();
        let e = run(
            Exec::Stream(vec![(1, b"GPU 0: A1".to_vec())], End::Drop),
            PodNow::Running,
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(4), "{e:?}");
        assert!(
            matches!(e, NodeOpsError::Interrupted { ref detail, .. } if detail.contains("broke")),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(
                "`nvidia-smi -L` in pod gpu-operator/nvidia-driver-abc was interrupted"
            ),
            "{e}"
        );
        // Closed cleanly, but without a status.
        let e = run(
            Exec::Stream(vec![(1, b"GPU 0: A100\n".to_vec())], End::Close),
            PodNow::Running,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, NodeOpsError::Interrupted { ref detail, .. } if detail.contains("closed")),
            "{e:?}"
        );
        // The pod was deleted meanwhile.
        let e = run(
            Exec::Stream(vec![(1, b"GPU".to_vec())], End::Drop),
            PodNow::Gone,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, NodeOpsError::PodDeleted { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn refused_execs_name_the_pod_or_container() {
        use fake::{Exec, PodNow};
        let e = run(
            Exec::Refuse(404, "application/json", fake::not_found()),
            PodNow::Gone,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, NodeOpsError::PodNotFound { .. }), "{e:?}");
        // The kubelet's plain-text refusal, passed on by the API server.
        let e = run(
            Exec::Refuse(
                500,
                "text/plain",
                "container not found (\"nvidia-driver-ctr\")".into(),
            ),
            PodNow::Running,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, NodeOpsError::ContainerNotRunning { ref detail, .. } if detail.starts_with("container not found")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn the_timeout_is_the_runners_and_named() {
        use fake::{End, Exec, PodNow};
        for exec in [
            Exec::Silent,
            Exec::Stream(vec![(1, b"GPU".to_vec())], End::Hang),
        ] {
            let client = fake::client(exec, PodNow::Running).await;
            let runner = KubeExecRunner::new(client).with_timeout(Duration::from_millis(300));
            let e = runner.run(&pod(), &cmd()).await.unwrap_err();
            assert!(
                matches!(e, NodeOpsError::ExecTimeout { limit, .. } if limit == Duration::from_millis(300)),
                "{e:?}"
            );
            assert!(e.to_string().contains("within 300ms"), "{e}");
        }
        assert_eq!(KubeExecRunner::DEFAULT_TIMEOUT, Duration::from_secs(120));
    }
}
