//! Running a command in a pod through the Kubernetes exec API.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use tokio::io::AsyncReadExt;

use super::NodeOpsError;

/// How long one command may run on a node before it counts as failed.
const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// Output beyond this is cut; nvidia-smi's answers are a few lines.
const MAX_OUTPUT: u64 = 1 << 20;

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
}

impl KubeExecRunner {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    async fn exec(&self, pod: &PodRef, command: &[String]) -> Result<ExecOutput, NodeOpsError> {
        let exec_err = |message: String| NodeOpsError::Exec {
            pod: pod.to_string(),
            message,
        };
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
            .map_err(|e| exec_err(e.to_string()))?;
        let (Some(stdout), Some(stderr)) = (process.stdout(), process.stderr()) else {
            return Err(exec_err("the exec stream has no stdout or stderr".into()));
        };
        let status = process.take_status();
        let read = |r| async move {
            let mut buf = Vec::new();
            tokio::io::AsyncReadExt::take(r, MAX_OUTPUT)
                .read_to_end(&mut buf)
                .await
                .map(|_| String::from_utf8_lossy(&buf).into_owned())
        };
        let (out, err) = tokio::try_join!(read(stdout), read(stderr))
            .map_err(|e| exec_err(format!("reading output: {e}")))?;
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        let _ = process.join().await;
        Ok(ExecOutput {
            stdout: out,
            stderr: err,
            exit_code: exit_code(status.as_ref()),
        })
    }
}

/// The API server reports a non-zero exit as a Status with reason NonZeroExitCode and
/// a cause `ExitCode`; success has status "Success".
fn exit_code(status: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> i32 {
    let Some(status) = status else { return -1 };
    if status.status.as_deref() == Some("Success") {
        return 0;
    }
    status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|causes| {
            causes
                .iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))
                .and_then(|c| c.message.as_deref())
                .and_then(|m| m.parse().ok())
        })
        .unwrap_or(-1)
}

impl CommandRunner for KubeExecRunner {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(async move {
            tokio::time::timeout(EXEC_TIMEOUT, self.exec(pod, command))
                .await
                .unwrap_or_else(|_| {
                    Err(NodeOpsError::Exec {
                        pod: pod.to_string(),
                        message: format!("no answer within {EXEC_TIMEOUT:?}"),
                    })
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

    #[test]
    fn exit_codes_from_status() {
        assert_eq!(exit_code(None), -1);
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&ok)), 0);
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("6".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&failed)), 6);
    }
}
