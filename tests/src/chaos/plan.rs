//! A seed → a [`Plan`]: the network, the controller's settings, the initial Nodes and the
//! schedule of [`Step`]s. Everything random is drawn here, from one ChaCha8 stream seeded with the
//! seed number, so a seed always gives the same plan (print it with `{plan}`); the driver draws
//! nothing (except the free blocks a quiescent foreign Node takes, seeded from the seed and the
//! step, see [`Action::QuiesceAndAddForeign`]).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;
use std::time::Duration;

use ipnet::IpNet;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::sandbox::{FaultAction, FaultRule, LateAnswer, Resource, Verb, fixture};

/// The real Node documents the chaos Nodes are made from (`fixtures/nodes/`), with the short
/// name their copies are called by (`aws-17`).
pub const TEMPLATE_FIXTURES: [(&str, &str); 6] = [
    ("05-aws-4nodes-no-podcidr.json", "aws"),
    ("06-kvm-onprem-4nodes-no-podcidr.json", "kvm"),
    ("07-eks-2nodes-no-podcidr.json", "eks"),
    (
        "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
        "ocp-gcp",
    ),
    ("09-openshift-baremetal-2nodes-no-podcidr.json", "ocp-metal"),
    ("10-minikube-single-node-no-podcidr.json", "minikube"),
];

/// One real Node to copy.
#[derive(Debug)]
pub struct Template {
    /// The fixture file it comes from.
    pub fixture: &'static str,
    /// Short name of the fixture (copies are `<short>-<n>`).
    pub short: &'static str,
    /// The Node as the fixture has it.
    pub node: Value,
}

/// Every Node of [`TEMPLATE_FIXTURES`], in file and item order (19 Nodes), read once.
///
/// # Panics
/// If a fixture is missing or not a NodeList (a repository setup error).
pub fn templates() -> &'static [Template] {
    static TEMPLATES: OnceLock<Vec<Template>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let mut all = Vec::new();
        for (file, short) in TEMPLATE_FIXTURES {
            let list = fixture(file);
            let items = list["items"].as_array().cloned().unwrap_or_default();
            assert!(!items.is_empty(), "fixture {file} has no Nodes");
            for node in items {
                all.push(Template {
                    fixture: file,
                    short,
                    node,
                });
            }
        }
        all
    })
}

/// A cluster network the controller is configured with, as flag text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// Short name for the plan's header.
    pub name: &'static str,
    /// `--cluster-cidr`.
    pub cluster_cidrs: &'static str,
    /// `--service-cluster-ip-range`.
    pub service_cidrs: &'static str,
    /// `--node-cidr-mask-size-ipv4` (dual-stack), bits.
    pub mask_ipv4: Option<u8>,
    /// `--node-cidr-mask-size-ipv6` (dual-stack), bits.
    pub mask_ipv6: Option<u8>,
}

/// The networks a seed picks from. Each has about 1,000 node blocks per cluster CIDR (enough for
/// 500 Nodes) except `ipv4-tight` (240 usable blocks: seeds with many Nodes exhaust it, so Nodes
/// wait for a block freed by a deletion). Service CIDRs inside a cluster CIDR reserve blocks the
/// controller must never hand out.
pub const NETWORKS: [Network; 5] = [
    Network {
        name: "ipv4",
        cluster_cidrs: "10.64.0.0/14",
        service_cidrs: "10.67.252.0/22",
        mask_ipv4: None,
        mask_ipv6: None,
    },
    Network {
        name: "ipv4-tight",
        cluster_cidrs: "10.70.0.0/16",
        service_cidrs: "10.70.240.0/20",
        mask_ipv4: None,
        mask_ipv6: None,
    },
    Network {
        name: "dual-stack",
        cluster_cidrs: "10.80.0.0/14,fd00:80::/100",
        service_cidrs: "10.96.0.0/12,fd00:96::/112",
        mask_ipv4: Some(24),
        mask_ipv6: Some(112),
    },
    Network {
        name: "dual-stack-ipv6-first",
        cluster_cidrs: "fd00:90::/104,10.90.0.0/15",
        service_cidrs: "fd00:90::ff:0/112,10.91.255.0/24",
        mask_ipv4: Some(25),
        mask_ipv6: Some(114),
    },
    Network {
        name: "ipv6",
        cluster_cidrs: "fd00:a0::/54",
        service_cidrs: "fd00:a0:0:3ff::/112",
        mask_ipv4: None,
        mask_ipv6: None,
    },
];

impl Network {
    /// The validated configuration (as the binary builds it from these flags).
    ///
    /// # Panics
    /// Never for the [`NETWORKS`] (tested).
    pub fn ipam(&self) -> nodeipam_core::IpamConfig {
        let masks = nodeipam_core::NodeMaskFlags {
            node_cidr_mask_size: None,
            node_cidr_mask_size_ipv4: self.mask_ipv4,
            node_cidr_mask_size_ipv6: self.mask_ipv6,
        };
        match nodeipam_core::config::validate(self.cluster_cidrs, self.service_cidrs, masks) {
            Ok(config) => config,
            Err(e) => panic!("network {}: {e}", self.name),
        }
    }

    /// `(cluster CIDR, node mask size)` per cluster CIDR, flag order, as `ipnet` values.
    pub fn clusters(&self) -> Vec<(IpNet, u8)> {
        self.ipam()
            .cluster_cidrs
            .iter()
            .map(|c| (parse_net(&c.cluster_cidr.to_string()), c.node_mask_size))
            .collect()
    }

    /// The service CIDRs as `ipnet` values.
    pub fn services(&self) -> Vec<IpNet> {
        self.service_cidrs.split(',').map(parse_net).collect()
    }
}

/// One of `choices` (not empty), uniformly.
fn pick<T: Copy>(rng: &mut ChaCha8Rng, choices: &[T]) -> T {
    choices[rng.random_range(0..choices.len())]
}

fn parse_net(text: &str) -> IpNet {
    match text.trim().parse::<IpNet>() {
        Ok(net) => net.trunc(),
        Err(e) => panic!("CIDR {text:?} of a chaos network: {e}"),
    }
}

/// Width of the address family of `net`, bits.
pub fn family_bits(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    }
}

/// Block `index` of `cluster` cut into `/mask` blocks (`None` past the end).
pub fn block(cluster: &IpNet, mask: u8, index: u128) -> Option<IpNet> {
    let bits = family_bits(cluster);
    let count_bits = u32::from(mask.checked_sub(cluster.prefix_len())?);
    if count_bits < 128 && index >= (1u128 << count_bits) {
        return None;
    }
    let shift = u32::from(bits - mask);
    let offset = index.checked_shl(shift)?;
    let base = match cluster.network() {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let address = base.checked_add(offset)?;
    let ip = match cluster {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(address).ok()?)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(address)),
    };
    IpNet::new(ip, mask).ok()
}

/// Number of `/mask` blocks in `cluster` (saturating).
pub fn block_count(cluster: &IpNet, mask: u8) -> u128 {
    let bits = u32::from(mask.saturating_sub(cluster.prefix_len()));
    1u128.checked_shl(bits).unwrap_or(u128::MAX)
}

/// Leader-election timing (kube-controller-manager's `--leader-elect-*`, scaled down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// `--leader-elect-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`.
    pub retry_period: Duration,
}

/// A Node the actor creates (initially or during the run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `metadata.name`.
    pub name: String,
    /// Index into [`templates`].
    pub template: usize,
    /// podCIDRs set by the actor at creation (empty: the controller is to allocate).
    pub pod_cidrs: Vec<String>,
    /// Whether the Node carries a finalizer (a deletion then leaves it terminating).
    pub finalizer: bool,
}

/// Why an actor-created Node has podCIDRs the controller did not give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignKind {
    /// Outside every cluster CIDR: the controller skips the Node (out of range).
    OutOfRange,
    /// Inside a service CIDR that lies in a cluster CIDR: skipped (conflict); the service CIDR's
    /// blocks are reserved, so nothing the controller holds or sends can collide with it.
    InServiceCidr,
}

/// One thing the schedule does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create a Node (no podCIDRs).
    Create(NodeSpec),
    /// Create a Node whose podCIDRs another actor chose, in a range no controller allocation can
    /// reach ([`ForeignKind`]).
    CreateForeign(NodeSpec, ForeignKind),
    /// Delete a Node (one with a finalizer is left terminating).
    Delete(String),
    /// Delete a Node and create one of the same name at once (a new object, a new uid).
    Recreate(NodeSpec),
    /// Set a label (`chaos.nodeipam.test/churn`) on a Node: a MODIFIED event that changes no
    /// podCIDR.
    Label {
        /// The Node.
        name: String,
        /// The label value.
        value: u32,
    },
    /// Refresh a Node's `status.conditions[*].lastHeartbeatTime` through the `status`
    /// subresource, as a kubelet does.
    Heartbeat(String),
    /// Remove a terminating Node's finalizers (it is then gone).
    RemoveFinalizer(String),
    /// Add a fault rule.
    Fault(FaultRule),
    /// End every open watch stream.
    DropWatches,
    /// Forget the change history: the next watch or continue from an older resourceVersion gets
    /// `410 Gone`.
    Compact,
    /// Delay every response by this much (zero: back to normal).
    SetDelay(Duration),
    /// `kill -9` the controller (with leader election: the leader), its futures dropped at once
    /// (in-flight requests cut, no Lease release). With `late_write`, a late-write rule is added
    /// first and the kill waits (at most 2 s) until a PATCH got it, so a write the server may
    /// still apply is in flight at the kill.
    Kill {
        /// The late-write rule to fire first.
        late_write: Option<FaultRule>,
    },
    /// Shut the controller (the leader) down cleanly: in-flight writes finish, the Lease is
    /// released. With `late_write`, a late-write rule is added first and the stop waits (at most
    /// 2 s) until a PATCH got it, so a write answered early (a 504 or a dropped connection) that
    /// the server applies later is in doubt at the stop (issue 15, item 1: the leader released the
    /// Lease at once and the standby gave the block to another Node before the write landed).
    Stop {
        /// The late-write rule to fire first.
        late_write: Option<FaultRule>,
    },
    /// Start controllers until the plan's number of replicas run (a new identity each: a new
    /// pod).
    Start,
    /// Make the leader lose the Lease: fail or hang Lease requests (both replicas see them), so
    /// renewals fail past the renew deadline; the standby takes over once the faults are spent.
    /// With `late_write`, that late-write rule is added first and the Lease faults only once a
    /// PATCH got it (at most 2 s), so an early-answered write the server applies later is in
    /// doubt when the leader loses the Lease.
    LoseLease {
        /// The Lease faults.
        rules: Vec<FaultRule>,
        /// The late-write rule to fire first.
        late_write: Option<FaultRule>,
    },
    /// At a quiescent point — every controller stopped cleanly, no request or late write left in
    /// flight — create `count` Nodes whose podCIDRs another actor chose **inside** the cluster
    /// CIDRs, in blocks free at that moment; then start the controllers again, which must occupy
    /// them (a podCIDR inside a cluster CIDR set by someone else while a controller runs could
    /// collide with a write in flight: two allocators, which no controller can prevent).
    QuiesceAndAddForeign {
        /// Nodes to add.
        count: usize,
        /// First index of their names (`foreign-in-<i>`).
        first: usize,
    },
    /// Wait (at most 2 s) until this rule, added by an earlier step, has fired — a PATCH of a
    /// delivered-late write is on the wire before the next step (a kill, a Lease loss) comes
    /// (`chaos::edges`).
    AwaitFault(FaultRule),
    /// Create a ClusterCIDR (the variant of `chaos::pools`).
    CreateClusterCidr(super::pools::PoolSpec),
    /// Delete a ClusterCIDR (it stays, terminating, while the controller's finalizer holds it).
    DeleteClusterCidr(String),
}

/// A step: wait `gap` after the previous step, then do `action`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Time since the previous step (or the start).
    pub gap: Duration,
    /// What to do.
    pub action: Action,
}

/// Everything a seed runs: drawn by [`Plan::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// Index into [`NETWORKS`].
    pub network: usize,
    /// Controllers running at once: 1 (no leader election; a restart waits for the start-up
    /// write fence) or 2 (leader election on one Lease).
    pub replicas: usize,
    /// `ControllerConfig::request_timeout` (with leader election the controller shortens or
    /// lengthens it to fit the Lease: at least 1 s).
    pub request_timeout: Duration,
    /// First retry delay.
    pub retry_min_delay: Duration,
    /// Retry delay cap.
    pub retry_max_delay: Duration,
    /// Writes per second (token bucket) and burst.
    pub kube_api_qps: f64,
    /// Token bucket size.
    pub kube_api_burst: u32,
    /// Concurrent writes.
    pub workers: usize,
    /// Leader-election timing (used when `replicas` is 2).
    pub lease: LeaseTiming,
    /// Whether the sandbox serves streaming lists (else the informer falls back to a paged LIST).
    pub streaming_list: bool,
    /// Changes the sandbox keeps for watches (a small history makes `410 Gone` happen by itself).
    pub history_limit: usize,
    /// The Nodes the sandbox starts with.
    pub initial: Vec<NodeSpec>,
    /// The schedule.
    pub steps: Vec<Step>,
    /// The ClusterCIDR variant ([`Plan::generate_with_cluster_cidrs`]): the controllers run with
    /// `--cidr-allocator-type=MultiCIDRRangeAllocator` and these ClusterCIDRs exist at the start.
    pub cluster_cidrs: Option<super::pools::PoolPlan>,
}

/// The label the schedule churns.
pub const CHURN_LABEL: &str = "chaos.nodeipam.test/churn";

/// The finalizer some Nodes carry.
pub const FINALIZER: &str = "chaos.nodeipam.test/drain";

/// What the generator knows of the Nodes the actor made (the controller never creates or deletes
/// Nodes, so this is exact).
#[derive(Default)]
pub(super) struct Model {
    /// Names of Nodes that exist and are not terminating, sorted (draws must not depend on
    /// hash order).
    live: BTreeSet<String>,
    /// Live Nodes with a finalizer.
    with_finalizer: BTreeSet<String>,
    /// Terminating Nodes (deleted while holding a finalizer).
    terminating: BTreeSet<String>,
    /// Names ever used (names are never reused except by [`Action::Recreate`]).
    next_index: usize,
    foreign_out_of_range: usize,
    foreign_in_service: usize,
    foreign_in_range: usize,
}

impl Model {
    fn pick_live(&self, rng: &mut ChaCha8Rng) -> Option<String> {
        let names: Vec<&String> = self.live.iter().collect();
        names.choose(rng).map(|n| (*n).clone())
    }

    pub(super) fn new_spec(&mut self, rng: &mut ChaCha8Rng, finalizer_chance: f64) -> NodeSpec {
        let template = rng.random_range(0..templates().len());
        let name = format!("{}-{}", templates()[template].short, self.next_index);
        self.next_index += 1;
        NodeSpec {
            name,
            template,
            pod_cidrs: Vec::new(),
            finalizer: rng.random_bool(finalizer_chance),
        }
    }

    pub(super) fn add(&mut self, spec: &NodeSpec) {
        self.live.insert(spec.name.clone());
        if spec.finalizer {
            self.with_finalizer.insert(spec.name.clone());
        } else {
            self.with_finalizer.remove(&spec.name);
        }
    }

    fn delete(&mut self, name: &str) {
        self.live.remove(name);
        if self.with_finalizer.remove(name) {
            self.terminating.insert(name.to_owned());
        }
    }
}

/// podCIDRs outside every cluster CIDR of `network` for the `index`-th such Node: one per cluster
/// CIDR family, in `192.168.0.0/16` (`/24`s, then `/28`s of `172.16.0.0/12`) and `fd99::/16`.
fn out_of_range_cidrs(network: &Network, index: usize) -> Vec<String> {
    network
        .clusters()
        .iter()
        .map(|(cluster, _)| match cluster {
            IpNet::V4(_) if index < 256 => format!("192.168.{index}.0/24"),
            IpNet::V4(_) => {
                let i = u32::try_from(index).unwrap_or(u32::MAX) << 4;
                format!("{}/28", Ipv4Addr::from(0xac10_0000u32 | (i & 0x000f_fff0)))
            }
            IpNet::V6(_) => {
                let i = u128::try_from(index).unwrap_or(0) & 0xffff;
                format!("{}/64", Ipv6Addr::from(0xfd99u128 << 112 | i << 96))
            }
        })
        .collect()
}

/// podCIDRs inside a service CIDR that lies in a cluster CIDR, for the `index`-th such Node
/// (`None` if the network has no such service CIDR, or it is used up): the `index`-th of its 64
/// sub-blocks (prefix 6 bits longer), one family only.
fn in_service_cidrs(network: &Network, index: usize) -> Option<Vec<String>> {
    let clusters = network.clusters();
    let service = network
        .services()
        .into_iter()
        .find(|s| clusters.iter().any(|(c, _)| c.contains(s)))?;
    let sub = (service.prefix_len() + 6).min(family_bits(&service));
    let net = block(&service, sub, u128::try_from(index).ok()?)?;
    Some(vec![net.to_string()])
}

impl Plan {
    /// The plan of `seed` (see the module doc of [`crate::chaos`] for what is drawn and why).
    pub fn generate(seed: u64) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let network = rng.random_range(0..NETWORKS.len());
        let replicas = if rng.random_bool(0.4) { 2 } else { 1 };
        // Renew deadlines leave room for one slow Lease request (each may take 1 s): a debug
        // build on busy shared cores must not lose the Lease without a fault.
        let lease = match rng.random_range(0..2) {
            0 => LeaseTiming {
                lease_duration: Duration::from_secs(2),
                renew_deadline: Duration::from_millis(1500),
                retry_period: Duration::from_millis(200),
            },
            _ => LeaseTiming {
                lease_duration: Duration::from_secs(3),
                renew_deadline: Duration::from_millis(2000),
                retry_period: Duration::from_millis(300),
            },
        };
        // Slow writes: PATCHes queue at the token bucket (up to workers / qps = 0.6 s) after the
        // write gate let them through — more often with leader election, whose Lease fence a
        // queued write must not outlive.
        let (kube_api_qps, kube_api_burst) =
            if rng.random_bool(if replicas > 1 { 0.35 } else { 0.2 }) {
                (50.0, 5)
            } else {
                (1000.0, 1000)
            };
        let workers = pick(&mut rng, &[1usize, 4, 30, 30, 30]);
        let mut plan = Plan {
            seed,
            network,
            replicas,
            request_timeout: Duration::from_millis(500),
            retry_min_delay: Duration::from_millis(5),
            retry_max_delay: Duration::from_millis(100),
            kube_api_qps,
            kube_api_burst,
            workers,
            lease,
            streaming_list: rng.random_bool(0.7),
            history_limit: if rng.random_bool(0.2) { 300 } else { 5000 },
            initial: Vec::new(),
            steps: Vec::new(),
            cluster_cidrs: None,
        };
        plan.draw_nodes_and_steps(&mut rng);
        plan
    }

    /// The network of this plan.
    pub fn network(&self) -> &'static Network {
        &NETWORKS[self.network]
    }

    /// The longest a write of a controller of this plan may take: its request timeout, as the
    /// Lease adjusts it (`controller::write_timeout`) — with leader election, and without it
    /// too, where the Lease keeps the write intents ([`Plan::fence_lease`]). Only a run with the
    /// intents switched off (`CHAOS_NO_WRITE_INTENTS`) has no Lease without leader election; it
    /// is given this same timeout.
    pub fn effective_request_timeout(&self) -> Duration {
        nodeipam::controller::write_timeout(self.request_timeout, &self.lease_config("x"))
    }

    /// The Lease settings for a replica called `identity`: the leader-election Lease with two
    /// replicas, the fence Lease (`ControllerConfig::fence_lease`, as `from_flags` sets it
    /// without `--leader-elect`) with one.
    fn lease_config(&self, identity: &str) -> nodeipam::leader::LeaseConfig {
        nodeipam::leader::LeaseConfig {
            namespace: "kube-system".to_owned(),
            name: "nodeipam-controller".to_owned(),
            identity: identity.to_owned(),
            lease_duration: self.lease.lease_duration,
            renew_deadline: self.lease.renew_deadline,
            retry_period: self.lease.retry_period,
        }
    }

    /// With one replica: the Lease that keeps its write intents, taken at once at start-up
    /// (`ControllerConfig::fence_lease`; the binary's `--leader-elect=false`). `None` with two.
    pub fn fence_lease(&self, identity: &str) -> Option<nodeipam::leader::LeaseConfig> {
        (self.replicas == 1).then(|| self.lease_config(identity))
    }

    /// The leader-election settings for a replica called `identity` (`None` with one replica).
    pub fn leader_election(&self, identity: &str) -> Option<nodeipam::leader::LeaseConfig> {
        (self.replicas > 1).then(|| self.lease_config(identity))
    }

    /// Nodes created over the whole run (initial ones included; a re-creation counts).
    pub fn nodes_created(&self) -> usize {
        self.initial.len()
            + self
                .steps
                .iter()
                .map(|s| match &s.action {
                    Action::Create(_) | Action::CreateForeign(..) | Action::Recreate(_) => 1,
                    Action::QuiesceAndAddForeign { count, .. } => *count,
                    _ => 0,
                })
                .sum::<usize>()
    }

    fn draw_nodes_and_steps(&mut self, rng: &mut ChaCha8Rng) {
        let network = *self.network();
        let clusters = network.clusters();
        let services = network.services();
        let mut model = Model::default();
        let total = rng.random_range(200..=500usize);
        let initial = rng.random_range(total / 4..=total / 2);
        let finalizer_chance = 0.08;

        // Initial Nodes: some already allocated by an earlier controller (distinct free blocks),
        // a few foreign ones out of range, the rest waiting for podCIDRs.
        let allocated_share = rng.random_range(0.0..0.6);
        let mut taken: Vec<BTreeSet<u128>> = vec![BTreeSet::new(); clusters.len()];
        for _ in 0..initial {
            let mut spec = model.new_spec(rng, finalizer_chance);
            if rng.random_bool(0.02) {
                spec.name = format!("foreign-{}", spec.name);
                spec.pod_cidrs = out_of_range_cidrs(&network, model.foreign_out_of_range);
                model.foreign_out_of_range += 1;
            } else if rng.random_bool(allocated_share) {
                spec.pod_cidrs = clusters
                    .iter()
                    .zip(taken.iter_mut())
                    .filter_map(|((cluster, mask), taken)| {
                        let count = block_count(cluster, *mask);
                        for _ in 0..64 {
                            let index = rng.random_range(0..count);
                            let candidate = block(cluster, *mask, index)?;
                            let clashes = services
                                .iter()
                                .any(|s| s.contains(&candidate) || candidate.contains(s));
                            if !clashes && taken.insert(index) {
                                return Some(candidate.to_string());
                            }
                        }
                        None
                    })
                    .collect();
                if spec.pod_cidrs.len() != clusters.len() {
                    spec.pod_cidrs.clear();
                }
            }
            model.add(&spec);
            self.initial.push(spec);
        }

        // The schedule: Node churn and faults, over about 2–4 s.
        let mut creates_left = total - initial;
        let mut steps: Vec<Action> = Vec::new();
        let mut label_value = 0u32;
        while creates_left > 0 {
            let roll = rng.random_range(0..100u32);
            let action = match roll {
                0..=39 => {
                    creates_left -= 1;
                    let spec = model.new_spec(rng, finalizer_chance);
                    model.add(&spec);
                    Some(Action::Create(spec))
                }
                40..=41 => {
                    creates_left -= 1;
                    let mut spec = model.new_spec(rng, 0.0);
                    let kind = if rng.random_bool(0.5) {
                        ForeignKind::OutOfRange
                    } else {
                        ForeignKind::InServiceCidr
                    };
                    let cidrs = match kind {
                        ForeignKind::OutOfRange => {
                            model.foreign_out_of_range += 1;
                            Some(out_of_range_cidrs(&network, model.foreign_out_of_range - 1))
                        }
                        ForeignKind::InServiceCidr => {
                            model.foreign_in_service += 1;
                            in_service_cidrs(&network, model.foreign_in_service - 1)
                        }
                    };
                    cidrs.map(|cidrs| {
                        spec.name = format!("foreign-{}", spec.name);
                        spec.pod_cidrs = cidrs;
                        model.add(&spec);
                        Action::CreateForeign(spec, kind)
                    })
                }
                42..=53 => model.pick_live(rng).map(|name| {
                    model.delete(&name);
                    Action::Delete(name)
                }),
                54..=59 => model
                    .pick_live(rng)
                    .filter(|n| !n.starts_with("foreign-") && !model.with_finalizer.contains(n))
                    .map(|name| {
                        creates_left -= 1;
                        let mut spec = model.new_spec(rng, finalizer_chance);
                        spec.name = name;
                        model.add(&spec);
                        Action::Recreate(spec)
                    }),
                60..=71 => model.pick_live(rng).map(|name| {
                    label_value += 1;
                    Action::Label {
                        name,
                        value: label_value,
                    }
                }),
                72..=75 => model.pick_live(rng).map(Action::Heartbeat),
                76..=77 => {
                    let names: Vec<&String> = model.terminating.iter().collect();
                    names.choose(rng).map(|n| (*n).clone()).map(|name| {
                        model.terminating.remove(&name);
                        Action::RemoveFinalizer(name)
                    })
                }
                78..=95 => Some(Action::Fault(self.draw_fault(rng, &model))),
                96 => Some(Action::DropWatches),
                97 => Some(Action::Compact),
                _ => Some(Action::SetDelay(Duration::from_millis(
                    rng.random_range(0..=150),
                ))),
            };
            steps.extend(action);
        }
        // Slow responses end within the run (the end phase clears them anyway).
        if rng.random_bool(0.5) {
            steps.push(Action::SetDelay(Duration::ZERO));
        }

        // Controller events, at random places: 1–3 of them.
        let events = rng.random_range(1..=3usize);
        for _ in 0..events {
            let at = rng.random_range(steps.len() / 10..=steps.len());
            let (mut inserted, burst_first) = self.draw_controller_event(rng, &mut model);
            // A kill mid-PATCH, or a Lease loss, comes right after a burst of new Nodes (so
            // PATCHes are in flight, some of them late writes).
            if burst_first {
                let burst: Vec<Action> = (0..rng.random_range(3..=10))
                    .map(|_| {
                        let spec = model.new_spec(rng, 0.0);
                        model.add(&spec);
                        Action::Create(spec)
                    })
                    .collect();
                inserted.splice(0..0, burst);
            }
            let at = at.min(steps.len());
            steps.splice(at..at, inserted);
        }

        // Gaps: spread the steps over 2–4 s (bursts happen: many gaps are zero).
        let span_ms = rng.random_range(2000..=4000u64);
        let mean_ms = span_ms as f64 / steps.len().max(1) as f64;
        self.steps = steps
            .into_iter()
            .map(|action| {
                let gap_ms = if rng.random_bool(0.3) {
                    0.0
                } else {
                    rng.random_range(0.0..(mean_ms * 2.0 / 0.7).max(0.001))
                };
                let gap = match &action {
                    // Instant restarts are not what a process supervisor does; at least 20 ms
                    // (see RELIABILITY.md: a request written just before a kill may still arrive).
                    Action::Start => Duration::from_millis(rng.random_range(20..=600)),
                    _ => Duration::from_micros((gap_ms * 1000.0) as u64),
                };
                Step { gap, action }
            })
            .collect();
        // Issue 30: delivered-late writes and the fence's edges, from a stream of their own
        // (every draw above is what it was before).
        self.draw_fence_edges(&mut model);
    }

    /// Times and bounds of faults, relative to the request timeout `t`.
    fn draw_fault(&self, rng: &mut ChaCha8Rng, model: &Model) -> FaultRule {
        let t = self.effective_request_timeout();
        let frac = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| t.mul_f64(rng.random_range(lo..hi));
        let times = rng.random_range(1..=6usize);
        let roll = rng.random_range(0..100u32);
        let lease_faults = self.replicas > 1;
        let (verb, resource, action) = match roll {
            // Node PATCH: the write whose outcome matters.
            0..=54 => {
                let action = match rng.random_range(0..10u32) {
                    0 => FaultAction::Status(pick(rng, &[500u16, 502, 503])),
                    1 => FaultAction::Status(409),
                    2 => FaultAction::TooManyRequests {
                        retry_after_secs: 1,
                    },
                    3 => FaultAction::Hang(frac(rng, 0.5, 2.0)),
                    4 => FaultAction::Delay(frac(rng, 0.05, 1.3)),
                    5 => FaultAction::CommitThenStatus(pick(rng, &[500u16, 503, 504])),
                    6 => FaultAction::CommitThenHang(frac(rng, 0.5, 2.0)),
                    _ => self.draw_late_write(rng),
                };
                (Verb::Patch, Resource::Nodes, action)
            }
            // The re-read after a refused write.
            55..=62 => {
                let action = match rng.random_range(0..3u32) {
                    0 => FaultAction::Status(500),
                    1 => FaultAction::Hang(frac(rng, 0.5, 2.0)),
                    _ => FaultAction::Delay(frac(rng, 0.05, 1.3)),
                };
                (Verb::Get, Resource::Nodes, action)
            }
            // The informer: its list and watch requests.
            63..=72 => {
                let verb = if rng.random_bool(0.5) {
                    Verb::List
                } else {
                    Verb::Watch
                };
                let action = match rng.random_range(0..3u32) {
                    0 => FaultAction::Status(pick(rng, &[500u16, 503])),
                    1 => FaultAction::Hang(frac(rng, 0.5, 2.0)),
                    _ => FaultAction::Delay(frac(rng, 0.05, 1.0)),
                };
                (verb, Resource::Nodes, action)
            }
            // Events: must never matter.
            73..=79 => {
                let action = if rng.random_bool(0.5) {
                    FaultAction::Status(500)
                } else {
                    FaultAction::Hang(frac(rng, 0.5, 2.0))
                };
                (Verb::Create, Resource::Events, action)
            }
            // Lease requests (with leader election; else another Node PATCH fault).
            _ if lease_faults => {
                let verb = if rng.random_bool(0.5) {
                    Verb::Get
                } else {
                    Verb::Update
                };
                let action = match rng.random_range(0..5u32) {
                    0 => FaultAction::Status(500),
                    1 => FaultAction::Status(409),
                    2 => FaultAction::Hang(frac(rng, 0.3, 1.5)),
                    3 => FaultAction::Delay(frac(rng, 0.05, 0.8)),
                    _ if verb == Verb::Update => FaultAction::LateWrite {
                        commit_after: frac(rng, 0.1, 0.9),
                        answer: LateAnswer::DropConnection,
                    },
                    _ => FaultAction::Status(503),
                };
                (verb, Resource::Leases, action)
            }
            _ => (Verb::Patch, Resource::Nodes, self.draw_late_write(rng)),
        };
        let mut rule = FaultRule::new(verb, resource, times, action);
        if resource == Resource::Nodes
            && rng.random_bool(0.3)
            && let Some(name) = model.pick_live(rng)
        {
            rule = rule.named(name);
        }
        rule
    }

    /// A late write: committed `commit_after` (up to 1.2 × the request timeout: the sandbox
    /// refuses to commit past the request's own deadline, `timeout=`) after it arrived, the
    /// client answered earlier with a 504 or a dropped connection.
    fn draw_late_write(&self, rng: &mut ChaCha8Rng) -> FaultAction {
        let t = self.effective_request_timeout();
        let commit_after = t.mul_f64(rng.random_range(0.1..1.2));
        let answer = if rng.random_bool(0.5) {
            LateAnswer::DropConnection
        } else {
            LateAnswer::Timeout {
                after: commit_after.mul_f64(rng.random_range(0.0..1.0)),
            }
        };
        FaultAction::LateWrite {
            commit_after,
            answer,
        }
    }

    /// A late write for a clean stop: committed late in the request's life (0.5–1.0 *T* after
    /// it arrived, never past its deadline), answered early (a dropped connection, or a 504 after
    /// at most a fifth of that), so it is still in doubt when a successor could take over and
    /// list — the case a stopping leader must wait out.
    fn draw_late_write_at_stop(&self, rng: &mut ChaCha8Rng) -> FaultAction {
        let t = self.effective_request_timeout();
        let commit_after = t.mul_f64(rng.random_range(0.5..1.0));
        let answer = if rng.random_bool(0.5) {
            LateAnswer::DropConnection
        } else {
            LateAnswer::Timeout {
                after: commit_after.mul_f64(rng.random_range(0.0..0.2)),
            }
        };
        FaultAction::LateWrite {
            commit_after,
            answer,
        }
    }

    /// One controller event, and whether a burst of new Nodes is to come right before it.
    fn draw_controller_event(
        &self,
        rng: &mut ChaCha8Rng,
        model: &mut Model,
    ) -> (Vec<Action>, bool) {
        let roll = rng.random_range(0..10u32);
        let actions = match roll {
            0..=4 => {
                let late = FaultRule::new(
                    Verb::Patch,
                    Resource::Nodes,
                    rng.random_range(1..=5),
                    self.draw_late_write(rng),
                );
                return (
                    vec![
                        Action::Kill {
                            late_write: Some(late),
                        },
                        Action::Start,
                    ],
                    true,
                );
            }
            5 => vec![Action::Kill { late_write: None }, Action::Start],
            6 => {
                // A clean stop with an early-answered late write in doubt, right after a burst
                // of new Nodes (issue 15, item 1).
                let late = FaultRule::new(
                    Verb::Patch,
                    Resource::Nodes,
                    rng.random_range(1..=5),
                    self.draw_late_write_at_stop(rng),
                );
                return (
                    vec![
                        Action::Stop {
                            late_write: Some(late),
                        },
                        Action::Start,
                    ],
                    true,
                );
            }
            7..=8 if self.replicas > 1 => {
                // Renewals fail for longer than the renew deadline.
                let t = self.lease.renew_deadline;
                let hang = FaultRule::new(
                    Verb::Update,
                    Resource::Leases,
                    rng.random_range(3..=8),
                    FaultAction::Hang(t.mul_f64(rng.random_range(0.6..1.2))),
                );
                let fail = FaultRule::new(
                    Verb::Get,
                    Resource::Leases,
                    rng.random_range(3..=12),
                    FaultAction::Status(500),
                );
                // Writes the server applies late, up to their deadline, while the leader loses
                // the Lease: none may land after the standby has taken over and listed. The Lease
                // faults start once one of them is in doubt.
                let late = FaultRule::new(
                    Verb::Patch,
                    Resource::Nodes,
                    rng.random_range(3..=10),
                    self.draw_late_write(rng),
                );
                return (
                    vec![Action::LoseLease {
                        rules: vec![hang, fail],
                        late_write: Some(late),
                    }],
                    true,
                );
            }
            _ => {
                let count = rng.random_range(1..=4usize);
                let first = model.foreign_in_range;
                model.foreign_in_range += count;
                vec![Action::QuiesceAndAddForeign { count, first }]
            }
        };
        (actions, false)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let network = self.network();
        writeln!(
            f,
            "seed {}: network {} (--cluster-cidr {} --service-cluster-ip-range {}), {} replica(s), \
             request timeout {:?} (effective {:?}), retries {:?}..{:?}, {} qps / burst {}, {} workers, \
             lease {:?}/{:?}/{:?}, {} list, history {}",
            self.seed,
            network.name,
            network.cluster_cidrs,
            network.service_cidrs,
            self.replicas,
            self.request_timeout,
            self.effective_request_timeout(),
            self.retry_min_delay,
            self.retry_max_delay,
            self.kube_api_qps,
            self.kube_api_burst,
            self.workers,
            self.lease.lease_duration,
            self.lease.renew_deadline,
            self.lease.retry_period,
            if self.streaming_list {
                "streaming"
            } else {
                "paged"
            },
            self.history_limit,
        )?;
        let with_cidrs = self
            .initial
            .iter()
            .filter(|n| !n.pod_cidrs.is_empty())
            .count();
        writeln!(
            f,
            "initial: {} Nodes ({with_cidrs} with podCIDRs); {} Nodes created in all; {} steps",
            self.initial.len(),
            self.nodes_created(),
            self.steps.len()
        )?;
        for node in self.initial.iter().filter(|n| !n.pod_cidrs.is_empty()) {
            writeln!(f, "  initial {} {:?}", node.name, node.pod_cidrs)?;
        }
        for pool in self.cluster_cidrs.iter().flat_map(|p| &p.initial) {
            writeln!(f, "  initial {pool}")?;
        }
        let mut at = Duration::ZERO;
        for step in &self.steps {
            at += step.gap;
            writeln!(
                f,
                "  {:>7.1} ms  {:?}",
                at.as_secs_f64() * 1000.0,
                step.action
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_network_validates_and_blocks_are_where_they_should_be() {
        for network in NETWORKS {
            let clusters = network.clusters();
            assert!(!clusters.is_empty());
            for (cluster, mask) in &clusters {
                let count = block_count(cluster, *mask);
                assert!(count >= 256, "{}: {count} blocks", network.name);
                let first = block(cluster, *mask, 0).unwrap();
                let last = block(cluster, *mask, count - 1).unwrap();
                assert!(cluster.contains(&first) && cluster.contains(&last));
                assert_eq!(first.prefix_len(), *mask);
                assert_eq!(block(cluster, *mask, count), None);
            }
            for i in [0, 5, 300] {
                for cidr in out_of_range_cidrs(&network, i) {
                    let net: IpNet = cidr.parse().unwrap();
                    assert!(
                        clusters
                            .iter()
                            .all(|(c, _)| !c.contains(&net) && !net.contains(c))
                    );
                }
            }
        }
        let tight = &NETWORKS[1];
        let inside = in_service_cidrs(tight, 3).unwrap();
        let net: IpNet = inside[0].parse().unwrap();
        assert!(tight.services()[0].contains(&net));
        assert_eq!(
            in_service_cidrs(&NETWORKS[2], 0),
            None,
            "service CIDRs outside"
        );
    }

    #[test]
    fn a_seed_always_gives_the_same_plan_and_seeds_differ() {
        let a = Plan::generate(7);
        assert_eq!(a, Plan::generate(7));
        assert_ne!(a, Plan::generate(8));
        for seed in 0..50 {
            let plan = Plan::generate(seed);
            let created = plan.nodes_created();
            assert!((200..=580).contains(&created), "seed {seed}: {created}");
            assert!(
                plan.steps.iter().any(|s| matches!(
                    s.action,
                    Action::Kill { .. }
                        | Action::Stop { .. }
                        | Action::LoseLease { .. }
                        | Action::QuiesceAndAddForeign { .. }
                )),
                "seed {seed} has a controller event"
            );
        }
    }
}
