//! Making sure nothing outlives a test run.
//!
//! - Every harness directory holds `harness.lock`, `flock`ed for as long as its harness lives.
//!   The kernel drops the lock when the owning process dies, however it dies, so a later
//!   [`sweep_stale_dirs`] can tell a directory left by a killed test from one in use.
//! - Every local control plane registers its process groups and directory here; an `atexit`
//!   handler kills and removes whatever is still registered when the process exits normally
//!   (a harness kept in a `static`, or one leaked by `std::process::exit` in a test).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

/// Prefix of every harness directory under the system temporary directory.
pub const DIR_PREFIX: &str = "cro-kube-harness-";
const LOCK_FILE: &str = "harness.lock";
/// A directory without a lock file younger than this may still be being set up.
const UNLOCKED_GRACE: Duration = Duration::from_secs(60);

struct Registered {
    dir: PathBuf,
    pids: Vec<u32>,
}

static REGISTRY: Mutex<BTreeMap<u64, Registered>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static AT_EXIT: Once = Once::new();

extern "C" fn cleanup_at_exit() {
    // A thread may hold the lock while the process exits; waiting would hang the exit, and
    // PR_SET_PDEATHSIG kills the children anyway.
    let Ok(mut registry) = REGISTRY.try_lock() else {
        return;
    };
    for (_, entry) in std::mem::take(&mut *registry) {
        for pid in entry.pids {
            // SAFETY: plain syscalls on our own unreaped children.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
        let _ = std::fs::remove_dir_all(&entry.dir);
    }
}

/// A harness directory: created locked, registered for cleanup at exit, removed on drop
/// (after the processes living in it are gone: drop those first).
#[derive(Debug)]
pub struct HarnessDir {
    path: PathBuf,
    id: u64,
    _lock: File,
}

impl HarnessDir {
    /// Creates and locks a fresh directory under the system temporary directory.
    pub fn create() -> io::Result<Self> {
        AT_EXIT.call_once(|| {
            // SAFETY: registers a plain extern "C" function.
            unsafe {
                libc::atexit(cleanup_at_exit);
            }
        });
        let path = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()?
            .keep();
        let lock = match File::create(path.join(LOCK_FILE))
            .and_then(|f| lock_exclusive(&f, false).map(|_| f))
        {
            Ok(lock) => lock,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&path);
                return Err(e);
            }
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        registry().insert(
            id,
            Registered {
                dir: path.clone(),
                pids: Vec::new(),
            },
        );
        Ok(Self {
            path,
            id,
            _lock: lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a child (process group leader) to kill at exit; the record is dropped with
    /// the returned value, which must happen once the child is reaped.
    pub fn register_pid(&self, pid: u32) -> Registration {
        if let Some(entry) = registry().get_mut(&self.id) {
            entry.pids.push(pid);
        }
        Registration {
            dir_id: self.id,
            pid,
        }
    }
}

/// A child recorded for killing at exit; dropping it removes the record.
#[derive(Debug)]
pub struct Registration {
    dir_id: u64,
    pid: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(entry) = registry().get_mut(&self.dir_id) {
            entry.pids.retain(|&p| p != self.pid);
        }
    }
}

impl Drop for HarnessDir {
    fn drop(&mut self) {
        registry().remove(&self.id);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<u64, Registered>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// `flock(LOCK_EX)`; with `try_only`, fails with `WouldBlock` instead of waiting.
fn lock_exclusive(file: &File, try_only: bool) -> io::Result<()> {
    let flags = if try_only {
        libc::LOCK_EX | libc::LOCK_NB
    } else {
        libc::LOCK_EX
    };
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes harness directories whose owner is gone (a test process that was killed), and
/// returns them. Directories in use are left alone.
pub fn sweep_stale_dirs() -> Vec<PathBuf> {
    sweep_stale_dirs_in(&std::env::temp_dir())
}

pub(crate) fn sweep_stale_dirs_in(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = entry.file_name().to_string_lossy().starts_with(DIR_PREFIX)
            && entry.file_type().is_ok_and(|t| t.is_dir());
        if is_ours && is_abandoned(&path) && std::fs::remove_dir_all(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

fn is_abandoned(dir: &Path) -> bool {
    match File::open(dir.join(LOCK_FILE)) {
        // Getting the lock means its holder is dead; we drop it again when `lock` closes.
        Ok(lock) => lock_exclusive(&lock, true).is_ok(),
        Err(_) => dir
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > UNLOCKED_GRACE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_dir_is_kept_and_a_dropped_one_removed() {
        let dir = HarnessDir::create().unwrap();
        let path = dir.path().to_owned();
        assert!(
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(DIR_PREFIX)
        );
        let parent = path.parent().unwrap();
        assert!(!sweep_stale_dirs_in(parent).contains(&path));
        assert!(path.join(LOCK_FILE).exists());
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn an_abandoned_dir_is_swept() {
        let parent = tempfile::tempdir().unwrap();
        let abandoned = parent.path().join(format!("{DIR_PREFIX}dead"));
        std::fs::create_dir(&abandoned).unwrap();
        std::fs::write(abandoned.join(LOCK_FILE), "").unwrap();
        std::fs::write(abandoned.join("etcd.log"), "x").unwrap();
        let young = parent.path().join(format!("{DIR_PREFIX}starting"));
        std::fs::create_dir(&young).unwrap();
        let held = parent.path().join(format!("{DIR_PREFIX}held"));
        std::fs::create_dir(&held).unwrap();
        let holder = File::create(held.join(LOCK_FILE)).unwrap();
        // flock locks belong to the open file description, so a second open conflicts even
        // within this process, exactly as it would for another process.
        lock_exclusive(&holder, false).unwrap();
        let other = parent.path().join("unrelated");
        std::fs::create_dir(&other).unwrap();

        assert_eq!(sweep_stale_dirs_in(parent.path()), vec![abandoned.clone()]);
        assert!(!abandoned.exists());
        assert!(young.exists() && held.exists() && other.exists());
        drop(holder);
        // A process another test forks in this moment holds a copy of the descriptor, and
        // with it the lock, until it execs (close-on-exec): the lock frees within moments.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let swept = sweep_stale_dirs_in(parent.path());
            if !swept.is_empty() || std::time::Instant::now() >= deadline {
                assert_eq!(swept, vec![held.clone()]);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
