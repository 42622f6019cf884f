//! How a simulator is set up before it starts.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The simulator's notion of "now". Tokens are issued and checked against it, so a
/// test can move time for the simulator and for the provider host with one closure.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system clock as a [`Clock`].
pub fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// Identity-manager credentials the simulator accepts (the fields of the Go operator's
/// `credentials` Secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    pub client_id: String,
    pub client_secret: String,
}

impl Default for Credentials {
    fn default() -> Self {
        Self {
            username: "cro-operator".into(),
            password: "cro-password".into(),
            client_id: "cdi-client".into(),
            client_secret: "cdi-client-secret".into(),
        }
    }
}

/// Settings of one simulator. `Default` gives random tenant/cluster ids, free ports on
/// 127.0.0.1, a 300 s token TTL and a 500 ms Cluster Manager delay.
#[derive(Clone)]
pub struct SimConfig {
    pub tenant_id: String,
    pub cluster_id: String,
    /// Identity-manager realm in the token path.
    pub realm: String,
    pub credentials: Credentials,
    /// Lifetime written into the `exp` of issued access tokens.
    pub token_ttl: Duration,
    /// Time a Cluster Manager resize takes before its devices settle. Measured on the
    /// monotonic real clock, not on [`SimConfig::clock`], so a frozen test clock does not
    /// stall it; `FabricSim::complete_pending` finishes pending changes at once.
    pub cm_delay: Duration,
    /// Port for HTTPS on 127.0.0.1; 0 picks a free one.
    pub https_port: u16,
    /// Port for plain HTTP on 127.0.0.1; 0 picks a free one.
    pub http_port: u16,
    /// `max_resspec_count` the Cluster Manager reports and enforces per spec.
    pub max_devices_per_spec: u32,
    /// Injected clock; `None` is the system clock.
    pub clock: Option<Clock>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            tenant_id: uuid::Uuid::new_v4().to_string(),
            cluster_id: uuid::Uuid::new_v4().to_string(),
            realm: "fti".into(),
            credentials: Credentials::default(),
            token_ttl: Duration::from_secs(300),
            cm_delay: Duration::from_millis(500),
            https_port: 0,
            http_port: 0,
            max_devices_per_spec: 8,
            clock: None,
        }
    }
}

impl SimConfig {
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    pub fn with_token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = ttl;
        self
    }

    pub fn with_cm_delay(mut self, delay: Duration) -> Self {
        self.cm_delay = delay;
        self
    }
}

impl fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimConfig")
            .field("tenant_id", &self.tenant_id)
            .field("cluster_id", &self.cluster_id)
            .field("realm", &self.realm)
            .field("credentials", &self.credentials)
            .field("token_ttl", &self.token_ttl)
            .field("cm_delay", &self.cm_delay)
            .field("https_port", &self.https_port)
            .field("http_port", &self.http_port)
            .field("max_devices_per_spec", &self.max_devices_per_spec)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .finish()
    }
}
