//! Memory returns: looping the memory bomb does not grow the process without bound.
//! (Its own test binary, so no other test moves the RSS it measures.)

mod common;

use common::*;
use cro_runtime::{AddOutcome, CallError};

const LIMIT: u64 = 64 << 20;
const ROUNDS: usize = 30;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let resident_pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    resident_pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_bomb_looped_does_not_grow_the_process() {
    let mut spec = spec("membomb", &[]);
    spec.limits.memory_bytes = LIMIT;
    let bomb = load(&spec).await;
    let good = load(&common::spec("fake", &[])).await;

    // Warm up: code, pool slots and allocator arenas get touched once.
    for _ in 0..3 {
        let err = bomb.add_resource(&gpu("b")).await.unwrap_err();
        assert_eq!(err, CallError::OutOfMemory { limit_bytes: LIMIT });
    }
    let before = rss_bytes();
    let mut peak = before;
    for round in 0..ROUNDS {
        let err = bomb.add_resource(&gpu("b")).await.unwrap_err();
        assert_eq!(
            err,
            CallError::OutOfMemory { limit_bytes: LIMIT },
            "round {round}"
        );
        let out = good.add_resource(&gpu(&format!("g{round}"))).await;
        assert!(matches!(out, Ok(AddOutcome::Attached(_))), "{out:?}");
        peak = peak.max(rss_bytes());
    }
    let after = rss_bytes();
    eprintln!(
        "RSS before {} MiB, after {} MiB, peak {} MiB over {ROUNDS} bombs of {} MiB",
        before >> 20,
        after >> 20,
        peak >> 20,
        LIMIT >> 20
    );
    // Each bomb touches the whole 64 MiB; a leak would add that per round (~1.9 GiB).
    assert!(
        after < before + 2 * LIMIT,
        "RSS grew from {before} to {after} bytes"
    );
}
