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
//! least recently used entries go first, and an entry larger than the bound is not stored.
//!
//! Trust: `Component::deserialize` maps an entry as native code, so an entry is only
//! used when this process can be sure it wrote it, or another process of the same user
//! holding the same key did. At first use the directory must be a real directory (not a
//! symbolic link) owned by the effective user and writable by nobody else; otherwise the
//! cache is refused, with one warning, and every load compiles. Every entry carries an
//! HMAC-SHA256 under a key kept outside the directory: the file [`KEY_FILE_NAME`] beside
//! it (in its parent), or `CRO_COMPONENT_CACHE_KEY_FILE`, created with mode 0600 and 32
//! random bytes when absent. When no such file can be kept safely the key is random and
//! held in memory: this process trusts only the entries it wrote itself. Entries and the
//! key file are opened without following symbolic links.
//!
//! A cache never fails a load: any problem with it (unusable directory, a corrupt,
//! forged or incompatible entry) is logged and the component is compiled as if there
//! were no cache, and a bad entry is replaced.

use std::fs::{self, File, Metadata};
use std::hash::Hasher;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The cache's default size bound.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// The key file's name, in the cache directory's parent (`~/.cache/cro/component-cache.key`
/// for the default directory) unless `CRO_COMPONENT_CACHE_KEY_FILE` names another.
pub const KEY_FILE_NAME: &str = "component-cache.key";

/// Starts every entry; the trailing digit is the layout's version. Layout 1 had a plain
/// SHA-256 where layout 2 has a MAC: anyone able to write the directory could make a
/// layout-1 entry pass, so one is refused like any unknown header.
const MAGIC: &[u8; 16] = b"cro-component-2\n";
const MAGIC_WITHOUT_MAC: &[u8; 16] = b"cro-component-1\n";
/// Magic, key (32), payload length (8, little-endian), HMAC-SHA256 of all that and the
/// payload (32).
const HEADER_LEN: usize = MAGIC.len() + 32 + 8 + MAC_LEN;
const MAC_LEN: usize = 32;
/// Bytes of a MAC key: SHA-256's output size, as RFC 2104 recommends at least.
const KEY_LEN: usize = 32;
const ENTRY_SUFFIX: &str = "cwasm";
/// Where the random bytes of a new key come from.
const RANDOM_SOURCE: &str = "/dev/urandom";

type HmacSha256 = Hmac<Sha256>;

/// What can go wrong with the cache itself (never with the component: compiling errors
/// are the caller's). The directory and key-file variants are also the reasons a cache
/// is refused ([`ComponentCache::check`]).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("component cache {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The entry is not one we wrote for this key (truncated, another layout, garbage).
    #[error("component cache entry {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The entry's MAC is not this cache's: forged, altered after it was written, or
    /// written by a process holding another key.
    #[error(
        "component cache entry {path} is not authenticated by this cache's key (forged, \
         altered, or written by a process with another key)"
    )]
    Unauthenticated { path: PathBuf },
    /// The entry is intact but this engine cannot use it.
    #[error("component cache entry {path} is incompatible with this engine: {reason}")]
    Incompatible { path: PathBuf, reason: String },
    #[error("cannot serialize the compiled component: {0}")]
    Serialize(String),
    /// The cache follows no symbolic link: one could point at a file someone else
    /// controls.
    #[error("component cache: {path} is a symbolic link")]
    Symlink { path: PathBuf },
    #[error("component cache: {path} is not a {expected}")]
    WrongType {
        path: PathBuf,
        expected: &'static str,
    },
    /// Its owner could write entries (or the key) of their choosing.
    #[error(
        "component cache: {path} belongs to uid {owner}, not to this process's user (uid {euid})"
    )]
    NotOwned {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    /// Others could write entries (a directory) or read and replace the key (a key file).
    #[error("component cache: {path} has mode {mode:04o}: {what}")]
    Permissions {
        path: PathBuf,
        mode: u32,
        what: &'static str,
    },
    #[error("component cache key file {path} holds {len} bytes, not {KEY_LEN}")]
    KeyLength { path: PathBuf, len: u64 },
    /// A key readable wherever the entries are would authenticate nothing.
    #[error("component cache key file {path} is inside the cache directory {dir}")]
    KeyInsideCache { path: PathBuf, dir: PathBuf },
    /// Larger than the whole cache may be: not stored (nor read, since we never wrote it).
    #[error(
        "component cache entry {path} of {size} bytes is over the cache's bound of {max} bytes"
    )]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("the component cache needs Unix file ownership and modes, which this platform lacks")]
    Unsupported,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An error opening `path` without following links: a link is a refusal of its own.
fn open_error(path: &Path, source: io::Error) -> CacheError {
    if sys::is_link_refusal(&source) {
        CacheError::Symlink {
            path: path.to_path_buf(),
        }
    } else {
        io_error(path)(source)
    }
}

/// How one compilation went, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from an entry; nothing was compiled.
    Hit,
    /// Compiled; the entry was written (or writing it failed, logged). Also every
    /// compilation of a refused cache.
    Miss,
    /// An entry existed but was refused (corrupt, unauthenticated, a link, incompatible):
    /// compiled and replaced.
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
    /// Of the `replaced`, those whose MAC was not this cache's (forged or altered).
    pub unauthenticated: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    replaced: AtomicU64,
    evicted: AtomicU64,
    unauthenticated: AtomicU64,
}

/// Where the key that authenticates entries comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// This file (outside the cache directory, mode 0600): every process of the user
    /// reading it trusts the entries the others wrote.
    File(PathBuf),
    /// Random, held by this process only: entries other processes wrote are recompiled.
    Memory,
}

/// A MAC key. Its `Debug` shows nothing, since the cache (and so the runtime's options)
/// is printed in logs.
#[derive(Clone, Copy, PartialEq, Eq)]
struct MacKey([u8; KEY_LEN]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    /// An HMAC-SHA256 ready to take the message.
    fn hmac(&self) -> HmacSha256 {
        let mut block = [0u8; 64];
        block[..KEY_LEN].copy_from_slice(&self.0);
        hmac_of_block(&block)
    }
}

/// HMAC-SHA256 keyed by one block. RFC 2104 pads a key shorter than SHA-256's 64-byte
/// block with zeros, so a shorter key zero-padded here is the same key; taking a whole
/// block makes the construction infallible (`new_from_slice` returns a `Result`).
fn hmac_of_block(block: &[u8; 64]) -> HmacSha256 {
    <HmacSha256 as Mac>::new(&(*block).into())
}

/// What the cache checked at first use: the key entries are authenticated with.
#[derive(Debug)]
struct Trusted {
    key: MacKey,
    source: KeySource,
}

/// An on-disk cache of compiled components. Cheap to clone (clones share counters and
/// the checks made at first use).
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
    max_bytes: u64,
    /// `None`: a key held in memory.
    key_file: Option<PathBuf>,
    counters: Arc<Counters>,
    /// Set at first use: the key, or why the cache is refused (logged once, when set).
    state: Arc<OnceLock<Result<Trusted, CacheError>>>,
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
    /// A cache in `dir` holding at most `max_bytes` of entries, keyed by the file
    /// [`KEY_FILE_NAME`] in `dir`'s parent (a key in memory when `dir` has none). Nothing
    /// is checked or created until the first compilation.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> ComponentCache {
        let dir = dir.into();
        let key_file = dir.parent().map(|parent| parent.join(KEY_FILE_NAME));
        ComponentCache {
            dir,
            max_bytes,
            key_file,
            counters: Arc::default(),
            state: Arc::default(),
        }
    }

    /// The same cache keyed by the file `path` (created when absent).
    pub fn with_key_file(self, path: impl Into<PathBuf>) -> ComponentCache {
        ComponentCache {
            key_file: Some(path.into()),
            state: Arc::default(),
            ..self
        }
    }

    /// The same cache keyed by a random key held by this process: it trusts only the
    /// entries it wrote itself.
    pub fn with_memory_key(self) -> ComponentCache {
        ComponentCache {
            key_file: None,
            state: Arc::default(),
            ..self
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
        let cache = ComponentCache::new(dir, max_bytes);
        Some(match var("CRO_COMPONENT_CACHE_KEY_FILE") {
            Some(path) => cache.with_key_file(path),
            None => cache,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file the key is read from (or made in); `None`: a key held in memory.
    pub fn key_file(&self) -> Option<&Path> {
        self.key_file.as_deref()
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            replaced: c.replaced.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            unauthenticated: c.unauthenticated.load(Ordering::Relaxed),
        }
    }

    /// Whether the cache is used, and with which key: checks (and creates) the directory
    /// and the key on the first call, then answers the same. A refusal is logged once.
    pub fn check(&self) -> Result<&KeySource, &CacheError> {
        self.trusted().map(|t| &t.source)
    }

    fn trusted(&self) -> Result<&Trusted, &CacheError> {
        self.state
            .get_or_init(|| {
                let trusted = self.prepare();
                if let Err(e) = &trusted {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        error = %e,
                        "component cache refused; components are compiled without it"
                    );
                }
                trusted
            })
            .as_ref()
    }

    /// Creates the directory if needed, checks it, and reads (or makes) the key.
    fn prepare(&self) -> Result<Trusted, CacheError> {
        create_private_dir(&self.dir)?;
        let meta = fs::symlink_metadata(&self.dir).map_err(io_error(&self.dir))?;
        check_private(&self.dir, Private::Dir, Facts::of(&meta)?, sys::euid()?)?;
        let from_file = match &self.key_file {
            None => None,
            Some(path) => match file_key(path, &self.dir) {
                Ok(key) => Some((key, KeySource::File(path.clone()))),
                Err(e) => {
                    tracing::warn!(
                        key_file = %path.display(),
                        error = %e,
                        "component cache key file unusable; using a key held in memory, \
                         so entries written by other processes are recompiled"
                    );
                    None
                }
            },
        };
        let (key, source) = match from_file {
            Some(found) => found,
            None => (memory_key()?, KeySource::Memory),
        };
        Ok(Trusted { key, source })
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
        let Ok(trusted) = self.trusted() else {
            // Refused (and said so once): compiled as if there were no cache.
            let component = compile()?;
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok((component, CacheOutcome::Miss));
        };
        let key = ComponentCache::key(engine, bytes);
        let path = self.entry_path(&key);
        let outcome = match self.read(engine, &trusted.key, &key, &path) {
            Ok(Some(component)) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(entry = %path.display(), "compiled component from the cache");
                return Ok((component, CacheOutcome::Hit));
            }
            Ok(None) => CacheOutcome::Miss,
            // The entry cannot be read (permissions, I/O): nothing to replace; storing
            // will most likely fail too, and say so.
            Err(e @ CacheError::Io { .. }) => {
                tracing::debug!(error = %e, "component cache entry unreadable");
                CacheOutcome::Miss
            }
            Err(e) => {
                if matches!(e, CacheError::Unauthenticated { .. }) {
                    self.counters
                        .unauthenticated
                        .fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(error = %e, "component cache entry refused; recompiling");
                // Removed now, so it is not refused again on every load if the new
                // entry cannot be stored (too large, disk full). Removing a link removes
                // the link, not what it points at.
                let _ = fs::remove_file(&path);
                CacheOutcome::Replaced
            }
        };
        let component = compile()?;
        match outcome {
            CacheOutcome::Replaced => self.counters.replaced.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.misses.fetch_add(1, Ordering::Relaxed),
        };
        if let Err(e) = self.store(&trusted.key, &key, &path, &component) {
            tracing::warn!(error = %e, "compiled component not stored in the cache");
        } else if let Err(e) = self.evict(&path) {
            tracing::warn!(error = %e, "cannot trim the component cache");
        }
        Ok((component, outcome))
    }

    /// Reads and checks `key`'s entry: `None` when there is none.
    fn read(
        &self,
        engine: &Engine,
        mac_key: &MacKey,
        key: &CacheKey,
        path: &Path,
    ) -> Result<Option<Component>, CacheError> {
        let mut file = match sys::open_no_follow(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(open_error(path, e)),
        };
        // Checked on the open descriptor: what was opened is what is read.
        let meta = file.metadata().map_err(io_error(path))?;
        if !meta.is_file() {
            return Err(CacheError::WrongType {
                path: path.to_path_buf(),
                expected: "regular file",
            });
        }
        // Nothing over the bound is ever stored, so a larger file is not ours; and it
        // is not read into memory.
        if meta.len() > self.max_bytes {
            return Err(CacheError::TooLarge {
                path: path.to_path_buf(),
                size: meta.len(),
                max: self.max_bytes,
            });
        }
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io_error(path))?;
        let payload = verify(path, &data, key, mac_key)?;
        // SAFETY: `Component::deserialize` trusts its input to be wasmtime's own output
        // (it maps it as executable code without validating it), so it must only ever see
        // bytes a process holding this cache's key wrote from `Component::serialize`.
        // `verify` guarantees that: the header names this exact key (component digest +
        // engine settings + versions), its length matches, and its HMAC-SHA256, computed
        // by `store` over the header and the payload, checks under the key. The key lives
        // outside the directory (a 0600 file of this user, or this process's memory), so
        // whoever can write the directory without it (another user of a shared volume, a
        // stale layout-1 entry) cannot make an entry pass; the directory itself was
        // checked to be this user's and writable by no one else, and the entry was opened
        // without following links. An engine that still cannot use the entry (wasmtime
        // checks its own version and settings again) returns an error, which replaces
        // the entry.
        match unsafe { Component::deserialize(engine, payload) } {
            Ok(component) => {
                // Touched (through the descriptor, not the path) so eviction drops the
                // least recently used entries first.
                let _ = file.set_modified(SystemTime::now());
                Ok(Some(component))
            }
            Err(e) => Err(CacheError::Incompatible {
                path: path.to_path_buf(),
                reason: crate::base::error_chain(&e),
            }),
        }
    }

    /// Writes the entry to a temporary file in the same directory and renames it into
    /// place: readers see either no entry or a whole one, and two processes storing the
    /// same key at once both succeed (the last rename wins with identical content).
    fn store(
        &self,
        mac_key: &MacKey,
        key: &CacheKey,
        path: &Path,
        component: &Component,
    ) -> Result<(), CacheError> {
        let payload = component
            .serialize()
            .map_err(|e| CacheError::Serialize(crate::base::error_chain(&e)))?;
        // An entry over the bound would either break the bound or evict everything else
        // for one component: not stored, the component is compiled at each start.
        let size = (HEADER_LEN + payload.len()) as u64;
        if size > self.max_bytes {
            return Err(CacheError::TooLarge {
                path: path.to_path_buf(),
                size,
                max: self.max_bytes,
            });
        }
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.hex(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            // `create_new` never follows a link planted under the temporary name.
            let mut file = sys::create_private(&tmp).map_err(io_error(&tmp))?;
            file.write_all(&header(mac_key, key, &payload))
                .and_then(|()| file.write_all(&payload))
                .and_then(|()| file.sync_all())
                .map_err(io_error(&tmp))?;
            // Renaming over a link replaces the link itself.
            fs::rename(&tmp, path).map_err(io_error(path))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Removes the least recently used entries until the rest fit `max_bytes`, and
    /// temporary files left by a crashed writer (older than an hour). `keep` (the entry
    /// just stored, never over the bound alone: `store` refuses those) stays.
    fn evict(&self, keep: &Path) -> Result<(), CacheError> {
        let mut entries = Vec::new();
        for item in fs::read_dir(&self.dir).map_err(io_error(&self.dir))? {
            let Ok(item) = item else { continue };
            // Not following links: a link is neither counted nor its target touched.
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
        let kept = fs::symlink_metadata(keep).map(|m| m.len()).unwrap_or(0);
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

/// The header of `payload`'s entry under `key`, its MAC computed with `mac_key`.
fn header(mac_key: &MacKey, key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&key.0);
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let mac = mac_key
        .hmac()
        .chain_update(&h)
        .chain_update(payload)
        .finalize()
        .into_bytes();
    h.extend_from_slice(&mac);
    h
}

/// The payload of an entry, if the entry is whole, is `key`'s, and was written with
/// `mac_key`.
fn verify<'a>(
    path: &Path,
    data: &'a [u8],
    key: &CacheKey,
    mac_key: &MacKey,
) -> Result<&'a [u8], CacheError> {
    let corrupt = |reason: String| CacheError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if data.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "{} bytes, shorter than the header",
            data.len()
        )));
    }
    let (head, payload) = data.split_at(HEADER_LEN);
    let (magic, rest) = head.split_at(MAGIC.len());
    if magic == MAGIC_WITHOUT_MAC {
        return Err(corrupt(
            "an entry of layout 1, whose checksum anyone could recompute".into(),
        ));
    }
    if magic != MAGIC {
        return Err(corrupt("unknown header".into()));
    }
    let (entry_key, rest) = rest.split_at(32);
    let (len, mac) = rest.split_at(8);
    if entry_key != key.0 {
        return Err(corrupt("the entry is for another key".into()));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(len);
    let len = u64::from_le_bytes(len_bytes);
    if len != payload.len() as u64 {
        return Err(corrupt(format!(
            "payload is {} bytes, the header says {len}",
            payload.len()
        )));
    }
    // Compared in constant time (`verify_slice`): how much of a forged MAC matched must
    // not show in how long the check took.
    mac_key
        .hmac()
        .chain_update(&head[..HEADER_LEN - MAC_LEN])
        .chain_update(payload)
        .verify_slice(mac)
        .map_err(|_| CacheError::Unauthenticated {
            path: path.to_path_buf(),
        })?;
    Ok(payload)
}

fn create_private_dir(dir: &Path) -> Result<(), CacheError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_error(dir))
}

/// What a checked path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Private {
    /// The cache directory: nobody but its owner may add or replace entries.
    Dir,
    /// The key file: nobody but its owner may read or replace it.
    KeyFile,
}

/// What [`check_private`] looks at, read from `lstat`/`fstat` (a plain struct so the
/// rules are unit-tested without making files of another user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Facts {
    symlink: bool,
    dir: bool,
    file: bool,
    uid: u32,
    mode: u32,
}

impl Facts {
    fn of(meta: &Metadata) -> Result<Facts, CacheError> {
        let (uid, mode) = sys::owner_and_mode(meta)?;
        let kind = meta.file_type();
        Ok(Facts {
            symlink: kind.is_symlink(),
            dir: kind.is_dir(),
            file: kind.is_file(),
            uid,
            mode,
        })
    }
}

/// Refuses what someone other than `euid` could have written: a link, the wrong kind of
/// file, another owner, or a mode letting others write (the directory) or read and write
/// (the key file).
fn check_private(path: &Path, what: Private, facts: Facts, euid: u32) -> Result<(), CacheError> {
    let path_buf = || path.to_path_buf();
    if facts.symlink {
        return Err(CacheError::Symlink { path: path_buf() });
    }
    let (kind_ok, expected, others_mask, what_others) = match what {
        Private::Dir => (facts.dir, "directory", 0o022, "writable by group or other"),
        Private::KeyFile => (
            facts.file,
            "regular file",
            0o077,
            "readable or writable by group or other",
        ),
    };
    if !kind_ok {
        return Err(CacheError::WrongType {
            path: path_buf(),
            expected,
        });
    }
    if facts.uid != euid {
        return Err(CacheError::NotOwned {
            path: path_buf(),
            owner: facts.uid,
            euid,
        });
    }
    if facts.mode & others_mask != 0 {
        return Err(CacheError::Permissions {
            path: path_buf(),
            mode: facts.mode & 0o7777,
            what: what_others,
        });
    }
    Ok(())
}

/// The key in `path`, made first when there is none.
fn file_key(path: &Path, cache_dir: &Path) -> Result<MacKey, CacheError> {
    if path.starts_with(cache_dir) {
        return Err(CacheError::KeyInsideCache {
            path: path.to_path_buf(),
            dir: cache_dir.to_path_buf(),
        });
    }
    match read_key(path) {
        Err(CacheError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
        found => return found,
    }
    create_key(path)?;
    read_key(path)
}

fn read_key(path: &Path) -> Result<MacKey, CacheError> {
    let mut file = sys::open_no_follow(path).map_err(|e| open_error(path, e))?;
    let meta = file.metadata().map_err(io_error(path))?;
    check_private(path, Private::KeyFile, Facts::of(&meta)?, sys::euid()?)?;
    if meta.len() != KEY_LEN as u64 {
        return Err(CacheError::KeyLength {
            path: path.to_path_buf(),
            len: meta.len(),
        });
    }
    let mut key = [0u8; KEY_LEN];
    file.read_exact(&mut key).map_err(io_error(path))?;
    Ok(MacKey(key))
}

/// Writes a new random key to `path`, unless another process just did.
fn create_key(path: &Path) -> Result<(), CacheError> {
    let key = random_key()?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = sys::create_private(&tmp)?;
        file.write_all(&key.0)?;
        file.sync_all()?;
        // A hard link, not a rename: it fails when the key already exists, so two
        // processes making one at once end up sharing the first, and a reader never sees
        // a key half written.
        match fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = fs::remove_file(&tmp);
    result.map_err(io_error(path))
}

fn random_key() -> Result<MacKey, CacheError> {
    let mut key = [0u8; KEY_LEN];
    File::open(RANDOM_SOURCE)
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(io_error(Path::new(RANDOM_SOURCE)))?;
    Ok(MacKey(key))
}

/// This process's key when no key file can be kept: random, made once, never written.
fn memory_key() -> Result<MacKey, CacheError> {
    static KEY: OnceLock<MacKey> = OnceLock::new();
    if let Some(key) = KEY.get() {
        return Ok(*key);
    }
    let key = random_key()?;
    Ok(*KEY.get_or_init(|| key))
}

/// The few system calls the checks need, on Unix.
#[cfg(unix)]
mod sys {
    use std::fs::{File, Metadata, OpenOptions};
    use std::io;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::Path;

    use super::CacheError;

    pub(super) fn euid() -> Result<u32, CacheError> {
        // SAFETY: geteuid has no preconditions and cannot fail (POSIX).
        Ok(unsafe { libc::geteuid() })
    }

    pub(super) fn owner_and_mode(meta: &Metadata) -> Result<(u32, u32), CacheError> {
        Ok((meta.uid(), meta.mode()))
    }

    /// Opens for reading, refusing a symbolic link as the last component (`O_NOFOLLOW`),
    /// and without blocking on a FIFO planted as an entry (`O_NONBLOCK`; no effect on a
    /// regular file).
    pub(super) fn open_no_follow(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    }

    /// A new file only this user can read or write (`O_EXCL`: never an existing file or
    /// link).
    pub(super) fn create_private(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    }

    /// What `open` with `O_NOFOLLOW` answers for a link (`ELOOP` on Linux, `EMLINK` on
    /// FreeBSD).
    pub(super) fn is_link_refusal(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EMLINK))
    }
}

/// Without Unix ownership and modes nothing can be checked: the cache is refused.
#[cfg(not(unix))]
mod sys {
    use std::fs::{File, Metadata};
    use std::io;
    use std::path::Path;

    use super::CacheError;

    pub(super) fn euid() -> Result<u32, CacheError> {
        Err(CacheError::Unsupported)
    }

    pub(super) fn owner_and_mode(_: &Metadata) -> Result<(u32, u32), CacheError> {
        Err(CacheError::Unsupported)
    }

    pub(super) fn open_no_follow(_: &Path) -> io::Result<File> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(super) fn create_private(_: &Path) -> io::Result<File> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(super) fn is_link_refusal(_: &io::Error) -> bool {
        false
    }
}

/// Compiles `bytes` with `compile`, through `cache` when there is one.
pub(crate) fn compile(
    cache: Option<&ComponentCache>,
    engine: &Engine,
    bytes: &[u8],
    compile: impl FnOnce() -> wasmtime::Result<Component>,
) -> wasmtime::Result<Component> {
    match cache {
        Some(cache) => cache.get_or_compile(engine, bytes, compile).map(|(c, _)| c),
        None => compile(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> CacheKey {
        CacheKey([b; 32])
    }

    fn mac_key(b: u8) -> MacKey {
        MacKey([b; KEY_LEN])
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// RFC 4231's HMAC-SHA256 test cases 1-4 and 6, through the block-keyed construction
    /// the cache uses (a key longer than a block is hashed first, RFC 2104 section 2).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let block_of = |k: &[u8]| {
            let mut block = [0u8; 64];
            if k.len() > 64 {
                block[..32].copy_from_slice(&Sha256::digest(k));
            } else {
                block[..k.len()].copy_from_slice(k);
            }
            block
        };
        let key4: Vec<u8> = (1..=25).collect();
        let cases: [(&[u8], &[u8], &str); 5] = [
            (
                &[0x0b; 20],
                b"Hi There",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe",
                b"what do ya want for nothing?",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                &[0xaa; 20],
                &[0xdd; 50],
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            ),
            (
                &key4,
                &[0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
        ];
        for (k, data, want) in cases {
            let got = hmac_of_block(&block_of(k))
                .chain_update(data)
                .finalize()
                .into_bytes();
            assert_eq!(hex(&got), want, "key {}", hex(k));
        }
        // A cache key is a 32-byte key zero-padded to the block.
        let k = mac_key(7);
        assert_eq!(
            k.hmac().chain_update(b"x").finalize().into_bytes(),
            hmac_of_block(&block_of(&[7; 32]))
                .chain_update(b"x")
                .finalize()
                .into_bytes()
        );
    }

    fn entry(mac: &MacKey, key: &CacheKey, payload: &[u8]) -> Vec<u8> {
        let mut entry = header(mac, key, payload);
        entry.extend_from_slice(payload);
        entry
    }

    fn corrupt_reason(e: CacheError) -> String {
        match e {
            CacheError::Corrupt { reason, .. } => reason,
            other => panic!("not corrupt: {other:?}"),
        }
    }

    #[test]
    fn verify_accepts_only_a_whole_entry_of_its_key_and_mac_key() {
        let path = Path::new("/c/e.cwasm");
        let payload = b"compiled code".to_vec();
        let entry = entry(&mac_key(9), &key(1), &payload);
        fn check(data: &[u8], k: u8) -> Result<&[u8], CacheError> {
            verify(Path::new("/c/e.cwasm"), data, &key(k), &mac_key(9))
        }
        assert_eq!(check(&entry, 1).unwrap(), &payload[..]);
        assert!(corrupt_reason(check(&entry, 2).unwrap_err()).contains("another key"));
        assert!(
            corrupt_reason(check(&entry[..entry.len() - 1], 1).unwrap_err())
                .contains("header says")
        );
        assert!(corrupt_reason(check(&entry[..10], 1).unwrap_err()).contains("shorter"));
        let mut other = entry.clone();
        other[0] = b'X';
        assert!(corrupt_reason(check(&other, 1).unwrap_err()).contains("header"));

        // A flipped bit in the payload or in the MAC itself fails the MAC.
        for at in [entry.len() - 1, HEADER_LEN - 1] {
            let mut flipped = entry.clone();
            flipped[at] ^= 1;
            assert!(
                matches!(check(&flipped, 1), Err(CacheError::Unauthenticated { .. })),
                "bit at {at}"
            );
        }
        // The same entry under another MAC key: refused.
        assert!(matches!(
            verify(path, &entry, &key(1), &mac_key(8)),
            Err(CacheError::Unauthenticated { .. })
        ));
    }

    #[test]
    fn a_layout_1_entry_with_a_valid_checksum_is_refused() {
        // What the cache wrote before entries had a MAC: magic, key, SHA-256 and length
        // of the payload. Anyone who can write the directory can compute all of it.
        let payload = b"someone else's machine code".to_vec();
        let mut old = MAGIC_WITHOUT_MAC.to_vec();
        old.extend_from_slice(&key(1).0);
        old.extend_from_slice(&Sha256::digest(&payload));
        old.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        old.extend_from_slice(&payload);
        let e = verify(Path::new("e"), &old, &key(1), &mac_key(1)).unwrap_err();
        assert!(corrupt_reason(e).contains("layout 1"));
    }

    #[test]
    fn only_a_private_directory_and_key_file_of_this_user_pass() {
        let p = Path::new("/x");
        let dir = Facts {
            symlink: false,
            dir: true,
            file: false,
            uid: 1000,
            mode: 0o40700,
        };
        let file = Facts {
            dir: false,
            file: true,
            mode: 0o100600,
            ..dir
        };
        let check = |what, facts| check_private(p, what, facts, 1000);
        assert!(check(Private::Dir, dir).is_ok());
        // Readable by others is fine for entries (the code is no secret), not for the key.
        assert!(
            check(
                Private::Dir,
                Facts {
                    mode: 0o40755,
                    ..dir
                }
            )
            .is_ok()
        );
        assert!(
            check(
                Private::Dir,
                Facts {
                    mode: 0o42700,
                    ..dir
                }
            )
            .is_ok()
        );
        assert!(check(Private::KeyFile, file).is_ok());
        for mode in [0o40770, 0o40720, 0o40702, 0o41777] {
            let e = check(Private::Dir, Facts { mode, ..dir }).unwrap_err();
            assert!(
                matches!(e, CacheError::Permissions { mode: m, .. } if m == mode & 0o7777),
                "{mode:o}: {e:?}"
            );
            assert!(e.to_string().contains("writable by group or other"), "{e}");
        }
        for mode in [0o100640, 0o100604, 0o100660] {
            let e = check(Private::KeyFile, Facts { mode, ..file }).unwrap_err();
            assert!(
                matches!(e, CacheError::Permissions { .. }),
                "{mode:o}: {e:?}"
            );
        }
        assert!(matches!(
            check(Private::Dir, Facts { uid: 0, ..dir }),
            Err(CacheError::NotOwned {
                owner: 0,
                euid: 1000,
                ..
            })
        ));
        assert!(matches!(
            check(Private::KeyFile, Facts { uid: 1001, ..file }),
            Err(CacheError::NotOwned { .. })
        ));
        let link = Facts {
            symlink: true,
            dir: false,
            file: false,
            mode: 0o120777,
            ..dir
        };
        assert!(matches!(
            check(Private::Dir, link),
            Err(CacheError::Symlink { .. })
        ));
        assert!(matches!(
            check(Private::KeyFile, link),
            Err(CacheError::Symlink { .. })
        ));
        assert!(matches!(
            check(Private::Dir, file),
            Err(CacheError::WrongType {
                expected: "directory",
                ..
            })
        ));
        assert!(matches!(
            check(Private::KeyFile, dir),
            Err(CacheError::WrongType { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_key_file_is_made_once_private_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("components");
        let path = dir.path().join(KEY_FILE_NAME);
        let first = file_key(&path, &cache_dir).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        assert_eq!(file_key(&path, &cache_dir).unwrap(), first, "reused");
        // No temporary file is left beside it.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);

        // Readable by others: refused, not repaired (someone may have read it).
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            file_key(&path, &cache_dir),
            Err(CacheError::Permissions { .. })
        ));
        // The wrong length.
        fs::remove_file(&path).unwrap();
        fs::write(&path, b"short").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            file_key(&path, &cache_dir),
            Err(CacheError::KeyLength { len: 5, .. })
        ));
        // A link to a private file of ours that someone else chose: refused.
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(matches!(
            file_key(&path, &cache_dir),
            Err(CacheError::Symlink { .. })
        ));
        // Inside the cache directory.
        assert!(matches!(
            file_key(&cache_dir.join("k"), &cache_dir),
            Err(CacheError::KeyInsideCache { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn an_unusable_key_file_falls_back_to_a_key_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ComponentCache::new(dir.path().join("components"), 1 << 20);
        assert_eq!(
            cache.check().unwrap(),
            &KeySource::File(dir.path().join(KEY_FILE_NAME))
        );
        // A key file whose directory does not exist (and is not made).
        let elsewhere = cache
            .clone()
            .with_key_file(dir.path().join("missing").join("key"));
        assert_eq!(elsewhere.check().unwrap(), &KeySource::Memory);
        let memory = cache.with_memory_key();
        assert_eq!(memory.key_file(), None);
        assert_eq!(memory.check().unwrap(), &KeySource::Memory);
        // The process's memory key is one key.
        assert_eq!(memory_key().unwrap(), memory_key().unwrap());
    }

    #[test]
    fn the_key_is_not_printed() {
        let shown = format!("{:?}", mac_key(0xab));
        assert!(!shown.contains("ab") && !shown.contains("171"), "{shown}");
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
    fn the_environment_names_the_directory_bound_key_file_and_off_switch() {
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
        assert_eq!(
            home.key_file(),
            Some(Path::new("/home/u/.cache/cro/component-cache.key"))
        );
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
        assert_eq!(explicit.key_file(), Some(Path::new("/component-cache.key")));
        let keyed = from(&[
            ("CRO_COMPONENT_CACHE_DIR", "/vol/c"),
            ("CRO_COMPONENT_CACHE_KEY_FILE", "/keys/cache.key"),
        ])
        .unwrap();
        assert_eq!(keyed.key_file(), Some(Path::new("/keys/cache.key")));
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
        // The entry just stored stays whatever the others weigh.
        let tiny = ComponentCache::new(dir.path(), 1);
        tiny.evict(&cache.entry_path(&key(1))).unwrap();
        assert!(!cache.entry_path(&key(2)).exists());
        assert!(cache.entry_path(&key(1)).exists());
    }
}
