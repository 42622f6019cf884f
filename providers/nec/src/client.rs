//! HTTP to CDIM's two services, and the shapes of their replies the provider reads.
//! CDIM takes no credentials (neither does the Go client). An error reply's
//! `{"code", "message"}` becomes the fabric error's code and message.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use cro_provider_sdk::json::{body_text, http_failure, parse_json};
use cro_provider_sdk::lenient;
use cro_provider_sdk::{Host, HttpRequest, HttpResponse, Method, ProviderError};

use crate::config::{API_BASE, Config};

/// The fabric adapter type on a node's I/O side, and the link type of a GPU connected
/// to it.
pub const IO_ADAPTER: &str = "destinationFabricAdapter";
/// The fabric adapter type on a node's host side.
pub const HOST_ADAPTER: &str = "sourceFabricAdapter";
/// CDIM's code for "a layout apply is already running".
pub const ALREADY_RUNNING: &str = "E40010";

/// One resource of the configuration manager.
#[derive(Debug, Clone, Deserialize)]
pub struct Entry {
    pub device: Device,
    #[serde(default)]
    pub detected: bool,
    #[serde(rename = "nodeIDs", default, deserialize_with = "lenient::list")]
    pub node_ids: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    #[serde(rename = "deviceID", default)]
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub attribute: Value,
    #[serde(default)]
    pub status: Status,
    #[serde(default, deserialize_with = "lenient::list")]
    pub links: Vec<Link>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub health: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Link {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(rename = "deviceID", default)]
    pub id: String,
}

impl Device {
    pub fn is_gpu(&self) -> bool {
        self.kind.eq_ignore_ascii_case("gpu")
    }

    /// `attribute.deviceSpecificInformation.status`, the ExpEther role of an adapter.
    fn role(&self) -> Option<&str> {
        self.attribute
            .get("deviceSpecificInformation")?
            .get("status")?
            .as_str()
    }

    /// A node's host-side adapter (ExpEther `eesv`).
    pub fn is_host_adapter(&self) -> bool {
        self.kind.eq_ignore_ascii_case(HOST_ADAPTER)
            && self.role().is_some_and(|r| r.eq_ignore_ascii_case("eesv"))
    }

    /// An I/O-side adapter (ExpEther `eeio`), what a GPU is connected to.
    pub fn is_io_adapter(&self) -> bool {
        self.kind.eq_ignore_ascii_case(IO_ADAPTER)
            && self.role().is_some_and(|r| r.eq_ignore_ascii_case("eeio"))
    }

    /// The I/O adapter a GPU is connected to. The link's type is the linked device's
    /// (`destinationFabricAdapter`); the Go client also takes a link typed `eeio` for
    /// one, so this does too.
    pub fn connected_to(&self) -> Option<&str> {
        self.links
            .iter()
            .find(|l| {
                !l.id.is_empty()
                    && (l.kind.eq_ignore_ascii_case(IO_ADAPTER)
                        || l.kind.eq_ignore_ascii_case("eeio"))
            })
            .map(|l| l.id.as_str())
    }

    /// `Enabled` and `OK`, as the Go client requires of a GPU to attach or to pass a
    /// check.
    pub fn healthy(&self) -> bool {
        self.status.state.eq_ignore_ascii_case("enabled")
            && self.status.health.eq_ignore_ascii_case("ok")
    }
}

#[derive(Debug, Deserialize)]
pub struct ResourceList {
    #[serde(default, deserialize_with = "lenient::list")]
    pub resources: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
pub struct NodeList {
    #[serde(default, deserialize_with = "lenient::list")]
    pub nodes: Vec<NodeEntry>,
}

#[derive(Debug, Deserialize)]
pub struct NodeEntry {
    #[serde(default)]
    pub id: String,
    #[serde(default, deserialize_with = "lenient::list")]
    pub resources: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Accepted {
    #[serde(rename = "applyID", default)]
    apply_id: String,
}

/// A layout apply's state.
#[derive(Debug, Clone, Deserialize)]
pub struct ApplyState {
    #[serde(default)]
    pub status: String,
    #[serde(rename = "rollbackStatus", default)]
    pub rollback_status: Option<String>,
}

/// What a layout apply's status means to the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Running,
    Completed,
    /// Ended without doing what it was asked: FAILED, CANCELED (rolled back or not).
    Failed,
    /// Stopped on a critical error: CDIM takes no other apply until an administrator
    /// resumes or cancels it.
    Suspended,
}

impl ApplyState {
    pub fn phase(&self) -> Result<Phase, ProviderError> {
        Ok(match self.status.to_ascii_uppercase().as_str() {
            // An empty status is what the Go client also waits on.
            "IN_PROGRESS" | "CANCELING" | "" => Phase::Running,
            "COMPLETED" => Phase::Completed,
            "FAILED" | "CANCELED" => Phase::Failed,
            "SUSPENDED" => Phase::Suspended,
            other => {
                return Err(ProviderError::malformed(format!(
                    "a layout apply reports status {other:?}, not one CDIM defines"
                )));
            }
        })
    }

    /// `status=… rollbackStatus=…`, for messages.
    pub fn describe(&self) -> String {
        match &self.rollback_status {
            Some(r) => format!("status {} (rollbackStatus {r})", self.status),
            None => format!("status {}", self.status),
        }
    }
}

/// One procedure of a layout apply, as the Go client sends it.
pub fn procedure(operation: &str, io: &str, gpu: &str) -> Value {
    json!({"procedures": [{
        "operationID": 1,
        "operation": operation,
        "sourceDeviceID": io,
        "destinationDeviceID": gpu,
        "dependencies": [],
    }]})
}

/// CDIM over the host.
pub struct Client<'a, H: Host + ?Sized> {
    host: &'a H,
    pub cfg: &'a Config,
}

impl<'a, H: Host + ?Sized> Client<'a, H> {
    pub fn new(host: &'a H, cfg: &'a Config) -> Self {
        Client { host, cfg }
    }

    pub fn host(&self) -> &'a H {
        self.host
    }

    fn send(
        &self,
        peer: &str,
        method: Method,
        url: String,
        body: Option<&Value>,
    ) -> Result<HttpResponse, ProviderError> {
        let mut headers = vec![("accept".to_string(), "application/json".to_string())];
        let body = match body {
            Some(b) => {
                headers.push(("content-type".into(), "application/json".into()));
                serde_json::to_vec(b).map_err(|e| {
                    ProviderError::Other(format!("encoding the request to the {peer}: {e}"))
                })?
            }
            None => Vec::new(),
        };
        self.host
            .http_send(HttpRequest {
                method,
                url,
                headers,
                body,
                timeout_ms: Some(self.cfg.timeout_ms),
            })
            .map_err(|e| http_failure(peer, e))
    }

    /// `GET` of a configuration-manager path (under `/cdim/api/v1`), parsed as `T`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ProviderError> {
        let url = format!("{}{API_BASE}{path}", self.cfg.configuration_manager);
        let reply = self.send("CDIM configuration manager", Method::Get, url, None)?;
        expect(&reply, path)
    }

    /// One resource (`/resources/{id}`); `None` when CDIM does not know it. The Go
    /// client also accepts the entry wrapped in `{"resource": …}`, so this does too.
    pub fn resource(&self, id: &str) -> Result<Option<Entry>, ProviderError> {
        let path = format!("/resources/{}", cro_provider_sdk::encode::component(id));
        let url = format!("{}{API_BASE}{path}", self.cfg.configuration_manager);
        let reply = self.send("CDIM configuration manager", Method::Get, url, None)?;
        if reply.status == 404 {
            return Ok(None);
        }
        let v: Value = expect(&reply, &path)?;
        let v = match v.get("resource") {
            Some(inner) if v.get("device").is_none() => inner.clone(),
            _ => v,
        };
        serde_json::from_value(v)
            .map(Some)
            .map_err(|e| ProviderError::malformed(format!("{path}: {e}")))
    }

    /// Every resource, in detail.
    pub fn resources(&self) -> Result<Vec<Entry>, ProviderError> {
        Ok(self
            .get::<ResourceList>("/resources?detail=true")?
            .resources)
    }

    /// Every node with its resources, in detail.
    pub fn nodes(&self) -> Result<Vec<NodeEntry>, ProviderError> {
        Ok(self.get::<NodeList>("/nodes?detail=true")?.nodes)
    }

    /// Starts a layout apply; its id.
    pub fn apply(&self, body: &Value) -> Result<String, ProviderError> {
        let url = format!("{}{API_BASE}/layout-apply", self.cfg.layout_apply);
        let reply = self.send("CDIM layout-apply service", Method::Post, url, Some(body))?;
        let accepted: Accepted = expect(&reply, "/layout-apply")?;
        if accepted.apply_id.trim().is_empty() {
            return Err(ProviderError::malformed(
                "/layout-apply accepted the request without an applyID",
            ));
        }
        Ok(accepted.apply_id)
    }

    /// A layout apply's state; `None` when CDIM does not know the id.
    pub fn apply_state(&self, id: &str) -> Result<Option<ApplyState>, ProviderError> {
        let path = format!("/layout-apply/{}", cro_provider_sdk::encode::component(id));
        let url = format!("{}{API_BASE}{path}", self.cfg.layout_apply);
        let reply = self.send("CDIM layout-apply service", Method::Get, url, None)?;
        if reply.status == 404 {
            return Ok(None);
        }
        expect(&reply, &path).map(Some)
    }
}

/// A 2xx reply parsed as `T`; otherwise the reply's typed error.
fn expect<T: DeserializeOwned>(reply: &HttpResponse, what: &str) -> Result<T, ProviderError> {
    if !(200..300).contains(&reply.status) {
        return Err(error_of(reply));
    }
    parse_json(&reply.body, what)
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default, deserialize_with = "lenient::string")]
    code: Option<String>,
    #[serde(default)]
    message: String,
}

/// The fabric error of a non-2xx reply: CDIM's `code` and `message`, or the body
/// verbatim with no code.
pub fn error_of(reply: &HttpResponse) -> ProviderError {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(&reply.body) {
        Ok(b) if b.code.is_some() || !b.message.is_empty() => {
            (b.code.unwrap_or_default(), b.message)
        }
        _ => (String::new(), body_text(&reply.body)),
    };
    ProviderError::Fabric {
        status: reply.status,
        code,
        message,
    }
}

/// Whether CDIM refused a layout apply because another one is running: the Go client
/// waits then, and so does this provider.
pub fn already_running(e: &ProviderError) -> bool {
    matches!(e, ProviderError::Fabric { status: 409, code, .. } if code == ALREADY_RUNNING)
}
