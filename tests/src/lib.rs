//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests,
//! and the invariant checker they end with.

pub mod invariants;
pub mod sandbox;
