//! A simulator of a DMTF Redfish composition service, for tests, the Redfish provider
//! and vendors: `docs/redfish-api.md` says what it serves and which composition style
//! it follows.
//!
//! It serves over real HTTP on 127.0.0.1: the service root, the SessionService
//! (log in with `POST /redfish/v1/SessionService/Sessions`, then `X-Auth-Token`), the
//! CompositionService with its ResourceBlocks (one GPU or one CXL memory device each,
//! `Unused` / `Composing` / `Composed`), the cluster's ComputerSystems, and a TaskService.
//! A system is recomposed by PATCHing its `Links.ResourceBlocks`; with a compose delay
//! the PATCH answers 202 with a task monitor. Every request is recorded and faults can
//! be injected per route.
//!
//! ```
//! use std::time::Duration;
//! use redfish_sim::{Fault, RedfishSim, Route, SimConfig};
//!
//! let sim = RedfishSim::start(SimConfig::default())?;
//! sim.add_system("worker-0");
//! let gpu = sim.add_gpu_block("NVIDIA A100 80GB");
//! assert_eq!(sim.block(&gpu.id).unwrap().state.as_str(), "Unused");
//! sim.set_compose_delay(Duration::from_millis(200));
//! sim.inject(Fault::Drop.on(Route::SystemPatch));
//! assert!(sim.endpoint().starts_with("http://127.0.0.1:"));
//! sim.shutdown();
//! # Ok::<(), redfish_sim::SimError>(())
//! ```

mod api;
mod faults;
mod route;
mod server;
mod shared;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sim_kit::{Controls, Listener, Server, SimControl, bind_loopback};

pub use api::BASE as BASE_REGISTRY;
pub use faults::{Fault, Injection};
pub use route::Route;
pub use shared::RecordedRequest;
pub use sim_kit::{FaultId, Scope};
pub use state::{Block, BlockKind, CompositionState, System, TaskState};

use shared::{Fixed, Shared, lock};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot bind a loopback listener: {0}")]
    Bind(std::io::Error),
    #[error("cannot start the server thread: {0}")]
    Runtime(std::io::Error),
    #[error("resource block {0} not found")]
    UnknownBlock(String),
    #[error("health must be OK, Warning or Critical, not {0}")]
    BadHealth(String),
}

/// How the simulator starts.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub username: String,
    pub password: String,
    /// A session unused for this long ends (`SessionService.SessionTimeout`).
    pub session_timeout: Duration,
    /// How long a recomposition takes; zero answers the PATCH at once (200).
    pub compose_delay: Duration,
    /// 0 picks a free port.
    pub port: u16,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            username: "admin".into(),
            password: "redfish-sim-password".into(),
            session_timeout: Duration::from_secs(1800),
            compose_delay: Duration::ZERO,
            port: 0,
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    addr: SocketAddr,
    // Dropped with the last handle, which stops the server as well.
    server: Server,
}

/// Handle to a running simulator. Cheap to clone; the server stops on
/// [`RedfishSim::shutdown`] or when the last clone is dropped.
#[derive(Clone)]
pub struct RedfishSim {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedfishSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishSim")
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

impl RedfishSim {
    /// Binds 127.0.0.1 and serves on a thread of its own (no async runtime needed).
    pub fn start(config: SimConfig) -> Result<RedfishSim, SimError> {
        let listener = bind_loopback(config.port).map_err(SimError::Bind)?;
        let addr = listener.local_addr().map_err(SimError::Bind)?;
        let shared = Arc::new(Shared {
            config: Fixed {
                username: config.username,
                password: config.password,
                session_timeout: config.session_timeout,
            },
            state: Mutex::default(),
            compose_delay: Mutex::new(config.compose_delay),
            controls: Controls::default(),
        });
        let server = Server::start(
            format!("redfish-sim-{}", addr.port()),
            Arc::new(server::Redfish {
                shared: shared.clone(),
            }),
            vec![Listener {
                socket: listener,
                tls: None,
            }],
        )
        .map_err(SimError::Runtime)?;
        Ok(RedfishSim {
            inner: Arc::new(Inner {
                shared,
                addr,
                server,
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Stops the server and waits for its thread.
    pub fn shutdown(&self) {
        self.inner.server.shutdown();
    }

    /// `http://127.0.0.1:PORT/`: the service is under `redfish/v1/`.
    pub fn endpoint(&self) -> String {
        format!("http://{}/", self.inner.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// User name and password that open a session.
    pub fn credentials(&self) -> (String, String) {
        let c = &self.shared().config;
        (c.username.clone(), c.password.clone())
    }

    // ---- inventory ----

    /// A composed system (a cluster node) with its compute block `Compute-<id>`.
    pub fn add_system(&self, id: &str) -> System {
        lock(&self.shared().state).add_system(id)
    }

    pub fn add_gpu_block(&self, model: &str) -> Block {
        lock(&self.shared().state).add_block(BlockKind::Gpu, model)
    }

    pub fn add_cxl_block(&self, model: &str) -> Block {
        lock(&self.shared().state).add_block(BlockKind::CxlMemory, model)
    }

    /// A block as it is now (tasks due are finished first).
    pub fn block(&self, id: &str) -> Option<Block> {
        let mut state = lock(&self.shared().state);
        state.advance(std::time::Instant::now());
        state.blocks.get(id).cloned()
    }

    /// Every block as it is now (tasks due are finished first).
    pub fn blocks(&self) -> Vec<Block> {
        let mut state = lock(&self.shared().state);
        state.advance(std::time::Instant::now());
        state.blocks.values().cloned().collect()
    }

    pub fn system(&self, id: &str) -> Option<System> {
        let mut state = lock(&self.shared().state);
        state.advance(std::time::Instant::now());
        state.systems.get(id).cloned()
    }

    /// Sets a block's (and its device's) `Status.Health`.
    pub fn set_health(&self, block: &str, health: &str) -> Result<(), SimError> {
        if !matches!(health, "OK" | "Warning" | "Critical") {
            return Err(SimError::BadHealth(health.into()));
        }
        let mut state = lock(&self.shared().state);
        let b = state
            .blocks
            .get_mut(block)
            .ok_or_else(|| SimError::UnknownBlock(block.into()))?;
        b.health = health.into();
        b.version += 1;
        Ok(())
    }

    /// How long later recompositions take (0: at once).
    pub fn set_compose_delay(&self, delay: Duration) {
        *lock(&self.shared().compose_delay) = delay;
    }

    /// Ends every session, as a service restart or timeout would.
    pub fn expire_sessions(&self) {
        lock(&self.shared().state).sessions.clear();
    }

    pub fn session_count(&self) -> usize {
        lock(&self.shared().state).sessions.len()
    }

    // ---- faults and records ----

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

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.controls().requests()
    }

    pub fn requests_to(&self, route: Route) -> Vec<RecordedRequest> {
        self.controls().requests_to(route)
    }

    pub fn clear_requests(&self) {
        self.controls().clear_requests();
    }
}

impl SimControl for RedfishSim {
    type Fault = Fault;
    type Route = Route;

    fn endpoint(&self) -> String {
        RedfishSim::endpoint(self)
    }

    fn controls(&self) -> &Controls<Fault, Route> {
        &self.shared().controls
    }

    fn shutdown(&self) {
        RedfishSim::shutdown(self);
    }
}
