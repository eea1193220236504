//! `nodeipam`: the Kubernetes node IPAM controller (range allocator, and per-node-pool sizes with
//! `CloudAllocator`) around `nodeipam-core`.
//!
//! - [`flags`]: kube-controller-manager's command line (clap, pflag's syntax, every kcm/ccm flag
//!   and our own in [`flags::kcm::KCM_FLAGS`]);
//! - [`logging`]: `-v` and `--logging-format` onto tracing; [`startup`]: the start-up lines;
//! - [`diagnostics`]: the recommended diagnostics (R05, R08, R10, R11, R13);
//! - [`nodelist`]: streaming NodeList reader;
//! - [`reconcile`]: the pure decision logic (which patch, event, metric for a Node);
//! - [`node_pools`]: per-Node mask sizes from rules and labels (`CloudAllocator`);
//! - [`plan`]: the offline `plan` subcommand;
//! - [`controller`]: the tokio/kube-rs runner, [`controller::run`];
//! - [`serving`]: the secure port (HTTPS, delegated authentication and authorization).

pub mod build_info;
pub mod compact;
pub mod controller;
pub mod diagnostics;
pub mod error;
pub mod flags;
pub mod logging;
pub mod metric_names;
pub mod metrics;
pub mod node_pools;
pub mod node_selector;
pub mod nodelist;
pub mod plan;
pub mod reasons;
pub mod reconcile;
pub mod serving;
pub mod startup;
#[cfg(test)]
mod test_support;

pub use error::Error;
