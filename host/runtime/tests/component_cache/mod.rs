//! The compiled-component cache across runtimes (each runtime stands for a process: an
//! operator restart, a second `cro provider inspect`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cro_runtime::AddRequest;
use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, CacheStats, ComponentCache, LoadError, Provider, Runtime, RuntimeOptions,
};

use crate::common::{gpu, spec};

fn runtime_with(cache: &ComponentCache, max_memory_bytes: u64) -> Runtime {
    Runtime::new(RuntimeOptions {
        component_cache: Some(cache.clone()),
        max_memory_bytes,
        max_instances: 2,
        ..RuntimeOptions::default()
    })
    .unwrap()
}

const MEM: u64 = 256 << 20;

async fn load(runtime: &Runtime) -> Result<Provider, LoadError> {
    runtime
        .load(&spec("fake", &[]), Arc::new(StaticCluster::new()))
        .await
}

/// The loaded provider works (its code came from wherever the cache says).
async fn works(provider: &Provider) {
    let outcome = provider
        .add(&AddRequest::new(gpu("gpu-cached")))
        .await
        .unwrap();
    assert!(matches!(outcome, AddOutcome::Attached(_)), "{outcome:?}");
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "cwasm"));
    v.sort();
    v
}

fn stats(hits: u64, misses: u64, replaced: u64) -> CacheStats {
    CacheStats {
        hits,
        misses,
        replaced,
        evicted: 0,
    }
}

#[tokio::test]
async fn a_second_runtime_loads_the_compiled_component_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ComponentCache::new(dir.path().join("components"), 1 << 30);
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 1, 0));
    assert_eq!(entries(cache.dir()).len(), 1);
    // A fresh runtime (a restarted process) finds it and compiles nothing.
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(1, 1, 0));
    assert_eq!(entries(cache.dir()).len(), 1);
}

#[tokio::test]
async fn a_corrupt_entry_is_detected_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ComponentCache::new(dir.path(), 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let [entry] = entries(cache.dir()).try_into().unwrap();
    let good = fs::read(&entry).unwrap();

    // One flipped bit in the compiled code: the checksum catches it before wasmtime
    // maps anything.
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    fs::write(&entry, &flipped).unwrap();
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 1, 1));
    assert_eq!(
        fs::read(&entry).unwrap(),
        good,
        "the entry was rewritten whole"
    );

    // A truncated entry (a crash mid-write by some other tool) and garbage.
    for bad in [&good[..good.len() - 7], &b"not a cache entry"[..], &[][..]] {
        fs::write(&entry, bad).unwrap();
        works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
        assert_eq!(fs::read(&entry).unwrap(), good);
    }
    assert_eq!(cache.stats(), stats(0, 1, 4));

    // And the replacement is used again.
    load(&runtime_with(&cache, MEM)).await.unwrap();
    assert_eq!(cache.stats(), stats(1, 1, 4));
}

#[tokio::test]
async fn another_engine_setting_misses_and_a_foreign_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ComponentCache::new(dir.path(), 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let [big] = entries(cache.dir()).try_into().unwrap();
    // A smaller memory reservation changes the compiled bounds checks: another key.
    works(&load(&runtime_with(&cache, 64 << 20)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 2, 0));
    let small = entries(cache.dir())
        .into_iter()
        .find(|p| *p != big)
        .expect("a second entry");

    // The 256 MiB engine's code placed under the 64 MiB engine's key, with a header that
    // claims that key and a valid checksum: wasmtime's own check refuses it, and the
    // entry is recompiled and replaced rather than trusted.
    let small_bytes = fs::read(&small).unwrap();
    let mut forged = fs::read(&big).unwrap();
    forged[16..48].copy_from_slice(&small_bytes[16..48]);
    fs::write(&small, &forged).unwrap();
    works(&load(&runtime_with(&cache, 64 << 20)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 2, 1));
    assert_eq!(fs::read(&small).unwrap(), small_bytes);
}

#[tokio::test]
async fn an_unwritable_cache_never_fails_a_load() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the directory should be.
    let blocked = dir.path().join("file");
    fs::write(&blocked, b"x").unwrap();
    let cache = ComponentCache::new(blocked.join("components"), 1 << 30);
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 1, 0));
}

#[tokio::test]
async fn the_cache_stays_under_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    // Smaller than one entry: every store evicts everything older, keeping the newest.
    let cache = ComponentCache::new(dir.path(), 1);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let first = entries(cache.dir());
    load(&runtime_with(&cache, 64 << 20)).await.unwrap();
    let now = entries(cache.dir());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first);
    assert_eq!(cache.stats().evicted, 1);
}
