//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests,
//! the invariant checker they end with, a monitor that checks every state in between, the chaos
//! suite (seeded schedules of churn and faults against the real controller), the harness that
//! runs upstream's real etcd and kube-apiserver (`real_apiserver`), the differential against
//! upstream's allocator (kube-controller-manager's cidrset), and a TCP proxy that delivers a
//! client's bytes late (`delay_proxy`, for the real-server runs of issue 30).

pub mod chaos;
pub mod delay_proxy;
pub mod differential;
pub mod invariants;
pub mod monitor;
pub mod real_apiserver;
pub mod sandbox;
