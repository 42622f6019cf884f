//! Finding the etcd and kube-apiserver executables.
//!
//! Same order as `tests/control-plane/ensure-binaries.sh`: `CRO_KUBE_APISERVER` + `CRO_ETCD`,
//! then `KUBEBUILDER_ASSETS`, then the script's cache directory; only when none has them is
//! the script run (it builds them once, which takes minutes).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Kubernetes version the script builds when `CRO_K8S_VERSION` is unset; must match the
/// script's default (a unit test checks it).
pub const DEFAULT_K8S_VERSION: &str = "v1.36.3";

/// The script that provides the binaries.
pub const ENSURE_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../control-plane/ensure-binaries.sh"
);

/// Paths of the two control-plane executables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binaries {
    /// The kube-apiserver executable.
    pub kube_apiserver: PathBuf,
    /// The etcd executable.
    pub etcd: PathBuf,
}

/// Why the binaries could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    /// Only one of the two environment variables is set, or one names no executable.
    #[error("{0}")]
    BadEnvironment(String),
    /// The script could not be run.
    #[error("cannot run {script}: {source}")]
    ScriptSpawn {
        /// Path of the script.
        script: String,
        /// The error.
        source: std::io::Error,
    },
    /// The script failed or printed no directory holding both binaries.
    #[error("{script} failed ({status}); its output is above. Last stdout line: {last_line:?}")]
    ScriptFailed {
        /// Path of the script.
        script: String,
        /// How it exited.
        status: String,
        /// The last line it printed.
        last_line: String,
    },
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn in_dir(dir: &Path) -> Option<Binaries> {
    let found = Binaries {
        kube_apiserver: dir.join("kube-apiserver"),
        etcd: dir.join("etcd"),
    };
    (is_executable(&found.kube_apiserver) && is_executable(&found.etcd)).then_some(found)
}

/// The cache directory the script fills, computed like the script does.
fn cache_dir(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let root = match (env("CRO_CACHE_DIR"), env("XDG_CACHE_HOME"), env("HOME")) {
        (Some(dir), _, _) if !dir.is_empty() => PathBuf::from(dir),
        (_, Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg).join("cro"),
        (_, _, Some(home)) if !home.is_empty() => PathBuf::from(home).join(".cache/cro"),
        _ => return None,
    };
    let version = env("CRO_K8S_VERSION")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_K8S_VERSION.into());
    Some(root.join("controlplane").join(version).join("bin"))
}

/// Looks for existing binaries without building anything. `Ok(None)`: none found.
fn find_existing(
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Option<Binaries>, BinariesError> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    match (set("CRO_KUBE_APISERVER"), set("CRO_ETCD")) {
        (Some(apiserver), Some(etcd)) => {
            let found = Binaries {
                kube_apiserver: apiserver.into(),
                etcd: etcd.into(),
            };
            for (var, path) in [
                ("CRO_KUBE_APISERVER", &found.kube_apiserver),
                ("CRO_ETCD", &found.etcd),
            ] {
                if !is_executable(path) {
                    return Err(BinariesError::BadEnvironment(format!(
                        "{var}={} is not an executable file",
                        path.display()
                    )));
                }
            }
            return Ok(Some(found));
        }
        (None, None) => {}
        _ => {
            return Err(BinariesError::BadEnvironment(
                "set both CRO_KUBE_APISERVER and CRO_ETCD, or neither".into(),
            ));
        }
    }
    if let Some(found) = set("KUBEBUILDER_ASSETS").and_then(|dir| in_dir(Path::new(&dir))) {
        return Ok(Some(found));
    }
    Ok(cache_dir(env).and_then(|dir| in_dir(&dir)))
}

/// Finds the binaries, running the script (which may build them) when none exist yet.
/// Blocking: call it from a blocking context.
pub fn locate() -> Result<Binaries, BinariesError> {
    let env = |name: &str| std::env::var_os(name);
    if let Some(found) = find_existing(&env)? {
        return Ok(found);
    }
    run_script(Path::new(ENSURE_SCRIPT))
}

fn run_script(script: &Path) -> Result<Binaries, BinariesError> {
    let script_name = script.display().to_string();
    // stderr stays attached so a first-time build shows its progress.
    let output = Command::new("bash")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| BinariesError::ScriptSpawn {
            script: script_name.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last_line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    match (output.status.success(), in_dir(Path::new(last_line))) {
        (true, Some(found)) => Ok(found),
        _ => Err(BinariesError::ScriptFailed {
            script: script_name,
            status: output.status.to_string(),
            last_line: last_line.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    fn fake_bin_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in ["kube-apiserver", "etcd"] {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    fn env_of(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn explicit_paths_win() {
        let a = fake_bin_dir();
        let b = fake_bin_dir();
        let env = env_of(&[
            ("CRO_KUBE_APISERVER", &a.path().join("kube-apiserver")),
            ("CRO_ETCD", &b.path().join("etcd")),
            ("KUBEBUILDER_ASSETS", b.path()),
        ]);
        let found = find_existing(&env).unwrap().unwrap();
        assert_eq!(found.kube_apiserver, a.path().join("kube-apiserver"));
        assert_eq!(found.etcd, b.path().join("etcd"));
    }

    #[test]
    fn half_set_or_broken_explicit_paths_are_errors() {
        let a = fake_bin_dir();
        let only_one = env_of(&[("CRO_ETCD", &a.path().join("etcd"))]);
        assert!(matches!(
            find_existing(&only_one),
            Err(BinariesError::BadEnvironment(_))
        ));
        let missing = env_of(&[
            ("CRO_KUBE_APISERVER", &a.path().join("nope")),
            ("CRO_ETCD", &a.path().join("etcd")),
        ]);
        let err = find_existing(&missing).unwrap_err().to_string();
        assert!(err.contains("CRO_KUBE_APISERVER"), "{err}");
    }

    #[test]
    fn kubebuilder_assets_then_cache() {
        let assets = fake_bin_dir();
        let cache = tempfile::tempdir().unwrap();
        let env = env_of(&[
            ("KUBEBUILDER_ASSETS", assets.path()),
            ("CRO_CACHE_DIR", cache.path()),
        ]);
        assert_eq!(
            find_existing(&env).unwrap().unwrap().etcd,
            assets.path().join("etcd")
        );

        let env = env_of(&[("CRO_CACHE_DIR", cache.path())]);
        assert_eq!(find_existing(&env).unwrap(), None);

        let bin = cache
            .path()
            .join("controlplane")
            .join(DEFAULT_K8S_VERSION)
            .join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for name in ["kube-apiserver", "etcd"] {
            std::fs::copy(assets.path().join(name), bin.join(name)).unwrap();
        }
        assert_eq!(
            find_existing(&env).unwrap().unwrap().kube_apiserver,
            bin.join("kube-apiserver")
        );

        // An assets directory lacking a binary falls through to the cache, like the script.
        std::fs::remove_file(assets.path().join("etcd")).unwrap();
        let env = env_of(&[
            ("KUBEBUILDER_ASSETS", assets.path()),
            ("CRO_CACHE_DIR", cache.path()),
        ]);
        assert_eq!(find_existing(&env).unwrap().unwrap().etcd, bin.join("etcd"));
    }

    #[test]
    fn cache_dir_follows_the_script() {
        let home = Path::new("/home/u");
        let xdg = Path::new("/x");
        let v = Path::new("v9.9.9");
        assert_eq!(
            cache_dir(&env_of(&[("HOME", home)])).unwrap(),
            Path::new("/home/u/.cache/cro/controlplane")
                .join(DEFAULT_K8S_VERSION)
                .join("bin")
        );
        assert_eq!(
            cache_dir(&env_of(&[
                ("HOME", home),
                ("XDG_CACHE_HOME", xdg),
                ("CRO_K8S_VERSION", v)
            ]))
            .unwrap(),
            Path::new("/x/cro/controlplane/v9.9.9/bin")
        );
        let script = std::fs::read_to_string(ENSURE_SCRIPT).unwrap();
        assert!(
            script.contains(&format!(
                "K8S_VERSION=\"${{CRO_K8S_VERSION:-{DEFAULT_K8S_VERSION}}}\""
            )),
            "the script's default version differs from DEFAULT_K8S_VERSION"
        );
        assert!(
            script.contains("CACHE_ROOT=\"${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}\"")
        );
    }

    #[test]
    fn a_failing_script_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s.sh");
        std::fs::write(&script, "echo /nonexistent\nexit 3\n").unwrap();
        let err = run_script(&script).unwrap_err().to_string();
        assert!(err.contains("/nonexistent") && err.contains('3'), "{err}");

        let good = fake_bin_dir();
        std::fs::write(
            &script,
            format!(
                "echo building >&2\necho noise\necho {}\n",
                good.path().display()
            ),
        )
        .unwrap();
        assert_eq!(run_script(&script).unwrap().etcd, good.path().join("etcd"));
    }
}
