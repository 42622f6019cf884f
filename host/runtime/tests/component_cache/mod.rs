//! The compiled-component cache across runtimes (each runtime stands for a process: an
//! operator restart, a second `cro provider inspect`).
//!
//! Every cache here lives in `<tempdir>/components`, so its key file
//! (`<tempdir>/component-cache.key`, beside the directory) is the test's own too.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cro_runtime::cache::{KEY_FILE_NAME, KeySource};
use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, CacheError, CacheStats, ComponentCache, LoadError, Provider, ProviderSpec, Runtime,
    RuntimeOptions,
};
use cro_runtime::{AddRequest, CallError};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::common::{gpu, memory_hog, spec};

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

/// A cache in `<tmp>/components` (key file `<tmp>/component-cache.key`).
fn cache_in(tmp: &tempfile::TempDir, max_bytes: u64) -> ComponentCache {
    ComponentCache::new(tmp.path().join("components"), max_bytes)
}

async fn load(runtime: &Runtime) -> Result<Provider, LoadError> {
    runtime
        .load(&spec("fake", &[]), Arc::new(StaticCluster::new()))
        .await
}

/// Another provider component (hand-written, 0.1.0): each call grows its memory until
/// refused. Its compiled code is what a forger puts under the testkit's key.
async fn load_other(runtime: &Runtime) -> Provider {
    runtime
        .load_bytes(
            &ProviderSpec::new("other", "other.wasm"),
            memory_hog(1, 0),
            Arc::new(StaticCluster::new()),
        )
        .await
        .unwrap()
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
        unauthenticated: 0,
    }
}

/// The compiled code inside an entry, found without knowing the header's layout:
/// wasmtime serializes a component as an ELF image.
fn code_of(entry: &[u8]) -> &[u8] {
    let at = entry
        .windows(4)
        .position(|w| w == b"\x7fELF")
        .expect("an ELF image in the entry");
    &entry[at..]
}

/// The cache key an entry's header names (after the 16-byte magic, in every layout).
fn key_of(entry: &[u8]) -> &[u8] {
    &entry[16..48]
}

/// An entry as the cache wrote them before they carried a MAC: magic, key, SHA-256 and
/// length of the code. Everything in it can be computed by whoever writes the directory.
fn layout_1_entry(key: &[u8], code: &[u8]) -> Vec<u8> {
    let mut e = b"cro-component-1\n".to_vec();
    e.extend_from_slice(key);
    e.extend_from_slice(&Sha256::digest(code));
    e.extend_from_slice(&(code.len() as u64).to_le_bytes());
    e.extend_from_slice(code);
    e
}

/// An entry of the current layout, authenticated with `mac_key`: magic, key, length,
/// HMAC-SHA256 of those and the code.
fn entry_with_mac(mac_key: &[u8], key: &[u8], code: &[u8]) -> Vec<u8> {
    let mut e = b"cro-component-2\n".to_vec();
    e.extend_from_slice(key);
    e.extend_from_slice(&(code.len() as u64).to_le_bytes());
    let mac = Hmac::<Sha256>::new_from_slice(mac_key)
        .unwrap()
        .chain_update(&e)
        .chain_update(code)
        .finalize()
        .into_bytes();
    e.extend_from_slice(&mac);
    e.extend_from_slice(code);
    e
}

/// The cached testkit's entry, and the other component's code, compiled by `cache`.
async fn testkit_entry_and_other_code(cache: &ComponentCache) -> (PathBuf, Vec<u8>, Vec<u8>) {
    works(&load(&runtime_with(cache, MEM)).await.unwrap()).await;
    let [testkit] = entries(cache.dir()).try_into().unwrap();
    load_other(&runtime_with(cache, MEM)).await;
    let other = entries(cache.dir())
        .into_iter()
        .find(|p| *p != testkit)
        .expect("the other component's entry");
    let good = fs::read(&testkit).unwrap();
    let code = code_of(&fs::read(&other).unwrap()).to_vec();
    (testkit, good, code)
}

#[tokio::test]
async fn a_second_runtime_loads_the_compiled_component_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 1, 0));
    assert_eq!(entries(cache.dir()).len(), 1);
    // A fresh runtime (a restarted process) finds it and compiles nothing.
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(1, 1, 0));
    assert_eq!(entries(cache.dir()).len(), 1);
    // So does another process of the user: a new cache reading the same key file.
    let restarted = cache_in(&dir, 1 << 30);
    works(&load(&runtime_with(&restarted, MEM)).await.unwrap()).await;
    assert_eq!(restarted.stats(), stats(1, 0, 0));
}

#[tokio::test]
async fn the_key_is_a_private_file_beside_the_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let key_file = dir.path().join(KEY_FILE_NAME);
    assert_eq!(cache.check().unwrap(), &KeySource::File(key_file.clone()));
    let meta = fs::symlink_metadata(&key_file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 32);
    let dir_mode = fs::metadata(cache.dir()).unwrap().permissions().mode();
    assert_eq!(dir_mode & 0o777, 0o700);

    // A new key (the file lost, or replaced on purpose) trusts none of the old entries.
    fs::remove_file(&key_file).unwrap();
    let rekeyed = cache_in(&dir, 1 << 30);
    works(&load(&runtime_with(&rekeyed, MEM)).await.unwrap()).await;
    assert_eq!(
        rekeyed.stats(),
        CacheStats {
            unauthenticated: 1,
            ..stats(0, 0, 1)
        }
    );
    load(&runtime_with(&rekeyed, MEM)).await.unwrap();
    assert_eq!(rekeyed.stats().hits, 1);
}

#[tokio::test]
async fn a_forged_entry_is_refused_and_the_component_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    let (entry, good, other_code) = testkit_entry_and_other_code(&cache).await;
    let key = key_of(&good).to_vec();
    let before = cache.stats();

    // The other component's code under the testkit's key, with the header the cache
    // used to check (a valid SHA-256 and length): refused, not run.
    fs::write(&entry, layout_1_entry(&key, &other_code)).unwrap();
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats().replaced, before.replaced + 1);
    assert_eq!(cache.stats().hits, before.hits);
    // Replaced by a whole entry of the testkit's code, authenticated with the key.
    let rewritten = fs::read(&entry).unwrap();
    assert_eq!(key_of(&rewritten), &key[..]);
    assert_ne!(code_of(&rewritten), &other_code[..]);

    // The same in today's layout, authenticated by a forger with a key of their own
    // (another user, another volume): refused as unauthenticated.
    fs::write(&entry, entry_with_mac(&[0x5a; 32], &key, &other_code)).unwrap();
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    let after = cache.stats();
    assert_eq!(after.replaced, before.replaced + 2);
    assert_eq!(after.unauthenticated, before.unauthenticated + 1);
    assert_eq!(after.hits, before.hits);

    // And what the MAC stands between: with the key file's key the same forgery is
    // trusted and the other code runs under the testkit's name. The key file is the
    // secret, and it lives outside the directory.
    let secret = fs::read(dir.path().join(KEY_FILE_NAME)).unwrap();
    fs::write(&entry, entry_with_mac(&secret, &key, &other_code)).unwrap();
    let impostor = load(&runtime_with(&cache, MEM)).await.unwrap();
    assert_eq!(cache.stats().hits, after.hits + 1);
    let out = impostor.add(&AddRequest::new(gpu("gpu-cached"))).await;
    assert!(
        matches!(out, Err(CallError::OutOfMemory { .. })),
        "not the other component's code: {out:?}"
    );
}

#[tokio::test]
async fn an_entry_written_with_another_key_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let mine = cache_in(&dir, 1 << 30);
    // Another process sharing the directory with its own key file.
    let theirs = cache_in(&dir, 1 << 30).with_key_file(dir.path().join("their.key"));
    works(&load(&runtime_with(&theirs, MEM)).await.unwrap()).await;
    let [entry] = entries(mine.dir()).try_into().unwrap();
    let theirs_written = fs::read(&entry).unwrap();

    works(&load(&runtime_with(&mine, MEM)).await.unwrap()).await;
    assert_eq!(
        mine.stats(),
        CacheStats {
            unauthenticated: 1,
            ..stats(0, 0, 1)
        }
    );
    assert_ne!(fs::read(&entry).unwrap(), theirs_written, "replaced");
    works(&load(&runtime_with(&mine, MEM)).await.unwrap()).await;
    assert_eq!(mine.stats().hits, 1);

    // A process whose key is in memory trusts only what it wrote itself.
    let memory = cache_in(&dir, 1 << 30).with_memory_key();
    works(&load(&runtime_with(&memory, MEM)).await.unwrap()).await;
    assert_eq!(memory.check().unwrap(), &KeySource::Memory);
    assert_eq!(memory.stats().unauthenticated, 1);
    works(&load(&runtime_with(&memory, MEM)).await.unwrap()).await;
    assert_eq!(memory.stats().hits, 1);
}

#[tokio::test]
async fn a_symlinked_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let [entry] = entries(cache.dir()).try_into().unwrap();
    // A link to a whole, authenticated entry elsewhere: sound bytes, but whoever owns
    // the link's target (or can change the link) would choose the code. Not followed.
    let elsewhere = dir.path().join("elsewhere.cwasm");
    fs::rename(&entry, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    let target = fs::read(&elsewhere).unwrap();

    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 1, 1));
    let meta = fs::symlink_metadata(&entry).unwrap();
    assert!(meta.is_file(), "the link was replaced by an entry");
    assert_eq!(
        fs::read(&elsewhere).unwrap(),
        target,
        "the target is untouched"
    );
    load(&runtime_with(&cache, MEM)).await.unwrap();
    assert_eq!(cache.stats(), stats(1, 1, 1));
}

#[tokio::test]
async fn a_cache_directory_others_can_write_is_refused() {
    for mode in [0o770, 0o707, 0o1777] {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(&dir, 1 << 30);
        fs::create_dir(cache.dir()).unwrap();
        fs::set_permissions(cache.dir(), fs::Permissions::from_mode(mode)).unwrap();
        // Loads still work (compiled each time), and nothing is read from or written
        // to the directory.
        works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
        works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
        assert_eq!(cache.stats(), stats(0, 2, 0), "{mode:o}");
        assert!(entries(cache.dir()).is_empty(), "{mode:o}");
        let refusal = cache.check().unwrap_err();
        assert!(
            matches!(refusal, CacheError::Permissions { mode: m, .. } if *m == mode),
            "{mode:o}: {refusal:?}"
        );
        assert!(
            refusal.to_string().contains("writable by group or other"),
            "{refusal}"
        );
        assert!(!dir.path().join(KEY_FILE_NAME).exists(), "no key is made");
    }
}

#[tokio::test]
async fn a_symlinked_or_foreign_cache_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    let cache = cache_in(&dir, 1 << 30);
    std::os::unix::fs::symlink(&real, cache.dir()).unwrap();
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert!(matches!(cache.check(), Err(CacheError::Symlink { .. })));
    assert!(entries(&real).is_empty());

    // Another user's directory, however private: only checkable where this test may
    // give a directory away (as root); the rule itself is unit-tested in cache.rs.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(&dir, 1 << 30);
        fs::create_dir(cache.dir()).unwrap();
        fs::set_permissions(cache.dir(), fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(cache.dir(), Some(65534), Some(65534)).unwrap();
        works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
        assert!(
            matches!(
                cache.check(),
                Err(CacheError::NotOwned {
                    owner: 65534,
                    euid: 0,
                    ..
                })
            ),
            "{:?}",
            cache.check()
        );
        assert!(entries(cache.dir()).is_empty());
    }
}

#[tokio::test]
async fn a_corrupt_entry_is_detected_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let [entry] = entries(cache.dir()).try_into().unwrap();
    let good = fs::read(&entry).unwrap();

    // One flipped bit in the compiled code: the MAC catches it before wasmtime maps
    // anything.
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    fs::write(&entry, &flipped).unwrap();
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(
        cache.stats(),
        CacheStats {
            unauthenticated: 1,
            ..stats(0, 1, 1)
        }
    );
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
    assert_eq!(cache.stats().replaced, 4);

    // And the replacement is used again.
    load(&runtime_with(&cache, MEM)).await.unwrap();
    assert_eq!(cache.stats().hits, 1);
}

#[tokio::test]
async fn another_engine_setting_misses_and_a_foreign_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir, 1 << 30);
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let [big] = entries(cache.dir()).try_into().unwrap();
    // A smaller memory reservation changes the compiled bounds checks: another key.
    works(&load(&runtime_with(&cache, 64 << 20)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 2, 0));
    let small = entries(cache.dir())
        .into_iter()
        .find(|p| *p != big)
        .expect("a second entry");

    // The 256 MiB engine's code placed under the 64 MiB engine's key, its header
    // claiming that key: the MAC (which covers the key) refuses it before wasmtime would
    // have, and the entry is recompiled and replaced rather than trusted.
    let small_bytes = fs::read(&small).unwrap();
    let mut forged = fs::read(&big).unwrap();
    forged[16..48].copy_from_slice(&small_bytes[16..48]);
    fs::write(&small, &forged).unwrap();
    works(&load(&runtime_with(&cache, 64 << 20)).await.unwrap()).await;
    assert_eq!(
        cache.stats(),
        CacheStats {
            unauthenticated: 1,
            ..stats(0, 2, 1)
        }
    );
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
    assert!(matches!(cache.check(), Err(CacheError::Io { .. })));
}

#[tokio::test]
async fn the_cache_stays_under_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    // The sizes of the two entries this test stores.
    let sizing = cache_in(&dir, 1 << 30);
    load(&runtime_with(&sizing, MEM)).await.unwrap();
    load(&runtime_with(&sizing, 64 << 20)).await.unwrap();
    let sizes: Vec<u64> = entries(sizing.dir())
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .collect();
    fs::remove_dir_all(sizing.dir()).unwrap();

    // Room for either entry, not both: every store evicts everything older.
    let cache = cache_in(&dir, sizes.iter().copied().max().unwrap());
    load(&runtime_with(&cache, MEM)).await.unwrap();
    let first = entries(cache.dir());
    assert_eq!(first.len(), 1);
    load(&runtime_with(&cache, 64 << 20)).await.unwrap();
    let now = entries(cache.dir());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first);
    assert_eq!(cache.stats().evicted, 1);
}

#[tokio::test]
async fn an_entry_larger_than_the_bound_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    // Smaller than any entry: nothing is ever stored, nothing evicted, loads compile.
    let cache = cache_in(&dir, 1);
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    works(&load(&runtime_with(&cache, MEM)).await.unwrap()).await;
    assert_eq!(cache.stats(), stats(0, 2, 0));
    assert!(entries(cache.dir()).is_empty());

    // Nor is one larger than the bound ever read: whoever put it there, it is not ours.
    let roomy = cache_in(&dir, 1 << 30);
    load(&runtime_with(&roomy, MEM)).await.unwrap();
    let [entry] = entries(roomy.dir()).try_into().unwrap();
    let small = cache_in(&dir, fs::metadata(&entry).unwrap().len() - 1);
    works(&load(&runtime_with(&small, MEM)).await.unwrap()).await;
    assert_eq!(small.stats(), stats(0, 0, 1));
    assert!(!entry.exists(), "refused, removed and not replaced");
}
