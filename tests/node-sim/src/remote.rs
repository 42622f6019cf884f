//! The operator's [`CommandRunner`] for an operator in another process than the node
//! simulation: each command goes over HTTP to the test's stand-in service
//! ([`crate::Standin`], the same `POST /v1/exec` the stand-in pods' binary uses) and is
//! answered there by the one [`SimNodes`](crate::SimNodes) of the test. So several
//! operator processes (replicas a test kills and stops) share the nodes, and each
//! command is answered as the in-process runner would answer it: the same output, the
//! same refusals (an unknown or not-ready pod, an unreachable node) as
//! [`NodeOpsError::Exec`], the same test hook.

use std::sync::Arc;
use std::time::Duration;

use cro_operator::nodeops::{CommandRunner, ExecOutput, NodeOpsError, PodRef};
use futures::future::BoxFuture;

use crate::standin::{ExecReply, ExecRequest};

/// The service is on loopback: it answers a connection at once or is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Characters of a command shown in an error, as the operator's own runner cuts them.
const COMMAND_IN_ERRORS: usize = 120;

#[derive(Debug, thiserror::Error)]
pub enum StandinRunnerError {
    #[error("the stand-in service URL {0:?} is not an http:// URL")]
    Url(String),
    #[error("cannot set up TLS for the HTTP client: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Runs each command through the stand-in service at a URL ([`crate::Standin::url`]).
#[derive(Clone, Debug)]
pub struct StandinRunner {
    /// `http://host:port` without a trailing slash.
    url: String,
    http: reqwest::Client,
}

impl StandinRunner {
    /// A runner sending to the stand-in service at `url` (`http://127.0.0.1:PORT`).
    /// No request is made until a command runs.
    pub fn new(url: &str) -> Result<Self, StandinRunnerError> {
        if !url.starts_with("http://") {
            return Err(StandinRunnerError::Url(url.to_owned()));
        }
        // The client never speaks TLS, but reqwest (built without a default crypto
        // provider) sets TLS up anyway: give it its own rather than rely on the
        // process having installed one.
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            // HTTP_PROXY in a test's environment must not catch loopback requests.
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            // No overall timeout: a command the test's hook holds never returns, as
            // in-process; the operator bounds its own waits.
            .build()?;
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            http,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn exec(&self, pod: &PodRef, command: &[String]) -> Result<ExecOutput, NodeOpsError> {
        let exec_err = |message: String| NodeOpsError::Exec {
            pod: pod.to_string(),
            message,
        };
        let request = ExecRequest {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            node: pod.node.clone(),
            kind: String::new(),
            argv: command.to_vec(),
            container: pod.container.clone(),
            runner: true,
        };
        let response = self
            .http
            .post(format!("{}/v1/exec", self.url))
            .json(&request)
            .send()
            .await
            .map_err(|e| {
                exec_err(format!(
                    "the stand-in service at {} is unreachable: {}",
                    self.url,
                    error_chain(&e)
                ))
            })?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| {
            exec_err(format!(
                "the stand-in service's reply was cut: {}",
                error_chain(&e)
            ))
        })?;
        if !status.is_success() {
            return Err(exec_err(format!(
                "the stand-in service answered {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let reply: ExecReply = serde_json::from_slice(&body)
            .map_err(|e| exec_err(format!("bad reply from the stand-in service: {e}")))?;
        from_reply(pod, command, reply)
    }
}

/// What the operator's runner makes of a reply: the simulation's refusal as the
/// in-process runner's error; a command killed by a signal (a test's
/// [`crate::ExecFault::Signal`]) as the exec runner reports one.
fn from_reply(
    pod: &PodRef,
    command: &[String],
    reply: ExecReply,
) -> Result<ExecOutput, NodeOpsError> {
    if let Some(message) = reply.error {
        return Err(NodeOpsError::Exec {
            pod: pod.to_string(),
            message,
        });
    }
    if let Some(signal) = reply.signal {
        return Err(NodeOpsError::Killed {
            pod: pod.to_string(),
            command: command_text(command),
            signal,
        });
    }
    Ok(ExecOutput {
        stdout: reply.stdout,
        stderr: reply.stderr,
        exit_code: reply.code,
    })
}

/// A command as the operator's errors show it: its words, cut after
/// [`COMMAND_IN_ERRORS`] characters.
fn command_text(command: &[String]) -> String {
    let text = command.join(" ");
    match text.char_indices().nth(COMMAND_IN_ERRORS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// An error with its causes: reqwest's own message rarely says why.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl CommandRunner for StandinRunner {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(self.exec(pod, command))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{DriverKind, NodeOptions, PodKind};
    use crate::runner::{ExecPath, ExecPod, SimNodes};
    use crate::standin::{ExecFault, Standin};
    use fabric_sim::{FabricSim, SimConfig};

    const NODE: &str = "node-1";

    fn pod(namespace: &str, name: &str, node: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
            node: node.into(),
            container: Some("main".into()),
        }
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    /// A node with a GPU, a Ready driver pod and one still starting, as the cluster
    /// side of the simulation makes them.
    fn nodes() -> (FabricSim, SimNodes) {
        let fabric = FabricSim::start(SimConfig::default()).unwrap();
        fabric.add_machine("m1", "m1");
        fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let nodes = SimNodes::new(fabric.clone());
        nodes.insert_node(
            NODE,
            "m1",
            DriverKind::GpuOperator,
            NodeOptions::default(),
            None,
        );
        let mut world = nodes.lock();
        for (name, ready) in [("driver", true), ("starting", false)] {
            world.pods.insert(
                ("gpu-operator".into(), name.into()),
                ExecPod {
                    kind: PodKind::Driver,
                    node: NODE.into(),
                    ready,
                },
            );
        }
        drop(world);
        (fabric, nodes)
    }

    /// What a runner made of a command, comparable: the output, or the error's text.
    async fn outcome(runner: &dyn CommandRunner, pod: &PodRef, command: &[&str]) -> String {
        match runner.run(pod, &argv(command)).await {
            Ok(out) => format!("{out:?}"),
            Err(e) => format!("error: {e}"),
        }
    }

    #[tokio::test]
    async fn answers_as_the_in_process_runner() {
        let (_fabric, nodes) = nodes();
        let standin = Standin::start(nodes.clone()).unwrap();
        let remote = StandinRunner::new(standin.url()).unwrap();
        nodes.set_unreachable("node-2", true);
        let driver = pod("gpu-operator", "driver", NODE);
        let cases: Vec<(PodRef, Vec<&str>)> = vec![
            (
                driver.clone(),
                vec![
                    "nvidia-smi",
                    "--query-gpu=gpu_uuid,pci.bus_id",
                    "--format=csv,noheader,nounits",
                ],
            ),
            (driver.clone(), vec!["nvidia-smi"]),
            // Unknown to the simulation: exit 127, recorded as unknown.
            (driver.clone(), vec!["nvidia-smi", "--bogus"]),
            // Refusals: not ready, no such pod, the pod on another node, the node's
            // kubelet unreachable.
            (pod("gpu-operator", "starting", NODE), vec!["nvidia-smi"]),
            (pod("gpu-operator", "gone", NODE), vec!["nvidia-smi"]),
            (pod("gpu-operator", "driver", "node-3"), vec!["nvidia-smi"]),
            (pod("gpu-operator", "driver", "node-2"), vec!["nvidia-smi"]),
        ];
        for (pod, command) in &cases {
            let local = outcome(&nodes, pod, command).await;
            let forwarded = outcome(&remote, pod, command).await;
            assert_eq!(forwarded, local, "{pod} {command:?}");
        }
        assert!(
            outcome(&nodes, &driver, &["nvidia-smi"])
                .await
                .contains("1 GPUs")
        );
        assert!(
            outcome(&remote, &cases[3].0, &["nvidia-smi"])
                .await
                .contains("container not ready")
        );

        // Each ran once each way, and the forwarded ones are told apart.
        let n = cases.len();
        assert_eq!(nodes.commands_via(ExecPath::InProcess).len(), n + 1);
        assert_eq!(nodes.commands_via(ExecPath::Forwarded).len(), n + 1);
        assert_eq!(
            nodes.unknown_commands().len(),
            2 + 2,
            "--bogus and node-3, twice"
        );
        assert_eq!(standin.exec_answered().len(), n + 1);
        // A runner's command does not make its pod exist, unlike a stand-in pod's.
        assert!(
            !nodes
                .lock()
                .pods
                .contains_key(&("gpu-operator".to_owned(), "gone".to_owned()))
        );
    }

    #[tokio::test]
    async fn faults_and_failures_reach_the_operator_as_errors() {
        let (_fabric, nodes) = nodes();
        let standin = Standin::start(nodes.clone()).unwrap();
        let remote = StandinRunner::new(&format!("{}/", standin.url())).unwrap();
        let driver = pod("gpu-operator", "driver", NODE);

        standin.inject(&["nvidia-smi"], ExecFault::Signal(9));
        let e = remote
            .run(&driver, &argv(&["nvidia-smi"]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, NodeOpsError::Killed { signal: 9, command, .. } if command == "nvidia-smi"),
            "{e:?}"
        );
        standin.inject(&["nvidia-smi"], ExecFault::reply("odd", "", 3));
        let out = remote.run(&driver, &argv(&["nvidia-smi"])).await.unwrap();
        assert_eq!((out.stdout.as_str(), out.exit_code), ("odd", 3));

        // The service refusing the request, and the service gone.
        let e = remote.run(&driver, &[]).await.unwrap_err();
        assert!(e.to_string().contains("400"), "{e}");
        let url = standin.url().to_owned();
        drop(standin);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let e = remote
            .run(&driver, &argv(&["nvidia-smi"]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, NodeOpsError::Exec { message, .. } if message.contains(&url)),
            "{e:?}"
        );
        assert!(e.is_transient());

        assert!(matches!(
            StandinRunner::new("https://127.0.0.1:1"),
            Err(StandinRunnerError::Url(_))
        ));
    }

    #[test]
    fn commands_in_errors_are_cut() {
        let long = vec!["x".repeat(200)];
        assert_eq!(command_text(&long).chars().count(), COMMAND_IN_ERRORS + 1);
        assert_eq!(command_text(&argv(&["a", "b"])), "a b");
    }
}
