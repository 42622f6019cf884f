//! `cro provider new`: a provider that passes `cro provider test` as generated, from the
//! templates in `host/cli/templates/`:
//! - `--template rest` (the default): a generic REST fabric, with `fabric_sim.py`, the
//!   reference simulator of that fabric speaking the control protocol, beside it; in
//!   Rust on the SDK, Python (componentize-py) or JavaScript (componentize-js);
//! - `--template fti`: cro's reference fabric (FTI), Rust only, certified against the
//!   built-in simulator.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};

const CARGO_TOML: &str = include_str!("../templates/rust/Cargo.toml.tmpl");
const FTI_LIB_RS: &str = include_str!("../templates/fti/lib.rs.tmpl");
const FTI_README: &str = include_str!("../templates/fti/README.md.tmpl");
const REST_LIB_RS: &str = include_str!("../templates/rest/lib.rs.tmpl");
const REST_README: &str = include_str!("../templates/rest/README.md.tmpl");
const FABRIC_SIM: &str = include_str!("../templates/rest/fabric_sim.py");
const PYTHON_APP: &str = include_str!("../templates/python/app.py.tmpl");
const PYTHON_README: &str = include_str!("../templates/python/README.md.tmpl");
const JS_PROVIDER: &str = include_str!("../templates/javascript/provider.js.tmpl");
const JS_BUILD: &str = include_str!("../templates/javascript/build.mjs.tmpl");
const JS_PACKAGE: &str = include_str!("../templates/javascript/package.json.tmpl");
const JS_README: &str = include_str!("../templates/javascript/README.md.tmpl");
/// The contract the Python and JavaScript templates build against, as this cro serves it.
const WIT_0_3_0: &str = include_str!("../../../wit/since_v0.3.0/provider.wit");
const WIT_0_2_0: &str = include_str!("../../../wit/since_v0.2.0/provider.wit");
const WIT_0_1_0: &str = include_str!("../../../wit/since_v0.1.0/provider.wit");
const RUST_GITIGNORE: &str = "/target\n";
const PYTHON_GITIGNORE: &str = "/.venv\n__pycache__/\n*.wasm\n";
const JS_GITIGNORE: &str = "/node_modules\n*.wasm\n";

/// Where this binary's sources keep the SDK (a scaffold made by a `cro` built from a
/// checkout depends on it by path).
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers/sdk");

/// The fabric a scaffold speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Template {
    /// A generic REST fabric, with its reference simulator (`fabric_sim.py`).
    Rest,
    /// cro's reference fabric, the FTI Fabric Manager API (Rust only).
    Fti,
}

/// The language of a scaffold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Javascript,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The provider's name: lowercase letters, digits and '-', starting with a letter
    /// (also the crate's or package's name).
    pub name: String,
    /// The directory to create the provider in (default: ./NAME).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The fabric the provider starts with.
    #[arg(long, value_enum, default_value = "rest")]
    pub template: Template,
    /// The language.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// For Rust: the path of cro's `providers/sdk` (default: the checkout this `cro`
    /// was built from).
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
pub fn render(
    name: &str,
    vendor: &str,
    sdk_path: &Path,
    template: Template,
    lang: Lang,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let sdk = sdk_path.display().to_string().replace('\\', "/");
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{crate_name}}", &name.replace('-', "_"))
            .replace("{{type_name}}", &type_name(name))
            .replace(
                "{{vendor}}",
                &vendor.replace(['"', '\\', '\'', '`', '$'], ""),
            )
            .replace("{{sdk_path}}", &sdk)
    };
    let wit = |mut files: Vec<(&'static str, String)>| {
        files.push(("wit/provider.wit", WIT_0_3_0.to_string()));
        files.push((
            "wit/deps/cro-provider-0.2.0/provider.wit",
            WIT_0_2_0.to_string(),
        ));
        files.push((
            "wit/deps/cro-provider-0.1.0/provider.wit",
            WIT_0_1_0.to_string(),
        ));
        files.push(("fabric_sim.py", FABRIC_SIM.to_string()));
        files
    };
    Ok(match (template, lang) {
        (Template::Fti, Lang::Rust) => vec![
            ("Cargo.toml", fill(CARGO_TOML)),
            ("src/lib.rs", fill(FTI_LIB_RS)),
            ("README.md", fill(FTI_README)),
            (".gitignore", RUST_GITIGNORE.to_string()),
        ],
        (Template::Fti, _) => bail!(
            "--template fti is Rust only (cro's providers/python-example is an FTI provider in Python); use --template rest"
        ),
        (Template::Rest, Lang::Rust) => vec![
            ("Cargo.toml", fill(CARGO_TOML)),
            ("src/lib.rs", fill(REST_LIB_RS)),
            ("README.md", fill(REST_README)),
            (".gitignore", RUST_GITIGNORE.to_string()),
            ("fabric_sim.py", FABRIC_SIM.to_string()),
        ],
        (Template::Rest, Lang::Python) => wit(vec![
            ("app.py", fill(PYTHON_APP)),
            ("README.md", fill(PYTHON_README)),
            (".gitignore", PYTHON_GITIGNORE.to_string()),
        ]),
        (Template::Rest, Lang::Javascript) => wit(vec![
            ("provider.js", fill(JS_PROVIDER)),
            ("build.mjs", fill(JS_BUILD)),
            ("package.json", fill(JS_PACKAGE)),
            ("README.md", fill(JS_README)),
            (".gitignore", JS_GITIGNORE.to_string()),
        ]),
    })
}

/// What to run next, for the scaffold's language.
fn next_steps(args: &NewArgs, dir: &Path) -> String {
    let d = dir.display();
    let crate_name = args.name.replace('-', "_");
    let sim = "python3 fabric_sim.py --port 9471 &";
    let fabric_sim = "--fabric-sim http://127.0.0.1:9471/sim/";
    match (args.template, args.lang) {
        (Template::Fti, _) => format!(
            "build:  (cd {d} && cargo build --target wasm32-wasip2 --profile component)\ntest:   cro provider test {d}/target/wasm32-wasip2/component/{crate_name}.wasm"
        ),
        (_, Lang::Rust) => format!(
            "build:  (cd {d} && cargo build --target wasm32-wasip2 --profile component)\ntest:   (cd {d} && {sim} cro provider test target/wasm32-wasip2/component/{crate_name}.wasm {fabric_sim})"
        ),
        (_, Lang::Python) => format!(
            "build:  see {d}/README.md (componentize-py)\ntest:   (cd {d} && {sim} cro provider test {crate_name}.wasm {fabric_sim})"
        ),
        (_, Lang::Javascript) => format!(
            "build:  (cd {d} && npm install && node build.mjs)\ntest:   (cd {d} && {sim} cro provider test {crate_name}.wasm {fabric_sim})"
        ),
    }
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
    let sdk = match (args.lang, &args.sdk_path) {
        (Lang::Rust, Some(p)) => sdk_dir(p)?,
        (Lang::Rust, None) => sdk_dir(Path::new(BUILT_SDK))?,
        (_, Some(_)) => bail!("--sdk-path is for Rust providers"),
        (_, None) => PathBuf::new(),
    };
    for (path, text) in render(&args.name, &args.vendor, &sdk, args.template, args.lang)? {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    println!(
        "created provider {} in {}\n{}",
        args.name,
        dir.display(),
        next_steps(args, &dir)
    );
    Ok(ExitCode::SUCCESS)
}

/// The SDK's directory, checked.
fn sdk_dir(sdk: &Path) -> anyhow::Result<PathBuf> {
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("the SDK at {} (pass --sdk-path)", sdk.display()))?;
    if !sdk.join("Cargo.toml").is_file() {
        bail!(
            "{} holds no Cargo.toml: pass --sdk-path <cro checkout>/providers/sdk",
            sdk.display()
        );
    }
    Ok(sdk)
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
        for (template, lang) in [
            (Template::Rest, Lang::Rust),
            (Template::Fti, Lang::Rust),
            (Template::Rest, Lang::Python),
            (Template::Rest, Lang::Javascript),
        ] {
            let files = render(
                "acme-gpu",
                "Acme \"Inc\"",
                Path::new("/sdk"),
                template,
                lang,
            );
            for (path, text) in files.unwrap() {
                assert!(!text.contains("{{"), "{template:?} {lang:?} {path}: {text}");
            }
        }
        assert!(render("a", "A", Path::new("/sdk"), Template::Fti, Lang::Python).is_err());
        let files = render(
            "acme-gpu",
            "Acme",
            Path::new("/sdk"),
            Template::Rest,
            Lang::Rust,
        );
        let files = files.unwrap();
        let lib = &files[1].1;
        assert!(lib.contains("pub struct AcmeGpu<H: Host>"));
        assert!(
            files[0]
                .1
                .contains("cro-provider-sdk = { path = \"/sdk\" }")
        );
    }
}
