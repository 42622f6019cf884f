//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go does it: the
//! holder renews the Lease; another instance takes it over only after seeing the record
//! unchanged for the lease duration on its own clock (so clock skew between machines
//! does not matter). Writes carry the resourceVersion read, so two candidates never
//! both win.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::LeaderElectionConfig;
use crate::error::OperatorError;

/// What identifies one term of a holder: a renewal changes it.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    holder: String,
    renew: Option<MicroTime>,
    transitions: Option<i32>,
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Option<(Record, Instant)>,
    /// Labels a Lease this elector creates carries (a provider's Lease is listed by them).
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// Annotations every write of this elector sets (who holds a provider's Lease, from
    /// which process).
    annotations: std::collections::BTreeMap<String, String>,
}

/// Who holds a Lease as an elector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The holder; None when nobody does.
    pub(crate) holder: Option<String>,
    /// The record has not changed for the lease duration on this clock: it may be taken.
    pub(crate) expired: bool,
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl LeaderElector {
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            labels: None,
            annotations: std::collections::BTreeMap::new(),
        }
    }

    /// An elector whose writes set `annotations` on the Lease.
    pub(crate) fn with_annotations(
        mut self,
        annotations: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.annotations = annotations;
        self
    }

    pub(crate) fn set_annotations(
        &mut self,
        annotations: std::collections::BTreeMap<String, String>,
    ) {
        self.annotations = annotations;
    }

    pub(crate) fn lease_name(&self) -> &str {
        &self.config.lease_name
    }

    /// An elector whose Lease, when it creates it, carries `labels`.
    pub(crate) fn with_labels(
        mut self,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.labels = Some(labels);
        self
    }

    /// Notes the record of `lease` (when it was first seen as it is) and says who holds
    /// it and whether that holder's time is up on this clock.
    pub(crate) fn sees(&mut self, lease: Option<&Lease>) -> Seen {
        let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
            return Seen {
                holder: None,
                expired: true,
            };
        };
        let observed_at = self.observe(spec);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let expired = holder.is_none() || observed_at.elapsed() >= self.duration_of(spec);
        Seen { holder, expired }
    }

    fn observe(&mut self, spec: &LeaseSpec) -> Instant {
        let record = Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew: spec.renew_time.clone(),
            transitions: spec.lease_transitions,
        };
        match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record, at));
                at
            }
        }
    }

    fn duration_of(&self, spec: &LeaseSpec) -> Duration {
        spec.lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.lease_duration, Duration::from_secs)
    }

    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Who held the Lease when it was last read (None: nobody, or not read yet).
    pub fn holder(&self) -> Option<&str> {
        self.observed
            .as_ref()
            .map(|(r, _)| r.holder.as_str())
            .filter(|h| !h.is_empty())
    }

    /// A failure to read or write the Lease, in words; a missing namespace says which
    /// setting names it.
    pub fn describe_error(&self, e: &kube::Error) -> String {
        match e {
            kube::Error::Api(s) if s.code == 404 && s.message.contains("namespaces") => format!(
                "the Lease's namespace {} does not exist: create it, or set --leader-election-namespace (POD_NAMESPACE)",
                self.config.namespace
            ),
            other => format!(
                "Lease {}/{}: {}",
                self.config.namespace,
                self.config.lease_name,
                crate::text::kube_error(other)
            ),
        }
    }

    /// One attempt: true when this instance holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let existing = self.api.get_opt(&self.config.lease_name).await?;
        self.attempt(existing).await
    }

    /// One attempt on the Lease as just read (`None`: it does not exist): true when this
    /// instance holds it afterwards. The write carries the read's resourceVersion.
    pub(crate) async fn attempt(&mut self, existing: Option<Lease>) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let me = self.config.identity.clone();
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    labels: self.labels.clone(),
                    annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(secs(self.config.lease_duration)),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed_at = self.observe(&spec);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let duration = self.duration_of(&spec);
        let mine = holder == me;
        if !holder.is_empty() && !mine && observed_at.elapsed() < duration {
            return Ok(false);
        }
        if !self.annotations.is_empty() {
            lease
                .metadata
                .annotations
                .get_or_insert_default()
                .extend(self.annotations.clone());
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(secs(self.config.lease_duration)),
            acquire_time: if mine {
                spec.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if mine {
                spec.lease_transitions.unwrap_or(0)
            } else {
                spec.lease_transitions.unwrap_or(0).saturating_add(1)
            }),
            ..spec
        });
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this instance holds it, so a standby takes over at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone else changed it: it is not ours to release any more.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The longest wait between two attempts while the Lease cannot be read or written.
const MAX_FAILING_DELAY: Duration = Duration::from_secs(60);
/// While the same failure repeats, it is logged again at most this often.
const REPEAT_WARNING: Duration = Duration::from_secs(300);

/// What a replica waiting for the Lease has said: one line on becoming standby (and on
/// a new leader), one warning per new failure (repeated every [`REPEAT_WARNING`]), and
/// attempts spaced out while the same failure repeats.
#[derive(Debug, Default)]
pub struct Waiting {
    leader: Option<String>,
    failure: Option<(String, Instant, u32)>,
}

impl Waiting {
    /// Another replica leads: true when that is news worth a line.
    pub fn standby(&mut self, holder: &str) -> bool {
        self.failure = None;
        let news = self.leader.as_deref() != Some(holder);
        self.leader = Some(holder.to_owned());
        news
    }

    /// A failed attempt: how long to wait before the next, and whether to warn.
    pub fn failed(&mut self, text: &str, base: Duration) -> (Duration, bool) {
        self.leader = None;
        let now = Instant::now();
        let (say, repeats) = match &mut self.failure {
            Some((last, said_at, n)) if last == text => {
                *n = n.saturating_add(1);
                let again = said_at.elapsed() >= REPEAT_WARNING;
                if again {
                    *said_at = now;
                }
                (again, *n)
            }
            _ => {
                self.failure = Some((text.to_owned(), now, 0));
                (true, 0)
            }
        };
        let delay = base
            .saturating_mul(2u32.saturating_pow(repeats.min(16)))
            .min(MAX_FAILING_DELAY.max(base));
        (delay, say)
    }
}

/// Held leadership: renewed in the background until released or lost.
pub struct Leadership {
    lost: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Resolves when the Lease could not be renewed in time or another instance holds it.
    pub async fn lost(&mut self) {
        // An error means the renewal task ended, which it only does after losing.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Stops renewing and releases the Lease.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // Without release(): stop renewing; the Lease then expires.
        self.task.abort();
    }
}

/// Waits until this instance holds the Lease, then keeps renewing it.
pub async fn acquire(
    client: kube::Client,
    config: LeaderElectionConfig,
    on_change: impl Fn(bool) + Send + Sync + 'static,
) -> Result<Leadership, OperatorError> {
    let renew_period = config.renew_period;
    // Give up leading a while before others may take over, as client-go's renew deadline.
    let renew_deadline = config.lease_duration.mul_f64(2.0 / 3.0);
    let lease = format!("{}/{}", config.namespace, config.lease_name);
    let mut elector = LeaderElector::new(client, config);
    let mut waiting = Waiting::default();
    loop {
        let delay = match elector.try_acquire_or_renew().await {
            Ok(true) => break,
            Ok(false) => {
                let holder = elector.holder().unwrap_or("another instance").to_owned();
                if waiting.standby(&holder) {
                    tracing::info!(identity = elector.identity(), leader = %holder, lease = %lease,
                        "standby: another replica leads; waiting for the Lease");
                }
                renew_period
            }
            Err(e) => {
                let text = elector.describe_error(&e);
                let (delay, say) = waiting.failed(&text, renew_period);
                if say {
                    tracing::warn!(error = %text, retry_in = ?delay, "leader election: cannot read or write the Lease");
                } else {
                    tracing::debug!(error = %text, "leader election: still failing");
                }
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
    tracing::info!(identity = elector.identity(), lease = %lease, "became the leader");
    on_change(true);
    let (lost_tx, lost) = watch::channel(false);
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                _ = &mut stopped => {
                    if let Err(e) = elector.release().await {
                        tracing::warn!(error = %elector.describe_error(&e), "leader election: cannot release the Lease");
                    }
                    on_change(false);
                    return;
                }
                () = tokio::time::sleep(renew_period) => {}
            }
            match elector.try_acquire_or_renew().await {
                Ok(true) => last_renewal = Instant::now(),
                Ok(false) => {
                    tracing::error!(
                        identity = elector.identity(),
                        "leader election: another instance holds the Lease"
                    );
                    break;
                }
                Err(e) if last_renewal.elapsed() < renew_deadline => {
                    tracing::warn!(error = %elector.describe_error(&e), "leader election: renewal failed; retrying");
                }
                Err(e) => {
                    tracing::error!(error = %elector.describe_error(&e), "leader election: could not renew the Lease in time");
                    break;
                }
            }
        }
        on_change(false);
        let _ = lost_tx.send(true);
    });
    Ok(Leadership {
        lost,
        stop: Some(stop),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_failure_is_said_once_and_waited_out_longer() {
        let mut w = Waiting::default();
        let base = Duration::from_secs(5);
        assert_eq!(w.failed("no namespace", base), (base, true));
        assert_eq!(w.failed("no namespace", base), (base * 2, false));
        assert_eq!(w.failed("no namespace", base), (base * 4, false));
        for _ in 0..10 {
            w.failed("no namespace", base);
        }
        assert_eq!(w.failed("no namespace", base).0, MAX_FAILING_DELAY);
        // A different failure is news.
        assert_eq!(w.failed("forbidden", base), (base, true));
    }

    #[test]
    fn standby_is_said_once_per_leader() {
        let mut w = Waiting::default();
        assert!(w.standby("a"));
        assert!(!w.standby("a"));
        assert!(w.standby("b"));
        w.failed("x", Duration::from_secs(1));
        assert!(w.standby("b"));
    }
}
