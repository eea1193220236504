//! Fuzz target `pool_order`: bytes → a `Pool` of several cluster CIDRs per family → allocations
//! and releases checked against the order rule (issue 18 §1; see `fuzz/src/harness/order.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodeipam_fuzz::harness::run_pool_order(data));
