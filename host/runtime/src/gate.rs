//! The single choke point: every host import asks the provider's [`Gate`] first.
//!
//! A denial is returned to the guest as the interface's typed `denied` error naming the
//! missing grant, logged (`warn`) with the provider's name, and counted; it never traps.
//! What the guest wrote is quoted clipped and escaped (a megabyte-long key makes a short
//! line), and denial lines are rate-limited per provider (counting goes on regardless).
//!
//! The gate holds no rule of its own: each capability module owns its grant and the
//! [`Check`]s of it, and its host functions hand them to [`Gate::check`], so every
//! decision still goes through here, and so do the counting, logging and observing of
//! denials.
//!
//! A [`CapabilityObserver`] (optional, given at load) is told of every HTTP request,
//! Secret read and lookup a call made, allowed or not, and of every call's end with what
//! it cost: `cro provider call` prints it as a trace and `cro provider test` checks it
//! against what the provider declared. Without one nothing is built or recorded.
//!
//! A [`Fence`] (optional, given at load) is asked right before every outgoing HTTP
//! request of the provider (and every redirect hop), after the grants allowed it: the
//! embedder's say on whether this process may act for the provider *now* (the operator:
//! whether its Lease of the provider is still held). A refusal is not a denial: the
//! grants allowed the request, the host chose not to send it, so it is not counted as
//! one; the guest gets a connection failure (`not sent: <reason>`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::base::escape_line;
use crate::budget::{Admit, MinuteWindow};

/// Denial lines logged per provider per minute; further denials are only counted.
const DENIAL_LINES_PER_MINUTE: u64 = 120;

/// Fence refusal lines logged per provider per minute. A window of their own, so a
/// provider flooding denials cannot hide that its process lost the right to act.
const FENCE_LINES_PER_MINUTE: u64 = 120;

/// The embedder's check that this process may still act for the provider: `Ok` to send
/// the request, `Err(reason)` to refuse it (the reason goes to the guest and the log).
/// Asked on the call's task right before each HTTP request (and from the HTTP client's
/// redirect policy): keep it quick, never block and never panic.
pub type Fence = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// One decision a host import asks the gate for (an HTTP request to a URL, a key of
/// the Secret, ...). Each capability module implements it for what its imports do: the
/// module owns the rule, the gate counts, logs and reports what it refuses.
pub(crate) trait Check {
    /// The capability its denials are counted as; `None` for the checks of a capability
    /// that is always granted (they never deny).
    fn kind(&self) -> Option<CapabilityKind>;
    /// `Ok` when allowed; otherwise why not, naming the missing grant (guest text
    /// quoted clipped and escaped).
    fn decide(&self) -> Result<(), String>;
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

impl UseOutcome {
    /// The outcome with its reason made safe to print and at most `max` bytes of it
    /// kept (it quotes guest text).
    pub fn bounded(self, max: usize) -> UseOutcome {
        match self {
            UseOutcome::Failed(why) => UseOutcome::Failed(escape_line(&why, max)),
            UseOutcome::Denied(why) => UseOutcome::Denied(escape_line(&why, max)),
            allowed => allowed,
        }
    }
}

/// Bytes of a use's target and reason kept for an observer (before escaping): both come
/// from the guest (a URL, a Secret key, an object name), and a trace of a provider
/// looping on 8 MB key names must hold neither those bytes nor their control characters.
pub const OBSERVED_TEXT_BYTES: usize = 512;

/// Bytes of each HTTP body an observer asking for exchanges is given.
pub const EXCHANGE_BODY_BYTES: usize = 16 << 10;
/// Headers of each side of an exchange an observer is given (values clipped like
/// targets).
pub const EXCHANGE_HEADERS: usize = 64;

/// What one HTTP use sent and got back, for an observer that asks for it
/// ([`CapabilityObserver::wants_http_exchanges`]): raw, secrets included, so an observer
/// that shows it must redact (`cro provider call --trace-bodies` does). Headers at most
/// [`EXCHANGE_HEADERS`] a side, values clipped; bodies at most [`EXCHANGE_BODY_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HttpExchange {
    pub request_headers: Vec<(String, String)>,
    pub request_body: Vec<u8>,
    pub response_headers: Vec<(String, String)>,
    pub response_body: Vec<u8>,
}

impl HttpExchange {
    /// Headers bounded as an observer gets them.
    pub(crate) fn headers(headers: &[(String, String)]) -> Vec<(String, String)> {
        headers
            .iter()
            .take(EXCHANGE_HEADERS)
            .map(|(n, v)| {
                (
                    crate::base::clip(n, OBSERVED_TEXT_BYTES).to_owned(),
                    crate::base::clip(v, OBSERVED_TEXT_BYTES).to_owned(),
                )
            })
            .collect()
    }

    /// A body bounded as an observer gets it.
    pub(crate) fn body(body: &[u8]) -> Vec<u8> {
        body[..body.len().min(EXCHANGE_BODY_BYTES)].to_vec()
    }
}

/// One capability use of a call, as the observer sees it: `target` and any reason are
/// escaped (no control or invisible format character) and at most
/// [`OBSERVED_TEXT_BYTES`] of the guest's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityUse {
    pub capability: CapabilityKind,
    /// `METHOD URL` for HTTP, the key for a Secret, `apiVersion Kind [namespace/]name`
    /// for a lookup.
    pub target: String,
    pub outcome: UseOutcome,
    /// Wall time the host spent on it.
    pub duration: std::time::Duration,
    /// An HTTP use's headers and bodies, when the observer asked for them.
    pub exchange: Option<HttpExchange>,
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

/// Told of every capability use, log line and call end of one provider (see the module
/// docs). Called on the call's task: keep it quick and never block.
pub trait CapabilityObserver: Send + Sync + 'static {
    fn capability_used(&self, event: CapabilityUse);
    /// A line the provider logged within its per-call budget, at `level` (`trace` ..
    /// `error`), its message quoted, escaped and clipped as in the host's own log line.
    fn provider_logged(&self, level: &'static str, message: &str);
    /// Whether HTTP uses should carry their headers and bodies ([`HttpExchange`]):
    /// copying them costs, so only an observer that shows them asks.
    fn wants_http_exchanges(&self) -> bool;
    fn call_finished(&self, _stats: CallStats) {}
}

/// Asks each capability's checks for one provider, and counts, logs and reports what
/// they refuse.
pub struct Gate {
    provider: String,
    observer: Option<Arc<dyn CapabilityObserver>>,
    fence: Option<Fence>,
    http: AtomicU64,
    secret: AtomicU64,
    lookup: AtomicU64,
    lines: Mutex<MinuteWindow>,
    fence_lines: Mutex<MinuteWindow>,
}

impl Gate {
    pub fn new(provider: impl Into<String>) -> Gate {
        Gate {
            provider: provider.into(),
            observer: None,
            fence: None,
            http: AtomicU64::new(0),
            secret: AtomicU64::new(0),
            lookup: AtomicU64::new(0),
            lines: Mutex::new(MinuteWindow::new(
                DENIAL_LINES_PER_MINUTE,
                u64::MAX,
                Instant::now(),
            )),
            fence_lines: Mutex::new(MinuteWindow::new(
                FENCE_LINES_PER_MINUTE,
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

    /// Asks `fence` before every outgoing HTTP request from now on (see [`Fence`]).
    pub fn with_fence(mut self, fence: Fence) -> Gate {
        self.fence = Some(fence);
        self
    }

    /// Whether the fence, if any, lets the provider act now: asked by the `http`
    /// capability after the grants allowed a request, right before it is handed to the
    /// client. A refusal is logged (rate-limited) but not counted as a denial: nothing
    /// the provider was granted is missing.
    pub(crate) fn fence_allows(&self) -> Result<(), String> {
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        let reason = match fence() {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        let admit = self
            .fence_lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(0, Instant::now());
        match admit {
            Admit::Yes { dropped_before: 0 } => {
                tracing::warn!(provider = %self.provider, reason = %reason, "provider request not sent: fenced");
            }
            Admit::Yes { dropped_before } => {
                tracing::warn!(
                    provider = %self.provider,
                    reason = %reason,
                    unlogged_refusals = dropped_before,
                    "provider request not sent: fenced"
                );
            }
            Admit::No { first: true } => {
                tracing::warn!(
                    provider = %self.provider,
                    "more than {FENCE_LINES_PER_MINUTE} fenced requests this minute: \
                     further ones are not logged until the minute is over"
                );
            }
            Admit::No { first: false } => {}
        }
        Err(reason)
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
        self.used_with(started, || {
            let (capability, target, outcome) = event();
            (capability, target, outcome, None)
        });
    }

    /// [`Gate::used`] for an HTTP use that may carry its exchange.
    pub(crate) fn used_with(
        &self,
        started: Option<Instant>,
        event: impl FnOnce() -> (CapabilityKind, String, UseOutcome, Option<HttpExchange>),
    ) {
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            let (capability, target, outcome, exchange) = event();
            observer.capability_used(CapabilityUse {
                capability,
                target: escape_line(&target, OBSERVED_TEXT_BYTES),
                outcome: outcome.bounded(OBSERVED_TEXT_BYTES),
                duration: started.elapsed(),
                exchange,
            });
        }
    }

    /// Whether the observer, if any, wants HTTP exchanges.
    pub(crate) fn wants_exchanges(&self) -> bool {
        self.observer
            .as_ref()
            .is_some_and(|o| o.wants_http_exchanges())
    }

    /// Tells the observer, if any, of a line the provider logged.
    pub(crate) fn logged(&self, level: &'static str, message: &str) {
        if let Some(observer) = &self.observer {
            observer.provider_logged(level, message);
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

    /// Allows or denies what `check` describes, as its capability decides; a denial is
    /// counted and logged here.
    pub(crate) fn check(&self, check: &impl Check) -> Result<(), Denial> {
        let Err(message) = check.decide() else {
            return Ok(());
        };
        if let Some(counter) = check.kind().map(|kind| self.counter(kind)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        self.log_denial(&message);
        Err(Denial(message))
    }

    fn counter(&self, kind: CapabilityKind) -> &AtomicU64 {
        match kind {
            CapabilityKind::Http => &self.http,
            CapabilityKind::Secret => &self.secret,
            CapabilityKind::Lookup => &self.lookup,
        }
    }

    /// One warning per denial, at most [`DENIAL_LINES_PER_MINUTE`] a minute.
    fn log_denial(&self, message: &str) {
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
            .field("observed", &self.observer.is_some())
            .field("fenced", &self.fence.is_some())
            .field("denials", &self.denials())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The gate asking each capability's own checks is tested with them (`caps::tests`).

    fn gate() -> Gate {
        Gate::new("p")
    }

    /// A check that decides what it is told to.
    struct Fixed(Option<CapabilityKind>, Result<(), &'static str>);

    impl Check for Fixed {
        fn kind(&self) -> Option<CapabilityKind> {
            self.0
        }
        fn decide(&self) -> Result<(), String> {
            self.1.map_err(String::from)
        }
    }

    #[test]
    fn denials_are_counted_by_kind_and_returned() {
        let gate = gate();
        let http = Some(CapabilityKind::Http);
        assert_eq!(gate.check(&Fixed(http, Ok(()))), Ok(()));
        assert_eq!(
            gate.check(&Fixed(http, Err("no"))),
            Err(Denial("no".into()))
        );
        assert!(
            gate.check(&Fixed(Some(CapabilityKind::Lookup), Err("no")))
                .is_err()
        );
        assert!(gate.check(&Fixed(None, Err("always"))).is_err());
        assert_eq!(
            gate.denials(),
            DenialCounts {
                http: 1,
                secret: 0,
                lookup: 1
            }
        );
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<CapabilityUse>>, Mutex<Vec<CallStats>>);

    impl CapabilityObserver for Seen {
        fn capability_used(&self, event: CapabilityUse) {
            self.0.lock().unwrap().push(event);
        }
        fn provider_logged(&self, _level: &'static str, _message: &str) {}
        fn wants_http_exchanges(&self) -> bool {
            false
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
    fn a_fence_refuses_without_counting_a_denial_and_is_asked_every_time() {
        assert_eq!(gate().fence_allows(), Ok(()));

        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let asked = Arc::new(AtomicU64::new(0));
        let fence: Fence = {
            let (open, asked) = (open.clone(), asked.clone());
            Arc::new(move || {
                asked.fetch_add(1, Ordering::SeqCst);
                if open.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("lease expired".into())
                }
            })
        };
        let fenced = gate().with_fence(fence);
        assert_eq!(fenced.fence_allows(), Ok(()));
        open.store(false, Ordering::SeqCst);
        assert_eq!(fenced.fence_allows(), Err("lease expired".into()));
        // Past the log window's lines: still refused every time, only not logged.
        for _ in 0..FENCE_LINES_PER_MINUTE + 5 {
            assert!(fenced.fence_allows().is_err());
        }
        open.store(true, Ordering::SeqCst);
        assert_eq!(fenced.fence_allows(), Ok(()));
        assert_eq!(asked.load(Ordering::SeqCst), FENCE_LINES_PER_MINUTE + 8);
        assert_eq!(fenced.denials(), DenialCounts::default());
    }

    /// A guest's 8 MB key name full of terminal escapes reaches an observer bounded
    /// and escaped, and so does the reason quoting it.
    #[test]
    fn an_observer_sees_guest_text_bounded_and_escaped() {
        let seen = Arc::new(Seen::default());
        let observed = gate().with_observer(seen.clone());
        let hostile = format!("\u{1b}[2J\n\u{202e}{}", "k".repeat(8 << 20));
        observed.used(observed.start(), || {
            (
                CapabilityKind::Secret,
                hostile.clone(),
                UseOutcome::Denied(format!("key {hostile} not granted")),
            )
        });
        let uses = seen.0.lock().unwrap();
        let UseOutcome::Denied(why) = &uses[0].outcome else {
            panic!("{:?}", uses[0].outcome);
        };
        for text in [&uses[0].target, why] {
            assert!(
                text.len() < OBSERVED_TEXT_BYTES + 64,
                "{} bytes",
                text.len()
            );
            assert!(
                !text.chars().any(crate::base::needs_escape),
                "unescaped: {text:?}"
            );
            assert!(text.contains("\\u{1b}[2J\\n\\u{202e}kkk"), "{text}");
        }
    }
}
