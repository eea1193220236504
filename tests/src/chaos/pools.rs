//! The ClusterCIDR variant of the chaos suite (issue 18 §3): pools appearing and going away while
//! Nodes churn and the API faults.
//!
//! A plan of this variant ([`Plan::generate_with_cluster_cidrs`]) is the ordinary plan of the seed
//! (same network, controllers, Nodes and faults), with the controllers run as
//! `--cidr-allocator-type=MultiCIDRRangeAllocator` and ClusterCIDR steps drawn from a second
//! ChaCha8 stream of the seed (so the ordinary plans of every seed stay what they were):
//!
//! - one selector-less **fallback** pool exists before the controllers start — disjoint from the
//!   flag CIDRs, or (IPv4 and IPv6 networks) a supernet of them, so two pools share the flag
//!   CIDR's addresses — with room for every Node the plan creates, so at the end every servable
//!   Node must be served (no "full" excuse);
//! - 2–5 steps create **selector pools** (KEP-2593's overlaps: a range inside the flag CIDR with
//!   finer blocks, one with coarser blocks, a small disjoint one that fills up) with selectors on
//!   the fixture Nodes' real labels (`topology.kubernetes.io/zone`, `node-role.kubernetes.io/worker`,
//!   two requirements, the churned label), or **delete** one created earlier: its finalizer holds
//!   it until no Node has a block inside it.
//!
//! Checks added to the suite's (see [`crate::chaos`]), at every committed write:
//! - a podCIDR set by an update is an allocation of the flag CIDRs ([`super::allocation_problem`])
//!   or of one ClusterCIDR that exists at that commit: one block per range, in the cluster's family
//!   order, each exactly the pool's block size inside its range, overlapping no service CIDR;
//! - a ClusterCIDR is removed (its finalizer let go) only while no Node holds a podCIDR inside
//!   its ranges — the controller's rule for "holds a block from it";
//!
//! and after quiescence: every servable Node served; the leader's usage per backing address space
//! (its pool rows: CIDR and grid) equal to what the Nodes and service CIDRs cover; every pool being
//! deleted that no Node holds a block of is gone, and every other carries the finalizer.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::plan::{Action, CHURN_LABEL, Network, Plan, Step, family_bits};
use crate::invariants::{ClusterSpec, pod_cidrs_of};

/// The finalizer the controller puts on every ClusterCIDR it serves from.
pub const POOL_FINALIZER: &str = "nodeipam.io/cluster-cidr-finalizer";

/// The name of the fallback pool every plan of the variant starts with.
pub const FALLBACK_POOL: &str = "fallback";

/// One requirement of a node selector term: key, operator, values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: &'static str,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: &'static str,
    /// The values (`In`/`NotIn`).
    pub values: &'static [&'static str],
}

/// A ClusterCIDR the actor creates (`nodeipam.io/v1alpha1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// `metadata.name`.
    pub name: String,
    /// `spec.ipv4`.
    pub ipv4: Option<&'static str>,
    /// `spec.ipv6`.
    pub ipv6: Option<&'static str>,
    /// `spec.perNodeHostBits`.
    pub per_node_host_bits: u8,
    /// One node selector term (`None`: no selector, a fallback pool).
    pub selector: Option<&'static [Requirement]>,
}

impl PoolSpec {
    /// The object to create.
    pub fn object(&self) -> Value {
        let mut spec = json!({ "perNodeHostBits": self.per_node_host_bits });
        if let Some(v4) = self.ipv4 {
            spec["ipv4"] = json!(v4);
        }
        if let Some(v6) = self.ipv6 {
            spec["ipv6"] = json!(v6);
        }
        if let Some(term) = self.selector {
            let expressions: Vec<Value> = term
                .iter()
                .map(|r| {
                    let mut e = json!({"key": r.key, "operator": r.operator});
                    if !r.values.is_empty() {
                        e["values"] = json!(r.values);
                    }
                    e
                })
                .collect();
            spec["nodeSelector"] =
                json!({"nodeSelectorTerms": [{"matchExpressions": expressions}]});
        }
        json!({
            "apiVersion": "nodeipam.io/v1alpha1",
            "kind": "ClusterCIDR",
            "metadata": {"name": self.name},
            "spec": spec,
        })
    }
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges: Vec<&str> = self.ipv4.iter().chain(&self.ipv6).copied().collect();
        write!(
            f,
            "ClusterCIDR {} {} host bits {}",
            self.name,
            ranges.join(","),
            self.per_node_host_bits
        )?;
        match self.selector {
            None => write!(f, " (no selector)"),
            Some(term) => {
                let text: Vec<String> = term
                    .iter()
                    .map(|r| format!("{} {} {:?}", r.key, r.operator, r.values))
                    .collect();
                write!(f, " selecting {}", text.join(" and "))
            }
        }
    }
}

/// What a ClusterCIDR says, as the checks read it: `(range, block prefix length)` per range.
fn ranges_of(object: &Value) -> Vec<(IpNet, u8)> {
    let host_bits = object["spec"]["perNodeHostBits"].as_u64().unwrap_or(0);
    ["ipv4", "ipv6"]
        .iter()
        .filter_map(|f| object["spec"][*f].as_str())
        .filter_map(|t| t.parse::<IpNet>().ok())
        .filter_map(|net| {
            let bits = u64::from(family_bits(&net));
            let prefix = u8::try_from(bits.checked_sub(host_bits)?).ok()?;
            Some((net, prefix))
        })
        .collect()
}

/// A pool layout of one network: ranges (IPv4, IPv6) and host bits.
type Layout = (Option<&'static str>, Option<&'static str>, u8);

/// Per network ([`super::NETWORKS`] by name): the fallback pools (one is drawn) and the selector
/// pools' layouts — inside the flag CIDR with finer blocks, inside it with coarser blocks (in a
/// dual-stack network host bits are shared: coarser in one family can be finer in the other),
/// and a small disjoint range that fills up. Every range holds at most 2^15 blocks.
fn layouts(network: &Network) -> (&'static [Layout], &'static [Layout]) {
    match network.name {
        "ipv4" => (
            &[
                (Some("10.64.0.0/13"), None, 8),
                (Some("10.72.0.0/16"), None, 8),
            ],
            &[
                (Some("10.66.0.0/20"), None, 6),
                (Some("10.65.0.0/18"), None, 9),
                (Some("10.100.0.0/20"), None, 8),
            ],
        ),
        "ipv4-tight" => (
            &[
                (Some("10.64.0.0/13"), None, 8),
                (Some("10.72.0.0/15"), None, 8),
            ],
            &[
                (Some("10.70.224.0/20"), None, 6),
                (Some("10.70.128.0/18"), None, 9),
                (Some("10.100.16.0/20"), None, 8),
            ],
        ),
        "dual-stack" => (
            &[(Some("10.84.0.0/15"), Some("fd00:81::/112"), 8)],
            &[
                (Some("10.82.0.0/20"), Some("fd00:80::a0:0/108"), 6),
                (Some("10.81.0.0/18"), Some("fd00:80::100:0/104"), 9),
                (Some("10.120.0.0/20"), Some("fd00:82::/112"), 8),
            ],
        ),
        "dual-stack-ipv6-first" => (
            &[(Some("10.92.0.0/16"), Some("fd00:91::/112"), 7)],
            &[
                (Some("10.91.0.0/20"), Some("fd00:90::80:0/108"), 5),
                (Some("10.90.128.0/18"), Some("fd00:90::40:0/106"), 8),
                (Some("10.93.0.0/21"), Some("fd00:92::/116"), 7),
            ],
        ),
        _ => (
            &[
                (None, Some("fd00:a0::/52"), 64),
                (None, Some("fd00:a1::/56"), 64),
            ],
            &[
                (None, Some("fd00:a0:0:300::/56"), 62),
                (None, Some("fd00:a0:0:100::/56"), 66),
                (None, Some("fd00:a2::/60"), 64),
            ],
        ),
    }
}

/// The selectors pools are drawn with: the fixture Nodes' real labels, and the churned one.
const SELECTORS: [&[Requirement]; 4] = [
    &[Requirement {
        key: "topology.kubernetes.io/zone",
        operator: "In",
        values: &["us-east1-b", "us-east-1a"],
    }],
    &[Requirement {
        key: "node-role.kubernetes.io/worker",
        operator: "Exists",
        values: &[],
    }],
    &[
        Requirement {
            key: "node.kubernetes.io/instance-type",
            operator: "In",
            values: &["n1-standard-4"],
        },
        Requirement {
            key: "topology.kubernetes.io/zone",
            operator: "In",
            values: &["us-east1-c", "us-east1-d"],
        },
    ],
    &[Requirement {
        key: CHURN_LABEL,
        operator: "Exists",
        values: &[],
    }],
];

/// The ClusterCIDRs of a plan of the variant: those that exist before the controllers start.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    /// Created before the first controller starts (the fallback first).
    pub initial: Vec<PoolSpec>,
}

impl Plan {
    /// [`Plan::generate`], or with `cluster_cidrs` [`Plan::generate_with_cluster_cidrs`].
    pub fn of_seed(seed: u64, cluster_cidrs: bool) -> Plan {
        if cluster_cidrs {
            Plan::generate_with_cluster_cidrs(seed)
        } else {
            Plan::generate(seed)
        }
    }

    /// The ClusterCIDR variant of `seed`'s plan (see the module doc): the ordinary plan plus
    /// ClusterCIDR steps from a second stream of the seed.
    pub fn generate_with_cluster_cidrs(seed: u64) -> Plan {
        let mut plan = Plan::generate(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(1);
        let (fallbacks, selector_layouts) = layouts(plan.network());
        let &(ipv4, ipv6, host_bits) = fallbacks.choose(&mut rng).unwrap_or(&fallbacks[0]);
        let mut initial = vec![PoolSpec {
            name: FALLBACK_POOL.to_owned(),
            ipv4,
            ipv6,
            per_node_host_bits: host_bits,
            selector: None,
        }];
        let mut next = 0usize;
        let mut draw_pool = |rng: &mut ChaCha8Rng| {
            let &(ipv4, ipv6, host_bits) =
                selector_layouts.choose(rng).unwrap_or(&selector_layouts[0]);
            next += 1;
            PoolSpec {
                name: format!("pool-{next}"),
                ipv4,
                ipv6,
                per_node_host_bits: host_bits,
                selector: SELECTORS.choose(rng).copied(),
            }
        };
        if rng.random_bool(0.5) {
            initial.push(draw_pool(&mut rng));
        }
        let mut live: Vec<String> = initial.iter().skip(1).map(|p| p.name.clone()).collect();
        let count = rng.random_range(2..=5usize);
        let mut actions = Vec::new();
        for _ in 0..count {
            if !live.is_empty() && rng.random_bool(0.35) {
                let index = rng.random_range(0..live.len());
                actions.push(Action::DeleteClusterCidr(live.remove(index)));
            } else {
                let pool = draw_pool(&mut rng);
                live.push(pool.name.clone());
                actions.push(Action::CreateClusterCidr(pool));
            }
        }
        // Spread over the schedule, in order (a deletion comes after its creation).
        let len = plan.steps.len();
        let mut places: Vec<usize> = actions.iter().map(|_| rng.random_range(0..=len)).collect();
        places.sort_unstable();
        for (offset, (at, action)) in places.into_iter().zip(actions).enumerate() {
            let gap = std::time::Duration::from_millis(rng.random_range(0..=40));
            plan.steps.insert(at + offset, Step { gap, action });
        }
        plan.cluster_cidrs = Some(PoolPlan { initial });
        plan
    }
}

/// What the variant's commit checks know: the ClusterCIDRs that exist and every Node's podCIDRs,
/// in commit order (kept by [`super::AllocationMonitor`]).
#[derive(Debug, Default)]
pub struct PoolWatch {
    /// ClusterCIDR name → its ranges with their block sizes, and whether it carries the
    /// controller's finalizer.
    live: BTreeMap<String, (Vec<(IpNet, u8)>, bool)>,
    /// Node name → podCIDRs.
    nodes: BTreeMap<String, Vec<IpNet>>,
}

fn has_pool_finalizer(object: &Value) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|v| v.as_str() == Some(POOL_FINALIZER)))
}

impl PoolWatch {
    /// A committed ClusterCIDR write; a violation if it let go of the controller's finalizer
    /// while a Node held a block of it. (A ClusterCIDR deleted before the controller put its
    /// finalizer on is removed by the API server at once, whatever Nodes hold: not the
    /// controller's doing.)
    pub fn pool_commit(&mut self, name: &str, after: &Value, removed: bool) -> Option<String> {
        let had = self.live.get(name).is_some_and(|(_, f)| *f);
        let has = !removed && has_pool_finalizer(after);
        let ranges = ranges_of(after);
        if removed {
            self.live.remove(name);
        } else {
            self.live.insert(name.to_owned(), (ranges.clone(), has));
        }
        if !had || has {
            return None;
        }
        let holders: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, cidrs)| {
                cidrs
                    .iter()
                    .any(|c| ranges.iter().any(|(r, _)| r.contains(c)))
            })
            .map(|(n, cidrs)| format!("{n} {cidrs:?}"))
            .take(5)
            .collect();
        let what = if removed { "removed with" } else { "lost" };
        (!holders.is_empty()).then(|| {
            format!(
                "ClusterCIDR {name} was {what} its finalizer while Nodes held blocks of it: {holders:?}"
            )
        })
    }

    /// A committed Node write (`None` after: deleted).
    pub fn node_commit(&mut self, name: &str, after: Option<&Value>) {
        match after {
            Some(node) => {
                let cidrs: Vec<IpNet> = pod_cidrs_of(node)
                    .iter()
                    .filter_map(|t| t.parse().ok())
                    .collect();
                self.nodes.insert(name.to_owned(), cidrs);
            }
            None => {
                self.nodes.remove(name);
            }
        }
    }

    /// Whether `node`'s podCIDRs are an allocation of one ClusterCIDR that exists now: one block
    /// per range, ranges in the cluster's family order (`first_family_bits`: 32 or 128), each
    /// exactly the pool's size inside its range, outside every service CIDR.
    pub fn is_pool_allocation(&self, spec: &ClusterSpec, node: &Value) -> bool {
        let texts = pod_cidrs_of(node);
        let Ok(nets) = texts
            .iter()
            .map(|t| t.parse::<IpNet>())
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        if node["spec"]["podCIDR"].as_str() != texts.first().map(String::as_str) {
            return false;
        }
        let first_family = spec.cluster_cidrs.first().map(|(c, _)| family_bits(c));
        self.live.values().any(|(ranges, _)| {
            let mut ordered = ranges.clone();
            ordered.sort_by_key(|(r, _)| Some(family_bits(r)) != first_family);
            ordered.len() == nets.len()
                && ordered.iter().zip(&nets).all(|((range, size), net)| {
                    net.trunc() == *net
                        && net.prefix_len() == *size
                        && range.contains(net)
                        && !spec
                            .service_cidrs
                            .iter()
                            .any(|s| s.contains(net) || net.contains(s))
                })
        })
    }
}

/// The oracle's spec for the variant at the end: the leader's backing address spaces (each pool
/// row's CIDR with its grid), so [`crate::invariants::check`] counts blocks on the controller's
/// own grid, plus the service CIDRs.
pub fn spec_of_rows(rows: &[(String, u8)], flags: &ClusterSpec) -> ClusterSpec {
    let rows: Vec<(&str, u8)> = rows.iter().map(|(c, g)| (c.as_str(), *g)).collect();
    let services: Vec<String> = flags
        .service_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    let services: Vec<&str> = services.iter().map(String::as_str).collect();
    ClusterSpec::new(&rows, &services)
}

/// For the end: ClusterCIDRs being deleted that no Node holds a block of (their finalizer should
/// be gone, and so should they), and live ones without the finalizer.
pub fn finalizer_problems(pools: &[Value], nodes: &[Value]) -> Vec<String> {
    let held: Vec<IpNet> = nodes
        .iter()
        .flat_map(pod_cidrs_of)
        .filter_map(|t| t.parse().ok())
        .collect();
    let mut problems = Vec::new();
    for pool in pools {
        let name = pool["metadata"]["name"].as_str().unwrap_or_default();
        let has_finalizer = has_pool_finalizer(pool);
        let deleting = !pool["metadata"]["deletionTimestamp"].is_null();
        let ranges = ranges_of(pool);
        let holders = held
            .iter()
            .filter(|c| ranges.iter().any(|(r, _)| r.contains(*c)))
            .count();
        if deleting && holders == 0 {
            problems.push(format!(
                "ClusterCIDR {name} is being deleted and no Node holds a block of it, but it is still there"
            ));
        }
        if !deleting && !has_finalizer {
            problems.push(format!("ClusterCIDR {name} has no {POOL_FINALIZER}"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::super::NETWORKS;
    use super::*;

    /// Every layout is valid as the CRD reads it (host bits at least 4, 1 ..= 2^15 blocks per range),
    /// of the right family, and the fallback pools hold more blocks than any plan creates Nodes.
    #[test]
    fn every_layout_is_a_valid_cluster_cidr() {
        for network in &NETWORKS {
            let (fallbacks, selectors) = layouts(network);
            for (index, &(ipv4, ipv6, host_bits)) in fallbacks.iter().chain(selectors).enumerate() {
                let pool = PoolSpec {
                    name: "x".into(),
                    ipv4,
                    ipv6,
                    per_node_host_bits: host_bits,
                    selector: None,
                };
                let ranges = ranges_of(&pool.object());
                assert_eq!(
                    ranges.len(),
                    network.clusters().len(),
                    "{}: {pool}",
                    network.name
                );
                for (range, size) in ranges {
                    assert_eq!(range.trunc(), range, "{pool}");
                    let blocks = size - range.prefix_len();
                    assert!(host_bits >= 4 && blocks <= 15, "{}: {pool}", network.name);
                    if index < fallbacks.len() {
                        assert!(blocks >= 8, "{}: fallback {pool} too small", network.name);
                    }
                }
            }
        }
    }

    #[test]
    fn the_variant_keeps_the_seeds_plan_and_orders_deletions_after_creations() {
        for seed in 0..40 {
            let plain = Plan::generate(seed);
            let variant = Plan::generate_with_cluster_cidrs(seed);
            assert_eq!(plain.network, variant.network);
            assert_eq!(plain.initial, variant.initial);
            let others: Vec<&Step> = variant
                .steps
                .iter()
                .filter(|s| {
                    !matches!(
                        s.action,
                        Action::CreateClusterCidr(_) | Action::DeleteClusterCidr(_)
                    )
                })
                .collect();
            assert_eq!(others.len(), plain.steps.len());
            let pools = variant.cluster_cidrs.as_ref().expect("variant");
            let mut created: Vec<String> = pools.initial.iter().map(|p| p.name.clone()).collect();
            for step in &variant.steps {
                match &step.action {
                    Action::CreateClusterCidr(p) => created.push(p.name.clone()),
                    Action::DeleteClusterCidr(name) => {
                        assert!(created.contains(name), "seed {seed}: {name}");
                        assert_ne!(name, FALLBACK_POOL);
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_removal_while_a_node_holds_a_block_is_a_violation() {
        let pool = PoolSpec {
            name: "p".into(),
            ipv4: Some("10.66.0.0/20"),
            ipv6: None,
            per_node_host_bits: 6,
            selector: None,
        }
        .object();
        let mut watch = PoolWatch::default();
        assert_eq!(watch.pool_commit("p", &pool, false), None);
        let mut guarded = pool.clone();
        guarded["metadata"]["finalizers"] = json!([POOL_FINALIZER]);
        assert_eq!(watch.pool_commit("p", &guarded, false), None);
        let node = json!({"spec": {"podCIDR": "10.66.1.64/26", "podCIDRs": ["10.66.1.64/26"]}});
        let spec = ClusterSpec::new(&[("10.64.0.0/14", 24)], &["10.67.252.0/22"]);
        assert!(watch.is_pool_allocation(&spec, &node));
        let wrong_size = json!({"spec": {"podCIDR": "10.66.1.0/24", "podCIDRs": ["10.66.1.0/24"]}});
        assert!(!watch.is_pool_allocation(&spec, &wrong_size));
        watch.node_commit("n", Some(&node));
        assert!(watch.pool_commit("p", &pool, true).is_some());
        assert_eq!(
            watch.pool_commit("p", &pool, true),
            None,
            "removed without ever having the finalizer: not the controller's doing"
        );
        watch.node_commit("n", None);
        assert_eq!(watch.pool_commit("p", &guarded, false), None);
        assert_eq!(watch.pool_commit("p", &pool, false), None, "no holder left");
        assert_eq!(watch.pool_commit("p", &pool, true), None);
        assert!(
            !watch.is_pool_allocation(&spec, &node),
            "a removed pool serves no one"
        );
    }
}
