//! The end-to-end suite: the real controller (`nodeipam::controller::run`, in-process) against the
//! sandbox API server, the sandbox itself through a real `kube::Client`, and the manifests
//! (`deploy/`, the Helm chart) against the code. One test binary with a module per area (issue
//! 34): each binary links the whole stack, and 27 of them made `cargo test --workspace` slow and
//! outgrew the CI disk once.
//!
//! Run one area with a filter on the module path, e.g.
//! `cargo test -p nodeipam-tests --test e2e handover::` or
//! `cargo test -p nodeipam-tests --test e2e -- rbac:: deploy_manifests::`.
//!
//! Naming (issue 32, item 5): `flag_cidrs*` are the `--cluster-cidr` flag's CIDRs (several per
//! family), `clustercidr_objects*` the `networking.k8s.io` ClusterCIDR objects
//! (`--cidr-allocator-type=MultiCIDRRangeAllocator`).
//!
//! Tests that read the process-wide metrics recorder are not here: they need a process of their
//! own (`tests/tests/metrics/`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../deploy/mod.rs"]
mod deploy;
#[path = "../secure/mod.rs"]
mod secure;

// The controller against the sandbox.
mod diagnostics;
mod faults;
mod fixtures;
mod freed_block;
mod handover;
mod hostile;
mod kill;
mod late_write;
mod lifecycle;
mod throughput;
mod watch_scale;
mod workers;

// Leader election.
mod leader_election;

// Several `--cluster-cidr` flag CIDRs per family (issue 18 §1).
mod flag_cidrs;
mod flag_cidrs_hostile;

// ClusterCIDR objects (issue 18 §2).
mod clustercidr_objects;
mod clustercidr_objects_hostile;

// Node pools and the node selector.
mod node_pools;
mod selector_hostile;

// Secure serving, RBAC, the manifests and the documentation's links (`.ci/run`'s deploy and chart steps run these modules
// by name with NODEIPAM_REQUIRE_KUBECTL / NODEIPAM_MANIFESTS / NODEIPAM_REQUIRE_HELM).
mod deploy_manifests;
mod docs_links;
mod helm_chart;
mod rbac;
mod secure_serving;

// The sandbox API server alone.
mod sandbox_api;
