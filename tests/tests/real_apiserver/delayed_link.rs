//! Issue 30 (3): writes delivered late on the real stack. Two replicas with leader election on
//! one Lease; the leader's requests reach etcd through a [`DelayProxy`] that delivers them `D`
//! seconds late (a slow link, or a partition that heals and lets TCP deliver what it buffered),
//! on one of two links:
//!
//! - [`Link::Controller`]: leader → kube-apiserver (the standby talks to the same kube-apiserver
//!   directly);
//! - [`Link::Etcd`]: an HA control plane, two kube-apiservers on one etcd; the leader talks to
//!   the second one, which reaches etcd through the proxy; the standby (and the test) talk to
//!   the first, which reaches etcd directly.
//!
//! A run ([`run`]): the leader (`replica-a`) is elected with no delay and the standby
//! (`replica-b`) stands by; then the delay is set and Nodes are created, in reverse name order
//! (the leader's queue follows the watch, i.e. creation order; a new leader's follows its list,
//! i.e. name order — so the two hand blocks out in different orders, as after any churn). The
//! leader PATCHes while its renewals are late; the standby takes the Lease when it expires and
//! serves its backlog. Both replicas run at `--kube-api-qps=5 --kube-api-burst=10` so that the
//! new leader's backlog outlasts `D` with a few hundred Nodes (at the default 20/30 it takes four
//! times as many). The end: the delay is set back to 0, the proxy's queue has drained (every
//! delayed byte delivered), the Nodes have settled (all served, or no podCIDR changed for
//! [`QUIET`]); then every Node's podCIDRs are compared with every other Node's as blocks
//! (overlap test, `invariants::overlapping_pod_cidrs`).
//!
//! A duplicate arises when a late PATCH of the old leader lands on a Node the new leader has not
//! served yet, after the new leader gave the same block to another Node: PATCH, Lease and their
//! preconditions all commit at the server, so only a fence the server checks can refuse it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use nodeipam::controller::ControllerConfig;
use nodeipam::leader::LeaseConfig;
use nodeipam_tests::delay_proxy::DelayProxy;
use nodeipam_tests::invariants::overlapping_pod_cidrs;
use nodeipam_tests::real_apiserver::{ADMIN_TOKEN, ExtraApiServer, RealCluster};
use serde_json::Value;
use tokio::time::Instant;

use super::common::{self, Running, init_tracing, ipam, masks, spawn_with_client};

/// Which link the proxy delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The leader's controller → kube-apiserver.
    Controller,
    /// The leader's kube-apiserver → etcd (two kube-apiservers on one etcd).
    Etcd,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Controller => "controller→kube-apiserver",
            Link::Etcd => "kube-apiserver→etcd",
        }
    }
}

/// Leader election and request timeout of both replicas.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How the results table names them.
    pub name: &'static str,
    /// `--leader-elect-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`.
    pub retry_period: Duration,
    /// The request timeout (`ControllerConfig::request_timeout`).
    pub request_timeout: Duration,
}

/// kube-controller-manager's defaults, which are also ours: 15 s / 10 s / 2 s, 10 s requests.
pub const DEFAULTS: Settings = Settings {
    name: "15 s / 10 s / 2 s, 10 s",
    lease_duration: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
    request_timeout: Duration::from_secs(10),
};

/// Short settings (issue 30's): 4 s / 3 s / 0.5 s, 2.5 s requests.
pub const SHORT: Settings = Settings {
    name: "4 s / 3 s / 0.5 s, 2.5 s",
    lease_duration: Duration::from_secs(4),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_millis(500),
    request_timeout: Duration::from_millis(2500),
};

/// Writes per second and burst of both replicas (`--kube-api-qps`, `--kube-api-burst`).
const QPS: u32 = 5;
const BURST: u32 = 10;

/// How long the Nodes' podCIDRs must stay unchanged to count as settled when some Node is
/// still unserved.
const QUIET: Duration = Duration::from_secs(10);

/// How long a run waits for any one step (start-up, election) before it fails.
const STEP: Duration = Duration::from_secs(90);

/// What one run found.
#[derive(Debug)]
pub struct Outcome {
    /// The link delayed.
    pub link: Link,
    /// The delay.
    pub delay: Duration,
    /// The settings' name.
    pub settings: &'static str,
    /// Nodes created.
    pub nodes: usize,
    /// Nodes with podCIDRs at the end.
    pub served: usize,
    /// Whether the standby took the Lease.
    pub taken_over: bool,
    /// Connections the proxy accepted.
    pub connections: u64,
    /// One line per pair of Nodes whose podCIDRs overlap.
    pub duplicates: Vec<String>,
    /// From the delay being set to the check.
    pub took: Duration,
}

impl Outcome {
    /// One line for the log and RELIABILITY.md.
    pub fn line(&self) -> String {
        format!(
            "delayed link {}: D = {} s, {}: {} Nodes, {} served, take-over: {}, {} proxied \
             connections, {} duplicate pair(s){} ({:.0} s)",
            self.link.name(),
            self.delay.as_secs_f64(),
            self.settings,
            self.nodes,
            self.served,
            if self.taken_over { "yes" } else { "no" },
            self.connections,
            self.duplicates.len(),
            if self.duplicates.is_empty() {
                String::new()
            } else {
                format!(": {}", self.duplicates.join("; "))
            },
            self.took.as_secs_f64(),
        )
    }
}

/// Nodes to create for delay `delay`: the new leader's backlog at `QPS` must outlast the delay
/// (and the take-over) so that late writes find Nodes it has not served yet.
fn node_count(delay: Duration, settings: &Settings) -> usize {
    let seconds = delay.as_secs() + settings.lease_duration.as_secs() + 5;
    usize::try_from(u64::from(BURST) + u64::from(QPS) * seconds).unwrap()
}

/// A replica's configuration: the defaults of `ControllerConfig::new` (as the binary's flags
/// give them) with leader election `settings`, identity `identity`, and `QPS`/`BURST`.
fn replica(identity: &str, settings: &Settings) -> ControllerConfig {
    let mut config = ControllerConfig::new(ipam("10.64.0.0/14", "", masks(None, None, None)));
    config.kube_api_qps = f64::from(QPS);
    config.kube_api_burst = BURST;
    config.request_timeout = settings.request_timeout;
    config.instance = Some(identity.to_owned());
    config.leader_election = Some(LeaseConfig {
        namespace: "kube-system".to_owned(),
        name: "nodeipam-controller".to_owned(),
        identity: identity.to_owned(),
        lease_duration: settings.lease_duration,
        renew_deadline: settings.renew_deadline,
        retry_period: settings.retry_period,
    });
    config
}

/// A client built as `nodeipam-controller --kubeconfig` builds it, for server `url`.
async fn controller_client(cluster: &RealCluster, name: &str, url: &str) -> Client {
    let path = cluster.kubeconfig_for(name, url, ADMIN_TOKEN).unwrap();
    let config = nodeipam::client::config_from_kubeconfig(&path)
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// Polls `check` every 200 ms until it is true; `false` after `bound`.
async fn poll<F, Fut>(bound: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < bound {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Node name → podCIDRs of every Node; `None` if the LIST failed.
async fn pod_cidrs(nodes: &Api<Node>) -> Option<BTreeMap<String, Vec<String>>> {
    let list = nodes.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .map(|n| {
                let cidrs = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.pod_cidrs.clone())
                    .unwrap_or_default();
                (kube::ResourceExt::name_any(n), cidrs)
            })
            .collect(),
    )
}

/// Waits until every Node is served, or no podCIDR has changed for [`QUIET`]; `bound` caps the
/// wait. Returns the last state seen.
async fn settle(nodes: &Api<Node>, bound: Duration) -> BTreeMap<String, Vec<String>> {
    let start = Instant::now();
    let mut last = BTreeMap::new();
    let mut since = Instant::now();
    while start.elapsed() < bound {
        if let Some(now) = pod_cidrs(nodes).await {
            if now.values().all(|c| !c.is_empty()) {
                return now;
            }
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= QUIET {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

/// Creates Nodes `z-000 …` (from a real fixture Node) in reverse name order, 8 at a time.
async fn create_nodes(nodes: &Api<Node>, count: usize) {
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    let bodies: Vec<Value> = (0..count)
        .rev()
        .map(|i| common::node_like(&template, &format!("z-{i:03}")))
        .collect();
    let created = futures::stream::iter(bodies)
        .map(|body| async move {
            let node: Node = serde_json::from_value(body).unwrap();
            nodes.create(&PostParams::default(), &node).await
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for result in created {
        if let Err(e) = result {
            panic!("creating a Node on the undelayed kube-apiserver: {e}");
        }
    }
}

/// One run (see the module documentation).
///
/// # Panics
/// If the control plane does not start, or the replicas are not elected / standing by in time.
pub async fn run(link: Link, delay: Duration, settings: &Settings) -> Outcome {
    init_tracing();
    let cluster = super::start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    // The proxy and, for the etcd link, the leader's own kube-apiserver behind it.
    let (proxy, extra): (DelayProxy, Option<ExtraApiServer>) = match link {
        Link::Controller => {
            let upstream = cluster
                .url()
                .trim_start_matches("https://")
                .parse()
                .unwrap();
            (
                DelayProxy::start(upstream, Duration::ZERO).await.unwrap(),
                None,
            )
        }
        Link::Etcd => {
            let proxy = DelayProxy::start(cluster.etcd_addr().unwrap(), Duration::ZERO)
                .await
                .unwrap();
            let extra = cluster
                .start_extra_apiserver(&format!("http://{}", proxy.addr()))
                .await
                .unwrap_or_else(|e| panic!("the second kube-apiserver did not start: {e}"));
            (proxy, Some(extra))
        }
    };
    let leader_url = match &extra {
        Some(extra) => extra.url().to_owned(),
        None => format!("https://{}", proxy.addr()),
    };
    let a_client = controller_client(&cluster, "replica-a", &leader_url).await;
    let a = spawn_with_client(a_client, replica("replica-a", settings));
    assert!(
        poll(STEP, || async { a.health.is_leading() }).await,
        "replica-a never led"
    );
    let b_client = controller_client(&cluster, "replica-b", cluster.url()).await;
    let b = spawn_with_client(b_client, replica("replica-b", settings));
    assert!(
        poll(STEP, || async {
            b.health.is_ready() && !b.health.is_leading()
        })
        .await,
        "replica-b not standing by"
    );

    let started = Instant::now();
    proxy.set_delay(delay);
    let count = node_count(delay, settings);
    create_nodes(&nodes, count).await;
    // The leader serves (slowly) or loses the Lease and the standby serves its backlog.
    let backlog = Duration::from_secs(u64::try_from(count).unwrap() / u64::from(QPS));
    let bound = 2 * delay + 2 * settings.lease_duration + backlog + STEP;
    settle(&nodes, bound).await;
    // Heal the link; every delayed byte is delivered; the Nodes settle again.
    proxy.set_delay(Duration::ZERO);
    assert!(
        tokio::time::timeout(delay + STEP, proxy.drained())
            .await
            .is_ok(),
        "the proxy's queue did not drain ({} chunks queued)",
        proxy.queued()
    );
    let state = settle(&nodes, backlog + STEP).await;
    let taken_over = b.health.is_leading();
    let outcome = Outcome {
        link,
        delay,
        settings: settings.name,
        nodes: count,
        served: state.values().filter(|c| !c.is_empty()).count(),
        taken_over,
        connections: proxy.accepted(),
        duplicates: overlapping_pod_cidrs(&state),
        took: started.elapsed(),
    };
    stop(a).await;
    stop(b).await;
    eprintln!("{}", outcome.line());
    outcome
}

/// Stops a replica without waiting for its hand-over (the run is over).
async fn stop(replica: Running) {
    replica.abort().await;
}

/// The runs of the long variant, as `(link, delay in seconds, settings)`: both links, delays from
/// 0 to 60 s, the short and the default settings; 22 runs.
pub fn long_runs() -> Vec<(Link, u64, Settings)> {
    let mut runs = Vec::new();
    for link in [Link::Controller, Link::Etcd] {
        for d in [0, 2, 6, 12, 20, 40] {
            runs.push((link, d, SHORT));
        }
        for d in [0, 10, 20, 32, 60] {
            runs.push((link, d, DEFAULTS));
        }
    }
    runs
}

/// The long variant's runs, or the subset named by `NODEIPAM_DELAYED_LINK_RUNS`
/// (`controller/short/6,etcd/default/32,…`).
pub fn selected_runs() -> Vec<(Link, u64, Settings)> {
    let Ok(spec) = std::env::var("NODEIPAM_DELAYED_LINK_RUNS") else {
        return long_runs();
    };
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let parts: Vec<&str> = item.trim().split('/').collect();
            let [link, settings, delay] = parts[..] else {
                panic!("NODEIPAM_DELAYED_LINK_RUNS item {item:?}: want link/settings/seconds");
            };
            let link = match link {
                "controller" => Link::Controller,
                "etcd" => Link::Etcd,
                other => panic!("unknown link {other:?} (controller, etcd)"),
            };
            let settings = match settings {
                "short" => SHORT,
                "default" => DEFAULTS,
                other => panic!("unknown settings {other:?} (short, default)"),
            };
            let delay = delay
                .parse()
                .unwrap_or_else(|e| panic!("delay {delay:?}: {e}"));
            (link, delay, settings)
        })
        .collect()
}

/// CI: the controller → kube-apiserver link delayed by 6 s, short settings; no block on two
/// Nodes. Failed on main before the hand-over fence (RELIABILITY.md, "Late writes on the real
/// stack").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_on_the_controller_link_give_no_block_twice() {
    let outcome = run(Link::Controller, Duration::from_secs(6), &SHORT).await;
    assert!(outcome.duplicates.is_empty(), "{}", outcome.line());
}

/// CI: the leader's kube-apiserver → etcd link delayed by 6 s (two kube-apiservers on one etcd),
/// short settings; no block on two Nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_on_the_etcd_link_give_no_block_twice() {
    let outcome = run(Link::Etcd, Duration::from_secs(6), &SHORT).await;
    assert!(outcome.duplicates.is_empty(), "{}", outcome.line());
}

/// The long variant: [`long_runs`] (22 runs, both links, 0–60 s, short and default settings) or
/// `NODEIPAM_DELAYED_LINK_RUNS`; every run's line is printed, then no run may have a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 20 minutes; run by hand (RELIABILITY.md, \"Late writes on the real stack\")"]
async fn late_writes_on_delayed_links_give_no_block_twice_long() {
    let mut outcomes = Vec::new();
    for (link, delay, settings) in selected_runs() {
        outcomes.push(run(link, Duration::from_secs(delay), &settings).await);
    }
    let with_duplicates: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.duplicates.is_empty())
        .map(Outcome::line)
        .collect();
    eprintln!(
        "{} runs, {} with duplicates, {} duplicate pairs in all",
        outcomes.len(),
        with_duplicates.len(),
        outcomes.iter().map(|o| o.duplicates.len()).sum::<usize>()
    );
    assert!(with_duplicates.is_empty(), "{}", with_duplicates.join("\n"));
}
