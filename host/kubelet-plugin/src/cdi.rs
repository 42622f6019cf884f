//! The CDI spec files of prepared claims: one file per claim in the directory the
//! container runtime reads (`/var/run/cdi` by default), written whole (a temporary name
//! the runtime ignores, then a rename) so a container never sees half a spec.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A claim UID as the API server makes them; anything else never names a file.
pub(crate) fn is_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len())
        && uid
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Spec writes by this process, naming their temporary files apart.
static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Debug, Clone)]
pub(crate) struct SpecDir {
    dir: PathBuf,
}

impl SpecDir {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The spec file of claim `uid` (a checked UID: see [`is_uid`]).
    fn path(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{}-{uid}.json", cro_api::DRA_DRIVER))
    }

    pub(crate) fn write(&self, uid: &str, spec: &Value) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(uid);
        // `.tmp`: the runtime loads only `.json` and `.yaml` files. Numbered: two
        // prepares of one claim at once (the kubelet retrying) must not share one.
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{}-{uid}.{n}.tmp", cro_api::DRA_DRIVER));
        std::fs::write(&tmp, serde_json::to_vec_pretty(spec)?)?;
        std::fs::rename(&tmp, &path)
    }

    /// Removes the claim's spec; a spec already gone is not an error (the kubelet
    /// unprepares again after a restart).
    pub(crate) fn remove(&self, uid: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(uid)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    #[cfg(test)]
    pub(crate) fn read(&self, uid: &str) -> Option<Value> {
        let text = std::fs::read(self.path(uid)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_written_whole_and_removed_once_or_twice() {
        let dir = tempfile::tempdir().unwrap();
        let specs = SpecDir::new(&dir.path().join("cdi"));
        let spec = serde_json::json!({"cdiVersion": "0.6.0"});
        specs.write("abc-1", &spec).unwrap();
        assert_eq!(specs.read("abc-1"), Some(spec));
        let names: Vec<_> = std::fs::read_dir(dir.path().join("cdi"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            names,
            ["cro.hpsys.ibm.ie.com-abc-1.json"],
            "no temporary left"
        );
        specs.remove("abc-1").unwrap();
        specs.remove("abc-1").unwrap();
        assert_eq!(specs.read("abc-1"), None);
    }

    #[test]
    fn only_uids_name_files() {
        assert!(is_uid("0f1e2d3c-aaaa-bbbb-cccc-000000000001"));
        for bad in ["", "../etc/passwd", "A", "a/b", &"a".repeat(65)] {
            assert!(!is_uid(bad), "{bad:?}");
        }
    }
}
