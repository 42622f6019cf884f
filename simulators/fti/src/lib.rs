//! A simulator of the Fujitsu FTI composable fabric for tests, benchmarks, the local
//! demo and vendors.
//!
//! It serves, over real HTTP and HTTPS on 127.0.0.1, the three APIs of
//! `docs/fti-fabric-api.md`: the identity manager (Keycloak-style token endpoint issuing
//! HS256 JWTs), the Fabric Manager (FM: get / attach / detach on a machine) and the
//! Cluster Manager (CM: machine view with `resspecs` and an asynchronous resize). It
//! holds machines, the devices attached to them and a free pool per (type, model);
//! attach takes a device from the pool and detach returns it. CM changes show
//! `ADD_IN_PROGRESS` / `REMOVE_IN_PROGRESS` until [`SimConfig::cm_delay`] has passed.
//! Every request is recorded, and faults can be injected per test. A test running
//! several client processes can have each call recorded with the process it came from
//! ([`FabricSim::record_callers`], [`callers::PidResolver`], [`FabricSim::calls`]).
//!
//! ```
//! use std::time::Duration;
//! use fabric_sim::{FabricSim, Fault, Route, SimConfig};
//!
//! let sim = FabricSim::start(SimConfig::default().with_cm_delay(Duration::from_millis(50)))?;
//! sim.add_machine("6f1c2a9e-0000-4000-8000-000000000001", "worker-0");
//! sim.add_free_devices("gpu", "A100 40G", 2);
//! let seeded = sim.attach_directly("6f1c2a9e-0000-4000-8000-000000000001", "gpu", "A100 40G")?;
//! assert!(seeded.serial.starts_with("GPU-"));
//! assert_eq!(sim.free_devices("gpu", "A100 40G"), 2);
//!
//! // What a provider is configured with (FTI_CDI_ENDPOINT etc.).
//! assert!(sim.endpoint().starts_with("https://127.0.0.1:") && sim.endpoint().ends_with('/'));
//! assert!(sim.ca_pem().contains("BEGIN CERTIFICATE"));
//! let creds = sim.credentials();
//! assert!(!creds.client_secret.is_empty() && !sim.tenant_id().is_empty());
//!
//! // The next FM attach fails with an FTI error whose message is an object.
//! sim.inject(Fault::error_value(409, "E0001", serde_json::json!({"reason": "busy"}))
//!     .on(Route::FmAttach));
//! // Token requests are dropped until cleared.
//! sim.inject(Fault::Drop.on(Route::Token).always());
//! sim.clear_faults();
//! assert!(sim.token_requests().is_empty());
//! sim.shutdown();
//! # Ok::<(), fabric_sim::SimError>(())
//! ```
//!
//! # Replies the fabric documentation leaves open
//!
//! Errors of the FM and CM APIs are `{"status": N, "detail": {"code", "message"[, "data"]}}`
//! with HTTP status N; the codes the simulator uses are in [`codes`]:
//!
//! | situation | status | code |
//! |---|---|---|
//! | body not JSON, fields missing, ids not matching the path, bad `device_count` | 400 | `E0400` |
//! | no / invalid / unknown / revoked / expired bearer token | 401 | `E0401` |
//! | `tenant_uuid` query names another tenant | 403 | `E0403` |
//! | unknown path, machine, device, spec, or tenant/cluster in a CM path | 404 | `E0404` |
//! | wrong method on a known path | 405 | `E0405` |
//! | no free device: `"message": "no free resource of type gpu, model A100 40G (available: 0)"`, `"data": {"res_type", "model", "available"}` | 409 | `E0409` |
//! | CM remove of a device with a change in progress | 409 | `E0410` |
//!
//! The token endpoint answers like Keycloak: 401 `{"error": "invalid_grant",
//! "error_description": "Invalid user credentials"}` for a wrong user or password (and
//! for [`Fault::RejectCredentials`]), 401 `unauthorized_client` for a wrong client,
//! 400 `unsupported_grant_type` unless `grant_type=password`, 404 for another realm.
//!
//! FM attach replies 200 with the machine, the attached device(s) first in
//! `resources`, then the machine's other devices. FM detach replies 200 with the
//! machine after the detach. CM resize replies 202 with the machine view (the same
//! body as a CM GET). A CM spec's `device_count` counts devices in `ADD_IN_PROGRESS`,
//! `ADD_COMPLETE` and `REMOVE_FAILED`; an increase must ask for more than that (and
//! at most `max_resspec_count`), a remove for that count minus the listed devices it
//! counts (count minus all listed devices is accepted too, as the Go operator sends
//! current − 1 even for an `ADD_FAILED` device). `ADD_FAILED` devices stay
//! on the machine (listed by CM, not by FM) until removed. Every (type, model) the
//! simulator has seen is a spec of every machine, with one `spec_uuid` each.
//!
//! Device ids: `res_serial_num` / `device_id` is `GPU-<uuid>` for type `gpu`
//! (otherwise the upper-cased type, `-`, a uuid); `res_uuid` is another uuid. A
//! detached device goes back to the end of its pool, keeping ids and op status.

mod api;
pub mod callers;
mod config;
mod faults;
pub mod jwt;
mod record;
mod server;
pub mod setup;
mod shared;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::CertificateDer;
use sim_kit::{Controls, Server, SimControl, tls};

pub use api::codes;
pub use callers::{CallRecord, CallerResolver, PidResolver};
pub use config::{Clock, Credentials, SimConfig, system_clock};
pub use faults::{Fault, Injection};
pub use record::{RecordedRequest, Route};
pub use sim_kit::{FaultId, Scope, TlsError};
pub use state::{DEFAULT_FABRIC, DeviceStatus, SimDevice};

use shared::{Shared, lock};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot bind a loopback listener: {0}")]
    Bind(std::io::Error),
    #[error("cannot start the server thread: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("machine {0} not found")]
    UnknownMachine(String),
    #[error("device {0} not found")]
    UnknownDevice(String),
}

/// A machine known to the simulator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimMachine {
    pub uuid: String,
    pub name: String,
    /// The fabric whose pools the machine draws from.
    pub fabric_id: u64,
}

struct Inner {
    shared: Arc<Shared>,
    https_addr: SocketAddr,
    http_addr: SocketAddr,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    // Dropped with the last handle, which stops the server as well.
    server: Server,
    /// [`FabricSim::calls`] shows the requests after this one
    /// ([`FabricSim::clear_calls`]).
    calls_after: AtomicU64,
}

/// Handle to a running simulator. Cheap to clone; the server stops on
/// [`FabricSim::shutdown`] or when the last clone is dropped.
#[derive(Clone)]
pub struct FabricSim {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FabricSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricSim")
            .field("endpoint", &self.endpoint())
            .field("tenant_id", &self.tenant_id())
            .finish_non_exhaustive()
    }
}

impl FabricSim {
    /// Generates a CA and server certificate, binds HTTPS and HTTP on 127.0.0.1 and
    /// serves on a thread of its own. Needs no async runtime from the caller.
    pub fn start(config: SimConfig) -> Result<FabricSim, SimError> {
        let tls = tls::generate("fabric-sim")?;
        let listeners = server::bind(config.https_port, config.http_port, tls.server_config)
            .map_err(SimError::Bind)?;
        let https_addr = listeners[0].socket.local_addr().map_err(SimError::Bind)?;
        let http_addr = listeners[1].socket.local_addr().map_err(SimError::Bind)?;

        let mut secret = uuid::Uuid::new_v4().as_bytes().to_vec();
        secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        let shared = Arc::new(Shared::new(&config, &secret));

        let server = Server::start(
            format!("fabric-sim-{}", https_addr.port()),
            Arc::new(server::Fti::new(shared.clone())),
            listeners.into(),
        )
        .map_err(SimError::Runtime)?;
        Ok(FabricSim {
            inner: Arc::new(Inner {
                shared,
                https_addr,
                http_addr,
                ca_pem: tls.ca_pem,
                ca_der: tls.ca_der,
                server,
                calls_after: AtomicU64::new(0),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Stops the server and waits for its thread; open connections are closed.
    pub fn shutdown(&self) {
        self.inner.server.shutdown();
    }

    // ---- where and who ----

    /// `https://127.0.0.1:PORT/` — the value for `FTI_CDI_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("https://{}/", self.inner.https_addr)
    }

    /// `http://127.0.0.1:PORT/` — the same APIs without TLS.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}/", self.inner.http_addr)
    }

    pub fn https_addr(&self) -> SocketAddr {
        self.inner.https_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.inner.http_addr
    }

    /// PEM of the CA that signed the server certificate (SANs 127.0.0.1, localhost).
    pub fn ca_pem(&self) -> &str {
        &self.inner.ca_pem
    }

    pub fn ca_der(&self) -> &[u8] {
        self.inner.ca_der.as_ref()
    }

    /// A rustls client configuration (ring provider) trusting only this simulator's CA,
    /// e.g. for `reqwest::ClientBuilder::use_preconfigured_tls`.
    pub fn client_tls_config(&self) -> Result<rustls::ClientConfig, SimError> {
        Ok(tls::client_config(&self.inner.ca_der)?)
    }

    pub fn tenant_id(&self) -> &str {
        &self.shared().tenant_id
    }

    pub fn cluster_id(&self) -> &str {
        &self.shared().cluster_id
    }

    pub fn realm(&self) -> &str {
        &self.shared().realm
    }

    pub fn credentials(&self) -> Credentials {
        self.shared().credentials.clone()
    }

    /// The credentials Secret's data under the five keys the FTI provider reads
    /// (docs/fti-fabric-api.md): what a test or the conformance suite grants it.
    pub fn secret_data(&self) -> [(&'static str, String); 5] {
        let c = self.credentials();
        [
            ("username", c.username),
            ("password", c.password),
            ("client_id", c.client_id),
            ("client_secret", c.client_secret),
            ("realm", self.realm().to_string()),
        ]
    }

    pub fn fabric_uuid(&self) -> &str {
        &self.shared().fabric_uuid
    }

    /// The token path relative to the endpoint.
    pub fn token_path(&self) -> String {
        format!(
            "id_manager/realms/{}/protocol/openid-connect/token",
            self.realm()
        )
    }

    /// Now on the simulator's (possibly injected) clock.
    pub fn now(&self) -> SystemTime {
        self.shared().now()
    }

    // ---- seeding and inspecting state ----

    /// Adds a machine (or renames an existing one).
    pub fn add_machine(&self, uuid: &str, name: &str) {
        lock(&self.shared().fabric).add_machine(uuid, name);
    }

    pub fn machines(&self) -> Vec<SimMachine> {
        lock(&self.shared().fabric)
            .machines()
            .map(|m| SimMachine {
                uuid: m.uuid.clone(),
                name: m.name.clone(),
                fabric_id: m.fabric_id,
            })
            .collect()
    }

    /// Puts a machine on another fabric: it can then only take devices from that
    /// fabric's pools (the default fabric is [`DEFAULT_FABRIC`]).
    pub fn set_machine_fabric(&self, uuid: &str, fabric_id: u64) -> Result<(), SimError> {
        lock(&self.shared().fabric)
            .set_machine_fabric(uuid, fabric_id)
            .map_err(|_| SimError::UnknownMachine(uuid.to_string()))
    }

    /// Adds `n` new devices to the default fabric's free pool of (type, model) and
    /// returns them.
    pub fn add_free_devices(&self, res_type: &str, model: &str, n: usize) -> Vec<SimDevice> {
        self.add_free_devices_on(DEFAULT_FABRIC, res_type, model, n)
    }

    /// Adds `n` new devices to `fabric_id`'s free pool of (type, model).
    pub fn add_free_devices_on(
        &self,
        fabric_id: u64,
        res_type: &str,
        model: &str,
        n: usize,
    ) -> Vec<SimDevice> {
        lock(&self.shared().fabric).add_free(fabric_id, res_type, model, n)
    }

    /// Takes up to `n` free devices of (type, model) out of `fabric_id`'s pool behind
    /// the provider's back (another tenant took them); returns how many went.
    pub fn take_free_devices(
        &self,
        fabric_id: u64,
        res_type: &str,
        model: &str,
        n: usize,
    ) -> usize {
        lock(&self.shared().fabric).take_free_away(fabric_id, res_type, model, n)
    }

    /// Free devices of (type, model) in one fabric's pool.
    pub fn free_devices_on(&self, fabric_id: u64, res_type: &str, model: &str) -> usize {
        let mut fabric = lock(&self.shared().fabric);
        fabric.settle(Some(Instant::now()));
        fabric.free_in(fabric_id, res_type, model)
    }

    /// Seeds a new device attached to `machine` (`ADD_COMPLETE`); the pool is untouched.
    pub fn attach_directly(
        &self,
        machine: &str,
        res_type: &str,
        model: &str,
    ) -> Result<SimDevice, SimError> {
        lock(&self.shared().fabric)
            .attach_new(machine, res_type, model)
            .map_err(|_| SimError::UnknownMachine(machine.to_string()))
    }

    /// Takes a device (serial or `res_uuid`) off its machine back to its pool, as if
    /// someone detached it behind the provider's back.
    pub fn detach_directly(&self, id: &str) -> Result<SimDevice, SimError> {
        lock(&self.shared().fabric)
            .detach_any(id)
            .ok_or_else(|| SimError::UnknownDevice(id.to_string()))
    }

    /// Devices on `machine` (any CM status), in attach order; empty if unknown.
    pub fn machine_devices(&self, machine: &str) -> Vec<SimDevice> {
        let mut fabric = lock(&self.shared().fabric);
        fabric.settle(Some(Instant::now()));
        fabric
            .machine(machine)
            .map(|m| m.devices().cloned().collect())
            .unwrap_or_default()
    }

    /// A device, attached or free, by serial (`device_id`) or `res_uuid`.
    pub fn device(&self, id: &str) -> Option<SimDevice> {
        let mut fabric = lock(&self.shared().fabric);
        fabric.settle(Some(Instant::now()));
        fabric.device_mut(id).map(|d| d.clone())
    }

    pub fn free_devices(&self, res_type: &str, model: &str) -> usize {
        let mut fabric = lock(&self.shared().fabric);
        fabric.settle(Some(Instant::now()));
        fabric.free_count(res_type, model)
    }

    /// Sets `res_op_status` of a device found by serial or `res_uuid`.
    pub fn set_op_status(&self, id: &str, op_status: &str) -> Result<(), SimError> {
        let mut fabric = lock(&self.shared().fabric);
        let device = fabric
            .device_mut(id)
            .ok_or_else(|| SimError::UnknownDevice(id.to_string()))?;
        device.op_status = op_status.to_string();
        Ok(())
    }

    /// The CM `spec_uuid` of (type, model), created if the simulator has not seen it.
    pub fn spec_uuid(&self, res_type: &str, model: &str) -> String {
        lock(&self.shared().fabric).spec_uuid(res_type, model)
    }

    /// Delay of CM changes requested from now on.
    pub fn set_cm_delay(&self, delay: Duration) {
        lock(&self.shared().fabric).cm_delay = delay;
    }

    /// Finishes every pending CM change now (with its injected failure, if any).
    pub fn complete_pending(&self) {
        lock(&self.shared().fabric).settle(None);
    }

    // ---- tokens ----

    /// TTL of tokens issued from now on.
    pub fn set_token_ttl(&self, ttl: Duration) {
        *lock(&self.shared().token_ttl) = ttl;
    }

    /// A valid access token as the token endpoint would issue it, without a request.
    pub fn issue_token(&self) -> String {
        let s = self.shared();
        let ttl = i64::try_from(lock(&s.token_ttl).as_secs()).unwrap_or(i64::MAX / 2);
        let now = s.now_secs();
        s.issue_token(
            &s.credentials.username,
            now,
            now.saturating_add(ttl),
            "Bearer",
        )
    }

    /// Makes every token issued so far invalid (401 on next use), as after a restart
    /// of the identity manager.
    pub fn revoke_tokens(&self) {
        lock(&self.shared().tokens).clear();
    }

    // ---- faults ----

    /// Injects a fault; a bare [`Fault`] applies once, to any route.
    pub fn inject(&self, injection: impl Into<Injection>) -> FaultId {
        self.controls().inject(injection)
    }

    /// Removes one injection; false if it was used up or removed already.
    pub fn remove_fault(&self, id: FaultId) -> bool {
        self.controls().remove_fault(id)
    }

    pub fn clear_faults(&self) {
        self.controls().clear_faults();
    }

    /// Injections not used up yet.
    pub fn active_faults(&self) -> usize {
        self.controls().active_faults()
    }

    // ---- recorded requests ----

    /// Every request received since start or the last [`FabricSim::clear_requests`].
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.controls().requests()
    }

    pub fn requests_to(&self, route: Route) -> Vec<RecordedRequest> {
        self.controls().requests_to(route)
    }

    /// The sequence number of the newest request recorded (0: none yet, or cleared).
    /// Cheap, unlike [`FabricSim::requests`]: the node simulation asks on every command.
    pub fn last_seq(&self) -> u64 {
        self.controls().last_seq()
    }

    /// Whether a request to one of `routes` came after request `seq` and satisfies
    /// `pred`. Looks only at the requests after `seq` (they are kept in arrival order)
    /// and copies none: the node simulation asks for every GPU being drained, and a
    /// copy of every request each time made a run of N devices cost N² in the simulator.
    pub fn any_request_since(
        &self,
        seq: u64,
        routes: &[Route],
        pred: impl Fn(&RecordedRequest) -> bool,
    ) -> bool {
        self.controls().any_request_since(seq, routes, pred)
    }

    pub fn token_requests(&self) -> Vec<RecordedRequest> {
        self.requests_to(Route::Token)
    }

    pub fn clear_requests(&self) {
        self.controls().clear_requests();
    }

    // ---- callers ----

    /// Names the caller of connections with `resolver` (e.g. [`PidResolver::resolver`]:
    /// which of a test's processes owns the client's socket); [`FabricSim::calls`] shows
    /// the names. Asked as a connection is accepted, and again at each of its requests
    /// while it has no name (a connection open before this is named at its next
    /// request).
    pub fn record_callers(&self, resolver: CallerResolver) {
        self.controls().set_caller_resolver(Some(resolver));
    }

    /// Connections not named yet get no caller name any more.
    pub fn stop_recording_callers(&self) {
        self.controls().set_caller_resolver(None);
    }

    /// Every request received since start or the last [`FabricSim::clear_calls`], with
    /// its arrival time on the system clock, its client's address and the caller the
    /// resolver named ([`FabricSim::record_callers`]; None without one). A view of the
    /// request log ([`FabricSim::requests`]), so [`FabricSim::clear_requests`] clears
    /// it too.
    pub fn calls(&self) -> Vec<CallRecord> {
        let after = self.inner.calls_after.load(Ordering::Relaxed);
        self.controls().map_requests_since(after, |r| CallRecord {
            seq: r.seq,
            at: r.wall,
            method: r.method.clone(),
            path: r.path.clone(),
            route: r.route,
            peer: r.peer,
            caller: r.caller.clone(),
        })
    }

    /// Starts [`FabricSim::calls`] afresh. The request log itself is kept: the node
    /// simulation reads it ([`FabricSim::any_request_since`]).
    pub fn clear_calls(&self) {
        // The requests numbered so far are hidden; numbers only grow, so newer ones show.
        let last = self.controls().last_seq();
        self.inner.calls_after.fetch_max(last, Ordering::Relaxed);
    }
}

impl SimControl for FabricSim {
    type Fault = Fault;
    type Route = Route;

    fn endpoint(&self) -> String {
        FabricSim::endpoint(self)
    }

    fn controls(&self) -> &Controls<Fault, Route> {
        &self.shared().controls
    }

    fn shutdown(&self) {
        FabricSim::shutdown(self);
    }
}
