//! `cro-bench`: the measurements of docs/BENCHMARKS.md that need a cluster, and the report.
//!
//! - `cro-bench converge <requests> <nodes> <latency-ms>`: N requests × 2 GPUs over M
//!   simulated nodes on a real API server, the fabric simulator answering after the
//!   latency; prints one JSON line (times, API writes, fabric calls, RSS).
//! - `cro-bench memory`: the operator's RSS idle, with the FTI component, with several
//!   providers, and per concurrent call; each stage in a fresh child process.
//! - `cro-bench real-node <requests>`: N requests × 1 GPU on the real one-node cluster
//!   (docs/real-node.md), node commands through `pods/exec`, the operator as its own
//!   `cro run` process; prints one JSON line (times, exec round trip, operator RSS).
//! - `cro-bench real-node-dra <pods> <pool>`: N Pods with a ResourceClaim for one fabric
//!   GPU each against a pool of M < N, on the real one-node cluster with the real
//!   scheduler, `cro run` and `cro kubelet-plugin` as processes; prints one JSON line
//!   (each step's times, the waves, what was left).
//! - `cro-bench replicas <devices> <latency-ms> <kills>`: replicas sharing four providers
//!   (each its own FTI simulator and node pool), the replicas processes of their own
//!   (`cro-bench replica`): time to all Running and to all detached for N devices with
//!   1, 2 and 4 replicas, and failover per provider (SIGKILL of its holder → the new
//!   holder's Lease and first fabric call), median and max over `kills`; prints one
//!   JSON line.
//! - `cro-bench replica`: one operator replica (internal: `replicas` starts it, its spec
//!   in `CRO_REPLICA_SPEC`).
//! - `cro-bench report <results.jsonl> <criterion dir>`: the report, Markdown on stdout.
//!
//! scripts/bench.sh runs them all.

#[path = "../../../host/operator/tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

mod converge;
mod cpu;
mod cro_process;
mod dra;
mod gomodel;
mod memory;
mod real_node;
mod replicas;
mod report;
mod rss;

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: cro-bench converge <requests> <nodes> <latency-ms>\n       cro-bench memory\n       cro-bench real-node <requests>\n       cro-bench real-node-dra <pods> <pool>\n       cro-bench replicas <devices> <latency-ms> <kills>\n       cro-bench replica   (internal)\n       cro-bench memory-stage <stage>   (internal)\n       cro-bench report <results.jsonl> <criterion-dir>"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["converge", n, m, l] => match (n.parse(), m.parse(), l.parse()) {
            (Ok(n), Ok(m), Ok(l)) => converge::main(n, m, l),
            _ => return usage(),
        },
        ["memory"] => memory::main(),
        ["real-node", n] => match n.parse() {
            Ok(n) if n > 0 => real_node::main(n),
            _ => return usage(),
        },
        ["real-node-dra", n, m] => match (n.parse(), m.parse()) {
            (Ok(n), Ok(m)) => dra::main(n, m),
            _ => return usage(),
        },
        ["replicas", n, l, k] => match (n.parse(), l.parse(), k.parse()) {
            (Ok(n), Ok(l), Ok(k)) => replicas::main(n, l, k),
            _ => return usage(),
        },
        ["replica"] => replicas::replica(),
        ["memory-stage", stage] => memory::stage(stage),
        ["report", results, criterion] => report::main(results.as_ref(), criterion.as_ref()),
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cro-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
