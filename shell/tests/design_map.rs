//! docs/DESIGN.md's module map is what `.ci/import-circles --edges` prints for `shell/src`
//! (issue 32 item 5): every module's arrows, no more, no fewer.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The map's lines `module ──► a, b, …` (continued on indented lines), `main.rs` left out.
fn design_map() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("docs/DESIGN.md")).expect("DESIGN.md");
    let start = text.find("**Module map**").expect("the module map");
    let block = text[start..].split("```").nth(1).expect("its code block");
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = None;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (module, targets) = match line.split_once('►') {
            Some((left, right)) => {
                let module = left.trim_end_matches(['─', ' ']).trim().to_owned();
                current = Some(module.clone());
                (module, right)
            }
            None => (current.clone().expect("a continued line"), line),
        };
        if module == "main.rs" {
            continue;
        }
        let entry = map.entry(module).or_default();
        if !targets.contains("(nothing of ours)") {
            entry.extend(
                targets
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    map
}

#[test]
fn the_design_module_map_is_the_import_graph() {
    let out = Command::new("python3")
        .arg(root().join(".ci/import-circles"))
        .arg("--edges")
        .current_dir(root())
        .output()
        .expect("python3 runs .ci/import-circles");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some((module, targets)) = line
            .strip_prefix("shell: ")
            .and_then(|l| l.split_once(" → "))
        {
            edges.insert(
                module.to_owned(),
                targets.split(", ").map(str::to_owned).collect(),
            );
        }
    }
    let map = design_map();
    for (module, targets) in &edges {
        assert_eq!(
            map.get(module),
            Some(targets),
            "DESIGN.md's module map for {module}"
        );
    }
    for (module, targets) in &map {
        if !edges.contains_key(module) {
            assert!(
                targets.is_empty(),
                "DESIGN.md gives {module} arrows the code does not have: {targets:?}"
            );
        }
    }
    let modules: BTreeSet<String> = std::fs::read_dir(root().join("shell/src"))
        .expect("shell/src")
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            // `x.rs`, or a folder `x/` with `mod.rs`.
            let module = match name.strip_suffix(".rs") {
                Some(module) => module.to_owned(),
                None if e.path().join("mod.rs").exists() => name,
                None => return None,
            };
            (!matches!(module.as_str(), "lib" | "main" | "test_support")).then_some(module)
        })
        .collect();
    let drawn: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(drawn, modules, "every module of shell/src is on the map");
}
