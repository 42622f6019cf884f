//! `cro provider new`: a Rust provider on the SDK, from the templates in
//! `host/cli/templates/provider/`, that passes `cro provider test` as generated.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;

const CARGO_TOML: &str = include_str!("../templates/provider/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../templates/provider/lib.rs.tmpl");
const README: &str = include_str!("../templates/provider/README.md.tmpl");
const GITIGNORE: &str = "/target\n";

/// Where this binary's sources keep the SDK (a scaffold made by a `cro` built from a
/// checkout depends on it by path).
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers/sdk");

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The provider's name: lowercase letters, digits and '-', starting with a letter
    /// (also the crate's name).
    pub name: String,
    /// The directory to create the provider in (default: ./NAME).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The path of cro's `providers/sdk` (default: the checkout this `cro` was built from).
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
    /// The vendor named in describe().
    #[arg(long, default_value = "Example Vendor")]
    pub vendor: String,
}

/// Whether `name` works as a crate and provider name.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// `acme-gpu` -> `AcmeGpu`.
fn type_name(name: &str) -> String {
    name.split('-')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The files of a scaffold, by path relative to its directory.
pub fn render(name: &str, vendor: &str, sdk_path: &Path) -> Vec<(&'static str, String)> {
    let sdk = sdk_path.display().to_string().replace('\\', "/");
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{crate_name}}", &name.replace('-', "_"))
            .replace("{{type_name}}", &type_name(name))
            .replace("{{vendor}}", &vendor.replace(['"', '\\'], ""))
            .replace("{{sdk_path}}", &sdk)
    };
    vec![
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("README.md", fill(README)),
        (".gitignore", GITIGNORE.to_string()),
    ]
}

pub fn new_command(args: &NewArgs) -> anyhow::Result<ExitCode> {
    if !valid_name(&args.name) {
        bail!(
            "provider name {:?}: use lowercase letters, digits and '-', starting with a letter",
            args.name
        );
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists()
        && dir
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!("{} exists and is not empty", dir.display());
    }
    let sdk = match &args.sdk_path {
        Some(p) => p.clone(),
        None => PathBuf::from(BUILT_SDK),
    };
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("the SDK at {} (pass --sdk-path)", sdk.display()))?;
    if !sdk.join("Cargo.toml").is_file() {
        bail!(
            "{} holds no Cargo.toml: pass --sdk-path <cro checkout>/providers/sdk",
            sdk.display()
        );
    }
    for (path, text) in render(&args.name, &args.vendor, &sdk) {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    println!(
        "created provider {} in {}\nbuild:  (cd {} && cargo build --target wasm32-wasip2 --profile component)\ntest:   cro provider test {}/target/wasm32-wasip2/component/{}.wasm",
        args.name,
        dir.display(),
        dir.display(),
        dir.display(),
        args.name.replace('-', "_")
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        assert!(valid_name("acme-gpu2"));
        for bad in ["", "Acme", "1acme", "acme_gpu", "acme-", "a b"] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(type_name("acme-gpu2"), "AcmeGpu2");
    }

    #[test]
    fn every_placeholder_is_filled() {
        for (path, text) in render("acme-gpu", "Acme \"Inc\"", Path::new("/sdk")) {
            assert!(!text.contains("{{"), "{path}: {text}");
        }
        let files = render("acme-gpu", "Acme", Path::new("/sdk"));
        let lib = &files[1].1;
        assert!(lib.contains("pub struct AcmeGpu<H: Host>"));
        assert!(
            files[0]
                .1
                .contains("cro-provider-sdk = { path = \"/sdk\" }")
        );
    }
}
