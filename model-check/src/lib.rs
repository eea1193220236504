//! Empty: the model check is this package's test, `tests/model_check.rs` (run it with
//! `cargo test -p nodeipam-model-check`). It is a package of its own so that the workspace's
//! profile override can build it with optimisation inside `cargo test`'s own profile.
