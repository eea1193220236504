//! The recommended diagnostics of the bug reports: pure functions from the configuration and
//! Node views to [`Finding`]s, used by the controller at start-up (a warning per kind, an event on
//! each Node concerned) and by `plan` (a `note:` line per kind on stderr).
//!
//! | code | finding |
//! |---|---|
//! | R05 | a cluster CIDR holds a single node block (e.g. an IPv6 /64 with the default /64 mask): one Node gets a pod CIDR, every other waits; with node-pool rules or mask labels giving finer sizes, a Node of the default size takes the whole cluster CIDR |
//! | R08 | a Node's podCIDR is not canonical (`10.1.2.2/24`, `010.0.50.0/24`): host bits set, leading zeros (read as decimal, as kcm's ParseCIDRSloppy), an IPv4 range in IPv4-mapped IPv6 form (`::ffff:10.9.1.0/120`, read as `10.9.1.0/24` as Go reads it), or written otherwise than its canonical form (whatever its size: a podCIDR of another size than the default, kept under node-pool rules, is not a finding) |
//! | R10 | dual-stack: a Node's podCIDRs are in the other family order than `--cluster-cidr` |
//! | R11 | dual-stack: a Node has podCIDRs of one family only — it will never get the other |
//! | R13 | no `--service-cluster-ip-range`, while a cluster CIDR overlaps a well-known default service range |
//! | R13 | an IPv4-mapped `--service-cluster-ip-range` entry (`::ffff:10.96.0.0/108`): it overlaps no cluster CIDR here, so it filters nothing |
//! | —  | a `--cluster-cidr` entry with host bits set (its network is used) |

use nodeipam_core::{Cidr, Family, IpamConfig};

use crate::node_pools::Sizing;
use crate::reasons;
use crate::reconcile::{EventKind, EventSpec, NodeName, NodeView};

/// Default service ranges of common distributions: a cluster CIDR overlapping one of them while
/// no `--service-cluster-ip-range` is given is probably allocating over Service IPs.
pub const WELL_KNOWN_SERVICE_CIDRS: [(&str, &str); 7] = [
    ("10.96.0.0/12", "kubeadm's default service subnet"),
    (
        "10.0.0.0/24",
        "kube-apiserver's default --service-cluster-ip-range",
    ),
    ("10.43.0.0/16", "k3s's default --service-cidr"),
    ("172.30.0.0/16", "OpenShift's default serviceNetwork"),
    ("10.100.0.0/16", "EKS's default service range"),
    ("172.20.0.0/16", "EKS's service range in a 10.0.0.0/8 VPC"),
    ("10.0.0.0/16", "AKS's default --service-cidr"),
];

/// The IPv4-mapped IPv6 range `::ffff:0:0/96` (RFC 4291 §2.5.5.2).
fn ipv4_mapped_range() -> Option<Cidr> {
    Cidr::parse("::ffff:0:0/96").ok()
}

/// One diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// R05: `cluster_cidr` with `node_mask_size` holds one block. With node-pool rules or mask
    /// labels giving finer sizes (`grid_mask` > `node_mask_size`), Nodes of those sizes share it,
    /// but a Node of the default size still takes all of it.
    SingleBlockPool {
        /// The cluster CIDR.
        cluster_cidr: Cidr,
        /// Its node mask size (the default size), bits.
        node_mask_size: u8,
        /// The finest size a Node can get there (the grid), bits; `node_mask_size` without
        /// node-pool sizes.
        grid_mask: u8,
    },
    /// R08: Node `node` has podCIDR text `written`, whose canonical form is `canonical`.
    NonCanonicalPodCidr {
        /// The Node.
        node: NodeName,
        /// As written on the Node.
        written: String,
        /// What the controller reads it as.
        canonical: Cidr,
    },
    /// R10: Node `node`'s podCIDRs (`pod_cidrs`) are in the other family order.
    FamilyOrder {
        /// The Node.
        node: NodeName,
        /// As written on the Node.
        pod_cidrs: Vec<String>,
    },
    /// R11: Node `node` has no podCIDR in `missing`'s family, and never will.
    MissingFamily {
        /// The Node.
        node: NodeName,
        /// The cluster CIDR of the family it lacks.
        missing: Cidr,
    },
    /// R13: no service CIDR (or only IPv4-mapped ones, `mapped_only`), and `cluster_cidr`
    /// overlaps `service_cidr` (`what`).
    ServiceRangeUnset {
        /// `--service-cluster-ip-range` is given, but only with IPv4-mapped entries, which filter
        /// nothing ([`Finding::MappedServiceCidr`]).
        mapped_only: bool,
        /// The cluster CIDR.
        cluster_cidr: Cidr,
        /// The well-known service range it overlaps.
        service_cidr: Cidr,
        /// Whose default that range is.
        what: &'static str,
    },
    /// R13: a service CIDR in the IPv4-mapped range: filters nothing here.
    MappedServiceCidr {
        /// The service CIDR as read.
        service_cidr: Cidr,
    },
    /// A `--cluster-cidr` entry had host bits set; `cluster_cidr` (its network) is used.
    ClusterCidrHostBits {
        /// The network used.
        cluster_cidr: Cidr,
    },
}

impl Finding {
    /// The bug-report code (`R05` …), or `-` for the host-bits warning.
    pub fn code(&self) -> &'static str {
        match self {
            Finding::SingleBlockPool { .. } => "R05",
            Finding::NonCanonicalPodCidr { .. } => "R08",
            Finding::FamilyOrder { .. } => "R10",
            Finding::MissingFamily { .. } => "R11",
            Finding::ServiceRangeUnset { .. } | Finding::MappedServiceCidr { .. } => "R13",
            Finding::ClusterCidrHostBits { .. } => "-",
        }
    }

    /// The Node concerned, for per-Node findings.
    pub fn node(&self) -> Option<&NodeName> {
        match self {
            Finding::NonCanonicalPodCidr { node, .. }
            | Finding::FamilyOrder { node, .. }
            | Finding::MissingFamily { node, .. } => Some(node),
            _ => None,
        }
    }

    /// One sentence: what is wrong and what to do.
    pub fn message(&self) -> String {
        match self {
            Finding::SingleBlockPool {
                cluster_cidr,
                node_mask_size,
                grid_mask,
            } => {
                let flag = match cluster_cidr.family() {
                    Family::V4 => "--node-cidr-mask-size-ipv4",
                    Family::V6 => "--node-cidr-mask-size-ipv6",
                };
                // 2^16 blocks, but each keeps at least 16 addresses (a /32 or /128 block holds one
                // pod address: no suggestion to give).
                let finest = cluster_cidr.family().max_prefix_len() - 4;
                let example = cluster_cidr.prefix_len().saturating_add(16).min(finest);
                if example <= cluster_cidr.prefix_len() {
                    return format!(
                        "cluster CIDR {cluster_cidr} with node mask /{node_mask_size} holds a single block: one Node gets a pod CIDR and every other waits, and it is too small to share (a node block needs at least 16 addresses, a /{finest}); give a larger --cluster-cidr"
                    );
                }
                if grid_mask > node_mask_size {
                    format!(
                        "cluster CIDR {cluster_cidr} with node mask /{node_mask_size} holds a single block of the default size: Nodes that node-pool rules or mask labels size get blocks down to /{grid_mask}, but a Node of the default size gets a pod CIDR only while the whole cluster CIDR is free, so the first one takes all of it and every Node after it waits; give a longer default mask with {flag} (or --node-cidr-mask-size), e.g. /{example}, or make every Node match a rule"
                    )
                } else {
                    format!(
                        "cluster CIDR {cluster_cidr} with node mask /{node_mask_size} holds a single block: one Node gets a pod CIDR and every other waits; give a longer mask with {flag} (or --node-cidr-mask-size), e.g. /{example}"
                    )
                }
            }
            Finding::NonCanonicalPodCidr {
                node,
                written,
                canonical,
            } => {
                if Cidr::parse_sloppy(written).is_ok_and(|(c, _)| c.family() != canonical.family())
                {
                    format!(
                        "Node {node} has podCIDR {written:?}, which is not canonical (an IPv4 range in \"::ffff:\" mapped notation): Go's net.ParseCIDR, kube-controller-manager, the kubelet and CNI plugins read it as {canonical}, and the controller reserves {canonical}; write it as {canonical}"
                    )
                } else if Cidr::parse_masked(written).is_err() {
                    format!(
                        "Node {node} has podCIDR {written:?}, which is not canonical (leading zeros): the controller reads them as decimal, as kube-controller-manager does, and reserves {canonical}, but a tool reading them as octal sees another range; write podCIDRs without leading zeros"
                    )
                } else {
                    format!(
                        "Node {node} has podCIDR {written:?}, which is not canonical: the controller reserves {canonical}, but a CNI reading the Node may use the address as written"
                    )
                }
            }
            Finding::FamilyOrder { node, pod_cidrs } => format!(
                "Node {node} has podCIDRs [{}] in the other family order than --cluster-cidr: kept (matched by family), but kube-controller-manager would refuse them, and spec.podCIDR is of the other family than on new Nodes",
                pod_cidrs.join(",")
            ),
            Finding::MissingFamily { node, missing } => format!(
                "Node {node} has no {} podCIDR and will never get one from {missing} (podCIDRs are immutable once set): delete and re-register the Node to make it dual-stack",
                missing.family()
            ),
            Finding::ServiceRangeUnset {
                mapped_only,
                cluster_cidr,
                service_cidr,
                what,
            } => {
                let given = if *mapped_only {
                    "--service-cluster-ip-range has only IPv4-mapped entries, which filter nothing"
                } else {
                    "no --service-cluster-ip-range is given"
                };
                format!(
                    "{given}, and cluster CIDR {cluster_cidr} overlaps {service_cidr} ({what}): if Services use it, pod CIDRs will be allocated over Service IPs; pass the cluster's service range with --service-cluster-ip-range"
                )
            }
            Finding::MappedServiceCidr { service_cidr } => format!(
                "--service-cluster-ip-range entry {service_cidr} is in the IPv4-mapped IPv6 range: it overlaps no cluster CIDR, so it filters nothing (kube-controller-manager reads it as an IPv4 range); write it as IPv4"
            ),
            Finding::ClusterCidrHostBits { cluster_cidr } => format!(
                "--cluster-cidr entry has host bits set; using its network address {cluster_cidr}"
            ),
        }
    }

    /// The event to publish on the Node, for per-Node findings.
    pub fn event(&self) -> Option<EventSpec> {
        let reason = match self {
            Finding::NonCanonicalPodCidr { .. } => reasons::POD_CIDR_NOT_CANONICAL,
            Finding::FamilyOrder { .. } => reasons::POD_CIDR_FAMILY_ORDER,
            Finding::MissingFamily { .. } => reasons::POD_CIDR_MISSING_FAMILY,
            _ => return None,
        };
        Some(EventSpec {
            kind: EventKind::Warning,
            reason,
            note: self.message(),
            action: reasons::ACTION_OCCUPY,
        })
    }
}

/// Findings about the configuration alone (R05, R13, host bits), flag order. `sizing` gives the
/// sizes Nodes can get ([`Sizing::range_allocator`] without node-pool rules), which R05's
/// message depends on.
pub fn config_findings(config: &IpamConfig, sizing: &Sizing) -> Vec<Finding> {
    let mut findings = Vec::new();
    for cluster in &config.cluster_cidrs {
        if cluster.host_bits_were_set {
            findings.push(Finding::ClusterCidrHostBits {
                cluster_cidr: cluster.cluster_cidr,
            });
        }
        if cluster.block_count() == 1 {
            let grid_mask = sizing
                .set_of(cluster.cluster_cidr)
                .map_or(cluster.node_mask_size, |s| s.grid_mask);
            findings.push(Finding::SingleBlockPool {
                cluster_cidr: cluster.cluster_cidr,
                node_mask_size: cluster.node_mask_size,
                grid_mask,
            });
        }
    }
    let mapped = ipv4_mapped_range();
    for service in &config.service_cidrs {
        if mapped.is_some_and(|m| m.overlaps(service)) {
            findings.push(Finding::MappedServiceCidr {
                service_cidr: *service,
            });
        }
    }
    let effective_services = config
        .service_cidrs
        .iter()
        .filter(|s| !mapped.is_some_and(|m| m.overlaps(s)))
        .count();
    if effective_services == 0 {
        for cluster in &config.cluster_cidrs {
            let hit = WELL_KNOWN_SERVICE_CIDRS.iter().find_map(|(text, what)| {
                let service = Cidr::parse(text).ok()?;
                service
                    .overlaps(&cluster.cluster_cidr)
                    .then_some((service, *what))
            });
            if let Some((service_cidr, what)) = hit {
                findings.push(Finding::ServiceRangeUnset {
                    mapped_only: !config.service_cidrs.is_empty(),
                    cluster_cidr: cluster.cluster_cidr,
                    service_cidr,
                    what,
                });
            }
        }
    }
    findings
}

/// Findings about one Node that has podCIDRs (R08, R10, R11); none for a Node without them, or
/// whose podCIDRs do not parse (the allocator skips it with its own event).
pub fn node_findings(config: &IpamConfig, node: &NodeView) -> Vec<Finding> {
    let cluster_cidrs: Vec<Cidr> = config
        .cluster_cidrs
        .iter()
        .map(|c| c.cluster_cidr)
        .collect();
    node_findings_in(&cluster_cidrs, node)
}

/// [`node_findings`] given the cluster CIDRs alone (flag order), as the allocator has them: it
/// reports the findings of a Node whose podCIDRs it occupies while running, with the same events.
pub fn node_findings_in(cluster_cidrs: &[Cidr], node: &NodeView) -> Vec<Finding> {
    let raw = node.raw_pod_cidrs();
    let mut parsed = Vec::with_capacity(raw.len());
    let mut findings = Vec::new();
    for text in &raw {
        let Ok((cidr, _)) = Cidr::parse_pod_cidr(text) else {
            return Vec::new();
        };
        if cidr.to_string() != *text {
            findings.push(Finding::NonCanonicalPodCidr {
                node: node.name.clone(),
                written: text.clone(),
                canonical: cidr,
            });
        }
        parsed.push(cidr);
    }
    // Dual-stack: the first cluster CIDR of each family, the family of `--cluster-cidr`'s first
    // entry first (several per family change nothing here).
    let first = cluster_cidrs.first().copied();
    let second = cluster_cidrs
        .iter()
        .copied()
        .find(|c| Some(c.family()) != first.map(|f| f.family()));
    if let (Some(first), Some(second)) = (first, second) {
        match parsed.as_slice() {
            [a, b] if a.family() == second.family() && b.family() == first.family() => {
                findings.push(Finding::FamilyOrder {
                    node: node.name.clone(),
                    pod_cidrs: raw.clone(),
                });
            }
            [only] => {
                let missing = if only.family() == first.family() {
                    second
                } else {
                    first
                };
                findings.push(Finding::MissingFamily {
                    node: node.name.clone(),
                    missing,
                });
            }
            _ => {}
        }
    }
    findings
}

/// Nodes that hold podCIDRs outside every cluster CIDR of their family — typically a
/// `--cluster-cidr` entry removed since they got them — counted **per family** (which entry was
/// removed is not known: the controller keeps no earlier configuration), for one start-up line
/// per family. Such a Node keeps its podCIDRs and is skipped with the out-of-range Warning event,
/// as any out-of-range Node ([`crate::reconcile::SkipKind::OutOfRange`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutsideClusterCidrs {
    /// Per family: Nodes counted, the first three names (start-up order), the first podCIDR seen.
    families: std::collections::BTreeMap<Family, (usize, Vec<NodeName>, Cidr)>,
}

impl OutsideClusterCidrs {
    /// Counts `node` if one of its podCIDRs lies outside every cluster CIDR of its family (a
    /// family without cluster CIDRs is another finding: not counted here).
    pub fn observe(&mut self, allocator: &crate::reconcile::Allocator, node: &NodeView) {
        let Some(parsed) = node.parsed_pod_cidrs() else {
            return;
        };
        for cidr in allocator.outside_cluster_cidrs(&parsed) {
            let (nodes, names, _) =
                self.families
                    .entry(cidr.family())
                    .or_insert((0, Vec::new(), cidr));
            // One count per Node and family (a Node has one podCIDR per family).
            *nodes += 1;
            if names.len() < 3 {
                names.push(node.name.clone());
            }
        }
    }

    /// Nodes counted for `family`.
    pub fn count(&self, family: Family) -> usize {
        self.families.get(&family).map_or(0, |(nodes, _, _)| *nodes)
    }

    /// One line per family with Nodes counted, naming the family's cluster CIDRs
    /// (`cluster_cidrs`, flag order).
    pub fn lines(&self, cluster_cidrs: &[Cidr]) -> Vec<String> {
        self.families
            .iter()
            .map(|(family, (nodes, names, example))| {
                let listed: Vec<String> = cluster_cidrs
                    .iter()
                    .filter(|c| c.family() == *family)
                    .map(ToString::to_string)
                    .collect();
                let names: Vec<&str> = names.iter().map(|n| &**n).collect();
                let more = nodes.saturating_sub(names.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                let (nodes_word, hold, they_keep, them) = if *nodes == 1 {
                    ("Node", "holds", "It keeps its podCIDRs and is", "it")
                } else {
                    ("Nodes", "hold", "They keep their podCIDRs and are", "them")
                };
                format!(
                    "{nodes} {nodes_word} ({}{more}) {hold} {family} podCIDRs outside every {family} --cluster-cidr ({}), e.g. {example}: a cluster CIDR removed from --cluster-cidr? {they_keep} skipped (event {}); add the range back to --cluster-cidr to have {them} tracked again",
                    names.join(", "),
                    listed.join(", "),
                    reasons::POD_CIDR_OUT_OF_RANGE
                )
            })
            .collect()
    }
}

/// Log or note lines for `findings`: one per configuration finding, and per kind of Node
/// finding one line naming up to three Nodes (with the first one's message) and the count.
pub fn summarize(findings: &[Finding]) -> Vec<String> {
    let mut lines: Vec<String> = findings
        .iter()
        .filter(|f| f.node().is_none())
        .map(|f| format!("{}: {}", f.code(), f.message()))
        .collect();
    for code in ["R08", "R10", "R11"] {
        let group: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.node().is_some() && f.code() == code)
            .collect();
        let Some(first) = group.first() else {
            continue;
        };
        if group.len() == 1 {
            lines.push(format!("{code}: {}", first.message()));
            continue;
        }
        let names: Vec<&str> = group
            .iter()
            .filter_map(|f| f.node().map(|n| &**n))
            .take(3)
            .collect();
        let more = group.len().saturating_sub(3);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        lines.push(format!(
            "{code}: {} Nodes ({}{more}), e.g.: {}",
            group.len(),
            names.join(", "),
            first.message()
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeipam_core::NodeMaskFlags;

    fn config(cluster: &str, service: &str, v6_mask: Option<u8>) -> IpamConfig {
        nodeipam_core::config::validate(
            cluster,
            service,
            NodeMaskFlags {
                node_cidr_mask_size_ipv6: v6_mask,
                ..NodeMaskFlags::default()
            },
        )
        .expect("valid configuration")
    }

    /// The configuration's findings with the range allocator.
    fn range_findings(config: &IpamConfig) -> Vec<Finding> {
        config_findings(config, &Sizing::range_allocator(config))
    }

    fn view(name: &str, pod_cidrs: &[&str]) -> NodeView {
        NodeView {
            name: name.into(),
            pod_cidr: pod_cidrs.first().map(|s| (*s).to_owned()),
            pod_cidrs: pod_cidrs.iter().map(|s| (*s).to_owned()).collect(),
            ..NodeView::default()
        }
    }

    fn cidr(text: &str) -> Cidr {
        Cidr::parse(text).expect("CIDR")
    }

    /// R05: an IPv6 /64 cluster CIDR with the default /64 mask holds one block.
    #[test]
    fn r05_single_block_pool() {
        let findings = range_findings(&config("fd00:1:2:3::/64", "fd00:ffff::/112", None));
        assert_eq!(
            findings,
            [Finding::SingleBlockPool {
                cluster_cidr: cidr("fd00:1:2:3::/64"),
                node_mask_size: 64,
                grid_mask: 64,
            }]
        );
        assert!(findings[0].message().contains("--node-cidr-mask-size-ipv6"));
        assert!(
            findings[0]
                .message()
                .contains("one Node gets a pod CIDR and every other waits")
        );
        assert!(range_findings(&config("fd00:1:2::/48", "fd00:ffff::/112", None)).is_empty());
    }

    /// R05 with node-pool sizes: a rule giving /80s in the /64 does not make the default /64 any
    /// less a single block, so the finding stays, but says what is true then (rule-sized Nodes
    /// share the cluster CIDR; a default-size Node takes all of it, and only while it is free).
    /// Rules that leave the default a multi-block size give no finding, whatever the grid.
    #[test]
    fn r05_with_node_pool_sizes() {
        use crate::node_pools::{MaskRule, NodePools, RuleOrigin};
        let sizing = |ipam: &IpamConfig, rule: &str| {
            NodePools {
                rules: vec![MaskRule::parse(rule, RuleOrigin::Flag { index: 1 }).expect("rule")],
                ..NodePools::default()
            }
            .sizing(ipam)
            .expect("fits")
        };
        let ipam = config("fd00:1:2:3::/64", "fd00:ffff::/112", None);
        let findings = config_findings(&ipam, &sizing(&ipam, "pool=small:ipv6=80"));
        assert_eq!(
            findings,
            [Finding::SingleBlockPool {
                cluster_cidr: cidr("fd00:1:2:3::/64"),
                node_mask_size: 64,
                grid_mask: 80,
            }]
        );
        let message = findings[0].message();
        assert!(
            message.contains("get blocks down to /80, but a Node of the default size gets a pod CIDR only while the whole cluster CIDR is free"),
            "{message}"
        );
        assert!(
            !message.contains("one Node gets a pod CIDR and"),
            "{message}"
        );
        let ipam = config("fd00:1:2::/48", "fd00:ffff::/112", None);
        assert!(config_findings(&ipam, &sizing(&ipam, "pool=small:ipv6=72")).is_empty());
        let ipam = config("10.1.0.0/16", "10.96.0.0/12", None);
        assert!(config_findings(&ipam, &sizing(&ipam, "pool=big:ipv4=16")).is_empty());
    }

    /// R08: `10.1.2.2/24` is read as 10.1.2.0/24 and reported, with an event on the Node.
    #[test]
    fn r08_non_canonical_pod_cidr() {
        let ipam = config("10.1.0.0/16", "10.96.0.0/12", None);
        let findings = node_findings(&ipam, &view("a", &["10.1.2.2/24"]));
        assert_eq!(
            findings,
            [Finding::NonCanonicalPodCidr {
                node: "a".into(),
                written: "10.1.2.2/24".to_owned(),
                canonical: cidr("10.1.2.0/24"),
            }]
        );
        let event = findings[0].event().expect("per-Node finding has an event");
        assert_eq!(event.reason, reasons::POD_CIDR_NOT_CANONICAL);
        assert_eq!(event.kind, EventKind::Warning);
        assert!(node_findings(&ipam, &view("b", &["10.1.3.0/24"])).is_empty());
        assert!(node_findings(&ipam, &view("c", &["***HIDDEN***/25"])).is_empty());
    }

    /// R08 for a podCIDR stored with leading zeros (`010.0.50.0/24`): read as decimal, as
    /// kube-controller-manager's ParseCIDRSloppy reads it, and reported with what that means.
    #[test]
    fn r08_leading_zeros() {
        let ipam = config("10.0.0.0/16", "10.96.0.0/12", None);
        let findings = node_findings(&ipam, &view("a", &["010.0.50.0/24"]));
        assert_eq!(
            findings,
            [Finding::NonCanonicalPodCidr {
                node: "a".into(),
                written: "010.0.50.0/24".to_owned(),
                canonical: cidr("10.0.50.0/24"),
            }]
        );
        assert_eq!(
            findings[0].message(),
            "Node a has podCIDR \"010.0.50.0/24\", which is not canonical (leading zeros): the controller reads them as decimal, as kube-controller-manager does, and reserves 10.0.50.0/24, but a tool reading them as octal sees another range; write podCIDRs without leading zeros"
        );
        let event = findings[0].event().expect("per-Node finding has an event");
        assert_eq!(event.reason, reasons::POD_CIDR_NOT_CANONICAL);
    }

    /// R08 is about how a podCIDR is written, not its size: canonical podCIDRs of other sizes
    /// than the default (kept under node-pool rules: a /23 and a /26 beside /24s) are no finding,
    /// and a non-canonical /23 is reported with its own size.
    #[test]
    fn r08_is_independent_of_the_block_size() {
        let ipam = config("10.1.0.0/16", "10.96.0.0/12", None);
        for pod_cidr in ["10.1.2.0/23", "10.1.4.64/26", "10.1.5.0/24"] {
            assert!(
                node_findings(&ipam, &view("a", &[pod_cidr])).is_empty(),
                "{pod_cidr}"
            );
        }
        assert_eq!(
            node_findings(&ipam, &view("b", &["10.1.3.0/23"])),
            [Finding::NonCanonicalPodCidr {
                node: "b".into(),
                written: "10.1.3.0/23".to_owned(),
                canonical: cidr("10.1.2.0/23"),
            }]
        );
        let dual = config("10.1.0.0/16,fd00:1::/48", "10.96.0.0/12", None);
        assert!(node_findings(&dual, &view("c", &["10.1.4.0/23", "fd00:1:0:10::/60"])).is_empty());
    }

    /// R10 and R11 on a dual-stack configuration.
    #[test]
    fn r10_family_order_and_r11_missing_family() {
        let ipam = config("10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/12", None);
        assert_eq!(
            node_findings(
                &ipam,
                &view("v6-first", &["fd00:10:244::/64", "10.244.0.0/24"])
            ),
            [Finding::FamilyOrder {
                node: "v6-first".into(),
                pod_cidrs: vec!["fd00:10:244::/64".to_owned(), "10.244.0.0/24".to_owned()],
            }]
        );
        assert_eq!(
            node_findings(&ipam, &view("v4-only", &["10.244.1.0/24"])),
            [Finding::MissingFamily {
                node: "v4-only".into(),
                missing: cidr("fd00:10:244::/56"),
            }]
        );
        assert!(
            node_findings(&ipam, &view("ok", &["10.244.2.0/24", "fd00:10:244:1::/64"])).is_empty()
        );
        assert!(node_findings(&ipam, &view("none", &[])).is_empty());
        // Single-stack: neither applies.
        let single = config("10.244.0.0/16", "10.96.0.0/12", None);
        assert!(node_findings(&single, &view("v4-only", &["10.244.1.0/24"])).is_empty());
    }

    /// R13: no service range while the cluster CIDR overlaps kubeadm's default service subnet;
    /// an IPv4-mapped service range counts as none.
    #[test]
    fn r13_service_range_unset_or_mapped() {
        let findings = range_findings(&config("10.0.0.0/8", "", None));
        assert_eq!(
            findings.first(),
            Some(&Finding::ServiceRangeUnset {
                mapped_only: false,
                cluster_cidr: cidr("10.0.0.0/8"),
                service_cidr: cidr("10.96.0.0/12"),
                what: "kubeadm's default service subnet",
            })
        );
        assert!(range_findings(&config("10.0.0.0/8", "10.96.0.0/12", None)).is_empty());
        assert!(range_findings(&config("10.244.0.0/16", "", None)).is_empty());
        let mapped = range_findings(&config("10.0.0.0/8", "::ffff:10.96.0.0/108", None));
        assert!(
            matches!(mapped[0], Finding::MappedServiceCidr { .. }),
            "{mapped:?}"
        );
        assert!(
            matches!(
                mapped[1],
                Finding::ServiceRangeUnset {
                    mapped_only: true,
                    ..
                }
            ),
            "{mapped:?}"
        );
        // The second note does not say that no range is given: one is, but it filters nothing.
        assert!(
            mapped[1].message().starts_with("--service-cluster-ip-range has only IPv4-mapped entries, which filter nothing, and cluster CIDR 10.0.0.0/8 overlaps 10.96.0.0/12"),
            "{}",
            mapped[1].message()
        );
        assert!(
            findings[0]
                .message()
                .starts_with("no --service-cluster-ip-range is given")
        );
    }

    /// R05 on a cluster CIDR of one /24 block with the /24 mask: the suggestion keeps 16
    /// addresses per block (/28; it said /32, one address), and a cluster CIDR too small to share
    /// gets no mask suggestion but a larger --cluster-cidr.
    #[test]
    fn r05_suggests_a_usable_mask() {
        let ipam = nodeipam_core::config::validate(
            "10.0.0.0/24",
            "",
            nodeipam_core::NodeMaskFlags {
                node_cidr_mask_size: Some(24),
                ..nodeipam_core::NodeMaskFlags::default()
            },
        )
        .expect("valid");
        let message = range_findings(&ipam)[0].message();
        assert!(message.ends_with("e.g. /28"), "{message}");
        let ipam = nodeipam_core::config::validate(
            "10.0.0.0/29",
            "",
            nodeipam_core::NodeMaskFlags {
                node_cidr_mask_size: Some(29),
                ..nodeipam_core::NodeMaskFlags::default()
            },
        )
        .expect("valid");
        let message = range_findings(&ipam)[0].message();
        assert!(
            message.ends_with("give a larger --cluster-cidr"),
            "{message}"
        );
        assert!(!message.contains("e.g."), "{message}");
    }

    /// R10 and R11 with several cluster CIDRs per family: judged by family (the first entry's
    /// family first), whatever the number of CIDRs.
    #[test]
    fn r10_r11_with_several_cluster_cidrs_per_family() {
        let ipam = config(
            "10.244.0.0/16,10.245.0.0/16,fd00:10:244::/56",
            "10.96.0.0/12",
            None,
        );
        assert!(
            node_findings(&ipam, &view("ok", &["10.245.2.0/24", "fd00:10:244:1::/64"])).is_empty()
        );
        assert_eq!(
            node_findings(&ipam, &view("v4-only", &["10.245.1.0/24"])),
            [Finding::MissingFamily {
                node: "v4-only".into(),
                missing: cidr("fd00:10:244::/56"),
            }]
        );
        assert!(matches!(
            node_findings(
                &ipam,
                &view("v6-first", &["fd00:10:244::/64", "10.245.0.0/24"])
            )[..],
            [Finding::FamilyOrder { .. }]
        ));
        // Two IPv4 CIDRs and no IPv6: single-stack, neither applies.
        let single = config("10.244.0.0/16,10.245.0.0/16", "10.96.0.0/12", None);
        assert!(node_findings(&single, &view("v4-only", &["10.245.1.0/24"])).is_empty());
    }

    /// The start-up count of Nodes outside every cluster CIDR of their family: per family, up to
    /// three names, the family's cluster CIDRs; Nodes inside one, or of no configured family, are
    /// not counted.
    #[test]
    fn outside_cluster_cidrs_are_counted_per_family() {
        let ipam = config("10.20.0.0/23,fd00:20::/56,10.30.0.0/24", "", Some(64));
        let allocator = crate::reconcile::Allocator::new(&ipam).expect("pool");
        let mut outside = OutsideClusterCidrs::default();
        for (name, cidrs) in [
            ("a", &["10.10.0.0/24", "fd00:20::/64"][..]),
            ("b", &["10.10.1.0/24"][..]),
            ("c", &["10.20.0.0/24"][..]),
            ("d", &["10.10.2.0/24", "fd00:99::/64"][..]),
            ("e", &["10.10.3.0/24"][..]),
            ("garbage", &["not a CIDR"][..]),
        ] {
            outside.observe(&allocator, &view(name, cidrs));
        }
        assert_eq!(outside.count(Family::V4), 4);
        assert_eq!(outside.count(Family::V6), 1);
        let cluster_cidrs: Vec<Cidr> = ipam.cluster_cidrs.iter().map(|c| c.cluster_cidr).collect();
        assert_eq!(
            outside.lines(&cluster_cidrs),
            [
                "4 Nodes (a, b, d and 1 more) hold IPv4 podCIDRs outside every IPv4 --cluster-cidr (10.20.0.0/23, 10.30.0.0/24), e.g. 10.10.0.0/24: a cluster CIDR removed from --cluster-cidr? They keep their podCIDRs and are skipped (event PodCIDROutOfRange); add the range back to --cluster-cidr to have them tracked again",
                "1 Node (d) holds IPv6 podCIDRs outside every IPv6 --cluster-cidr (fd00:20::/56), e.g. fd00:99::/64: a cluster CIDR removed from --cluster-cidr? It keeps its podCIDRs and is skipped (event PodCIDROutOfRange); add the range back to --cluster-cidr to have it tracked again",
            ]
        );
        assert!(
            OutsideClusterCidrs::default()
                .lines(&cluster_cidrs)
                .is_empty()
        );
    }

    #[test]
    fn summaries_group_node_findings() {
        let ipam = config("10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/12", None);
        let findings: Vec<Finding> = ["a", "b", "c", "d"]
            .iter()
            .flat_map(|n| node_findings(&ipam, &view(n, &["10.244.1.0/24"])))
            .collect();
        let lines = summarize(&findings);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("R11: 4 Nodes (a, b, c and 1 more), e.g.: Node a has no IPv6 podCIDR"),
            "{lines:?}"
        );
    }
}
