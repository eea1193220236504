//! Replays the committed fuzz seed corpus (`fuzz/corpus/<target>/*`) through the same
//! model-checking harness the cargo-fuzz targets use, so `cargo test --workspace` on stable checks
//! every seed without libFuzzer. Also runs a short deterministic pseudo-random sweep per target.
//!
//! The harness uses `std`; it is compiled only into this test binary, never into the `no_std`
//! library.

#[path = "../../fuzz/src/harness/mod.rs"]
#[allow(dead_code)]
mod harness;

use std::fs;
use std::path::{Path, PathBuf};

/// A harness entry point: bytes in, a panic on any disagreement.
type Target = fn(&[u8]);

/// Each fuzz target, its corpus folder name and the harness entry point.
const TARGETS: [(&str, Target); 5] = [
    ("cidr_set_model", harness::run_cidr_set),
    ("pool_model", harness::run_pool),
    ("pool_ranges", harness::run_pool_ranges),
    ("cidr_parse", harness::run_cidr_parse),
    ("pool_order", harness::run_pool_order),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// The seed files of one target, sorted (hidden files and folders skipped).
fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir(target);
    let entries = fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("cannot read corpus {}: {error}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.is_file()
                && !path
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    files
}

fn replay(target: &str, run: Target) {
    let files = seeds(target);
    assert!(
        files.len() >= 3,
        "corpus for {target} has {} seeds; expected a handful",
        files.len()
    );
    for path in files {
        let data = fs::read(&path)
            .unwrap_or_else(|error| panic!("cannot read seed {}: {error}", path.display()));
        eprintln!("replaying {}", path.display());
        run(&data);
    }
}

#[test]
fn corpus_cidr_set_model() {
    replay(TARGETS[0].0, TARGETS[0].1);
}

#[test]
fn corpus_pool_model() {
    replay(TARGETS[1].0, TARGETS[1].1);
}

#[test]
fn corpus_pool_ranges() {
    replay(TARGETS[2].0, TARGETS[2].1);
}

#[test]
fn corpus_cidr_parse() {
    replay(TARGETS[3].0, TARGETS[3].1);
}

#[test]
fn corpus_pool_order() {
    replay(TARGETS[4].0, TARGETS[4].1);
}

/// SplitMix64, as in BENCHMARKS.md.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Characters CIDR and flag text is made of, for the parser's pseudo-random inputs.
const TEXT_ALPHABET: &[u8] = b"0123456789abcdefABCDEF:./,\n %+-x";

/// A few hundred pseudo-random inputs per target (fixed seed): beyond the corpus, on stable.
/// Binary inputs for the model targets, text from `TEXT_ALPHABET` for the parser.
#[test]
fn pseudo_random_inputs() {
    let mut rng = SplitMix64(0x6e6f_6465_6970_616d);
    for (target, run) in TARGETS {
        for case in 0..300 {
            let len = (rng.next() % 160) as usize;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    let byte = rng.next();
                    if target == "cidr_parse" {
                        TEXT_ALPHABET[(byte % TEXT_ALPHABET.len() as u64) as usize]
                    } else {
                        byte as u8
                    }
                })
                .collect();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "{target} case {case} failed; reproduce with input {data:02x?}"
            );
        }
    }
}
