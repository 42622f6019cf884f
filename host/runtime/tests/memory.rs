//! Memory returns: looping the memory bomb does not grow the process without bound, and a
//! component with several memories gets one budget for all of them.
//! (Its own test binary, so no other test moves the RSS it measures.)

mod common;

use common::*;
use cro_runtime::AddRequest;
use cro_runtime::{AddOutcome, CallError};

const LIMIT: u64 = 64 << 20;
const ROUNDS: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_bomb_looped_does_not_grow_the_process() {
    let mut spec = spec("membomb", &[]);
    spec.limits.memory_bytes = LIMIT;
    let bomb = load(&spec).await;
    let good = load(&common::spec("fake", &[])).await;

    // Warm up: code, pool slots and allocator arenas get touched once.
    for _ in 0..3 {
        let err = bomb.add(&AddRequest::new(gpu("b"))).await.unwrap_err();
        assert_eq!(err, CallError::OutOfMemory { limit_bytes: LIMIT });
    }
    let before = rss_bytes();
    let mut peak = before;
    for round in 0..ROUNDS {
        let err = bomb.add(&AddRequest::new(gpu("b"))).await.unwrap_err();
        assert_eq!(
            err,
            CallError::OutOfMemory { limit_bytes: LIMIT },
            "round {round}"
        );
        let out = good.add(&AddRequest::new(gpu(&format!("g{round}")))).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_memories_share_one_budget() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    // Large enough that the process's own noise (the good provider's instances, tokio,
    // allocator arenas: tens of MiB) cannot hide a second memory's worth.
    const CAP: u64 = 128 << 20;
    let memories = runtime().options().max_memories_per_component as usize;
    assert!(
        memories >= 2,
        "the test needs a component with several memories"
    );
    let mut spec = spec("fake", &[]);
    spec.name = "hog".into();
    spec.limits.memory_bytes = CAP;
    // Grow every memory until refused, then hold it (spin) long enough to be measured.
    let bytes = memory_hog(memories, 400_000_000);
    let hog = runtime()
        .load_bytes(
            &spec,
            bytes,
            Arc::new(cro_runtime::cluster::StaticCluster::new()),
        )
        .await
        .unwrap();

    // Warm up the good provider and the pool, then sample RSS while the hog holds memory.
    let (_, _) = beside_a_good_provider(async {}).await;
    let before = rss_bytes();
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(rss_bytes(), Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let (out, served) = beside_a_good_provider(hog.add(&AddRequest::new(gpu("h")))).await;
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    assert_eq!(out, Err(CallError::OutOfMemory { limit_bytes: CAP }));
    let grown = peak.load(Ordering::SeqCst).saturating_sub(before);
    eprintln!(
        "{memories} memories under a {} MiB cap: RSS grew {} MiB at peak ({served} good calls beside)",
        CAP >> 20,
        grown >> 20
    );
    // Checked one by one, each memory could take the whole cap: {memories} x 64 MiB.
    assert!(
        grown < CAP + CAP / 2,
        "RSS grew {} MiB under a {} MiB cap",
        grown >> 20,
        CAP >> 20
    );
    assert!(grown > CAP / 2, "the hog did not run: {} MiB", grown >> 20);
}
