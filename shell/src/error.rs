//! The shell's error type.

use nodeipam_core::{AllocError, ConfigError};

/// Everything that can stop the controller or `plan`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A node IPAM flag is invalid; the message names the flag.
    #[error("{0}")]
    Config(#[source] ConfigError),
    /// A controller flag is invalid in combination with others (e.g. the leader-election
    /// durations); the message names the flag.
    #[error("{0}")]
    Flag(String),
    /// The pool could not be built from a valid configuration (e.g. a service CIDR fills a
    /// cluster CIDR).
    #[error("--service-cluster-ip-range: {0}")]
    Pool(#[source] AllocError),
    /// A node-pool flag (`--node-cidr-mask-size-rule`, its file, the mask-label flags) is invalid;
    /// the message names the rule or flag.
    #[error("{0}")]
    NodePools(#[source] crate::node_pools::NodePoolError),
    /// The Kubernetes client could not be configured (kubeconfig, in-cluster, `--master`): a
    /// missing or unreadable file, a server URL that is not `http(s)://host[:port]`, …
    #[error("Kubernetes client configuration: {origin}: {message}")]
    ClientConfig {
        /// The flag or file the configuration came from (e.g. `--master`).
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A Kubernetes API request failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The leader-election Lease could not be managed.
    /// (Its message is the [`crate::leader::LeaderError`]'s, which names leader election.)
    #[error(transparent)]
    LeaderElection(crate::leader::LeaderError),
    /// This instance was the leader and lost the Lease (upstream exits then; so do we).
    #[error("leader election: lost the Lease")]
    LeadershipLost,
    /// The `plan` input could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path (`-` for stdin).
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `plan` input is not a NodeList/List of Nodes/Node in JSON.
    #[error("invalid NodeList: {0}")]
    InvalidNodeList(String),
    /// The `plan --cluster-cidrs` file is not a List of ClusterCIDRs or a ClusterCIDR in JSON.
    #[error("invalid --cluster-cidrs file: {0}")]
    InvalidClusterCidrs(String),
    /// A listener (metrics, health) could not be started.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Secure serving (`--secure-port`, `--tls-*`, `--authentication-kubeconfig`, …) could not be
    /// set up; the message names the flag or file.
    #[error("secure serving: {0}")]
    Serving(#[from] crate::serving::ServingError),
    /// The metrics recorder could not be installed (another one already is).
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(String),
    /// `--cidr-allocator-type=MultiCIDRRangeAllocator`, and the API server does not serve
    /// `nodeipam.io/v1alpha1` `clustercidrs` (404): the CRD is not installed.
    #[error(
        "--cidr-allocator-type=MultiCIDRRangeAllocator needs the ClusterCIDR CRD, which the API server does not serve ({message}): install it with `kubectl apply -f deploy/crds/clustercidrs.yaml` (or the chart's clusterCidrs.enabled=true)"
    )]
    ClusterCidrCrdMissing {
        /// The API server's message.
        message: String,
    },
    /// A long-lived task (informer, workers, leader election, probe server) stopped or panicked
    /// while the controller was running: the process exits non-zero rather than live on
    /// half-alive.
    #[error("{task} stopped unexpectedly: {reason}")]
    TaskFailed {
        /// Which task.
        task: &'static str,
        /// What happened (its error, or the panic message).
        reason: String,
    },
}

impl Error {
    /// A bounded, stable label for metrics (`error="…"`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Config(_) | Error::Flag(_) | Error::NodePools(_) => "config",
            Error::Pool(_) => "pool",
            Error::ClientConfig { .. } => "client_config",
            Error::Kube(_) => "kube_api",
            Error::LeaderElection(_) => "leader_election",
            Error::LeadershipLost => "leadership_lost",
            Error::Read { .. } => "read",
            Error::InvalidNodeList(_) => "invalid_node_list",
            Error::InvalidClusterCidrs(_) => "invalid_cluster_cidrs",
            Error::Listen { .. } => "listen",
            Error::Metrics(_) => "metrics",
            Error::Serving(_) => "serving",
            Error::TaskFailed { .. } => "task_failed",
            Error::ClusterCidrCrdMissing { .. } => "cluster_cidr_crd_missing",
        }
    }

    /// The process exit status for this error: 2 for bad flags or input — including a client
    /// configuration that cannot work (kube-controller-manager and `plan` convention) — 1
    /// otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_)
            | Error::Flag(_)
            | Error::Pool(_)
            | Error::NodePools(_)
            | Error::ClientConfig { .. }
            | Error::Read { .. }
            | Error::InvalidNodeList(_)
            | Error::InvalidClusterCidrs(_) => 2,
            Error::Serving(e) => e.exit_code(),
            _ => 1,
        }
    }
}

impl From<crate::client::ClientConfigError> for Error {
    fn from(error: crate::client::ClientConfigError) -> Error {
        Error::ClientConfig {
            origin: error.origin,
            message: error.message,
        }
    }
}

impl Error {
    /// A [`Error::ClientConfig`] from `origin` (a flag or file) and what is wrong with it.
    pub fn client_config(origin: impl Into<String>, message: impl Into<String>) -> Error {
        Error::ClientConfig {
            origin: origin.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::LeaderError;

    /// The leader-election error names leader election once (it printed "leader election: leader
    /// election: lost the Lease …" when both layers added the prefix) and the new holder by name
    /// (not `Some("…")`).
    #[test]
    fn leader_election_errors_name_leader_election_once() {
        let error = Error::LeaderElection(LeaderError::Superseded {
            lease: "kube-system/nodeipam".into(),
            holder: Some("other".into()),
        });
        assert_eq!(
            error.to_string(),
            "leader election: lost the Lease kube-system/nodeipam: it now names \"other\""
        );
        let deleted = Error::LeaderElection(LeaderError::Superseded {
            lease: "kube-system/nodeipam".into(),
            holder: None,
        });
        assert_eq!(
            deleted.to_string(),
            "leader election: lost the Lease kube-system/nodeipam: it now names nobody"
        );
    }
}
