//! Fault injection shared by the simulators: what can go wrong (each simulator's own
//! fault enum, seen through [`FaultKind`]), on which route, for how many requests, and
//! what the server does about a reply-level fault ([`Action`]).

use std::time::Duration;

/// What the kit needs to know of a simulator's fault enum.
pub trait FaultKind: Clone {
    /// The delay this fault adds to a reply, if it is a latency fault. Latencies combine
    /// with each other and with any other fault on the same request.
    fn latency(&self) -> Option<Duration>;

    /// Whether the server applies it around the handler (through
    /// [`crate::Protocol::reply_fault`]); the others are taken by the protocol step
    /// they change (for example "no free device" by an attach).
    fn is_reply_level(&self) -> bool;
}

/// What the server does with a request a reply-level fault applies to.
#[derive(Debug)]
pub enum Action<R> {
    /// Close the connection without a reply, before the request changes anything.
    Drop,
    /// Send this reply (an error status with its body, say) without handling the request.
    Answer(R),
    /// Handle the request, then do this with its reply.
    Handle(After),
}

/// What happens to the reply of a handled request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Send it as it is.
    Send,
    /// Close the connection without it: the request acted, the client never hears.
    Drop,
    /// Hold it this long, then close the connection without it: a client whose
    /// deadline is shorter gives up first, as against a fabric that acted too slowly.
    Stall(Duration),
    /// Send its status and headers with the body cut in half, so no JSON parser takes it.
    Truncate,
}

/// How long an injection lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The next N requests it applies to.
    Times(u32),
    /// Until removed or cleared.
    UntilCleared,
}

/// A fault with its route filter and scope. From a bare fault: any route, once.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection<F, R> {
    pub fault: F,
    pub route: Option<R>,
    pub scope: Scope,
}

impl<F, R> Injection<F, R> {
    /// Restrict to one route.
    pub fn on(mut self, route: R) -> Self {
        self.route = Some(route);
        self
    }

    /// Apply to the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.scope = Scope::Times(n);
        self
    }

    /// Apply until removed or cleared.
    pub fn always(mut self) -> Self {
        self.scope = Scope::UntilCleared;
        self
    }
}

impl<F, R> From<F> for Injection<F, R> {
    fn from(fault: F) -> Self {
        Injection {
            fault,
            route: None,
            scope: Scope::Times(1),
        }
    }
}

/// Handle to remove one injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultId(u64);

struct Active<F, R> {
    id: u64,
    injection: Injection<F, R>,
    used: u32,
}

impl<F, R: PartialEq> Active<F, R> {
    fn matches(&self, route: Option<&R>) -> bool {
        self.injection.route.is_none() || self.injection.route.as_ref() == route
    }

    fn exhausted(&self) -> bool {
        matches!(self.injection.scope, Scope::Times(n) if self.used >= n)
    }
}

/// The injections in force, in the order they were made.
pub struct FaultBook<F, R> {
    next_id: u64,
    active: Vec<Active<F, R>>,
}

impl<F, R> Default for FaultBook<F, R> {
    fn default() -> Self {
        FaultBook {
            next_id: 0,
            active: Vec::new(),
        }
    }
}

/// What the server does around the handler for one request.
#[derive(Debug)]
pub struct ReplyPlan<F> {
    pub latency: Duration,
    pub action: Option<F>,
}

impl<F> Default for ReplyPlan<F> {
    fn default() -> Self {
        ReplyPlan {
            latency: Duration::ZERO,
            action: None,
        }
    }
}

impl<F: FaultKind, R: PartialEq> FaultBook<F, R> {
    pub fn inject(&mut self, injection: Injection<F, R>) -> FaultId {
        self.next_id += 1;
        let id = self.next_id;
        if injection.scope != Scope::Times(0) {
            self.active.push(Active {
                id,
                injection,
                used: 0,
            });
        }
        FaultId(id)
    }

    /// Removes one injection; false if it was used up or removed already.
    pub fn remove(&mut self, id: FaultId) -> bool {
        let before = self.active.len();
        self.active.retain(|a| a.id != id.0);
        self.active.len() != before
    }

    pub fn clear(&mut self) {
        self.active.clear();
    }

    /// Injections not used up yet.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Consumes all matching latencies and the first matching reply-level fault.
    pub fn plan_reply(&mut self, route: Option<&R>) -> ReplyPlan<F> {
        let mut plan = ReplyPlan::default();
        for a in &mut self.active {
            if let Some(d) = a.injection.fault.latency()
                && a.matches(route)
            {
                plan.latency += d;
                a.used = a.used.saturating_add(1);
            }
        }
        plan.action = self.take(route, F::is_reply_level);
        plan
    }

    /// Consumes the first fault matching `route` that `pred` accepts.
    pub fn take(&mut self, route: Option<&R>, pred: impl Fn(&F) -> bool) -> Option<F> {
        let found = self
            .active
            .iter_mut()
            .find(|a| a.matches(route) && pred(&a.injection.fault))
            .map(|a| {
                a.used = a.used.saturating_add(1);
                a.injection.fault.clone()
            });
        self.active.retain(|a| !a.exhausted());
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    enum Toy {
        Slow(Duration),
        Drop,
        Step,
    }

    impl FaultKind for Toy {
        fn latency(&self) -> Option<Duration> {
            match self {
                Toy::Slow(d) => Some(*d),
                _ => None,
            }
        }
        fn is_reply_level(&self) -> bool {
            *self == Toy::Drop
        }
    }

    #[test]
    fn scopes_routes_and_steps() {
        let mut book = FaultBook::<Toy, u8>::default();
        book.inject(Injection::from(Toy::Drop).on(1).times(2));
        book.inject(Injection::from(Toy::Slow(Duration::from_millis(3))).always());
        assert!(book.plan_reply(Some(&2)).action.is_none());
        let plan = book.plan_reply(Some(&1));
        assert_eq!(plan.action, Some(Toy::Drop));
        assert_eq!(plan.latency, Duration::from_millis(3));
        assert_eq!(book.plan_reply(Some(&1)).action, Some(Toy::Drop));
        assert!(book.plan_reply(Some(&1)).action.is_none());
        assert_eq!(book.len(), 1);

        let step = book.inject(Injection::from(Toy::Step).always());
        assert!(book.plan_reply(None).action.is_none());
        assert_eq!(book.take(Some(&9), |f| *f == Toy::Step), Some(Toy::Step));
        assert!(book.remove(step));
        assert!(!book.remove(step));
        assert_eq!(book.inject(Injection::from(Toy::Drop).times(0)), FaultId(4));
        assert_eq!(book.len(), 1);
        book.clear();
        assert!(book.is_empty());
    }
}
