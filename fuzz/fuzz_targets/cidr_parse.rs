//! Fuzz target `cidr_parse`: arbitrary text → `Cidr::parse` / `parse_masked` → `Display` into a stack buffer →
//! parse again (must be equal), and `config::validate` on the lines; never a panic.
//! See `fuzz/src/harness.rs` for the byte format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodeipam_fuzz::harness::run_cidr_parse(data));
