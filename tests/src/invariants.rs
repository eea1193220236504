//! The invariants every end-to-end test checks at the end (docs/DESIGN.md §3), computed independently
//! of the controller from the Nodes the API server holds:
//!
//! 1. no two Nodes' podCIDRs overlap;
//! 2. every podCIDR lies in a cluster CIDR and avoids the service CIDRs;
//! 3. every Node that can be served is served (has podCIDRs);
//! 4. the pool's allocated count equals the blocks the Nodes (and service CIDRs) hold — nothing
//!    leaked — and what the controller says it holds per Node is what the Node has;
//! 5. with node-pool sizes (`CloudAllocator`): every Node listed in
//!    [`ClusterSpec::expected_sizes`] got blocks of exactly those prefix lengths.
//!
//! Blocks are counted on each cluster CIDR's **grid**: the mask given with it in
//! [`ClusterSpec::cluster_cidrs`], i.e. the node CIDR mask size, or with node-pool rules the
//! finest size any Node can get (the controller's `PoolStats::node_mask_size`). A podCIDR of
//! another size covers every grid block it overlaps, so mixed sizes are counted exactly.
//!
//! The checker uses `ipnet` and its own block arithmetic, not `nodeipam-core`, so it is an oracle
//! rather than a restatement of the code under test.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

/// The configuration the controller ran with, as the checker needs it.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Cluster CIDRs with their grid (bits): the node CIDR mask size, or with node-pool rules the
    /// finest configured size. Flag order.
    pub cluster_cidrs: Vec<(IpNet, u8)>,
    /// Service CIDRs.
    pub service_cidrs: Vec<IpNet>,
    /// Node name → the prefix lengths its podCIDRs must have, `(IPv4, IPv6)` (`None`: any), for
    /// Nodes sized by node-pool rules or labels. Empty: sizes are not checked.
    pub expected_sizes: BTreeMap<String, (Option<u8>, Option<u8>)>,
}

impl ClusterSpec {
    /// From text: `[("10.244.0.0/16", 24), ("fd00::/104", 110)]` and `["10.96.0.0/12"]`.
    ///
    /// # Panics
    /// On unparsable CIDR text (a test setup error).
    pub fn new(cluster_cidrs: &[(&str, u8)], service_cidrs: &[&str]) -> ClusterSpec {
        let parse = |t: &str| -> IpNet {
            match t.parse::<IpNet>() {
                Ok(n) => n.trunc(),
                Err(e) => panic!("bad CIDR {t:?} in the test setup: {e}"),
            }
        };
        ClusterSpec {
            cluster_cidrs: cluster_cidrs.iter().map(|(c, m)| (parse(c), *m)).collect(),
            service_cidrs: service_cidrs.iter().map(|s| parse(s)).collect(),
            expected_sizes: BTreeMap::new(),
        }
    }

    /// Expects Node `name` to be served with an IPv4 block of `/ipv4` and an IPv6 block of
    /// `/ipv6` (`None`: not checked).
    pub fn expect_sizes(mut self, name: &str, ipv4: Option<u8>, ipv6: Option<u8>) -> ClusterSpec {
        self.expected_sizes.insert(name.to_owned(), (ipv4, ipv6));
        self
    }
}

/// What the controller reports about its pool and reservations (from its `RunSummary`), as plain
/// text so this module does not depend on the controller's types.
#[derive(Debug, Clone, Default)]
pub struct ControllerView {
    /// Per cluster CIDR (canonical text): blocks in use (Nodes, pending, services, skipped).
    pub used: BTreeMap<String, u64>,
    /// Node name → CIDRs (canonical text) reserved for it.
    pub held: BTreeMap<String, Vec<String>>,
}

/// Figures from a successful check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Nodes with podCIDRs.
    pub served: usize,
    /// Nodes listed as not servable (and indeed not served, or served with invalid text).
    pub unservable: usize,
    /// Per cluster CIDR: blocks covered by Nodes' podCIDRs and service CIDRs.
    pub used_blocks: BTreeMap<String, u64>,
}

/// A Node's podCIDRs as text: `spec.podCIDRs`, else `[spec.podCIDR]`, else empty.
pub fn pod_cidrs_of(node: &Value) -> Vec<String> {
    let spec = &node["spec"];
    if let Some(list) = spec["podCIDRs"].as_array()
        && !list.is_empty()
    {
        return list
            .iter()
            .map(|c| c.as_str().unwrap_or_default().to_owned())
            .collect();
    }
    match spec["podCIDR"].as_str() {
        Some(c) if !c.is_empty() => vec![c.to_owned()],
        _ => Vec::new(),
    }
}

/// A Node's name.
pub fn name_of(node: &Value) -> String {
    node["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `net` as Go's `net.ParseCIDR` reads it (and so kube-controller-manager, the kubelet, CNI
/// plugins): an IPv6 network in the IPv4-mapped range
/// `::ffff:0:0/96` (only possible with a prefix of /96 or more) is the IPv4 network of its low
/// 32 bits, 96 bits shorter (`::ffff:10.9.1.0/120` is `10.9.1.0/24`).
pub fn as_go_reads(net: IpNet) -> IpNet {
    let IpNet::V6(v6) = net else {
        return net;
    };
    let segments = v6.network().segments();
    if v6.prefix_len() < 96 || segments[..5] != [0; 5] || segments[5] != 0xffff {
        return net;
    }
    let low = (u32::from(segments[6]) << 16) | u32::from(segments[7]);
    ipnet::Ipv4Net::new(low.into(), v6.prefix_len() - 96).map_or(net, IpNet::V4)
}

fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn width(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    }
}

fn same_family(a: &IpNet, b: &IpNet) -> bool {
    matches!(
        (a, b),
        (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
    )
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    same_family(a, b) && (a.contains(b) || b.contains(a))
}

/// Every pair of Nodes whose podCIDRs overlap, one line each (`Node a has X, Node b has Y`):
/// each Node's podCIDRs (`name → CIDR texts`, unparsable texts left out) compared as blocks with
/// every other Node's — invariant 1 on its own, for checks that have no [`ClusterSpec`].
pub fn overlapping_pod_cidrs(nodes: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let blocks: Vec<(&str, IpNet)> = nodes
        .iter()
        .flat_map(|(name, cidrs)| {
            cidrs
                .iter()
                .filter_map(|c| c.parse::<IpNet>().ok())
                .map(move |net| (name.as_str(), net))
        })
        .collect();
    let mut pairs = Vec::new();
    for (i, (a_name, a)) in blocks.iter().enumerate() {
        for (b_name, b) in &blocks[i + 1..] {
            if a_name != b_name && overlaps(a, b) {
                pairs.push(format!("Node {a_name} has {a}, Node {b_name} has {b}"));
            }
        }
    }
    pairs
}

/// First and last address of `net` as integers.
fn span(net: &IpNet) -> (u128, u128) {
    let lo = bits(net.network());
    let host_bits = u32::from(width(net) - net.prefix_len());
    let hi = if host_bits >= 128 {
        u128::MAX
    } else {
        lo | ((1u128 << host_bits) - 1)
    };
    (lo, hi)
}

/// Block index range `[first, last]` of `cluster` (cut into `/mask` blocks) that `net` overlaps.
fn block_range(cluster: &IpNet, mask: u8, net: &IpNet) -> Option<(u128, u128)> {
    if !overlaps(cluster, net) {
        return None;
    }
    let (c_lo, c_hi) = span(cluster);
    let (n_lo, n_hi) = span(net);
    let lo = c_lo.max(n_lo) - c_lo;
    let hi = c_hi.min(n_hi) - c_lo;
    let shift = u32::from(width(cluster) - mask);
    if shift >= 128 {
        return Some((0, 0));
    }
    Some((lo >> shift, hi >> shift))
}

/// Number of distinct indices covered by the ranges.
fn union_len(mut ranges: Vec<(u128, u128)>) -> u64 {
    ranges.sort_unstable();
    let mut total: u128 = 0;
    let mut current: Option<(u128, u128)> = None;
    for (lo, hi) in ranges {
        current = match current {
            Some((c_lo, c_hi)) if lo <= c_hi.saturating_add(1) => Some((c_lo, c_hi.max(hi))),
            Some((c_lo, c_hi)) => {
                total += c_hi - c_lo + 1;
                Some((lo, hi))
            }
            None => Some((lo, hi)),
        };
    }
    if let Some((c_lo, c_hi)) = current {
        total += c_hi - c_lo + 1;
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Checks the invariants over `nodes` (the API server's Nodes). `unservable` names the Nodes
/// that cannot be served (invalid or conflicting podCIDRs, or an exhausted pool) — each must
/// indeed be unserved or carry unusable podCIDRs; every other Node must be served. `controller`,
/// when given, must agree with the Nodes (no leak, no phantom reservation).
///
/// # Errors
/// Every violation, one line each.
pub fn check(
    nodes: &[Value],
    spec: &ClusterSpec,
    unservable: &[&str],
    controller: Option<&ControllerView>,
) -> Result<Report, Vec<String>> {
    let mut violations = Vec::new();
    let mut report = Report::default();
    let unservable: BTreeSet<&str> = unservable.iter().copied().collect();
    // (node name, podCIDR) of every served Node.
    let mut served: Vec<(String, IpNet)> = Vec::new();
    // Every parsable podCIDR of every Node (skipped ones keep their overlap reserved).
    let mut all_parsed: Vec<(String, IpNet)> = Vec::new();
    let mut node_names = BTreeSet::new();
    for node in nodes {
        let name = name_of(node);
        node_names.insert(name.clone());
        let texts = pod_cidrs_of(node);
        let parsed: Vec<Option<IpNet>> = texts
            .iter()
            .map(|t| t.parse::<IpNet>().ok().map(as_go_reads))
            .collect();
        for net in parsed.iter().flatten() {
            all_parsed.push((name.clone(), *net));
        }
        if unservable.contains(name.as_str()) {
            report.unservable += 1;
            continue;
        }
        if texts.is_empty() {
            violations.push(format!("Node {name} can be served but has no podCIDRs"));
            continue;
        }
        report.served += 1;
        if let Some(first) = node["spec"]["podCIDR"].as_str()
            && first != texts[0]
        {
            violations.push(format!(
                "Node {name}: spec.podCIDR {first} is not spec.podCIDRs[0] {}",
                texts[0]
            ));
        }
        let mut families = BTreeSet::new();
        for (text, net) in texts.iter().zip(&parsed) {
            let Some(net) = net else {
                violations.push(format!("Node {name}: podCIDR {text:?} is not a CIDR"));
                continue;
            };
            if !families.insert(width(net)) {
                violations.push(format!(
                    "Node {name}: two podCIDRs of one family: {texts:?}"
                ));
            }
            let expected = spec
                .expected_sizes
                .get(&name)
                .and_then(|(v4, v6)| match net {
                    IpNet::V4(_) => *v4,
                    IpNet::V6(_) => *v6,
                });
            if let Some(want) = expected
                && net.prefix_len() != want
            {
                violations.push(format!(
                    "Node {name}: podCIDR {net} is a /{} but its node pool's size is /{want}",
                    net.prefix_len()
                ));
            }
            if !spec.cluster_cidrs.iter().any(|(c, _)| c.contains(net)) {
                violations.push(format!("Node {name}: podCIDR {net} is in no cluster CIDR"));
            }
            for service in &spec.service_cidrs {
                if overlaps(service, net) {
                    violations.push(format!(
                        "Node {name}: podCIDR {net} overlaps service CIDR {service}"
                    ));
                }
            }
            served.push((name.clone(), *net));
        }
    }
    // 1. No overlap between Nodes.
    for (i, (a_name, a)) in served.iter().enumerate() {
        for (b_name, b) in &served[i + 1..] {
            if a_name != b_name && overlaps(a, b) {
                violations.push(format!(
                    "podCIDRs overlap: Node {a_name} has {a}, Node {b_name} has {b}"
                ));
            }
        }
    }
    // 4. Blocks in use per cluster CIDR.
    for (cluster, mask) in &spec.cluster_cidrs {
        let ranges: Vec<(u128, u128)> = all_parsed
            .iter()
            .map(|(_, n)| n)
            .chain(&spec.service_cidrs)
            .filter_map(|n| block_range(cluster, *mask, n))
            .collect();
        report
            .used_blocks
            .insert(cluster.to_string(), union_len(ranges));
    }
    if let Some(view) = controller {
        for (cluster, blocks) in &report.used_blocks {
            match view.used.get(cluster) {
                Some(used) if used == blocks => {}
                Some(used) => violations.push(format!(
                    "cluster CIDR {cluster}: the controller counts {used} blocks in use, the \
                     Nodes and service CIDRs cover {blocks} (leaked or lost blocks)"
                )),
                None => violations.push(format!("the controller has no pool for {cluster}")),
            }
        }
        for (name, held) in &view.held {
            if !node_names.contains(name) {
                violations.push(format!(
                    "the controller still holds {held:?} for Node {name}, which is gone"
                ));
                continue;
            }
            if unservable.contains(name.as_str()) {
                continue;
            }
            let mut has: Vec<String> = served
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, c)| c.trunc().to_string())
                .collect();
            let mut held_sorted = held.clone();
            has.sort();
            held_sorted.sort();
            if has != held_sorted {
                violations.push(format!(
                    "Node {name} has {has:?} but the controller holds {held_sorted:?} for it"
                ));
            }
        }
        for (name, _) in &served {
            if !view.held.contains_key(name) {
                violations.push(format!(
                    "Node {name} is served but the controller holds nothing for it"
                ));
            }
        }
    }
    if violations.is_empty() {
        Ok(report)
    } else {
        violations.sort();
        violations.dedup();
        Err(violations)
    }
}

/// [`check`], panicking with every violation listed.
///
/// # Panics
/// When any invariant is violated.
pub fn assert_invariants(
    nodes: &[Value],
    spec: &ClusterSpec,
    unservable: &[&str],
    controller: Option<&ControllerView>,
) -> Report {
    match check(nodes, spec, unservable, controller) {
        Ok(report) => report,
        Err(violations) => {
            let mut text = format!("{} invariant violation(s):\n", violations.len());
            for v in &violations {
                let _ = writeln!(text, "  - {v}");
            }
            panic!("{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidrs: &[&str]) -> Value {
        json!({"metadata": {"name": name}, "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs}})
    }

    fn spec() -> ClusterSpec {
        ClusterSpec::new(
            &[("10.0.0.0/22", 24), ("fd00::/120", 122)],
            &["10.0.3.0/25"],
        )
    }

    #[test]
    fn clean_state_passes_and_counts_blocks() {
        let nodes = vec![
            node("a", &["10.0.0.0/24", "fd00::/122"]),
            node("b", &["fd00::40/122", "10.0.1.0/24"]),
        ];
        let report = check(&nodes, &spec(), &[], None).unwrap();
        assert_eq!(report.served, 2);
        // Two Node blocks + the service CIDR's block.
        assert_eq!(report.used_blocks["10.0.0.0/22"], 3);
        assert_eq!(report.used_blocks["fd00::/120"], 2);
    }

    /// Mixed sizes on a /26 grid: a /23 counts 8 grid blocks, a /24 4, a /26 1; a wrong size is
    /// reported for a Node with an expected size.
    #[test]
    fn mixed_sizes_count_grid_blocks() {
        let spec = ClusterSpec::new(&[("10.244.0.0/16", 26)], &[])
            .expect_sizes("big", Some(23), None)
            .expect_sizes("small", Some(26), None);
        let nodes = vec![
            node("big", &["10.244.2.0/23"]),
            node("default", &["10.244.0.0/24"]),
            node("small", &["10.244.1.0/26"]),
        ];
        let report = check(&nodes, &spec, &[], None).unwrap();
        assert_eq!(report.used_blocks["10.244.0.0/16"], 8 + 4 + 1);
        let wrong = vec![node("big", &["10.244.2.0/24"])];
        let errors = check(&wrong, &spec, &[], None).unwrap_err();
        assert_eq!(
            errors,
            ["Node big: podCIDR 10.244.2.0/24 is a /24 but its node pool's size is /23"]
        );
    }

    #[test]
    fn violations_are_all_reported() {
        let nodes = vec![
            node("a", &["10.0.0.0/24"]),
            node("b", &["10.0.0.0/25"]),
            node("c", &["10.0.3.0/24"]),
            node("d", &["10.9.0.0/24"]),
            node("e", &[]),
        ];
        let view = ControllerView {
            used: [("10.0.0.0/22".to_owned(), 4), ("fd00::/120".to_owned(), 0)].into(),
            held: [("gone".to_owned(), vec!["10.0.2.0/24".to_owned()])].into(),
        };
        let errors = check(&nodes, &spec(), &[], Some(&view)).unwrap_err();
        let all = errors.join("\n");
        assert!(all.contains("overlap: Node a"), "{all}");
        assert!(all.contains("overlaps service CIDR"), "{all}");
        assert!(all.contains("in no cluster CIDR"), "{all}");
        assert!(
            all.contains("Node e can be served but has no podCIDRs"),
            "{all}"
        );
        assert!(all.contains("Node gone, which is gone"), "{all}");
        assert!(all.contains("leaked"), "{all}");
    }

    /// Overlap as blocks, not as equal text: a /25 inside another Node's /24, and the same block
    /// on two Nodes; a Node's own two families and disjoint blocks are no pair.
    #[test]
    fn overlapping_pod_cidrs_compares_blocks() {
        let nodes: BTreeMap<String, Vec<String>> = [
            ("a", vec!["10.64.16.0/24", "fd00::/64"]),
            ("b", vec!["10.64.16.128/25"]),
            ("c", vec!["10.64.17.0/24", "fd00:0:0:1::/64"]),
            ("d", vec!["10.64.17.0/24"]),
            ("e", vec![]),
        ]
        .into_iter()
        .map(|(n, c)| (n.to_owned(), c.into_iter().map(str::to_owned).collect()))
        .collect();
        assert_eq!(
            overlapping_pod_cidrs(&nodes),
            [
                "Node a has 10.64.16.0/24, Node b has 10.64.16.128/25",
                "Node c has 10.64.17.0/24, Node d has 10.64.17.0/24",
            ]
        );
        let disjoint: BTreeMap<String, Vec<String>> = nodes
            .into_iter()
            .filter(|(n, _)| n != "b" && n != "d")
            .collect();
        assert!(overlapping_pod_cidrs(&disjoint).is_empty());
    }
}
