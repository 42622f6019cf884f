//! Which providers this replica may act for now: the fence every fabric call and node
//! command passes right before it is made (docs/ARCHITECTURE.md, "Replicas").
//!
//! With one replica (no leader election) it acts for every provider. With several, each
//! provider has a Lease; a replica acts for a provider only while the Lease it holds is
//! valid *by its own clock*: until the instant it sent its last successful renewal plus
//! the lease duration, less a safety margin. Another replica takes the Lease over only
//! after seeing its record unchanged for the whole lease duration on its own clock,
//! which starts after that renewal was sent; so the fence closes here before the Lease
//! can move there, whatever the two clocks read. A paused process (SIGSTOP, a long GC of
//! the machine) finds its time gone when it resumes: the monotonic clock ran on.
//!
//! The check is made as late as the host can: before each call and, inside a call,
//! before each HTTP request the provider sends and before each write of that request to
//! its socket (cro_runtime's gate and connection). What the fence cannot close is a
//! pause between that last check and the write's system call; the fabric API has no
//! fencing token to refuse a late call.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::Instant;

use tokio::sync::watch;

/// This operator process (a restarted container is another process under the same
/// identity): a provider's memory of requests in progress ends with it.
static PROCESS: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().to_string());

pub(crate) fn process_id() -> &'static str {
    &PROCESS
}

/// Who holds a provider's Lease, as the Lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseHolder {
    pub(crate) identity: String,
    /// The holder's [`process_id`].
    pub(crate) process: String,
}

/// Why this replica may not act for a provider now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replica {identity} does not hold provider {provider}'s Lease{why}")]
pub struct NotHolding {
    pub identity: String,
    pub provider: String,
    why: &'static str,
}

/// How a replica's right to act is decided.
enum Mode {
    /// One replica: every provider, always.
    Everything,
    /// Several: per provider, until when (local monotonic clock) it may act.
    Leased(Mutex<BTreeMap<String, Instant>>),
}

/// The providers this replica acts for (see the module's documentation).
pub struct Tenure {
    identity: String,
    mode: Mode,
    /// The providers held, for whoever starts and stops their work; sent on each change.
    held: watch::Sender<Vec<String>>,
    /// Every provider's holder as the last read of the Leases found it.
    holders: Mutex<BTreeMap<String, LeaseHolder>>,
    /// Rounds of the Leases done (the first one writes this replica's membership).
    rounds: watch::Sender<u64>,
}

impl Tenure {
    /// A replica alone: it acts for every provider, without Leases.
    pub fn everything(identity: &str) -> Tenure {
        Tenure {
            identity: identity.to_owned(),
            mode: Mode::Everything,
            held: watch::Sender::new(Vec::new()),
            holders: Mutex::default(),
            rounds: watch::Sender::new(0),
        }
    }

    /// A replica among others: it acts for none until [`Tenure::hold_until`] says so.
    pub fn leased(identity: &str) -> Tenure {
        Tenure {
            identity: identity.to_owned(),
            mode: Mode::Leased(Mutex::default()),
            held: watch::Sender::new(Vec::new()),
            holders: Mutex::default(),
            rounds: watch::Sender::new(0),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether providers are held through Leases (several replicas may run).
    pub fn is_leased(&self) -> bool {
        matches!(self.mode, Mode::Leased(_))
    }

    /// `Ok` when this replica may act for `provider` at this instant.
    pub fn check(&self, provider: &str) -> Result<(), NotHolding> {
        let Mode::Leased(until) = &self.mode else {
            return Ok(());
        };
        let why = match until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(provider)
        {
            Some(t) if Instant::now() < *t => return Ok(()),
            Some(_) => " (its last renewal is too old: expired or about to)",
            None => "",
        };
        Err(NotHolding {
            identity: self.identity.clone(),
            provider: provider.to_owned(),
            why,
        })
    }

    /// Holds `provider` (leased mode) until `until`, the renewal's send instant plus the
    /// lease duration less the safety margin.
    pub(crate) fn hold_until(&self, provider: &str, until: Instant) {
        if let Mode::Leased(m) = &self.mode {
            m.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(provider.to_owned(), until);
        }
    }

    /// Stops acting for `provider` at once (given up, lost, or gone).
    pub(crate) fn drop_provider(&self, provider: &str) {
        if let Mode::Leased(m) = &self.mode {
            m.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(provider);
        }
    }

    /// Says which providers' work should run now (sorted); the watchers see a change.
    pub(crate) fn announce(&self, held: Vec<String>) {
        self.held.send_if_modified(|now| {
            let changed = *now != held;
            *now = held;
            changed
        });
    }

    /// Who holds `provider`'s Lease as last read; None alone (this process does it all)
    /// or when nobody does.
    pub(crate) fn holder_of(&self, provider: &str) -> Option<LeaseHolder> {
        self.holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(provider)
            .cloned()
    }

    pub(crate) fn set_holders(&self, holders: BTreeMap<String, LeaseHolder>) {
        *self.holders.lock().unwrap_or_else(PoisonError::into_inner) = holders;
    }

    /// One more round of the Leases is done.
    pub(crate) fn round_done(&self) {
        self.rounds.send_modify(|n| *n = n.saturating_add(1));
    }

    /// Resolves once the first round is done: this replica's membership Lease is
    /// written, so it may lead (a leader without one would read as a foreign operator).
    pub(crate) async fn after_first_round(&self) {
        let mut rounds = self.rounds.subscribe();
        let _ = rounds.wait_for(|n| *n > 0).await;
    }

    /// The providers whose work runs, as last announced.
    pub fn announced(&self) -> watch::Receiver<Vec<String>> {
        self.held.subscribe()
    }
}

/// Where the tenure in force is kept: made before the providers are loaded (each
/// provider's fence reads it), filled when the operator starts.
#[derive(Clone)]
pub(crate) struct TenureCell(Arc<RwLock<Arc<Tenure>>>);

impl Default for TenureCell {
    fn default() -> Self {
        TenureCell(Arc::new(RwLock::new(Arc::new(Tenure::everything("")))))
    }
}

impl TenureCell {
    pub(crate) fn get(&self) -> Arc<Tenure> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, tenure: Arc<Tenure>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = tenure;
    }

    /// The fence the runtime asks before each HTTP request `provider` sends: the last
    /// moment before acting (a call that began while the Lease was valid may outlive it).
    pub(crate) fn fence(&self, provider: &str) -> cro_runtime::Fence {
        let (cell, provider) = (self.clone(), provider.to_owned());
        Arc::new(move || cell.get().check(&provider).map_err(|e| e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn alone_acts_for_everything() {
        let t = Tenure::everything("a");
        assert!(t.check("fti").is_ok());
        assert!(!t.is_leased());
    }

    #[test]
    fn leased_acts_only_until_the_instant_given() {
        let t = Tenure::leased("a");
        let e = t.check("fti").unwrap_err();
        assert_eq!(
            e.to_string(),
            "replica a does not hold provider fti's Lease"
        );
        t.hold_until("fti", Instant::now() + Duration::from_secs(60));
        assert!(t.check("fti").is_ok());
        assert!(t.check("other").is_err());
        t.hold_until("fti", Instant::now());
        let e = t.check("fti").unwrap_err();
        assert!(e.to_string().contains("too old"), "{e}");
        t.hold_until("fti", Instant::now() + Duration::from_secs(60));
        t.drop_provider("fti");
        assert!(t.check("fti").is_err());
    }

    #[test]
    fn announcing_the_same_set_is_no_change() {
        let t = Tenure::leased("a");
        let mut rx = t.announced();
        t.announce(vec!["x".into()]);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        t.announce(vec!["x".into()]);
        assert!(!rx.has_changed().unwrap());
    }
}
