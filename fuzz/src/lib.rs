//! The model-checking harness behind the fuzz targets. `core/tests/fuzz_replay.rs` includes the
//! same file (`harness.rs`) with `#[path]`, so the committed corpus is replayed by a plain
//! `cargo test --workspace` on stable.

pub mod harness;
