//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests,
//! the invariant checker they end with, a monitor that checks every state in between, and the
//! chaos suite (seeded schedules of churn and faults against the real controller) and the
//! differential against upstream's allocator (kube-controller-manager's cidrset).

pub mod chaos;
pub mod differential;
pub mod invariants;
pub mod monitor;
pub mod sandbox;
