//! The `state` interface's store: a per-provider, size-bounded map with optional TTLs.
//!
//! Instances live for one call, so this map (owned by the `Provider` handle) is the only
//! place a provider's state survives between calls — the FTI token cache lives here. It is
//! in memory only: a restarted operator starts empty. Expiry uses the runtime's wall clock
//! (injectable in tests).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::runtime::WallClock;

pub(crate) struct StateStore {
    map: Mutex<HashMap<String, Entry>>,
    capacity: usize,
    clock: WallClock,
}

struct Entry {
    value: Vec<u8>,
    expires: Option<SystemTime>,
}

fn size(key: &str, value: &[u8]) -> usize {
    key.len() + value.len()
}

impl StateStore {
    pub(crate) fn new(capacity: usize, clock: WallClock) -> StateStore {
        StateStore {
            map: Mutex::new(HashMap::new()),
            capacity,
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        let now = (self.clock)();
        let mut map = self.lock();
        match map.get(key) {
            Some(e) if e.expires.is_some_and(|t| now >= t) => {
                map.remove(key);
                None
            }
            Some(e) => Some(e.value.clone()),
            None => None,
        }
    }

    /// False (and the old value kept) when the value would not fit.
    pub(crate) fn set(&self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> bool {
        let now = (self.clock)();
        let mut map = self.lock();
        map.retain(|_, e| e.expires.is_none_or(|t| now < t));
        let used: usize = map.iter().map(|(k, e)| size(k, &e.value)).sum();
        let replaced = map.get(&key).map_or(0, |e| size(&key, &e.value));
        if used - replaced + size(&key, &value) > self.capacity {
            return false;
        }
        let expires = ttl_ms.map(|ms| now + Duration::from_millis(ms));
        map.insert(key, Entry { value, expires });
        true
    }

    pub(crate) fn remove(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn bounded_and_expiring() {
        let now = Arc::new(AtomicU64::new(1_000));
        let clock_now = now.clone();
        let clock: WallClock = Arc::new(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(clock_now.load(Ordering::SeqCst))
        });
        let store = StateStore::new(10, clock);
        assert!(store.set("a".into(), b"1234".to_vec(), None)); // 5 bytes
        assert!(store.set("b".into(), b"123".to_vec(), Some(2_000))); // 9 bytes
        assert!(!store.set("c".into(), b"12".to_vec(), None)); // would be 12
        assert_eq!(store.get("c"), None);
        // Replacing counts the new size only.
        assert!(store.set("a".into(), b"12345".to_vec(), None)); // 10 bytes
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
    }
}
