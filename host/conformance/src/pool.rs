//! The pool checks (contract 0.3.0 `get-pool`): what a provider reports free is what
//! the fabric holds free, it follows the fabric when devices come and go behind the
//! provider's back, the pool reaches the suite's node, a read sends nothing that
//! attaches or detaches, and a failed read is a typed error. A provider of an older
//! contract has no pool: the checks are skipped, saying so. A provider whose fabric
//! cannot tell its free devices answers `not-supported`, which passes (the operator
//! then publishes no pool for it) as long as it says why.

use cro_runtime::{FabricPool, PoolKind, PoolOutcome, PoolQuery};

use crate::attached::{Target, changed_since, last_seq};
use crate::fabric::{FaultKind, Op};
use crate::faults::typed_for;
use crate::run::{NODE, Run, Verdict, fail, pass, skip};

/// Devices added behind the provider's back by `pool-follows-fabric`.
const ADDED: u32 = 2;

/// The query of every pool check: the suite's node and the model it attaches.
fn query(t: &Target) -> PoolQuery {
    PoolQuery {
        kinds: vec![kind(t)],
        nodes: vec![NODE.to_string()],
    }
}

fn kind(t: &Target) -> PoolKind {
    PoolKind {
        device_type: t.r1.device_type,
        model: t.model.clone(),
    }
}

/// What a pool read answered, judged: the count of free devices of the asked kind in
/// the one pool reaching [`NODE`], or the verdict that ends the check.
enum Read {
    Count(u32),
    Done(Verdict),
}

/// Reads the pool and checks its shape: no change sent to the fabric, exactly one pool
/// reaching the node, the asked kind in it.
async fn read(run: &mut Run, t: &Target) -> Read {
    if let Some(v) = older_contract(run) {
        return Read::Done(v);
    }
    let since = last_seq(t);
    let reply = run.pool(&query(t)).await;
    if let Some(why) = changed_since(t, since) {
        return Read::Done(fail(format!("reading the pool {why}")));
    }
    let pools = match reply {
        Err(e) => return Read::Done(fail(format!("get-pool failed: {e}"))),
        Ok(PoolOutcome::NotSupported(why)) if why.trim().is_empty() => {
            return Read::Done(fail(
                "answered not-supported without saying why".to_string(),
            ));
        }
        Ok(PoolOutcome::NotSupported(why)) => {
            return Read::Done(pass(format!("the fabric has no pool read: {why}")));
        }
        Ok(PoolOutcome::Pools(pools)) => pools,
    };
    let reaching: Vec<&FabricPool> = pools
        .iter()
        .filter(|p| p.nodes.iter().any(|n| n == NODE))
        .collect();
    let pool = match reaching.as_slice() {
        [one] => *one,
        [] => {
            return Read::Done(fail(format!(
                "no pool reaches node {NODE}, whose machine is on the fabric ({} pools)",
                pools.len()
            )));
        }
        many => {
            return Read::Done(fail(format!(
                "{} pools say they reach node {NODE}; a node's machine is on one fabric",
                many.len()
            )));
        }
    };
    let want = kind(t);
    let counts: Vec<u32> = pool
        .free
        .iter()
        .filter(|f| f.kind == want)
        .map(|f| f.count)
        .collect();
    match counts.as_slice() {
        [count] => Read::Count(*count),
        [] => Read::Done(fail(format!(
            "pool {} does not count the asked {:?} model {:?}",
            pool.id, want.device_type, want.model
        ))),
        _ => Read::Done(fail(format!(
            "pool {} counts {:?} model {:?} more than once",
            pool.id, want.device_type, want.model
        ))),
    }
}

/// The fabric's own count of the asked kind, or the skip when it cannot say.
fn oracle(t: &Target) -> Result<u32, Verdict> {
    t.fabric
        .free(t.r1.device_type, &t.model)
        .map_err(|why| skip(format!("the simulator cannot count free devices: {why}")))
}

/// `pool`: the free devices reported are the fabric's.
pub(crate) async fn pool(run: &mut Run, t: &Target) -> Verdict {
    let count = match read(run, t).await {
        Read::Count(c) => c,
        Read::Done(v) => return v,
    };
    match oracle(t) {
        Err(v) => v,
        Ok(free) if free == count => pass(format!(
            "{count} free {} reported, as the fabric holds",
            t.model
        )),
        Ok(free) => fail(format!(
            "reported {count} free {} where the fabric holds {free}",
            t.model
        )),
    }
}

/// `pool-follows-fabric`: devices freed behind the provider's back show in the next
/// read.
pub(crate) async fn follows(run: &mut Run, t: &Target) -> Verdict {
    let before = match read(run, t).await {
        Read::Count(c) => c,
        Read::Done(v) => return v,
    };
    t.fabric
        .add_free_devices(t.r1.device_type, Some(&t.model), ADDED as usize);
    let after = match read(run, t).await {
        Read::Count(c) => c,
        Read::Done(v) => return v,
    };
    let expected = match oracle(t) {
        Err(v) => return v,
        Ok(free) => free,
    };
    if after != expected {
        return fail(format!(
            "after {ADDED} devices were freed on the fabric, reported {after} free where the fabric holds {expected}"
        ));
    }
    pass(format!(
        "{before} free, then {after} once {ADDED} more were freed on the fabric"
    ))
}

/// `fault-5xx-pool`: a 5xx reply to the read is a typed error, never an empty pool.
pub(crate) async fn fault(run: &mut Run, t: &Target) -> Verdict {
    if let Some(v) = older_contract(run) {
        return v;
    }
    t.fabric.inject(FaultKind::ServerError, Op::First);
    let r = run.pool(&query(t)).await;
    t.fabric.clear_faults();
    let r = match r {
        // A provider that does not read the pool sends nothing to fault.
        Ok(PoolOutcome::NotSupported(why)) => {
            return pass(format!("no pool read to fault (not supported: {why})"));
        }
        Ok(PoolOutcome::Pools(p)) => Ok(format!("{} pools", p.len())),
        Err(e) => Err(e),
    };
    match typed_for(FaultKind::ServerError, &r, false) {
        Ok(why) => pass(why),
        Err(why) => fail(why),
    }
}

/// The skip of a provider whose contract has no `get-pool`.
fn older_contract(run: &Run) -> Option<Verdict> {
    let version = run.main.provider.contract_version();
    matches!(version, "0.1.0" | "0.2.0").then(|| {
        skip(format!(
            "contract {version} has no get-pool (0.3.0 added it)"
        ))
    })
}
