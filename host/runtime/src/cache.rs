//! Compiled components kept on disk across runs, so that `cro provider inspect`, an
//! operator restart or a second test process does not recompile a large component
//! (the Python example provider carries CPython and takes tens of seconds to compile).
//!
//! An entry is the output of `Component::serialize` behind a header. Its name (the key)
//! is the SHA-256 of the component's bytes, the engine's compilation settings
//! (`Engine::precompile_compatibility_hash`), wasmtime's and this crate's versions: a
//! different component, engine setting or build never finds another's entry.
//!
//! Where: `$CRO_COMPONENT_CACHE_DIR`, else `$XDG_CACHE_HOME/cro/components`, else
//! `~/.cache/cro/components`. `CRO_COMPONENT_CACHE=off` (or `0`, `false`, `no`) turns it
//! off. Size: at most [`DEFAULT_MAX_BYTES`] (or `CRO_COMPONENT_CACHE_MAX_BYTES`); the
//! least recently used entries go first.
//!
//! A cache never fails a load: any problem with it (unwritable directory, a corrupt or
//! incompatible entry) is logged and the component is compiled as if there were no
//! cache, and a bad entry is replaced.

use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The cache's default size bound.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// Starts every entry; the trailing digit is the layout's version.
const MAGIC: &[u8; 16] = b"cro-component-1\n";
/// Magic, key (32), payload SHA-256 (32), payload length (8, little-endian).
const HEADER_LEN: usize = MAGIC.len() + 32 + 32 + 8;
const ENTRY_SUFFIX: &str = "cwasm";

/// What can go wrong with the cache itself (never with the component: compiling errors
/// are the caller's).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("component cache {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The entry is not one we wrote for this key (truncated, altered, another layout).
    #[error("component cache entry {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The entry is intact but this engine cannot use it.
    #[error("component cache entry {path} is incompatible with this engine: {reason}")]
    Incompatible { path: PathBuf, reason: String },
    #[error("cannot serialize the compiled component: {0}")]
    Serialize(String),
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How one compilation went, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from an entry; nothing was compiled.
    Hit,
    /// Compiled; the entry was written (or writing it failed, logged).
    Miss,
    /// An entry existed but was corrupt or incompatible: compiled and replaced.
    Replaced,
}

/// Counts of [`CacheOutcome`]s since the cache was made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub replaced: u64,
    /// Entries removed to stay under the size bound.
    pub evicted: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    replaced: AtomicU64,
    evicted: AtomicU64,
}

/// An on-disk cache of compiled components. Cheap to clone (clones share counters).
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
    max_bytes: u64,
    counters: Arc<Counters>,
}

/// The key of one entry: hex SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Feeds `Hash` output into SHA-256, so the engine's compatibility hash is stable across
/// processes (std's `DefaultHasher` promises no such thing).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        // Only `write` is used: the digest is read from the inner SHA-256.
        0
    }
}

fn env_off(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "off" | "0" | "false" | "no" | "disabled"
    )
}

impl ComponentCache {
    /// A cache in `dir` holding at most `max_bytes` of entries.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> ComponentCache {
        ComponentCache {
            dir: dir.into(),
            max_bytes,
            counters: Arc::default(),
        }
    }

    /// The cache the environment asks for (see the module's documentation); `None` when
    /// turned off or when no cache directory can be named (no `HOME`).
    pub fn from_env() -> Option<ComponentCache> {
        ComponentCache::from_vars(|name| std::env::var_os(name))
    }

    /// [`ComponentCache::from_env`] with the variables read through `var`.
    fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<ComponentCache> {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        if let Some(v) = var("CRO_COMPONENT_CACHE")
            && env_off(&v.to_string_lossy())
        {
            return None;
        }
        let max_bytes = var("CRO_COMPONENT_CACHE_MAX_BYTES")
            .and_then(|v| v.to_string_lossy().trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES);
        let dir = match var("CRO_COMPONENT_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?
                .join("cro")
                .join("components"),
        };
        Some(ComponentCache::new(dir, max_bytes))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            replaced: c.replaced.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
        }
    }

    /// The key of `bytes` compiled by `engine`.
    pub fn key(engine: &Engine, bytes: &[u8]) -> CacheKey {
        let mut settings = ShaHasher(Sha256::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut settings);
        let mut key = Sha256::new();
        key.update(MAGIC);
        key.update(concat!("cro-runtime ", env!("CARGO_PKG_VERSION"), "\n"));
        key.update(settings.0.finalize());
        key.update(Sha256::digest(bytes));
        CacheKey(key.finalize().into())
    }

    /// The file of `key`'s entry.
    pub fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_SUFFIX}", key.hex()))
    }

    /// The compiled component of `bytes`: from the cache when a sound entry exists, else
    /// by `compile` (whose result is then stored). `compile`'s error is returned as is;
    /// cache trouble is only logged.
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        compile: impl FnOnce() -> wasmtime::Result<Component>,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let key = ComponentCache::key(engine, bytes);
        let path = self.entry_path(&key);
        let outcome = match self.read(engine, &key, &path) {
            Ok(Some(component)) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                // Touched so eviction drops the least recently used entries first.
                if let Ok(f) = File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                tracing::debug!(entry = %path.display(), "compiled component from the cache");
                return Ok((component, CacheOutcome::Hit));
            }
            Ok(None) => CacheOutcome::Miss,
            // The directory cannot be read (missing parent, permissions): no entry to
            // replace; storing will most likely fail too, and say so.
            Err(e @ CacheError::Io { .. }) => {
                tracing::debug!(error = %e, "component cache unreadable");
                CacheOutcome::Miss
            }
            Err(e) => {
                tracing::warn!(error = %e, "component cache entry rejected; recompiling");
                CacheOutcome::Replaced
            }
        };
        let component = compile()?;
        match outcome {
            CacheOutcome::Replaced => self.counters.replaced.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.misses.fetch_add(1, Ordering::Relaxed),
        };
        if let Err(e) = self.store(&key, &path, &component) {
            tracing::warn!(error = %e, "cannot store the compiled component in the cache");
        } else if let Err(e) = self.evict(&path) {
            tracing::warn!(error = %e, "cannot trim the component cache");
        }
        Ok((component, outcome))
    }

    /// Reads and checks `key`'s entry: `None` when there is none.
    fn read(
        &self,
        engine: &Engine,
        key: &CacheKey,
        path: &Path,
    ) -> Result<Option<Component>, CacheError> {
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path)(e)),
        };
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io_error(path))?;
        let payload = verify(&data, key).map_err(|reason| CacheError::Corrupt {
            path: path.to_path_buf(),
            reason,
        })?;
        // SAFETY: `Component::deserialize` trusts its input to be wasmtime's own output
        // (it maps it as executable code without validating it), so it must only ever see
        // bytes this module wrote. `verify` guarantees that: the header names this exact
        // key (component digest + engine settings + versions) and the payload's SHA-256
        // and length match what `store` recorded when it wrote `Component::serialize`'s
        // output, so a truncated, bit-flipped, half-written or foreign file is rejected
        // above and never reaches this call. The directory is the user's own (created
        // 0700), as trusted as the binary itself. An engine that still cannot use the
        // entry (wasmtime checks its own version and settings again) returns an error,
        // which replaces the entry.
        match unsafe { Component::deserialize(engine, payload) } {
            Ok(component) => Ok(Some(component)),
            Err(e) => Err(CacheError::Incompatible {
                path: path.to_path_buf(),
                reason: crate::base::error_chain(&e),
            }),
        }
    }

    /// Writes the entry to a temporary file in the same directory and renames it into
    /// place: readers see either no entry or a whole one, and two processes storing the
    /// same key at once both succeed (the last rename wins with identical content).
    fn store(&self, key: &CacheKey, path: &Path, component: &Component) -> Result<(), CacheError> {
        let payload = component
            .serialize()
            .map_err(|e| CacheError::Serialize(crate::base::error_chain(&e)))?;
        create_private_dir(&self.dir)?;
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.hex(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io_error(&tmp))?;
            file.write_all(&header(key, &payload))
                .and_then(|()| file.write_all(&payload))
                .and_then(|()| file.sync_all())
                .map_err(io_error(&tmp))?;
            fs::rename(&tmp, path).map_err(io_error(path))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Removes the least recently used entries until the rest fit `max_bytes`, and
    /// temporary files left by a crashed writer (older than an hour). `keep` (the entry
    /// just stored) stays even if it alone is over the bound: the one in use is worth more
    /// than an empty cache.
    fn evict(&self, keep: &Path) -> Result<(), CacheError> {
        let mut entries = Vec::new();
        for item in fs::read_dir(&self.dir).map_err(io_error(&self.dir))? {
            let Ok(item) = item else { continue };
            let Ok(meta) = item.metadata() else { continue };
            let path = item.path();
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = item.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                let stale = SystemTime::now()
                    .duration_since(modified)
                    .is_ok_and(|age| age.as_secs() > 3600);
                if stale {
                    let _ = fs::remove_file(&path);
                }
            } else if name.ends_with(ENTRY_SUFFIX) && meta.is_file() && path != keep {
                entries.push((modified, meta.len(), path));
            }
        }
        let kept = fs::metadata(keep).map(|m| m.len()).unwrap_or(0);
        let mut total: u64 = kept + entries.iter().map(|e| e.1).sum::<u64>();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
            total = total.saturating_sub(len);
        }
        Ok(())
    }
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn header(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&key.0);
    h.extend_from_slice(&Sha256::digest(payload));
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    h
}

/// The payload of an entry, if the entry is whole and is `key`'s.
fn verify<'a>(data: &'a [u8], key: &CacheKey) -> Result<&'a [u8], String> {
    if data.len() < HEADER_LEN {
        return Err(format!("{} bytes, shorter than the header", data.len()));
    }
    let (head, payload) = data.split_at(HEADER_LEN);
    if &head[..MAGIC.len()] != MAGIC {
        return Err("unknown header".into());
    }
    let rest = &head[MAGIC.len()..];
    if rest[..32] != key.0 {
        return Err("the entry is for another key".into());
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&rest[64..72]);
    if u64::from_le_bytes(len) != payload.len() as u64 {
        return Err(format!(
            "payload is {} bytes, the header says {}",
            payload.len(),
            u64::from_le_bytes(len)
        ));
    }
    if rest[32..64] != Sha256::digest(payload)[..] {
        return Err("payload checksum mismatch".into());
    }
    Ok(payload)
}

fn create_private_dir(dir: &Path) -> Result<(), CacheError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_error(dir))
}

/// Compiles `bytes` with `engine`, through `cache` when there is one.
pub(crate) fn compile(
    cache: Option<&ComponentCache>,
    engine: &Engine,
    bytes: &[u8],
) -> wasmtime::Result<Component> {
    match cache {
        Some(cache) => cache
            .get_or_compile(engine, bytes, || Component::new(engine, bytes))
            .map(|(c, _)| c),
        None => Component::new(engine, bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> CacheKey {
        CacheKey([b; 32])
    }

    #[test]
    fn verify_accepts_only_a_whole_entry_of_its_key() {
        let payload = b"compiled code".to_vec();
        let mut entry = header(&key(1), &payload);
        entry.extend_from_slice(&payload);
        assert_eq!(verify(&entry, &key(1)).unwrap(), &payload[..]);
        assert!(verify(&entry, &key(2)).unwrap_err().contains("another key"));
        assert!(
            verify(&entry[..entry.len() - 1], &key(1))
                .unwrap_err()
                .contains("header says")
        );
        assert!(
            verify(&entry[..10], &key(1))
                .unwrap_err()
                .contains("shorter")
        );
        let mut flipped = entry.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(verify(&flipped, &key(1)).unwrap_err().contains("checksum"));
        let mut other = entry.clone();
        other[0] = b'X';
        assert!(verify(&other, &key(1)).unwrap_err().contains("header"));
    }

    #[test]
    fn off_values() {
        for v in ["off", "OFF", "0", "false", "no", " disabled "] {
            assert!(env_off(v), "{v}");
        }
        for v in ["on", "1", "yes", "/tmp/x"] {
            assert!(!env_off(v), "{v}");
        }
    }

    #[test]
    fn the_environment_names_the_directory_bound_and_off_switch() {
        let from = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            ComponentCache::from_vars(move |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.into())
            })
        };
        let home = from(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(home.dir(), Path::new("/home/u/.cache/cro/components"));
        assert_eq!(home.max_bytes, DEFAULT_MAX_BYTES);
        let xdg = from(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]).unwrap();
        assert_eq!(xdg.dir(), Path::new("/xdg/cro/components"));
        let explicit = from(&[
            ("XDG_CACHE_HOME", "/xdg"),
            ("CRO_COMPONENT_CACHE_DIR", "/c"),
            ("CRO_COMPONENT_CACHE_MAX_BYTES", "1000"),
        ])
        .unwrap();
        assert_eq!(
            (explicit.dir(), explicit.max_bytes),
            (Path::new("/c"), 1000)
        );
        assert!(from(&[("HOME", "/home/u"), ("CRO_COMPONENT_CACHE", "off")]).is_none());
        assert!(from(&[("HOME", "/home/u"), ("CRO_COMPONENT_CACHE", "on")]).is_some());
        // Empty values count as unset; nothing to name a directory by: no cache.
        assert!(from(&[("HOME", ""), ("XDG_CACHE_HOME", "")]).is_none());
    }

    #[test]
    fn eviction_drops_the_oldest_entries_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ComponentCache::new(dir.path(), 250);
        let now = SystemTime::now();
        for (i, age) in [(0u8, 30u64), (1, 20), (2, 10)] {
            let path = cache.entry_path(&key(i));
            fs::write(&path, vec![0u8; 100]).unwrap();
            File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(now - std::time::Duration::from_secs(age))
                .unwrap();
        }
        cache.evict(&cache.entry_path(&key(2))).unwrap();
        assert!(!cache.entry_path(&key(0)).exists());
        assert!(cache.entry_path(&key(1)).exists());
        assert!(cache.entry_path(&key(2)).exists());
        assert_eq!(cache.stats().evicted, 1);
        // The entry just stored stays even when it alone is over the bound.
        let tiny = ComponentCache::new(dir.path(), 1);
        tiny.evict(&cache.entry_path(&key(1))).unwrap();
        assert!(!cache.entry_path(&key(2)).exists());
        assert!(cache.entry_path(&key(1)).exists());
    }
}
