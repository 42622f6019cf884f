//! Writes the CRDs generated from the cro-api types into `crds/`, or checks or prints them.
//!
//! Usage: `crdgen [--check | --stdout] [--dir DIR]` (default DIR: the repository's `crds/`).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: crdgen [--check | --stdout] [--dir DIR]";

enum Mode {
    Write,
    Check,
    Stdout,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(message) => {
            eprintln!("crdgen: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let mut mode = Mode::Write;
    let mut dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds"));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => mode = Mode::Check,
            "--stdout" => mode = Mode::Stdout,
            "--dir" => dir = args.next().map(PathBuf::from).ok_or(USAGE)?,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let files = cro_api::crd_files().map_err(|e| e.to_string())?;
    match mode {
        Mode::Stdout => {
            let docs: Vec<_> = files.iter().map(|f| f.yaml.as_str()).collect();
            print!("{}", docs.join("---\n"));
        }
        Mode::Write => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let dir = dir
                .canonicalize()
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            for f in &files {
                let path = dir.join(&f.file_name);
                std::fs::write(&path, &f.yaml).map_err(|e| format!("{}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Mode::Check => {
            let mut stale = false;
            for f in &files {
                let path = dir.join(&f.file_name);
                if std::fs::read_to_string(&path).ok().as_deref() != Some(f.yaml.as_str()) {
                    eprintln!("{} is out of date", path.display());
                    stale = true;
                }
            }
            if stale {
                eprintln!("run `{}` to regenerate", cro_api::REGENERATE_COMMAND);
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
