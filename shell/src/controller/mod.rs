//! The controller: list+watch Nodes, occupy what exists, then allocate through a de-duplicated
//! work queue, one Node name at a time; PATCH through a token bucket; leader election; graceful
//! shutdown.
//!
//! Tests drive it in-process:
//!
//! ```no_run
//! # async fn demo() -> Result<(), nodeipam::Error> {
//! use nodeipam::controller::{ControllerConfig, client_for_url, run};
//! let ipam = nodeipam_core::config::validate("10.244.0.0/16", "", Default::default())
//!     .map_err(nodeipam::Error::Config)?;
//! let config = ControllerConfig::new(ipam);
//! let health = config.health.clone(); // readiness + pool usage, shared
//! let client = client_for_url("http://127.0.0.1:6443")?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let task = tokio::spawn(run(config, client, async move { let _ = stopped.await; }));
//! // … wait for health.is_ready(), create/delete Nodes, check invariants …
//! let _ = stop.send(());
//! let summary = task.await.expect("joined")?;
//! # let _ = (health, summary);
//! # Ok(()) }
//! ```

mod backoff;
mod health;
mod limiter;
mod queue;
mod worker;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube_lease_manager::LeaseManagerBuilder;
use nodeipam_core::{Cidr, IpamConfig};
use tokio::sync::watch;

pub use health::{Health, router as health_router, serve as serve_health};
pub use limiter::WriteLimiter;
pub use queue::{QUEUE_CAPACITY, WorkQueue};

use crate::Error;
use crate::flags::ControllerFlags;
use crate::reconcile::PoolStats;

/// Name of the controller (events' `reportingController`, field manager).
pub const CONTROLLER_NAME: &str = "nodeipam-controller";

/// Leader-election settings (`--leader-elect-*`).
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This instance's identity (`holderIdentity`).
    pub identity: String,
    /// Lease duration (whole seconds are used; at least 1 s).
    pub lease_duration: Duration,
    /// Renew deadline: the leader renews `lease_duration − renew_deadline` before expiry.
    pub renew_deadline: Duration,
}

/// Everything [`run`] needs besides the client and the shutdown signal.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Validated cluster/service CIDRs and mask sizes.
    pub ipam: IpamConfig,
    /// Writes per second (token bucket refill).
    pub kube_api_qps: f64,
    /// Token bucket size.
    pub kube_api_burst: u32,
    /// `Some` to allocate only while holding the Lease.
    pub leader_election: Option<LeaderElection>,
    /// Readiness and pool usage, shared with the probe server (and tests).
    pub health: Health,
    /// Events' `reportingInstance` (e.g. the pod name).
    pub instance: Option<String>,
    /// How long one PATCH may take before the Node is re-read (default 10 s).
    pub request_timeout: Duration,
    /// First retry delay after a failure or an exhausted pool (default 250 ms).
    pub retry_min_delay: Duration,
    /// Retry delay cap (default 30 s).
    pub retry_max_delay: Duration,
}

impl ControllerConfig {
    /// Defaults: 20 qps, burst 30, no leader election, 10 s request timeout, retries 250 ms→30 s.
    pub fn new(ipam: IpamConfig) -> ControllerConfig {
        ControllerConfig {
            ipam,
            kube_api_qps: 20.0,
            kube_api_burst: 30,
            leader_election: None,
            health: Health::new(),
            instance: None,
            request_timeout: Duration::from_secs(10),
            retry_min_delay: Duration::from_millis(250),
            retry_max_delay: Duration::from_secs(30),
        }
    }

    /// From the validated IPAM config and the controller flags.
    pub fn from_flags(ipam: IpamConfig, flags: &ControllerFlags) -> ControllerConfig {
        let identity = instance_identity();
        let mut config = ControllerConfig::new(ipam);
        config.kube_api_qps = flags.kube_api_qps;
        config.kube_api_burst = flags.kube_api_burst;
        config.instance = Some(identity.clone());
        if flags.leader_elect {
            config.leader_election = Some(LeaderElection {
                namespace: flags.leader_elect_resource_namespace.clone(),
                name: flags.leader_elect_resource_name.clone(),
                identity,
                lease_duration: flags.leader_elect_lease_duration,
                renew_deadline: flags.leader_elect_renew_deadline,
            });
        }
        config
    }
}

/// `$POD_NAME`, else `$HOSTNAME`, else `nodeipam`, plus `_` and the process id.
fn instance_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "nodeipam".to_owned());
    format!("{host}_{}", std::process::id())
}

/// What a clean [`run`] leaves behind: the pool and who holds what.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Per cluster CIDR, flag order.
    pub pools: Vec<PoolStats>,
    /// Node name → CIDRs reserved for it (held, pending, or a skipped Node's reserved part).
    pub held: BTreeMap<String, Vec<Cidr>>,
}

/// A client for an API server URL with no credentials (tests, `kubectl proxy`).
///
/// # Errors
/// [`Error::ClientConfig`] for a bad URL or TLS setup.
pub fn client_for_url(url: &str) -> Result<Client, Error> {
    let uri = url
        .parse()
        .map_err(|e| Error::ClientConfig(format!("{url}: {e}")))?;
    Client::try_from(Config::new(uri)).map_err(|e| Error::ClientConfig(e.to_string()))
}

/// A client from `--kubeconfig`, else in-cluster config or `$KUBECONFIG`/`~/.kube/config`
/// (`Config::infer`); `--master` overrides the server URL (and alone is enough).
///
/// # Errors
/// [`Error::ClientConfig`] naming what failed.
pub async fn client_from_flags(flags: &ControllerFlags) -> Result<Client, Error> {
    let mut config = match (&flags.kubeconfig, &flags.master) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                Error::ClientConfig(format!("--kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::ClientConfig(format!("--kubeconfig {}: {e}", path.display())))?
        }
        (None, Some(master)) => match Config::infer().await {
            Ok(config) => config,
            Err(_) => Config::new(
                master
                    .parse()
                    .map_err(|e| Error::ClientConfig(format!("--master {master}: {e}")))?,
            ),
        },
        (None, None) => Config::infer()
            .await
            .map_err(|e| Error::ClientConfig(e.to_string()))?,
    };
    if let Some(master) = &flags.master {
        config.cluster_url = master
            .parse()
            .map_err(|e| Error::ClientConfig(format!("--master {master}: {e}")))?;
    }
    Client::try_from(config).map_err(|e| Error::ClientConfig(e.to_string()))
}

/// Runs the controller until `shutdown` resolves: (with leader election, wait for the Lease) →
/// list all Nodes → occupy every existing podCIDR → allocate for Nodes without podCIDRs, watching
/// for changes. On shutdown: stop taking work, finish the in-flight PATCH, release the Lease,
/// return the final state.
///
/// # Errors
/// [`Error::Pool`] if a service CIDR fills a cluster CIDR; [`Error::LeaderElection`] if the Lease
/// cannot be managed; [`Error::LeadershipLost`] if this instance was leading and lost the Lease
/// (the caller should exit non-zero, as kube-controller-manager does).
pub async fn run(
    config: ControllerConfig,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunSummary, Error> {
    // Fail fast on a configuration error, before taking a Lease.
    crate::reconcile::Allocator::new(&config.ipam).map_err(Error::Pool)?;
    let health = config.health.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    let shutdown = shutdown.shared();
    {
        let shutdown = shutdown.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
    }
    let Some(election) = config.leader_election.clone() else {
        health.set_leading(true);
        let summary = worker::pipeline(config, client, stop_rx).await;
        health.set_ready(false);
        return summary;
    };

    let manager = LeaseManagerBuilder::new(client.clone(), &election.name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_field_manager(CONTROLLER_NAME)
        .with_duration(election.lease_duration.as_secs().max(1))
        .with_grace(
            election
                .lease_duration
                .saturating_sub(election.renew_deadline)
                .as_secs()
                .max(1),
        )
        .build()
        .await?;
    let (mut leading, lease_task) = manager.watch().await;
    // Standing by cleanly counts as ready.
    health.set_ready(true);
    let mut stop_wait = stop_rx.clone();
    loop {
        let is_leader = *leading.borrow_and_update();
        if is_leader {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    health.set_ready(false);
                    return match lease_task.await {
                        Ok(Err(e)) => Err(Error::LeaderElection(e)),
                        _ => Err(Error::LeadershipLost),
                    };
                }
            }
            () = stopped(&mut stop_wait) => {
                drop(leading);
                let _ = lease_task.await;
                health.set_ready(false);
                return Ok(RunSummary::default());
            }
        }
    }
    tracing::info!(lease = %election.name, identity = %election.identity, "acquired the Lease; allocating");
    health.set_ready(false);
    health.set_leading(true);
    // Stop the pipeline when leadership is lost, too.
    let (lost_tx, lost_rx) = watch::channel(false);
    let mut leading_watch = leading.clone();
    let stop_on_loss = {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            // Lost (false), or the lease task ended (channel closed): stop either way.
            let _ = leading_watch.wait_for(|leader| !*leader).await.map(|_| ());
            let _ = lost_tx.send(true);
            let _ = stop_tx.send(true);
        })
    };
    let summary = worker::pipeline(config, client, stop_rx).await;
    stop_on_loss.abort();
    health.set_leading(false);
    health.set_ready(false);
    let lost = lost_rx.borrow().to_owned();
    // Closing the channel makes the lease task release the Lease and exit.
    drop(leading);
    match lease_task.await {
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the Lease failed"),
        Err(e) => tracing::warn!(error = %e, "lease task failed"),
        Ok(Ok(_)) => tracing::info!("released the Lease"),
    }
    if lost {
        return Err(Error::LeadershipLost);
    }
    summary
}

/// Resolves once `stop` is true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}
