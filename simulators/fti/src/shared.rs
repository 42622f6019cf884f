//! State shared by the server tasks and the handle.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use sim_kit::lock;
use sim_kit::{Controls, bearer_token};

use crate::config::{Clock, Credentials, SimConfig, system_clock};
use crate::faults::Fault;
use crate::jwt::{Claims, JwtError, Signer};
use crate::record::Route;
use crate::state::Fabric;

pub(crate) struct Shared {
    pub tenant_id: String,
    pub cluster_id: String,
    pub realm: String,
    pub credentials: Credentials,
    pub fabric_uuid: String,
    pub clock: Clock,
    pub signer: Signer,
    pub token_ttl: Mutex<Duration>,
    /// `jti` of every token still honoured.
    pub tokens: Mutex<HashSet<String>>,
    pub fabric: Mutex<Fabric>,
    /// Faults in force and requests received.
    pub controls: Controls<Fault, Route>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BearerError {
    #[error("missing Authorization: Bearer header")]
    Missing,
    #[error("invalid token: {0}")]
    Invalid(#[from] JwtError),
    #[error("token expired")]
    Expired,
    #[error("token not issued by this identity manager or revoked")]
    Unknown,
}

impl Shared {
    pub fn new(config: &SimConfig, secret: &[u8]) -> Self {
        Self {
            tenant_id: config.tenant_id.clone(),
            cluster_id: config.cluster_id.clone(),
            realm: config.realm.clone(),
            credentials: config.credentials.clone(),
            fabric_uuid: uuid::Uuid::new_v4().to_string(),
            clock: config.clock.clone().unwrap_or_else(system_clock),
            signer: Signer::new(secret),
            token_ttl: Mutex::new(config.token_ttl),
            tokens: Mutex::new(HashSet::new()),
            fabric: Mutex::new(Fabric::new(config.cm_delay, config.max_devices_per_spec)),
            controls: Controls::default(),
        }
    }

    pub fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// Unix seconds on the injected clock (negative before 1970).
    pub fn now_secs(&self) -> i64 {
        let now = self.now();
        match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        }
    }

    pub fn issuer(&self) -> String {
        format!("fabric-sim/id_manager/realms/{}", self.realm)
    }

    /// Signs a token valid for `ttl` from `iat` and remembers it.
    pub fn issue_token(&self, sub: &str, iat: i64, exp: i64, typ: &str) -> String {
        let claims = Claims {
            sub: sub.to_string(),
            iat,
            exp,
            jti: uuid::Uuid::new_v4().to_string(),
            iss: self.issuer(),
            azp: self.credentials.client_id.clone(),
            typ: typ.to_string(),
        };
        if typ == "Bearer" {
            lock(&self.tokens).insert(claims.jti.clone());
        }
        self.signer.sign(&claims)
    }

    pub fn check_bearer(&self, header: Option<&str>) -> Result<Claims, BearerError> {
        let token = header.and_then(bearer_token).ok_or(BearerError::Missing)?;
        let claims = self.signer.verify(token)?;
        if claims.typ != "Bearer" || !lock(&self.tokens).contains(&claims.jti) {
            return Err(BearerError::Unknown);
        }
        if claims.exp <= self.now_secs() {
            return Err(BearerError::Expired);
        }
        Ok(claims)
    }

    /// Consumes the first fault on `route` that `pred` accepts (for the step it changes).
    pub fn take_fault(&self, route: Route, pred: impl Fn(&Fault) -> bool) -> Option<Fault> {
        self.controls.take_fault(Some(&route), pred)
    }
}
