//! Fuzz target `pool_model`: bytes → single- or dual-stack `Pool` → node operations compared with one model per set
//! (`allocate_node` all-or-nothing; a failed call must change nothing).
//! See `fuzz/src/harness.rs` for the byte format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodeipam_fuzz::harness::run_pool(data));
