//! `nodeipam`: the Kubernetes node IPAM controller (range allocator, and per-node-pool sizes with
//! `CloudAllocator`) around `nodeipam-core`.
//!
//! - [`flags`]: kube-controller-manager's command line (clap, pflag's syntax, every kcm/ccm flag
//!   and our own in [`flags::kcm::KCM_FLAGS`], the secure-serving flags in [`flags::serving`]);
//! - [`logging`]: `-v` and `--logging-format` onto tracing; [`startup`]: the start-up lines;
//! - [`reconcile`]: the pure decision logic (which patch, event, metric for a Node), with
//!   [`diagnostics`] (the recommended diagnostics R05, R08, R10, R11, R13) as its child;
//! - [`cluster_cidr`]: ClusterCIDR objects (`nodeipam.io/v1alpha1`): what one says, the Nodes
//!   it serves, the order a Node's pools are tried, its status; the allocator hosts them
//!   ([`reconcile`]), the controller watches and finalizes them ([`controller::cluster_cidrs`]);
//! - [`nodelist`]: streaming NodeList reader; [`compact`]: a Node's uid and podCIDRs without a
//!   heap allocation;
//! - [`labels`]: label key and value validation, the `--node-selector` string form, and every
//!   label matcher (kube-rs expressions);
//! - [`node_pools`]: per-Node mask sizes from rules and labels (`CloudAllocator`);
//! - [`plan`]: the offline `plan` subcommand;
//! - [`client`]: the Kubernetes client configuration from the flags; [`kube_error`]: reading the
//!   client's errors; [`health`]: health, readiness and the `/metrics` router; [`http_server`]:
//!   the accept loop of every port, with its connection bounds;
//! - [`leader`]: leader election over a Lease and the write intents (each Node write's intent
//!   in the Lease before it is sent);
//! - [`malloc`]: glibc malloc's mmap threshold, fixed (peak RSS at scale); [`open_files`]: the
//!   soft open-file limit raised to the hard one at start;
//! - [`controller`]: the tokio/kube-rs runner, [`controller::run`];
//! - [`serving`]: the secure port (HTTPS, delegated authentication and authorization);
//! - [`metrics`] and [`metric_names`]: the exported metrics; [`reasons`]: event reasons;
//!   [`error`]: the error type; [`build_info`]: what `--version` prints.
//!
//! Each module imports only modules it does not share a circle with (`.ci/import-circles`).

pub mod build_info;
pub mod client;
pub mod cluster_cidr;
pub mod compact;
pub mod controller;
pub mod error;
pub mod flags;
pub mod health;
pub mod http_server;
pub mod kube_error;
pub mod labels;
pub mod leader;
pub mod logging;
pub mod malloc;
pub mod metric_names;
pub mod metrics;
pub mod node_pools;
pub mod nodelist;
pub mod open_files;
pub mod plan;
pub mod reasons;
pub mod reconcile;
pub mod serving;
pub mod startup;
#[cfg(test)]
mod test_support;

pub use error::Error;
/// The recommended diagnostics (a child of [`reconcile`]: its findings become the events of the
/// decisions; also read by `plan` and the start-up lines).
pub use reconcile::diagnostics;
