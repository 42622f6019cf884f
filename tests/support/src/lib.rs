//! Helpers for tests that need real provider components.
//!
//! [`component`] builds a component crate of the workspace for `wasm32-wasip2` (the `component` profile)
//! into `<workspace>/target/wasm` — a separate target dir, so the nested cargo never
//! waits on the lock held by the cargo that runs the tests — and returns the `.wasm`
//! path. Cargo runs once per process per package; it is a fast no-op when the component
//! is up to date.
//!
//! The path returned is a copy made right after the package's own build
//! (`target/wasm/built/<package>/`), not cargo's output file: cargo rewrites that file
//! when another package is built alone that depends on this one with other features
//! (building `fti-v0-1-0` alone writes an `fti_provider.wasm` without its export), and a
//! test of the same process reading it then would load the wrong component.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest.to_path_buf())
}

/// Where the components are built.
pub fn wasm_target_dir() -> PathBuf {
    workspace_root().join("target").join("wasm")
}

/// Builds `package` (its library, a `cdylib`) and returns the component's path.
///
/// # Panics
/// When cargo fails; the panic message carries cargo's output.
pub fn component(package: &str) -> PathBuf {
    match try_component(package) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// Builds the `cdylib` example `example` of `package` and returns the component's path.
///
/// # Panics
/// When cargo fails; the panic message carries cargo's output.
pub fn example_component(package: &str, example: &str) -> PathBuf {
    match try_example_component(package, example) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// Like [`component`], returning cargo's output as the error.
pub fn try_component(package: &str) -> Result<PathBuf, String> {
    let file = format!("{}.wasm", package.replace('-', "_"));
    build_once(package, None, wasm_release_dir().join(file))
}

/// Like [`example_component`], returning cargo's output as the error.
pub fn try_example_component(package: &str, example: &str) -> Result<PathBuf, String> {
    let file = format!("{}.wasm", example.replace('-', "_"));
    build_once(
        package,
        Some(example),
        wasm_release_dir().join("examples").join(file),
    )
}

/// The workspace's `[profile.component]`: stripped and optimised (LTO), as components ship.
const PROFILE: &str = "component";

fn wasm_release_dir() -> PathBuf {
    wasm_target_dir().join("wasm32-wasip2").join(PROFILE)
}

type Built = HashMap<String, Result<PathBuf, String>>;

fn build_once(package: &str, example: Option<&str>, artifact: PathBuf) -> Result<PathBuf, String> {
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let key = match example {
        Some(example) => format!("{package} --example {example}"),
        None => package.to_string(),
    };
    // Held across the build: concurrent tests asking for the same package wait for the
    // first build instead of racing cargo on the same output files.
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(result) = built.get(&key) {
        return result.clone();
    }
    let result = run_cargo(package, example).and_then(|()| {
        if artifact.is_file() {
            keep_copy(&key, &artifact)
        } else {
            Err(format!(
                "cargo built {key} but {} does not exist",
                artifact.display()
            ))
        }
    });
    built.insert(key, result.clone());
    result
}

/// A copy of `artifact` under `target/wasm/built/<key>/`, written to a temporary name
/// and renamed into place so that a reader never sees half of it.
fn keep_copy(key: &str, artifact: &Path) -> Result<PathBuf, String> {
    let dir = wasm_target_dir()
        .join("built")
        .join(key.replace([' ', '/'], "_"));
    let file = artifact
        .file_name()
        .ok_or_else(|| format!("{} has no file name", artifact.display()))?;
    let kept = dir.join(file);
    let tmp = dir.join(format!(
        ".{}.{}",
        file.to_string_lossy(),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::copy(artifact, &tmp))
        .and_then(|_| std::fs::rename(&tmp, &kept))
        .map_err(|e| format!("cannot keep a copy of {}: {e}", artifact.display()))?;
    Ok(kept)
}

fn run_cargo(package: &str, example: Option<&str>) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", wasm_target_dir())
        .args([
            "build",
            "--profile",
            PROFILE,
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ]);
    if let Some(example) = example {
        cmd.args(["--example", example]);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run cargo to build {package}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "building component {package}{} failed ({}):\n{}{}",
            example.map(|e| format!(" example {e}")).unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
