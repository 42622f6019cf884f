//! The `state` capability: a per-provider, size-bounded map with optional TTLs.
//!
//! Instances live for one call, so this map (owned by the `Provider` handle) is the only
//! place a provider's state survives between calls — the FTI token cache lives here. It is
//! in memory only: a restarted operator starts empty. Expiry uses the runtime's wall clock
//! (injectable in tests).
//!
//! Budget: every entry is charged its key, its value and [`ENTRY_OVERHEAD`] bytes (what
//! the host really spends on a tiny entry: map node, two allocations, the expiry index),
//! within `limits.state_bytes`, and at most `limits.state_entries` entries are kept. A
//! `set` beyond either returns false and keeps the old value. Updates are O(log n): a
//! running total instead of a sum over the map, and expired entries found through an
//! index ordered by expiry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::WasiView;

use super::capability::{CallSetup, Capability, Declared, Findings, Load, NoGrant, SetupError};
use crate::base::{FieldError, WallClock};
use crate::budget::{Budget, BudgetCounters};
use crate::gate::{CapabilityKind, Check, Gate};

/// The `cro:provider/state` import's bindings, as every served contract version imports
/// it (unchanged since 0.1.0; the version modules in `crate::wit` map it here).
pub(crate) mod wit {
    wasmtime::component::bindgen!({
        path: "../../wit/since_v0.1.0",
        inline: "
            package cro-host:state;
            world imports {
                import cro:provider/state@0.1.0;
            }
        ",
        world: "cro-host:state/imports",
    });

    pub(crate) use self::cro::provider::state::*;
}

/// The capability, as `crate::caps` registers it.
pub(crate) struct StateCap;

impl Capability for StateCap {
    const NAME: &'static str = "state";
    type Grant = NoGrant;
    type Shared = State;
    type Call = StateCall;

    fn validate(_: &NoGrant) -> Result<(), FieldError> {
        Ok(())
    }

    fn load(_: &NoGrant, load: &Load<'_>) -> Result<State, SetupError> {
        let limits = load.limits;
        let capacity = usize::try_from(limits.state_bytes)
            .map_err(|_| SetupError::Limits("state_bytes does not fit this platform".into()))?;
        Ok(State {
            store: StateStore::new(
                capacity,
                limits.state_entries as usize,
                load.clock.clone(),
                load.budgets.clone(),
            ),
            gate: load.gate.clone(),
        })
    }

    fn call(shared: &Arc<State>, _: &CallSetup) -> StateCall {
        StateCall {
            shared: shared.clone(),
        }
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        get: fn(&mut T) -> &mut StateCall,
    ) -> wasmtime::Result<()> {
        wit::add_to_linker::<T, HasSelf<StateCall>>(linker, get)
    }

    /// Always granted and never declared: nothing to compare.
    fn report(_: &NoGrant, _: &Declared<'_>, _: &mut Findings) {}

    #[cfg(test)]
    fn example() -> NoGrant {
        NoGrant
    }
}

/// The provider's side: its map.
pub(crate) struct State {
    pub(crate) store: StateStore,
    gate: Arc<Gate>,
}

/// Bytes charged per entry on top of its key and value.
pub const ENTRY_OVERHEAD: usize = 96;

pub(crate) struct StateStore {
    inner: Mutex<Map>,
    capacity: usize,
    max_entries: usize,
    clock: WallClock,
    counters: Arc<BudgetCounters>,
}

#[derive(Default)]
struct Map {
    entries: BTreeMap<String, Entry>,
    /// (expiry, key) of every entry with a TTL.
    expiries: BTreeSet<(SystemTime, String)>,
    used: usize,
}

struct Entry {
    value: Vec<u8>,
    expires: Option<SystemTime>,
}

fn charge(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Map {
    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.used -= charge(key, &entry.value);
        if let Some(t) = entry.expires {
            self.expiries.remove(&(t, key.to_string()));
        }
        Some(entry)
    }

    /// Drops what has expired by `now`: O(log n) per expired entry.
    fn expire(&mut self, now: SystemTime) {
        while let Some((t, _)) = self.expiries.first() {
            if *t > now {
                break;
            }
            if let Some((_, key)) = self.expiries.pop_first()
                && let Some(entry) = self.entries.remove(&key)
            {
                self.used -= charge(&key, &entry.value);
            }
        }
    }
}

impl StateStore {
    pub(crate) fn new(
        capacity: usize,
        max_entries: usize,
        clock: WallClock,
        counters: Arc<BudgetCounters>,
    ) -> StateStore {
        StateStore {
            inner: Mutex::new(Map::default()),
            capacity,
            max_entries,
            clock,
            counters,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        let now = (self.clock)();
        let mut map = self.lock();
        map.expire(now);
        map.entries.get(key).map(|e| e.value.clone())
    }

    /// False (and the old value kept) when the value would not fit.
    pub(crate) fn set(&self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> bool {
        let now = (self.clock)();
        let mut map = self.lock();
        map.expire(now);
        let replaced = map.entries.get(&key).map(|e| charge(&key, &e.value));
        let entries_after = map.entries.len() + usize::from(replaced.is_none());
        let used_after = map.used - replaced.unwrap_or(0) + charge(&key, &value);
        if used_after > self.capacity || entries_after > self.max_entries {
            self.counters.hit(Budget::State);
            return false;
        }
        map.remove(&key);
        let expires = ttl_ms.and_then(|ms| now.checked_add(Duration::from_millis(ms)));
        if let Some(t) = expires {
            map.expiries.insert((t, key.clone()));
        }
        map.used += charge(&key, &value);
        map.entries.insert(key, Entry { value, expires });
        true
    }

    pub(crate) fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    /// (entries, bytes charged) right now.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let map = self.lock();
        (map.entries.len(), map.used)
    }
}

/// One call's side (the store is the provider's).
pub(crate) struct StateCall {
    shared: Arc<State>,
}

/// Using the provider's own map: always allowed (bounded by `limits.state_bytes`).
pub(crate) struct UseState;

impl Check for UseState {
    fn kind(&self) -> Option<CapabilityKind> {
        None
    }

    fn decide(&self) -> Result<(), String> {
        Ok(())
    }
}

impl wit::Host for StateCall {
    fn get(&mut self, key: String) -> Option<Vec<u8>> {
        let shared = &self.shared;
        shared.gate.check(&UseState).ok()?;
        shared.store.get(&key)
    }

    fn set(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> bool {
        let shared = &self.shared;
        shared.gate.check(&UseState).is_ok() && shared.store.set(key, value, ttl_ms)
    }

    fn remove(&mut self, key: String) {
        let shared = &self.shared;
        if shared.gate.check(&UseState).is_ok() {
            shared.store.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn clock(now: &Arc<AtomicU64>) -> WallClock {
        let now = now.clone();
        Arc::new(move || SystemTime::UNIX_EPOCH + Duration::from_secs(now.load(Ordering::SeqCst)))
    }

    #[test]
    fn bounded_and_expiring() {
        let now = Arc::new(AtomicU64::new(1_000));
        let o = ENTRY_OVERHEAD;
        let counters = Arc::new(BudgetCounters::default());
        let store = StateStore::new(10 + 2 * o, 100, clock(&now), counters.clone());
        assert!(store.set("a".into(), b"1234".to_vec(), None)); // 5 + o
        assert!(store.set("b".into(), b"123".to_vec(), Some(2_000))); // 9 + 2o
        assert!(!store.set("c".into(), b"12".to_vec(), None)); // would be 12 + 3o
        assert_eq!(store.get("c"), None);
        // Replacing counts the new size only.
        assert!(store.set("a".into(), b"12345".to_vec(), None)); // 10 + 2o
        assert!(!store.set("a".into(), b"123456".to_vec(), None));
        assert_eq!(store.get("a").unwrap(), b"12345");
        assert_eq!(store.get("b").unwrap(), b"123");
        now.fetch_add(2, Ordering::SeqCst);
        assert_eq!(store.get("b"), None, "expired");
        // The expired entry no longer counts.
        assert!(store.set("c".into(), b"".to_vec(), None));
        store.remove("a");
        assert_eq!(store.get("a"), None);
        assert!(store.set("d".into(), b"12345678".to_vec(), None));
        assert_eq!(counters.get(Budget::State), 2);
    }

    #[test]
    fn tiny_entries_are_charged_and_capped() {
        let now = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(BudgetCounters::default());
        let store = StateStore::new(64 << 10, 256, clock(&now), counters.clone());
        let mut stored = 0;
        for i in 0..100_000 {
            if store.set(format!("{i}"), Vec::new(), Some(1_000_000)) {
                stored += 1;
            }
        }
        let (entries, used) = store.usage();
        assert_eq!(entries, stored);
        assert!(entries <= 256, "{entries}");
        assert!(used <= 64 << 10, "{used}");
        // A TTL replaced by none leaves no stale expiry behind.
        assert!(store.set("0".into(), b"x".to_vec(), None));
        now.fetch_add(2_000, Ordering::SeqCst);
        assert_eq!(store.get("0").unwrap(), b"x");
        assert_eq!(store.usage().0, 1);
    }
}
