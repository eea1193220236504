//! Fuzz target `pool_ranges`: overlapping pools allocating through `PoolRange`s of one shared set,
//! against a model; then re-gridding. See `fuzz/src/harness/ranges.rs` for the byte format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodeipam_fuzz::harness::run_pool_ranges(data));
