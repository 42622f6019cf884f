//! The two sockets the kubelet talks to: the registration socket its plugin watcher finds
//! under `plugins_registry/`, and the DRA service it then calls for prepare and unprepare.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::cdi::{SpecDir, is_uid};
use crate::claims::{self, ClaimError};
use crate::proto::{self, dra, registration};
use crate::{Config, PluginError};

/// The kubelet's name for a DRA plugin in the registration API.
const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service this plugin offers, as the kubelet names it (`<package>.<service>`).
const SERVICE_V1: &str = "v1.DRAPlugin";
/// One claim read: the kubelet's own call times out after 45 s and retries.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PluginError {
    let what = what.into();
    move |source| PluginError::Io { what, source }
}

/// Binds a unix socket at `path`, replacing one a previous run left.
fn bind(path: &Path) -> Result<UnixListener, PluginError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("remove the stale socket {}", path.display()))(e));
        }
        _ => {}
    }
    UnixListener::bind(path).map_err(io(format!("listen on {}", path.display())))
}

pub(crate) async fn serve(
    client: kube::Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), PluginError> {
    let driver = cro_api::DRA_DRIVER;
    let endpoint: PathBuf = config
        .kubelet_dir
        .join("plugins")
        .join(driver)
        .join("dra.sock");
    let registration_sock = config
        .kubelet_dir
        .join("plugins_registry")
        .join(format!("{driver}-reg.sock"));
    // The DRA socket first: the kubelet calls it as soon as registration succeeds.
    let dra_listener = bind(&endpoint)?;
    let registration_listener = bind(&registration_sock)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let plugin = Plugin {
        client,
        node: config.node_name.clone(),
        specs: SpecDir::new(&config.cdi_dir),
    };
    let registrar = Registrar {
        endpoint: endpoint.display().to_string(),
    };
    tracing::info!(
        node = %config.node_name,
        registration = %registration_sock.display(),
        endpoint = %endpoint.display(),
        "kubelet plugin serving"
    );
    let dra_server = tonic::transport::Server::builder()
        .add_service(dra::d_r_a_plugin_server::DRAPluginServer::new(plugin))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(dra_listener),
            stopped(stop_rx.clone()),
        );
    let registration_server = tonic::transport::Server::builder()
        .add_service(registration::registration_server::RegistrationServer::new(
            registrar,
        ))
        .serve_with_incoming_shutdown(
            crate::authority::relay(registration_listener),
            stopped(stop_rx),
        );
    let (dra_result, registration_result) = tokio::join!(dra_server, registration_server);
    // Gone from plugins_registry: the kubelet unregisters the driver.
    let _ = std::fs::remove_file(&registration_sock);
    let _ = std::fs::remove_file(&endpoint);
    dra_result.map_err(|source| PluginError::Serve {
        which: "DRA",
        source,
    })?;
    registration_result.map_err(|source| PluginError::Serve {
        which: "registration",
        source,
    })
}

struct Registrar {
    endpoint: String,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<proto::InfoRequest>,
    ) -> Result<Response<proto::PluginInfo>, Status> {
        Ok(Response::new(proto::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: cro_api::DRA_DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![SERVICE_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<proto::RegistrationStatus>,
    ) -> Result<Response<proto::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!("the kubelet registered the plugin");
        } else {
            tracing::error!(error = %status.error, "the kubelet refused the plugin");
        }
        Ok(Response::new(proto::RegistrationStatusResponse {}))
    }
}

struct Plugin {
    client: kube::Client,
    node: String,
    specs: SpecDir,
}

/// Why one claim's prepare failed, as the kubelet shows it in the Pod's events.
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    #[error("{0:?} is not a claim UID")]
    BadUid(String),
    #[error("cannot read ResourceClaim {namespace}/{name}: {message}")]
    Read {
        namespace: String,
        name: String,
        message: String,
    },
    #[error("ResourceClaim {namespace}/{name}: {source}")]
    Claim {
        namespace: String,
        name: String,
        #[source]
        source: ClaimError,
    },
    #[error("cannot write the CDI spec of claim {uid}: {source}")]
    Write {
        uid: String,
        #[source]
        source: std::io::Error,
    },
}

impl Plugin {
    async fn read(&self, claim: &proto::Claim) -> Result<ResourceClaim, PrepareError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let read_error = |message: String| PrepareError::Read {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            message,
        };
        match tokio::time::timeout(READ_TIMEOUT, api.get(&claim.name)).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(read_error(e.to_string())),
            Err(_) => Err(read_error(format!("no answer within {READ_TIMEOUT:?}"))),
        }
    }

    async fn prepare(&self, claim: &proto::Claim) -> Result<Vec<proto::Device>, PrepareError> {
        if !is_uid(&claim.uid) {
            return Err(PrepareError::BadUid(claim.uid.clone()));
        }
        let object = self.read(claim).await?;
        let plan = claims::plan(&object, &claim.uid, &self.node).map_err(|source| {
            PrepareError::Claim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                source,
            }
        })?;
        if let Some(spec) = &plan.spec {
            self.specs
                .write(&claim.uid, spec)
                .map_err(|source| PrepareError::Write {
                    uid: claim.uid.clone(),
                    source,
                })?;
        }
        Ok(plan
            .devices
            .into_iter()
            .map(|d| proto::Device {
                request_names: vec![d.request],
                pool_name: d.pool,
                device_name: d.device,
                cdi_device_ids: d.cdi_id.into_iter().collect(),
                share_id: None,
            })
            .collect())
    }

    fn unprepare(&self, claim: &proto::Claim) -> Result<(), PrepareError> {
        if !is_uid(&claim.uid) {
            return Err(PrepareError::BadUid(claim.uid.clone()));
        }
        self.specs
            .remove(&claim.uid)
            .map_err(|source| PrepareError::Write {
                uid: claim.uid.clone(),
                source,
            })
    }
}

#[tonic::async_trait]
impl dra::d_r_a_plugin_server::DRAPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        request: Request<proto::NodePrepareResourcesRequest>,
    ) -> Result<Response<proto::NodePrepareResourcesResponse>, Status> {
        let mut response = proto::NodePrepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let answer = match self.prepare(&claim).await {
                Ok(devices) => {
                    tracing::info!(claim = %claim.name, namespace = %claim.namespace,
                        devices = devices.len(), "prepared");
                    proto::NodePrepareResourceResponse {
                        devices,
                        error: String::new(),
                    }
                }
                Err(e) => {
                    tracing::warn!(claim = %claim.name, namespace = %claim.namespace,
                        error = %e, "not prepared");
                    proto::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            response.claims.insert(claim.uid, answer);
        }
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<proto::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<proto::NodeUnprepareResourcesResponse>, Status> {
        let mut response = proto::NodeUnprepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let error = match self.unprepare(&claim) {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
            response
                .claims
                .insert(claim.uid, proto::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(response))
    }
}
