//! README.md and docs/*.md hold together (issue 34 item 4): every relative link resolves — the
//! file exists and, for a `#fragment` into a Markdown file, a heading of that file has that
//! anchor (GitHub's rule: lower case, punctuation but `-` and `_` dropped, spaces to `-`, `-1`,
//! `-2`… for repeats) — and the README line `.ci/run` runs as the test step (the first line
//! starting with `cargo test` inside a ```` ```sh ```` block) is still there.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::deploy::repo_root;

/// The Markdown files whose links are checked: README.md and every docs/*.md.
fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// GitHub's anchor of a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading anchor of the Markdown `text` (repeats numbered as GitHub numbers them).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let Some(heading) = line.get(hashes..).and_then(|h| h.strip_prefix(' ')) else {
            continue;
        };
        if hashes == 0 || hashes > 6 {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut repeat = 0;
        while seen.contains(&anchor) {
            repeat += 1;
            anchor = format!("{base}-{repeat}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `line` without its inline code spans (a `` `[a](b)` `` is not a link).
fn without_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The link targets of the line: what stands in `](…)`.
fn targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find(')')?;
            let target = &rest[..end];
            (!target.is_empty() && !target.contains(char::is_whitespace)).then(|| target.to_owned())
        })
        .collect()
}

/// The broken relative links of the page `path` whose text is `text`: `file:line: target`.
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().unwrap();
    let mut broken = Vec::new();
    for (number, line) in prose(text) {
        for target in targets(line) {
            let scheme = target
                .split_once(':')
                .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase()));
            if scheme {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                path.to_path_buf()
            } else {
                dir.join(file)
            };
            let place = format!("{}:{number}: {target}", path.display());
            if !resolved.exists() {
                broken.push(format!("{place} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment
                && resolved.extension().is_some_and(|e| e == "md")
            {
                let target_text = if file.is_empty() {
                    text.to_owned()
                } else {
                    std::fs::read_to_string(&resolved).unwrap()
                };
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{place} (no such heading)"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        broken.extend(broken_links(&page, &text));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker itself: a missing file and a missing heading are found, good links are not.
#[test]
fn the_link_checker_finds_a_missing_file_and_a_missing_heading() {
    let readme = repo_root().join("README.md");
    let text = "# Title\n## Serving some Nodes (`--node-selector`)\n\
                [ok](#serving-some-nodes---node-selector) [ok](docs/operations.md) \
                [ok](https://example.invalid/x) `[code](nowhere.md)`\n\
                [gone](docs/no-such-page.md) [wrong](#no-such-heading)\n\
                ```sh\n[fenced](nowhere.md)\n```\n";
    let broken = broken_links(&readme, text);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].ends_with("docs/no-such-page.md (no such file)"),
        "{broken:?}"
    );
    assert!(
        broken[1].ends_with("#no-such-heading (no such heading)"),
        "{broken:?}"
    );
    assert!(anchors("# A\n# A\n").contains("a-1"));
}

/// `.ci/run`'s test step runs the first line starting with `cargo test` inside a ```` ```sh ````
/// block of README.md (its own awk program, checked here to be the rule it still uses): that
/// line exists and is the newcomer's command.
#[test]
fn the_readme_command_ci_runs_is_there() {
    let root = repo_root();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.contains("TEST_LINE=\"$(awk '/^```sh/ { block = 1; next } /^```/ { block = 0; next }")
            && ci.contains("block && /^cargo test/ { print; exit }' README.md)\""),
        ".ci/run reads README differently now: update this test"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut in_sh = false;
    let mut line = None;
    for text in readme.lines() {
        if text.starts_with("```sh") {
            in_sh = true;
        } else if text.starts_with("```") {
            in_sh = false;
        } else if in_sh && text.starts_with("cargo test") {
            line = Some(text);
            break;
        }
    }
    assert_eq!(line, Some("cargo test --workspace"));
}
