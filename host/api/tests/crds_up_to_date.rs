//! The YAML committed in `crds/` must be exactly what the types generate.

use std::collections::BTreeSet;
use std::path::Path;

const CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds");

#[test]
fn committed_crds_match_the_types() {
    let dir = &Path::new(CRD_DIR).canonicalize().unwrap();
    let generated = cro_api::crd_files().unwrap();
    let regenerate = cro_api::REGENERATE_COMMAND;
    for file in &generated {
        let path = dir.join(&file.file_name);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} cannot be read ({e}); run `{regenerate}`",
                path.display()
            )
        });
        if committed != file.yaml {
            let (line, (old, new)) = committed
                .lines()
                .chain(std::iter::repeat("<end of file>"))
                .zip(file.yaml.lines().chain(std::iter::repeat("<end of file>")))
                .enumerate()
                .find(|(_, (old, new))| old != new)
                .expect("contents differ, so some line differs");
            panic!(
                "{} is out of date; run `{regenerate}`.\nfirst difference at line {}:\n  committed: {old}\n  generated: {new}",
                path.display(),
                line + 1
            );
        }
    }

    let expected: BTreeSet<_> = generated.iter().map(|f| f.file_name.clone()).collect();
    let present: BTreeSet<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .collect();
    let stale: Vec<_> = present.difference(&expected).collect();
    assert!(
        stale.is_empty(),
        "crds/ holds files the types do not generate: {stale:?}; delete them and run `{regenerate}`"
    );
}
