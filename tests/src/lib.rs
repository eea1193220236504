//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests,
//! the invariant checker they end with, and a monitor that checks every state in between.

pub mod invariants;
pub mod monitor;
pub mod sandbox;
