//! The loops behind BENCHMARKS.md's instruction counts for `allocate_next` (callgrind counts
//! instructions exactly, unlike time on a shared machine).
//!
//! `allocate_instructions MODE ROUNDS`: ROUNDS × 65,536 operations, where MODE is
//! - `index`: fill 10.0.0.0/8 cut into /24s ROUNDS times, keeping only each `block_index`
//!   (the compiler may skip building the CIDR: the original "61 instructions" program);
//! - `result`: the same, keeping the whole `Result<Allocation, AllocError>` (`black_box`);
//! - `call`: the same through a non-inlined function whose `Result` is kept;
//! - `release`: on a full 10.244.0.0/16 (/24) set, `release(10.244.128.0/24)` then
//!   `allocate_next`, both results kept (W5 as a loop).
//!
//! Per operation = (count at 20 rounds − count at 10 rounds) / 655,360, which cancels start-up:
//!
//! ```sh
//! cargo build --release -p nodeipam-core --example allocate_instructions
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/allocate_instructions call 10
//! ```

use std::hint::black_box;

use nodeipam_core::{AllocError, Allocation, Cidr, CidrSet, storage_words_for};

type Set = CidrSet<Vec<u64>>;

fn set(cluster: &str, node_mask_size: u8) -> Set {
    let cidr: Cidr = cluster.parse().expect("a CIDR");
    let words = storage_words_for(cidr.prefix_len(), node_mask_size);
    CidrSet::new(cidr, node_mask_size, vec![0; words]).expect("a valid set")
}

#[inline(never)]
fn allocate(set: &mut Set) -> Result<Allocation, AllocError> {
    set.allocate_next()
}

/// Fills a 65,536-block set `rounds` times; `keep` decides what of each allocation is used.
fn fill(rounds: u32, mut keep: impl FnMut(&mut Set) -> u64) -> u64 {
    let mut kept = 0;
    for _ in 0..rounds {
        let mut s = set("10.0.0.0/8", 24);
        for _ in 0..65_536 {
            kept += keep(&mut s);
        }
    }
    kept
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "index".into());
    let rounds: u32 = args
        .next()
        .map_or(10, |n| n.parse().expect("ROUNDS is a number"));
    let kept = match mode.as_str() {
        "index" => fill(rounds, |s| {
            u64::from(black_box(s.allocate_next().map_or(0, |a| a.block_index)))
        }),
        "result" => fill(rounds, |s| u64::from(black_box(s.allocate_next()).is_ok())),
        "call" => fill(rounds, |s| u64::from(black_box(allocate(s)).is_ok())),
        "release" => {
            let mut s = set("10.244.0.0/16", 24);
            while s.allocate_next().is_ok() {}
            let block: Cidr = "10.244.128.0/24".parse().expect("a CIDR");
            let mut kept = 0u64;
            for _ in 0..rounds * 65_536 {
                kept += u64::from(black_box(s.release(black_box(block))).is_ok());
                kept += u64::from(black_box(s.allocate_next()).is_ok());
            }
            kept
        }
        other => panic!("unknown MODE {other:?}: index, result, call or release"),
    };
    println!("{kept}");
}
