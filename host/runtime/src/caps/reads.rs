//! The cluster-read budget shared by the `secrets` and `lookup` capabilities: at most
//! `limits.cluster_reads_per_call` API-server reads per call, and a client-side token
//! bucket of `limits.cluster_reads_per_second` (bursts of twice that) per provider, so
//! a provider looping on lookups costs the API server a bounded, steady trickle.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::base::DeadlineExceeded;
use crate::budget::{Budget, BudgetCounters, BudgetExceeded, TokenBucket};

/// The provider's side: the rate limiter.
pub(crate) struct ReadLimiter {
    bucket: Mutex<TokenBucket>,
    per_call: u32,
    counters: Arc<BudgetCounters>,
}

impl ReadLimiter {
    pub(crate) fn new(
        per_call: u32,
        per_second: u32,
        counters: Arc<BudgetCounters>,
    ) -> ReadLimiter {
        ReadLimiter {
            bucket: Mutex::new(TokenBucket::new(
                per_second,
                per_second.saturating_mul(2),
                Instant::now(),
            )),
            per_call,
            counters,
        }
    }
}

/// One call's reads so far (shared by the call's `secrets` and `lookup` sides).
pub(crate) struct CallReads {
    limiter: Arc<ReadLimiter>,
    used: AtomicU32,
    waited: AtomicBool,
}

impl CallReads {
    pub(crate) fn new(limiter: Arc<ReadLimiter>) -> CallReads {
        CallReads {
            limiter,
            used: AtomicU32::new(0),
            waited: AtomicBool::new(false),
        }
    }

    /// Takes one read: waits for the rate limiter within the deadline; a trap when the
    /// call is over its per-call budget (`BudgetExceeded`) or out of time.
    pub(crate) async fn take(&self, deadline: Instant) -> wasmtime::Result<()> {
        let limiter = &self.limiter;
        let n = self.used.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if n > limiter.per_call {
            limiter.counters.hit(Budget::ClusterReads);
            return Err(wasmtime::Error::new(BudgetExceeded {
                budget: Budget::ClusterReads,
                limit: u64::from(limiter.per_call),
            }));
        }
        loop {
            let now = Instant::now();
            let wait = match limiter
                .bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(now)
            {
                Ok(()) => return Ok(()),
                Err(wait) => wait,
            };
            if !self.waited.swap(true, Ordering::Relaxed) {
                limiter.counters.hit(Budget::ClusterRate);
            }
            if now + wait >= deadline {
                tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
                return Err(wasmtime::Error::new(DeadlineExceeded));
            }
            tokio::time::sleep(wait).await;
        }
    }
}
