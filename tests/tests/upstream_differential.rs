//! The differential against upstream's cidrset: kube-controller-manager's own allocator (the Go
//! driver `tests/upstream/cmd/cidrset-driver`, at the pinned release) and `nodeipam-core` answer
//! the same seeded sequences; any difference that no row of
//! `nodeipam_tests::differential::INTENDED` explains fails the test with the shrunk sequence.
//!
//! Needs `$NODEIPAM_UPSTREAM_BIN/cidrset-driver` and fails (never skips) without it. It is not
//! part of `cargo test --workspace` (`test = false` in tests/Cargo.toml); run it by name:
//!
//! ```sh
//! export NODEIPAM_UPSTREAM_BIN="$(tests/upstream/build.sh | tail -n 1)"
//! cargo test -p nodeipam-tests --test upstream_differential
//! # the long run (20,000 sequences, over 5 M requests; NODEIPAM_DIFF_SEEDS to change):
//! cargo test --release -p nodeipam-tests --test upstream_differential -- --ignored --nocapture
//! ```

use std::collections::BTreeMap;
use std::time::Instant;

use nodeipam_tests::differential::compare::Transcript;
use nodeipam_tests::differential::{
    INTENDED, Op, Outcome, UpstreamDriver, generate, run_and_compare, shrink,
};

/// What a run saw.
#[derive(Debug, Default)]
struct Summary {
    sequences: usize,
    requests: usize,
    compared: usize,
    rows: BTreeMap<&'static str, usize>,
}

/// Runs `seeds` in batches of `batch_size` (one Go process each); on an unexplained difference,
/// shrinks the sequence and panics with it.
fn run_seeds(seeds: std::ops::Range<u64>, batch_size: usize) -> Summary {
    let upstream = match UpstreamDriver::from_env() {
        Ok(driver) => driver,
        Err(error) => panic!("upstream's cidrset driver is needed: {error}"),
    };
    let mut summary = Summary::default();
    let seeds: Vec<u64> = seeds.collect();
    for chunk in seeds.chunks(batch_size) {
        let batch: Vec<Vec<Op>> = chunk.iter().map(|&seed| generate(seed)).collect();
        let outcomes = match run_and_compare(&upstream, &batch) {
            Ok(outcomes) => outcomes,
            Err(error) => panic!("seeds {}..={}: {error}", chunk[0], chunk[chunk.len() - 1]),
        };
        for ((seed, ops), outcome) in chunk.iter().zip(&batch).zip(outcomes) {
            summary.sequences += 1;
            summary.requests += ops.len();
            match outcome {
                Outcome::Same { rows, compared } => {
                    summary.compared += compared;
                    for (_, name) in rows {
                        *summary.rows.entry(name).or_default() += 1;
                    }
                }
                Outcome::Diverged { index } => {
                    let small = shrink(ops, |batch| upstream.run_batch(batch))
                        .unwrap_or_else(|error| panic!("seed {seed}: shrinking: {error}"));
                    let theirs = upstream
                        .run_batch(std::slice::from_ref(&small))
                        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
                    panic!(
                        "seed {seed}: upstream's cidrset and nodeipam-core differ at request \
                         {index} of {}, and no row of the intended-divergence table explains it.\n\
                         Shrunk to {} requests (replay: save the requests and pipe them into \
                         $NODEIPAM_UPSTREAM_BIN/cidrset-driver and nodeipam-cidrset-driver):\n{}",
                        ops.len(),
                        small.len(),
                        Transcript {
                            ops: &small,
                            upstream: &theirs[0],
                        }
                    );
                }
            }
        }
    }
    summary
}

#[test]
fn upstream_and_core_agree_on_300_sequences() {
    let summary = run_seeds(0..300, 100);
    println!("{summary:#?}");
    assert_eq!(summary.sequences, 300);
    assert!(summary.requests > 300 * 200, "{summary:?}");
    // The seeds reach every intended divergence, so each row is shown to be still needed.
    for row in INTENDED {
        assert!(
            summary.rows.contains_key(row.name),
            "row {} was never met in seeds 0..300: {summary:?}",
            row.name
        );
    }
}

/// The long run whose figure RELIABILITY.md reports. `NODEIPAM_DIFF_SEEDS` (default 20,000)
/// sequences from seed `NODEIPAM_DIFF_FIRST_SEED` (default 0), 500 per Go process.
#[test]
#[ignore = "long: over 5 M requests; run with --release --ignored"]
fn upstream_and_core_agree_on_20000_sequences() {
    let count: u64 = std::env::var("NODEIPAM_DIFF_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let first: u64 = std::env::var("NODEIPAM_DIFF_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let start = Instant::now();
    let summary = run_seeds(first..first + count, 500);
    println!(
        "seeds {first}..{}: {} sequences, {} requests ({} compared), rows met {:?}, in {:.0?}",
        first + count,
        summary.sequences,
        summary.requests,
        summary.compared,
        summary.rows,
        start.elapsed()
    );
    if count >= 20_000 {
        assert!(summary.requests >= 5_000_000, "{summary:?}");
    }
}

/// RELIABILITY.md mirrors the table: every row's name is there.
#[test]
fn every_intended_divergence_is_in_reliability_md() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../RELIABILITY.md");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for row in INTENDED {
        assert!(
            text.contains(&format!("`{}`", row.name)),
            "RELIABILITY.md does not list the intended divergence `{}`",
            row.name
        );
    }
}
