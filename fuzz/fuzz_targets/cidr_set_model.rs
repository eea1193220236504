//! Fuzz target `cidr_set_model`: bytes → cluster CIDR and node mask → `CidrSet` operations, each compared with a
//! `BTreeSet<u32>` model plus upstream's round-robin cursor; a failed call must change nothing.
//! See `fuzz/src/harness.rs` for the byte format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodeipam_fuzz::harness::run_cidr_set(data));
