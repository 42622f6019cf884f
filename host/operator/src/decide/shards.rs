//! Which provider Leases a replica renews, takes and gives up in one round: a pure
//! decision over what the round read (docs/ARCHITECTURE.md, "Replicas").
//!
//! With P providers and M live replicas no replica holds more than ceil(P / M). A
//! replica below its share takes free or expired Leases, each replica preferring its
//! own order of the providers (a hash of its identity and the provider) so that
//! replicas starting together ask for different ones. Shares differ by at most one once
//! settled: while a live replica holds fewer than floor(P / M), the replica holding the
//! most (ties: the smallest identity) gives one up, one per round, so two replicas never
//! give up at once for the same shortfall.
//! Meanwhile nobody else takes more than the floor, so the Lease given up goes to the
//! replica short of it.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

/// Who holds one provider's Lease, as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// This replica.
    Me,
    /// Another replica whose Lease record this replica has seen change within the
    /// lease duration (or only just seen).
    Live(String),
    /// Nobody (no Lease yet, released), or a holder whose record has not changed for the
    /// whole lease duration on this replica's clock.
    Free,
}

/// What one round read.
#[derive(Debug, Clone)]
pub(crate) struct View<'a> {
    pub(crate) me: &'a str,
    /// Every provider (the registry's).
    pub(crate) providers: &'a [String],
    /// Each provider's holder; a provider missing here is free.
    pub(crate) holders: &'a BTreeMap<String, Holder>,
    /// The replicas alive now (their membership Leases renewed), this one included.
    pub(crate) members: &'a BTreeSet<String>,
}

/// What to do this round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Held and kept: renewed.
    pub(crate) renew: Vec<String>,
    /// Free and wanted: taken, in this order.
    pub(crate) acquire: Vec<String>,
    /// Held and given up (its work stopped first).
    pub(crate) release: Vec<String>,
}

/// The most Leases one replica may hold: ceil(P / M).
pub(crate) fn share(providers: usize, members: usize) -> usize {
    providers.div_ceil(members.max(1))
}

fn preference(me: &str, provider: &str) -> u64 {
    // Stable across processes and versions of this binary: FNV-1a, not the std hasher.
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    me.hash(&mut h);
    provider.hash(&mut h);
    h.finish()
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// This replica's plan for the round.
pub(crate) fn plan(view: &View<'_>) -> Plan {
    let members = view.members.len().max(1);
    let most = share(view.providers.len(), members);
    let least = view.providers.len() / members;
    let holder = |p: &String| view.holders.get(p).cloned().unwrap_or(Holder::Free);
    let mut mine: Vec<String> = view
        .providers
        .iter()
        .filter(|p| holder(p) == Holder::Me)
        .cloned()
        .collect();
    // Given up first: the ones this replica likes least.
    mine.sort_by_key(|p| std::cmp::Reverse(preference(view.me, p)));
    let mut counts: BTreeMap<&str, usize> = view.members.iter().map(|m| (m.as_str(), 0)).collect();
    counts.insert(view.me, mine.len());
    for p in view.providers {
        if let Holder::Live(h) = holder(p)
            && let Some(c) = counts.get_mut(h.as_str())
        {
            *c += 1;
        }
    }
    let mut release = Vec::new();
    if mine.len() > most {
        release = mine.drain(..mine.len() - most).collect();
    } else if mine.len() > least && counts.values().any(|c| *c < least) {
        // Only the replica holding the most (smallest identity on a tie) gives one up.
        let top = counts
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(m, _)| *m);
        if top == Some(view.me) {
            release = mine.drain(..1).collect();
        }
    }
    // While another replica is below the floor, take no more than the floor: what is
    // free is its to take (else the one that gave a Lease up could take it back).
    let starved = counts.iter().any(|(m, c)| *m != view.me && *c < least);
    let cap = if starved { least } else { most };
    let mut acquire = Vec::new();
    if release.is_empty() && mine.len() < cap {
        let mut free: Vec<&String> = view
            .providers
            .iter()
            .filter(|p| holder(p) == Holder::Free)
            .collect();
        free.sort_by_key(|p| preference(view.me, p));
        acquire = free.into_iter().take(cap - mine.len()).cloned().collect();
    }
    mine.sort();
    Plan {
        renew: mine,
        acquire,
        release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    fn set(ms: &[&str]) -> BTreeSet<String> {
        ms.iter().map(|m| (*m).to_owned()).collect()
    }

    /// Runs the replicas' rounds in turn, each seeing the others' last outcome, until
    /// nothing changes; returns who holds what.
    fn settle(providers: &[String], members: &[&str]) -> BTreeMap<String, String> {
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        for _ in 0..50 {
            let before = held.clone();
            for me in members {
                let holders: BTreeMap<String, Holder> = held
                    .iter()
                    .map(|(p, h)| {
                        let who = if h == me {
                            Holder::Me
                        } else {
                            Holder::Live(h.clone())
                        };
                        (p.clone(), who)
                    })
                    .collect();
                let plan = plan(&View {
                    me,
                    providers,
                    holders: &holders,
                    members: &set(members),
                });
                for p in plan.release {
                    held.remove(&p);
                }
                for p in plan.acquire {
                    held.entry(p).or_insert_with(|| (*me).to_owned());
                }
            }
            if held == before {
                return held;
            }
        }
        panic!("no settled assignment: {held:?}");
    }

    fn counts(held: &BTreeMap<String, String>, members: &[&str]) -> Vec<usize> {
        members
            .iter()
            .map(|m| held.values().filter(|h| h == m).count())
            .collect()
    }

    #[test]
    fn shares_settle_within_one_and_never_above_the_ceiling() {
        for p in 0..9 {
            for m in 1..5 {
                let members: Vec<String> = (0..m).map(|i| format!("r{i}")).collect();
                let refs: Vec<&str> = members.iter().map(String::as_str).collect();
                let providers = names(p);
                let held = settle(&providers, &refs);
                assert_eq!(held.len(), p, "every provider held: {held:?}");
                let c = counts(&held, &refs);
                let (lo, hi) = (c.iter().min().unwrap(), c.iter().max().unwrap());
                assert!(*hi <= share(p, m), "{p} over {m}: {c:?}");
                assert!(hi - lo <= 1, "{p} over {m}: {c:?}");
            }
        }
    }

    #[test]
    fn a_replica_alone_takes_all_then_gives_back_when_others_join() {
        let providers = names(4);
        let alone = settle(&providers, &["a"]);
        assert_eq!(counts(&alone, &["a"]), vec![4]);
        let holders: BTreeMap<String, Holder> =
            providers.iter().map(|p| (p.clone(), Holder::Me)).collect();
        let plan = plan(&View {
            me: "a",
            providers: &providers,
            holders: &holders,
            members: &set(&["a", "b", "c"]),
        });
        assert_eq!(plan.release.len(), 2, "{plan:?}");
        assert_eq!(plan.renew.len(), 2);
        assert!(plan.acquire.is_empty());
    }

    #[test]
    fn only_the_top_holder_gives_one_up_for_a_member_with_none() {
        let providers = names(4);
        let holders = BTreeMap::from([
            ("p0".to_owned(), Holder::Me),
            ("p1".to_owned(), Holder::Me),
            ("p2".to_owned(), Holder::Live("b".into())),
            ("p3".to_owned(), Holder::Live("b".into())),
        ]);
        let members = set(&["a", "b", "c"]);
        let a = plan(&View {
            me: "a",
            providers: &providers,
            holders: &holders,
            members: &members,
        });
        assert_eq!(a.release.len(), 1, "a ties with b and is smaller: {a:?}");
        let as_b: BTreeMap<String, Holder> = holders
            .iter()
            .map(|(p, h)| {
                let h = match h {
                    Holder::Me => Holder::Live("a".into()),
                    Holder::Live(_) => Holder::Me,
                    Holder::Free => Holder::Free,
                };
                (p.clone(), h)
            })
            .collect();
        let b = plan(&View {
            me: "b",
            providers: &providers,
            holders: &as_b,
            members: &members,
        });
        assert!(b.release.is_empty(), "{b:?}");
    }

    #[test]
    fn a_dead_holders_leases_are_taken_up_to_the_share() {
        let providers = names(4);
        // c died: its Leases read Free once unchanged for the lease duration.
        let holders = BTreeMap::from([
            ("p0".to_owned(), Holder::Me),
            ("p1".to_owned(), Holder::Live("b".into())),
            ("p2".to_owned(), Holder::Free),
            ("p3".to_owned(), Holder::Free),
        ]);
        let a = plan(&View {
            me: "a",
            providers: &providers,
            holders: &holders,
            members: &set(&["a", "b"]),
        });
        assert_eq!(a.renew, vec!["p0".to_owned()]);
        assert_eq!(a.acquire.len(), 1, "{a:?}");
        assert!(a.release.is_empty());
    }

    #[test]
    fn preferences_differ_between_replicas() {
        let providers = names(8);
        let first = |me: &str| {
            let mut p = providers.clone();
            p.sort_by_key(|x| preference(me, x));
            p
        };
        assert_ne!(first("replica-0"), first("replica-1"));
        assert_eq!(first("replica-0"), first("replica-0"));
    }
}
