//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests,
//! the invariant checker they end with, a monitor that checks every state in between, and the
//! chaos suite (seeded schedules of churn and faults against the real controller).

pub mod chaos;
pub mod invariants;
pub mod monitor;
pub mod sandbox;
