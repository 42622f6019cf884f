//! Which resource a device was handed to, remembered in the host's state store.
//!
//! Both APIs need it: between the reply that hands a resource its device and the
//! operator storing the device's ids, the device is attached but claimed by no
//! ComposableResource, and another resource attaching on the same machine at that
//! moment must not take it (nor may a retry adopt it).

use crate::host::{Host, LogLevel};

/// How long a hand-out is kept: the operator stores the device's ids right after the
/// reply, so minutes are plenty; longer only fills the host's state store. Each attach
/// keeps an entry this long (and the Fabric Manager API its attempt's note), so the
/// host's default `limits.state_entries` / `state_bytes` must hold a provider's attaches
/// of this many minutes (docs/fti-fabric-api.md, "Lost replies").
pub const HANDOUT_TTL_MS: u64 = 10 * 60 * 1000;

/// The devices one API has handed out, under its own prefix in the state store.
pub struct Reservations {
    prefix: &'static str,
    ttl_ms: u64,
}

impl Reservations {
    /// `ttl_ms` only has to outlast the few reconciles before the operator stores the
    /// device's ids; a forgotten reservation weakens the guard, nothing more.
    pub const fn new(prefix: &'static str, ttl_ms: u64) -> Self {
        Self { prefix, ttl_ms }
    }

    fn key(&self, device_id: &str) -> String {
        format!("{}/{device_id}", self.prefix)
    }

    /// The resource `device_id` was handed to, if this provider remembers.
    pub fn holder(&self, host: &(impl Host + ?Sized), device_id: &str) -> Option<String> {
        host.state_get(&self.key(device_id))
            .and_then(|v| String::from_utf8(v).ok())
    }

    /// Records that `device_id` is `resource`'s. The device is the resource's either
    /// way, so a refused store is only logged: it weakens the guard, it does not fail
    /// the attach.
    pub fn hand(&self, host: &(impl Host + ?Sized), device_id: &str, resource: &str) {
        if !host.state_set(&self.key(device_id), resource.as_bytes(), Some(self.ttl_ms)) {
            host.log(
                LogLevel::Warn,
                &format!("the host refused to record that device {device_id} is {resource}'s"),
            );
        }
    }

    /// Forgets `device_id`'s reservation (it was detached).
    pub fn release(&self, host: &(impl Host + ?Sized), device_id: &str) {
        host.state_remove(&self.key(device_id));
    }
}
