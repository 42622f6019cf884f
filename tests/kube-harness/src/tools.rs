//! The deployment tools tests run (helm, kustomize), provided by
//! `deploy/tools/ensure-tools.sh`: built once from the Go module proxy into
//! `~/.cache/cro/tools/`, or taken from `CRO_HELM` / `CRO_KUSTOMIZE`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The script that provides the tools.
pub const ENSURE_TOOLS_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/tools/ensure-tools.sh"
);
/// The repository's `deploy/` directory.
pub const DEPLOY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");

/// A deployment tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// `helm` (v3).
    Helm,
    /// `kustomize` (v5).
    Kustomize,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Helm => "helm",
            Tool::Kustomize => "kustomize",
        }
    }
}

/// Why a tool could not be provided or failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A process could not be started.
    #[error("cannot run {what}: {source}")]
    Spawn {
        /// The command.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The ensure script failed or printed no path.
    #[error("{script} failed ({status}) or printed no path for {tool}; its output is above")]
    Ensure {
        /// The script.
        script: String,
        /// How it exited.
        status: String,
        /// Which tool.
        tool: &'static str,
    },
    /// The tool ran and failed.
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// The path of `tool`, building it once if needed (minutes on a cold cache).
pub fn locate(tool: Tool) -> Result<PathBuf, ToolError> {
    let output = Command::new("bash")
        .arg(ENSURE_TOOLS_SCRIPT)
        .arg(tool.name())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| ToolError::Spawn {
            what: ENSURE_TOOLS_SCRIPT.into(),
            source,
        })?;
    let prefix = format!("{}=", tool.name());
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(PathBuf::from));
    match path {
        Some(p) if output.status.success() && p.is_file() => Ok(p),
        _ => Err(ToolError::Ensure {
            script: ENSURE_TOOLS_SCRIPT.into(),
            status: output.status.to_string(),
            tool: tool.name(),
        }),
    }
}

/// Runs `program args...` in `dir` and returns its stdout; a failure carries stderr.
pub fn run(program: &Path, args: &[&str], dir: &Path) -> Result<String, ToolError> {
    let command = format!("{} {}", program.display(), args.join(" "));
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        // helm keeps caches and repository config under HOME; nothing of it is needed.
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("cro-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("cro-helm-config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("cro-helm-data"))
        .output()
        .map_err(|source| ToolError::Spawn {
            what: command.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(ToolError::Failed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
