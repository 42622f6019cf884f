//! What the Go operator's code would take on the same run: a discrete-event model of its
//! two controllers, fed with the run's fabric latency, API round trip and node delay.
//!
//! The rules (docs/BENCHMARKS.md repeats them beside the figures):
//! - One worker per controller: a controller runs one reconcile at a time, in the order
//!   they become due.
//! - Every reconcile that talks to the fabric first gets a new token (one fabric call).
//! - Request, on creation: finalizer, status and plan writes, and the creation of its two
//!   resources (4 round trips). When both its devices are Online, one status write makes
//!   it Running.
//! - Resource, attach: token + add (2 fabric calls) and a status write with the ids; that
//!   write re-triggers it at once. The next reconcile looks at the node (1 round trip): a
//!   device not yet visible (the node shows it `visible_after` the attach) is looked at
//!   again 30 s later, as nothing else re-triggers it; once visible, a status write makes
//!   it Online.
//! - Deletion, request: deletes its two resources and writes its state (3 round trips),
//!   then is re-polled every 30 s, not woken by its resources' deletion; once they are
//!   gone, its finalizer is removed (1 round trip).
//! - Deletion, resource: token + remove (2 fabric calls) and a status write; the device is
//!   still visible right after the removal, so it is looked at again 3 s later (1 round
//!   trip), then its finalizer is removed (1 round trip).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

pub struct Params {
    pub requests: usize,
    /// Fabric latency per call, seconds.
    pub latency: f64,
    /// One API write, seconds.
    pub round_trip: f64,
    /// From a device's attach until its node shows it, seconds.
    pub visible_after: f64,
}

#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// From applying all requests until all are Running, seconds.
    pub up: f64,
    /// From deleting all requests until all are gone, seconds.
    pub down: f64,
}

const RECHECK_NOT_VISIBLE: f64 = 30.0;
const RECHECK_STILL_VISIBLE: f64 = 3.0;
const CLEANUP_POLL: f64 = 30.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Work {
    RequestCreate(usize),
    RequestRunning(usize),
    Attach(usize),
    CheckVisible(usize),
    RequestDelete(usize),
    RequestPoll(usize),
    Detach(usize),
    CheckGone(usize),
}

#[derive(Debug, PartialEq)]
struct Due(f64, u64, Work);
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    // Earliest first (BinaryHeap is a max-heap), ties in arrival order.
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

struct Controller {
    queue: BinaryHeap<Due>,
    free_at: f64,
}

struct Model<'a> {
    p: &'a Params,
    requests: Controller,
    resources: Controller,
    seq: u64,
    attached_at: Vec<f64>,
    online: Vec<bool>,
    gone: Vec<bool>,
    done_at: f64,
}

impl Model<'_> {
    fn push(&mut self, at: f64, w: Work) {
        self.seq += 1;
        let c = match w {
            Work::RequestCreate(_)
            | Work::RequestRunning(_)
            | Work::RequestDelete(_)
            | Work::RequestPoll(_) => &mut self.requests,
            _ => &mut self.resources,
        };
        c.queue.push(Due(at, self.seq, w));
    }

    /// Runs until both queues are empty.
    fn run(&mut self) {
        loop {
            let next = |c: &Controller| c.queue.peek().map(|d| d.0.max(c.free_at));
            let (rq, rs) = (next(&self.requests), next(&self.resources));
            let on_requests = match (rq, rs) {
                (None, None) => return,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(a), Some(b)) => a <= b,
            };
            let c = if on_requests {
                &mut self.requests
            } else {
                &mut self.resources
            };
            let Some(Due(ready, _, work)) = c.queue.pop() else {
                return;
            };
            let start = ready.max(c.free_at);
            let (cost, follow) = self.step(start, work);
            let end = start + cost;
            if on_requests {
                self.requests.free_at = end;
            } else {
                self.resources.free_at = end;
            }
            for (delay, w) in follow {
                self.push(end + delay, w);
            }
        }
    }

    /// The cost of `work` started at `t`, and what it makes due (after its end).
    fn step(&mut self, t: f64, work: Work) -> (f64, Vec<(f64, Work)>) {
        let (l, rt) = (self.p.latency, self.p.round_trip);
        match work {
            Work::RequestCreate(r) => (
                4.0 * rt,
                vec![(0.0, Work::Attach(2 * r)), (0.0, Work::Attach(2 * r + 1))],
            ),
            Work::RequestRunning(_) => {
                self.done_at = self.done_at.max(t + rt);
                (rt, vec![])
            }
            Work::Attach(d) => {
                let cost = 2.0 * l + rt;
                self.attached_at[d] = t + 2.0 * l;
                (cost, vec![(0.0, Work::CheckVisible(d))])
            }
            Work::CheckVisible(d) => {
                if t + rt >= self.attached_at[d] + self.p.visible_after {
                    self.online[d] = true;
                    let r = d / 2;
                    let follow = if self.online[2 * r] && self.online[2 * r + 1] {
                        vec![(0.0, Work::RequestRunning(r))]
                    } else {
                        vec![]
                    };
                    (2.0 * rt, follow)
                } else {
                    (rt, vec![(RECHECK_NOT_VISIBLE, Work::CheckVisible(d))])
                }
            }
            Work::RequestDelete(r) => (
                3.0 * rt,
                vec![
                    (0.0, Work::Detach(2 * r)),
                    (0.0, Work::Detach(2 * r + 1)),
                    (CLEANUP_POLL, Work::RequestPoll(r)),
                ],
            ),
            Work::RequestPoll(r) => {
                if self.gone[2 * r] && self.gone[2 * r + 1] {
                    self.done_at = self.done_at.max(t + rt);
                    (rt, vec![])
                } else {
                    (0.0, vec![(CLEANUP_POLL, Work::RequestPoll(r))])
                }
            }
            Work::Detach(d) => (
                2.0 * l + rt,
                vec![(RECHECK_STILL_VISIBLE, Work::CheckGone(d))],
            ),
            Work::CheckGone(d) => {
                self.gone[d] = true;
                (2.0 * rt, vec![])
            }
        }
    }
}

pub fn simulate(p: &Params) -> Outcome {
    let phase = |first: fn(usize) -> Work, online: bool| {
        let mut m = Model {
            p,
            requests: Controller {
                queue: BinaryHeap::new(),
                free_at: 0.0,
            },
            resources: Controller {
                queue: BinaryHeap::new(),
                free_at: 0.0,
            },
            seq: 0,
            attached_at: vec![0.0; 2 * p.requests],
            online: vec![online; 2 * p.requests],
            gone: vec![false; 2 * p.requests],
            done_at: 0.0,
        };
        for r in 0..p.requests {
            m.push(0.0, first(r));
        }
        m.run();
        m.done_at
    };
    Outcome {
        up: phase(Work::RequestCreate, false),
        down: phase(Work::RequestDelete, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(requests: usize, visible_after: f64) -> Params {
        Params {
            requests,
            latency: 0.05,
            round_trip: 0.01,
            visible_after,
        }
    }

    #[test]
    fn a_device_the_node_shows_late_costs_a_thirty_second_recheck() {
        let quick = simulate(&params(1, 0.0));
        let late = simulate(&params(1, 1.5));
        // 4 rt + 2 × (2 L + rt) + checks: well under a second when visible at once.
        assert!(quick.up < 1.0, "{quick:?}");
        assert!(late.up > 30.0 && late.up < 31.0, "{late:?}");
    }

    #[test]
    fn cleanup_waits_for_its_thirty_second_poll() {
        let one = simulate(&params(1, 1.5));
        assert!(one.down > 30.0 && one.down < 31.0, "{one:?}");
    }

    #[test]
    fn one_worker_serialises_the_fabric_calls() {
        // 400 devices × (2 × 50 ms + 10 ms) of attach work on one worker: > 44 s.
        let many = simulate(&params(200, 0.0));
        assert!(many.up > 44.0, "{many:?}");
    }
}
