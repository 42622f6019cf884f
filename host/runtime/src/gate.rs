//! The single choke point: every host import asks the provider's [`Gate`] first.
//!
//! A denial is returned to the guest as the interface's typed `denied` error naming the
//! missing grant, logged (`warn`) with the provider's name, and counted; it never traps.
//! What the guest wrote is quoted clipped and escaped (a megabyte-long key makes a short
//! line), and denial lines are rate-limited per provider (counting goes on regardless).
//!
//! Each capability module owns its grant type and the check of it; the gate asks them,
//! so every decision still goes through here.
//!
//! A [`CapabilityObserver`] (optional, given at load) is told of every HTTP request,
//! Secret read and lookup a call made, allowed or not, and of every call's end with what
//! it cost: `cro provider call` prints it as a trace and `cro provider test` checks it
//! against what the provider declared. Without one nothing is built or recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use url::Url;

use crate::base::quote;
use crate::budget::{Admit, MinuteWindow};
use crate::caps::http::grant::refused_header;
use crate::caps::lookup::grant::check_name;
use crate::grants::{Grants, HttpTarget};

/// Denial lines logged per provider per minute; further denials are only counted.
const DENIAL_LINES_PER_MINUTE: u64 = 120;

/// What a host import is about to do on the guest's behalf.
#[derive(Debug, Clone, Copy)]
pub enum Capability<'a> {
    /// An HTTP request (or a redirect) to `url`.
    Http(&'a Url),
    /// A request header the provider wants to send (framing and routing headers are
    /// never allowed).
    HttpHeader(&'a str),
    /// Reading one key of the granted Secret.
    SecretKey(&'a str),
    /// Reading objects of a kind (`v1 Node` for `get-node`/`list-nodes`).
    Lookup { api_version: &'a str, kind: &'a str },
    /// The name (and namespace) of an object to read: must be a Kubernetes name.
    ObjectName {
        name: &'a str,
        namespace: Option<&'a str>,
    },
    /// The provider's own configuration: always allowed.
    Config,
    /// Logging: always allowed.
    Log,
    /// The provider's own state map: always allowed (bounded by `limits.state_bytes`).
    State,
}

/// A refused capability; the message names the missing grant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denial(pub String);

/// Denials so far, by capability.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DenialCounts {
    pub http: u64,
    pub secret: u64,
    pub lookup: u64,
}

impl DenialCounts {
    pub fn total(&self) -> u64 {
        self.http + self.secret + self.lookup
    }
}

/// Which host capability a [`CapabilityUse`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    Http,
    Secret,
    Lookup,
}

/// How a capability use ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UseOutcome {
    /// The gate allowed it and the host answered: an HTTP status (HTTP only) and the
    /// bytes handed back to the guest.
    Allowed { status: Option<u16>, bytes: u64 },
    /// Allowed, but it failed (connection refused, not found, timeout, ...).
    Failed(String),
    /// The gate refused it; the text names the missing grant.
    Denied(String),
}

/// One capability use of a call, as the observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityUse {
    pub capability: CapabilityKind,
    /// `METHOD URL` for HTTP, the key for a Secret, `apiVersion Kind [namespace/]name`
    /// for a lookup.
    pub target: String,
    pub outcome: UseOutcome,
    /// Wall time the host spent on it.
    pub duration: std::time::Duration,
}

impl CapabilityUse {
    pub fn denied(&self) -> bool {
        matches!(self.outcome, UseOutcome::Denied(_))
    }
}

/// What one provider call cost the host, when it ended (whatever the outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallStats {
    /// Instantiation plus the call.
    pub duration: std::time::Duration,
    /// The largest memory (all linear memories and tables) the instance held.
    pub peak_memory_bytes: u64,
}

/// Told of every capability use and call end of one provider (see the module docs).
/// Called on the call's task: keep it quick and never block.
pub trait CapabilityObserver: Send + Sync + 'static {
    fn capability_used(&self, event: CapabilityUse);
    fn call_finished(&self, _stats: CallStats) {}
}

/// Decides every capability of one provider against its grants.
pub struct Gate {
    provider: String,
    grants: Arc<Grants>,
    observer: Option<Arc<dyn CapabilityObserver>>,
    http: AtomicU64,
    secret: AtomicU64,
    lookup: AtomicU64,
    lines: Mutex<MinuteWindow>,
}

impl Gate {
    pub fn new(provider: impl Into<String>, grants: Arc<Grants>) -> Gate {
        Gate {
            provider: provider.into(),
            grants,
            observer: None,
            http: AtomicU64::new(0),
            secret: AtomicU64::new(0),
            lookup: AtomicU64::new(0),
            lines: Mutex::new(MinuteWindow::new(
                DENIAL_LINES_PER_MINUTE,
                u64::MAX,
                Instant::now(),
            )),
        }
    }

    /// Tells `observer` of every capability use and call end from now on.
    pub fn with_observer(mut self, observer: Arc<dyn CapabilityObserver>) -> Gate {
        self.observer = Some(observer);
        self
    }

    /// Starts timing a capability use when someone observes; `None` costs nothing more.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.observer.as_ref().map(|_| Instant::now())
    }

    /// Reports a use started with [`Gate::start`]; `event` is only built when observed.
    pub(crate) fn used(
        &self,
        started: Option<Instant>,
        event: impl FnOnce() -> (CapabilityKind, String, UseOutcome),
    ) {
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            let (capability, target, outcome) = event();
            observer.capability_used(CapabilityUse {
                capability,
                target,
                outcome,
                duration: started.elapsed(),
            });
        }
    }

    pub(crate) fn call_finished(&self, stats: impl FnOnce() -> CallStats) {
        if let Some(observer) = &self.observer {
            observer.call_finished(stats());
        }
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Allows or denies `capability`; a denial is logged and counted here.
    pub fn check(&self, capability: Capability<'_>) -> Result<(), Denial> {
        let (counter, message) = match capability {
            Capability::Http(url) => {
                if self.grants.http_grant_for(url).is_some() {
                    return Ok(());
                }
                (
                    &self.http,
                    format!("no http grant for {}", quote(&HttpTarget::describe(url))),
                )
            }
            Capability::HttpHeader(name) => {
                if !refused_header(name) {
                    return Ok(());
                }
                (
                    &self.http,
                    format!(
                        "the request header `{}` is set by the host only (Host, Connection, \
                         Transfer-Encoding, Content-Length, Upgrade, TE, Trailer, Keep-Alive \
                         and Proxy-* cannot be granted)",
                        quote(name)
                    ),
                )
            }
            Capability::SecretKey(key) => match &self.grants.secret {
                Some(secret) if secret.allows(key) => return Ok(()),
                Some(secret) => (
                    &self.secret,
                    format!(
                        "no secret grant for key `{}` of {}/{}",
                        quote(key),
                        secret.namespace,
                        secret.name
                    ),
                ),
                None => (
                    &self.secret,
                    format!(
                        "no secret grant (the provider asked for key `{}`)",
                        quote(key)
                    ),
                ),
            },
            Capability::Lookup { api_version, kind } => {
                if self.grants.allows_lookup(api_version, kind) {
                    return Ok(());
                }
                (
                    &self.lookup,
                    format!("no lookup grant for {} {}", quote(api_version), quote(kind)),
                )
            }
            Capability::ObjectName { name, namespace } => match check_name(name, namespace) {
                Ok(()) => return Ok(()),
                Err(why) => (&self.lookup, why),
            },
            Capability::Config | Capability::Log | Capability::State => return Ok(()),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let admit = self
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(0, Instant::now());
        match admit {
            Admit::Yes { dropped_before: 0 } => {
                tracing::warn!(provider = %self.provider, denied = %message, "provider capability denied");
            }
            Admit::Yes { dropped_before } => {
                tracing::warn!(
                    provider = %self.provider,
                    denied = %message,
                    unlogged_denials = dropped_before,
                    "provider capability denied"
                );
            }
            Admit::No { first: true } => {
                tracing::warn!(
                    provider = %self.provider,
                    "more than {DENIAL_LINES_PER_MINUTE} capability denials this minute: \
                     further ones are counted but not logged until the minute is over"
                );
            }
            Admit::No { first: false } => {}
        }
        Err(Denial(message))
    }

    pub fn denials(&self) -> DenialCounts {
        DenialCounts {
            http: self.http.load(Ordering::Relaxed),
            secret: self.secret.load(Ordering::Relaxed),
            lookup: self.lookup.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("provider", &self.provider)
            .field("grants", &self.grants)
            .field("observed", &self.observer.is_some())
            .field("denials", &self.denials())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::{HttpGrant, LookupGrant, SecretGrant};

    fn gate() -> Gate {
        let grants = Grants {
            http: vec![HttpGrant::new(
                "https://fabric.example:8443".parse().unwrap(),
            )],
            secret: Some(SecretGrant {
                namespace: "ns".into(),
                name: "creds".into(),
                keys: vec!["username".into()],
            }),
            lookup: vec![LookupGrant::new("v1", "Node")],
            wasi: Default::default(),
        };
        Gate::new("p", Arc::new(grants))
    }

    #[test]
    fn allows_what_is_granted_and_counts_the_rest() {
        let gate = gate();
        let good = Url::parse("https://fabric.example:8443/x").unwrap();
        let evil = Url::parse("https://evil.example/x").unwrap();
        assert_eq!(gate.check(Capability::Http(&good)), Ok(()));
        assert_eq!(
            gate.check(Capability::Http(&evil)),
            Err(Denial("no http grant for https://evil.example:443".into()))
        );
        assert_eq!(gate.check(Capability::SecretKey("username")), Ok(()));
        assert_eq!(
            gate.check(Capability::SecretKey("password")),
            Err(Denial(
                "no secret grant for key `password` of ns/creds".into()
            ))
        );
        let node = Capability::Lookup {
            api_version: "v1",
            kind: "Node",
        };
        assert_eq!(gate.check(node), Ok(()));
        let pod = Capability::Lookup {
            api_version: "v1",
            kind: "Pod",
        };
        assert_eq!(
            gate.check(pod),
            Err(Denial("no lookup grant for v1 Pod".into()))
        );
        for always in [Capability::Config, Capability::Log, Capability::State] {
            assert_eq!(gate.check(always), Ok(()));
        }
        assert_eq!(
            gate.denials(),
            DenialCounts {
                http: 1,
                secret: 1,
                lookup: 1
            }
        );
        assert_eq!(gate.denials().total(), 3);
    }

    #[test]
    fn headers_and_names_are_checked_and_guest_text_is_clipped() {
        let gate = gate();
        assert_eq!(gate.check(Capability::HttpHeader("authorization")), Ok(()));
        let host = gate.check(Capability::HttpHeader("Host")).unwrap_err();
        assert!(
            host.0.contains("`Host` is set by the host only"),
            "{}",
            host.0
        );
        assert_eq!(
            gate.check(Capability::ObjectName {
                name: "worker-0",
                namespace: None
            }),
            Ok(())
        );
        let proxy = gate
            .check(Capability::ObjectName {
                name: "worker-0/proxy",
                namespace: None,
            })
            .unwrap_err();
        assert!(
            proxy.0.contains("is not a Kubernetes object name"),
            "{}",
            proxy.0
        );
        let huge = "k\n".repeat(1 << 20);
        let denial = gate.check(Capability::SecretKey(&huge)).unwrap_err();
        assert!(denial.0.len() < 400, "{}", denial.0.len());
        assert!(!denial.0.contains('\n'), "{}", denial.0);
        assert_eq!(gate.denials().http, 1);
        assert_eq!(gate.denials().lookup, 1);
        assert_eq!(gate.denials().secret, 1);
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<CapabilityUse>>, Mutex<Vec<CallStats>>);

    impl CapabilityObserver for Seen {
        fn capability_used(&self, event: CapabilityUse) {
            self.0.lock().unwrap().push(event);
        }
        fn call_finished(&self, stats: CallStats) {
            self.1.lock().unwrap().push(stats);
        }
    }

    #[test]
    fn an_observer_sees_each_use_and_nothing_is_built_without_one() {
        let plain = gate();
        assert_eq!(plain.start(), None);
        plain.used(None, || panic!("built without an observer"));
        plain.call_finished(|| panic!("built without an observer"));

        let seen = Arc::new(Seen::default());
        let observed = gate().with_observer(seen.clone());
        let started = observed.start();
        assert!(started.is_some());
        observed.used(started, || {
            (
                CapabilityKind::Secret,
                "password".into(),
                UseOutcome::Denied("no".into()),
            )
        });
        observed.call_finished(|| CallStats {
            duration: std::time::Duration::from_millis(3),
            peak_memory_bytes: 1 << 20,
        });
        let uses = seen.0.lock().unwrap();
        assert_eq!(uses.len(), 1);
        assert_eq!(uses[0].capability, CapabilityKind::Secret);
        assert_eq!(uses[0].target, "password");
        assert!(uses[0].denied());
        assert_eq!(seen.1.lock().unwrap()[0].peak_memory_bytes, 1 << 20);
    }

    #[test]
    fn no_grants_deny_everything() {
        let gate = Gate::new("p", Arc::new(Grants::default()));
        let url = Url::parse("http://127.0.0.1/").unwrap();
        assert!(gate.check(Capability::Http(&url)).is_err());
        let denial = gate.check(Capability::SecretKey("k")).unwrap_err();
        assert_eq!(denial.0, "no secret grant (the provider asked for key `k`)");
        assert!(
            gate.check(Capability::Lookup {
                api_version: "v1",
                kind: "Node"
            })
            .is_err()
        );
        assert_eq!(gate.denials().total(), 3);
    }
}
