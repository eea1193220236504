//! `nodeipam-controller plan`: the controller's start-up occupy and allocation, offline, over a
//! NodeList, in list order (so results are reproducible).
//!
//! JSON output (`--output json`), exactly:
//! `{"nodes":[{"name":…,"podCIDRs":[…],"action":"keep"|"assign"|"skip"|"fail"|"ignore","reason":null|"…"}],
//!   "pools":[{"clusterCIDR":…,"nodeMaskSize":…,"capacity":…,"used":…,"free":…,
//!   "largestFreeBlock":null|"…"}]}`
//! where `podCIDRs` is what the Node has (keep, skip, ignore) or would get (assign), empty for
//! fail; `ignore` is a Node `--node-selector` does not select (never written; its podCIDRs stay
//! occupied, and its reason says so);
//! `capacity`/`used`/`free` count node blocks after the plan (service CIDRs and skipped Nodes'
//! reserved ranges count as used) — with node-pool rules, grid blocks of `nodeMaskSize` (the
//! finest configured size); `largestFreeBlock` is the largest entirely free aligned block left.
//! With node-pool rules, `reason` also says which rule or label sized an assigned block, and
//! names kept podCIDRs whose size differs from what their labels select now (they keep them:
//! podCIDRs cannot change once set).
//!
//! With `--cluster-cidrs FILE` ([`cluster_cidrs`]) the ClusterCIDRs are hosted before anything
//! is decided, an assigned block that lies in one names it in `reason` (`in ClusterCIDR
//! <name>`), the `pools` rows are the allocator's backing sets (see
//! [`crate::reconcile::Allocator::sync_cluster_cidrs`]), and one more key follows:
//! `"clusterCIDRs":[{"name":…,"perNodeHostBits":…|null,"selector":…|null,
//! "state":"serving"|"deleting"|"refused"|"invalid","reason":null|"…",
//! "ranges":[{"cidr":…,"capacity":…,"used":…,"free":…}]}]` (blocks of the ClusterCIDR's own
//! size). Without the flag the output is as before, byte for byte.
//!
//! Memory: [`Planner`] holds the input reduced to [`InputNode`]s (the informer cache's compact
//! entries) and writes the output as it
//! decides, never a whole report: JSON in one pass; the table in two passes (the first only
//! measures the columns; the allocator is deterministic, so the second decides the same).

use std::borrow::Cow;
use std::io::{self, Write};

use k8s_openapi::api::core::v1::Node;
use nodeipam_core::IpamConfig;
use serde::Serialize;

use crate::Error;
use crate::diagnostics::Finding;
use crate::node_pools::{MaskSource, Sizing};
use crate::nodelist::InputNode;
use crate::reconcile::{Action, Allocator, ClusterCidrSync, NodeView};

pub mod cluster_cidrs;

use cluster_cidrs::{ClusterCidrInput, PlanClusterCidr};

/// What `plan` says about one Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanNode {
    /// `metadata.name`.
    pub name: String,
    /// CIDR texts: kept or assigned (canonical), or as written on a skipped Node.
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    /// `keep`, `assign`, `skip`, `fail`, or `ignore` (not selected by `--node-selector`).
    pub action: &'static str,
    /// Why (skip, fail), else `None`.
    pub reason: Option<String>,
}

impl PlanNode {
    /// Whether the Node needs no attention: kept, assigned, or not ours to serve (`ignore`).
    fn served(&self) -> bool {
        matches!(self.action, "keep" | "assign" | "ignore")
    }
}

/// Capacity and use of one cluster CIDR after the plan, in node blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanPool {
    /// Canonical cluster CIDR text.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// Node block prefix length, bits.
    #[serde(rename = "nodeMaskSize")]
    pub node_mask_size: u8,
    /// Total blocks.
    pub capacity: u32,
    /// Used blocks.
    pub used: u32,
    /// Free blocks.
    pub free: u32,
    /// The largest entirely free aligned block (canonical CIDR text), `None` when full.
    #[serde(rename = "largestFreeBlock")]
    pub largest_free_block: Option<String>,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanReport {
    /// One entry per Node, list order.
    pub nodes: Vec<PlanNode>,
    /// One entry per cluster CIDR, flag order (per backing set with ClusterCIDRs).
    pub pools: Vec<PlanPool>,
    /// One entry per ClusterCIDR given with `--cluster-cidrs` (none without it).
    #[serde(rename = "clusterCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub cluster_cidrs: Vec<PlanClusterCidr>,
}

impl PlanReport {
    /// Whether every Node is kept, assigned or ignored (exit status 0).
    pub fn all_served(&self) -> bool {
        self.nodes.iter().all(PlanNode::served)
    }

    /// The JSON text (one line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// A human-readable table: Nodes, then pools. Control characters in Node names and podCIDR
    /// texts are escaped (`\n`, `\u{1b}`), so a hostile name cannot forge rows.
    pub fn to_table(&self) -> String {
        let mut widths = TableWidths::default();
        for node in &self.nodes {
            widths.measure(node);
        }
        let mut out = Vec::new();
        let _ = write_table_header(&mut out, widths);
        for node in &self.nodes {
            let _ = write_table_row(&mut out, widths, node);
        }
        let _ = write_table_pools(&mut out, &self.pools);
        let _ = cluster_cidrs::write_table(&mut out, &self.cluster_cidrs);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Column widths of the table (bytes, as the text is printed).
#[derive(Debug, Clone, Copy)]
struct TableWidths {
    name: usize,
    cidrs: usize,
}

impl Default for TableWidths {
    fn default() -> Self {
        TableWidths { name: 4, cidrs: 8 }
    }
}

impl TableWidths {
    fn measure(&mut self, node: &PlanNode) {
        self.name = self.name.max(escape_controls(&node.name).len());
        self.cidrs = self.cidrs.max(cidrs_cell(node).len());
    }
}

/// `text` with every control character escaped (`\n`, `\t`, `\u{7f}`); unchanged otherwise.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().collect::<String>()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

fn cidrs_cell(node: &PlanNode) -> String {
    if node.pod_cidrs.is_empty() {
        "-".to_owned()
    } else {
        escape_controls(&node.pod_cidrs.join(",")).into_owned()
    }
}

fn write_table_header(out: &mut impl Write, widths: TableWidths) -> io::Result<()> {
    writeln!(
        out,
        "{:name_width$}  {:6}  {:cidr_width$}  REASON",
        "NODE",
        "ACTION",
        "PODCIDRS",
        name_width = widths.name,
        cidr_width = widths.cidrs
    )
}

fn write_table_row(out: &mut impl Write, widths: TableWidths, node: &PlanNode) -> io::Result<()> {
    writeln!(
        out,
        "{:name_width$}  {:6}  {:cidr_width$}  {}",
        escape_controls(&node.name),
        node.action,
        cidrs_cell(node),
        escape_controls(node.reason.as_deref().unwrap_or("-")),
        name_width = widths.name,
        cidr_width = widths.cidrs
    )
}

fn write_table_pools(out: &mut impl Write, pools: &[PlanPool]) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "{:24}  {:8}  {:>10}  {:>10}  {:>10}  LARGEST FREE",
        "CLUSTER CIDR", "NODEMASK", "CAPACITY", "USED", "FREE"
    )?;
    for pool in pools {
        writeln!(
            out,
            "{:24}  {:8}  {:>10}  {:>10}  {:>10}  {}",
            pool.cluster_cidr,
            format!("/{}", pool.node_mask_size),
            pool.capacity,
            pool.used,
            pool.free,
            pool.largest_free_block.as_deref().unwrap_or("-")
        )?;
    }
    Ok(())
}

/// A plan over a NodeList read with [`crate::nodelist::read_nodes`] (given the label keys of
/// [`Sizing::label_keys`], so that the node-pool rules see the labels they read).
#[derive(Debug)]
pub struct Planner {
    /// Fresh from [`Allocator::with_sizing`]: every pass over the Nodes starts from a copy.
    allocator: Allocator,
    nodes: Vec<InputNode>,
    /// `--cluster-cidrs`: what was read, and what hosting it gave.
    cluster_cidrs: ClusterCidrInput,
    sync: ClusterCidrSync,
}

impl Planner {
    /// A plan of `nodes` (list order) against `config` with the range allocator (every Node gets
    /// the node CIDR mask size).
    ///
    /// # Errors
    /// [`Error::Pool`] if the configuration leaves a cluster CIDR no free block.
    pub fn new(config: &IpamConfig, nodes: Vec<InputNode>) -> Result<Planner, Error> {
        Planner::with_sizing(config, Sizing::range_allocator(config), nodes)
    }

    /// [`Planner::new`] with per-Node sizes (`CloudAllocator` rules and mask labels, from
    /// [`crate::node_pools::NodePools::sizing`]), as the controller applies them.
    ///
    /// # Errors
    /// [`Error::Pool`] if the configuration leaves a cluster CIDR no free block.
    pub fn with_sizing(
        config: &IpamConfig,
        sizing: Sizing,
        nodes: Vec<InputNode>,
    ) -> Result<Planner, Error> {
        let allocator = Allocator::with_sizing(config, sizing).map_err(Error::Pool)?;
        Ok(Planner::with_allocator(allocator, nodes))
    }

    /// A plan of `nodes` (list order) with `allocator`, fresh from [`Allocator::with_sizing`] (the
    /// binary builds it while validating the flags, once).
    pub fn with_allocator(allocator: Allocator, nodes: Vec<InputNode>) -> Planner {
        Planner {
            allocator,
            nodes,
            cluster_cidrs: ClusterCidrInput::default(),
            sync: ClusterCidrSync::default(),
        }
    }

    /// This plan with the ClusterCIDRs of a `--cluster-cidrs` file hosted first (as the
    /// controller hosts them before it occupies any podCIDR). The Nodes must have been read
    /// keeping the labels [`ClusterCidrInput::label_keys`] names.
    #[must_use]
    pub fn with_cluster_cidrs(mut self, input: ClusterCidrInput) -> Planner {
        self.sync = self.allocator.sync_cluster_cidrs(&input.pools);
        self.cluster_cidrs = input;
        self
    }

    /// The per-Node diagnostics ([`Allocator::node_findings`], the controller's: a Node a
    /// single-family ClusterCIDR serves is not missing a family) of the served Nodes that have
    /// podCIDRs, list order.
    pub fn findings(&self) -> Vec<Finding> {
        self.nodes
            .iter()
            .filter(|n| n.has_pod_cidrs())
            .map(InputNode::view)
            .filter(|view| self.allocator.sizing().serves(&view.labels))
            .flat_map(|view| self.allocator.node_findings(&view))
            .collect()
    }

    /// Decides for every Node in list order, handing each entry to `sink`; returns the pools and
    /// the ClusterCIDR rows.
    fn run(
        &self,
        mut sink: impl FnMut(PlanNode) -> io::Result<()>,
    ) -> io::Result<(Vec<PlanPool>, Vec<PlanClusterCidr>)> {
        // A copy: `write_table` passes over the Nodes twice, each from the fresh pool.
        let mut allocator = self.allocator.clone();
        // Start-up occupy, one Node at a time, keeping no decision: deciding a Node again below
        // gives the same Keep or Skip (the allocator is idempotent), so neither the views nor the
        // decisions of every Node with podCIDRs are held at once (at 300,000 Nodes, 60,000 of
        // them holding blocks, they were ~30 MB of the 124 MiB peak).
        // In name order, as `startup_occupy` orders them (and the controller's cache lists them):
        // a contested block goes to the same Node whatever order the file has.
        let mut occupied: Vec<&InputNode> =
            self.nodes.iter().filter(|n| n.has_pod_cidrs()).collect();
        occupied.sort_by(|a, b| a.name.cmp(&b.name));
        allocator.reserve_nodes(occupied.len());
        for node in occupied {
            drop(allocator.startup_occupy(std::slice::from_ref(&node.view())));
        }
        for node in &self.nodes {
            let view = node.view();
            let decision = if view.has_pod_cidrs() {
                allocator.decide(&view)
            } else {
                // Each write assumed applied; no index entry is kept for it (memory).
                allocator.assign_untracked(&view)
            };
            let note = size_note(&allocator, &view, &decision.action)
                .or_else(|| pool_note(&allocator, &decision.action));
            let mut planned = entry(&view, decision.action);
            if planned.reason.is_none() {
                planned.reason = note;
            }
            sink(planned)?;
        }
        let rows = cluster_cidrs::rows(&allocator, &self.cluster_cidrs, &self.sync);
        Ok((pool_entries(&allocator), rows))
    }

    /// Every entry, collected (for small inputs and tests).
    pub fn report(&self) -> PlanReport {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let (pools, cluster_cidrs) = self
            .run(|node| {
                nodes.push(node);
                Ok(())
            })
            .unwrap_or_default();
        PlanReport {
            nodes,
            pools,
            cluster_cidrs,
        }
    }

    /// Writes the JSON (one line and a newline), byte-identical to [`PlanReport::to_json`];
    /// returns whether every Node is kept or assigned.
    ///
    /// # Errors
    /// Writing `out` failed.
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<bool> {
        let mut served = true;
        let mut first = true;
        out.write_all(b"{\"nodes\":[")?;
        let (pools, rows) = self.run(|node| {
            served &= node.served();
            if !first {
                out.write_all(b",")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, &node).map_err(io::Error::other)
        })?;
        out.write_all(b"],\"pools\":")?;
        serde_json::to_writer(&mut *out, &pools).map_err(io::Error::other)?;
        if !rows.is_empty() {
            out.write_all(b",\"clusterCIDRs\":")?;
            serde_json::to_writer(&mut *out, &rows).map_err(io::Error::other)?;
        }
        out.write_all(b"}\n")?;
        Ok(served)
    }

    /// Writes the table, identical to [`PlanReport::to_table`]; returns whether every Node is
    /// kept or assigned.
    ///
    /// # Errors
    /// Writing `out` failed.
    pub fn write_table(&self, out: &mut impl Write) -> io::Result<bool> {
        let mut widths = TableWidths::default();
        self.run(|node| {
            widths.measure(&node);
            Ok(())
        })?;
        write_table_header(out, widths)?;
        let mut served = true;
        let (pools, rows) = self.run(|node| {
            served &= node.served();
            write_table_row(out, widths, &node)
        })?;
        write_table_pools(out, &pools)?;
        cluster_cidrs::write_table(out, &rows)?;
        Ok(served)
    }
}

fn pool_entries(allocator: &Allocator) -> Vec<PlanPool> {
    let largest = allocator.largest_free_blocks();
    allocator
        .pool_stats()
        .into_iter()
        .zip(largest)
        .map(|(s, (_, free))| PlanPool {
            cluster_cidr: s.cluster_cidr.to_string(),
            node_mask_size: s.node_mask_size,
            capacity: s.capacity_blocks,
            used: s.used_blocks,
            free: s.free_blocks,
            largest_free_block: free.map(|f| f.cidr.to_string()),
        })
        .collect()
}

/// Plans `nodes` against `config` with the range allocator (every Node gets the node CIDR mask
/// size): start-up occupy of every existing podCIDR, then one allocation per Node without
/// podCIDRs, in list order (each assumed to be patched successfully).
///
/// # Errors
/// [`Error::Pool`] if the configuration leaves a cluster CIDR no free block.
pub fn plan(config: &IpamConfig, nodes: &[Node]) -> Result<PlanReport, Error> {
    plan_with_sizing(config, Sizing::range_allocator(config), nodes)
}

/// [`plan`] with per-Node sizes (`CloudAllocator` rules and mask labels, from
/// [`crate::node_pools::NodePools::sizing`]), as the controller applies them: the same
/// [`Planner`], over whole Nodes.
///
/// # Errors
/// [`Error::Pool`] if the configuration leaves a cluster CIDR no free block.
pub fn plan_with_sizing(
    config: &IpamConfig,
    sizing: Sizing,
    nodes: &[Node],
) -> Result<PlanReport, Error> {
    let label_keys: Vec<std::sync::Arc<str>> = sizing
        .label_keys()
        .iter()
        .map(|k| k.as_str().into())
        .collect();
    let input = nodes
        .iter()
        .map(|node| InputNode::from_node(node, &label_keys))
        .collect();
    Ok(Planner::with_sizing(config, sizing, input)?.report())
}

/// With node-pool sizes: which rule or label sized an assigned block (`None` for the default
/// sizes), or which kept podCIDRs differ from the size the Node's labels select now.
fn size_note(allocator: &Allocator, view: &NodeView, action: &Action) -> Option<String> {
    match action {
        Action::Keep { pod_cidrs } => allocator.size_mismatch(view, pod_cidrs),
        Action::Assign { pod_cidrs, .. } => {
            let sizing = allocator.sizing();
            let masks = sizing.resolve(&view.labels).ok()?;
            let sized: Vec<String> = pod_cidrs
                .iter()
                .zip(&masks)
                .filter(|(_, m)| m.source != MaskSource::Default)
                .map(|(cidr, m)| format!("{cidr} sized by {}", sizing.describe(m.source)))
                .collect();
            (!sized.is_empty()).then(|| sized.join("; "))
        }
        _ => None,
    }
}

/// For an assigned block that lies in a ClusterCIDR's range with its block size: which one
/// (`in ClusterCIDR <name>`; the rule of [`Allocator::cluster_cidr_block_of`]).
fn pool_note(allocator: &Allocator, action: &Action) -> Option<String> {
    let Action::Assign { pod_cidrs, .. } = action else {
        return None;
    };
    let names: Vec<String> = pod_cidrs
        .iter()
        .filter_map(|c| allocator.cluster_cidr_block_of(*c))
        .collect();
    let first = names.first()?;
    Some(format!("in ClusterCIDR {first}"))
}

fn entry(view: &NodeView, action: Action) -> PlanNode {
    let texts = |cidrs: &[nodeipam_core::Cidr]| cidrs.iter().map(ToString::to_string).collect();
    let (pod_cidrs, action, reason) = match action {
        Action::Keep { pod_cidrs } => (texts(&pod_cidrs), "keep", None),
        Action::Assign { pod_cidrs, .. } => (texts(&pod_cidrs), "assign", None),
        Action::Skip { reason } => (view.raw_pod_cidrs(), "skip", Some(reason)),
        Action::Fail { reason } => (Vec::new(), "fail", Some(reason)),
        Action::Released { .. } => (Vec::new(), "fail", Some("released".to_owned())),
        // plan deletes no Node (and its allocator has no quarantine), so this does not occur.
        Action::Quarantined { .. } => (Vec::new(), "fail", Some("quarantined".to_owned())),
        Action::NotServed { held } => {
            let reason = if held.is_empty() {
                "not selected by --node-selector".to_owned()
            } else {
                format!(
                    "not selected by --node-selector; {} stays reserved",
                    crate::reconcile::join(&held)
                )
            };
            (view.raw_pod_cidrs(), "ignore", Some(reason))
        }
        // plan assumes every write succeeds, so this does not occur.
        Action::KeepTrying { pod_cidrs, reason } => (texts(&pod_cidrs), "assign", Some(reason)),
    };
    PlanNode {
        name: view.name.to_string(),
        pod_cidrs,
        action,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use nodeipam_core::NodeMaskFlags;

    use super::*;

    use crate::node_pools::{MaskRule, NodePools, RuleOrigin};

    fn fixture(file: &str) -> String {
        let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).expect("fixture")
    }

    /// `CloudAllocator` sizing with these rules (flag order), checked against `config`.
    fn sizing(config: &IpamConfig, rules: &[&str]) -> Sizing {
        NodePools {
            rules: rules
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    MaskRule::parse(text, RuleOrigin::Flag { index: i + 1 }).expect("rule")
                })
                .collect(),
            ..NodePools::default()
        }
        .sizing(config)
        .expect("rules fit")
    }

    /// Real fixtures under the range allocator and under node-pool rules: the OpenShift masters
    /// sized /25 by role in a /22 that then has room for one /23 worker (assigned, sized,
    /// exhausted), and the AKS Nodes keeping /24s that a rule now sizes /23.
    fn cases() -> Vec<(&'static str, IpamConfig, Sizing)> {
        let range = |cluster: &str, masks: NodeMaskFlags| {
            let config =
                nodeipam_core::config::validate(cluster, "", masks).expect("valid configuration");
            let sizing = Sizing::range_allocator(&config);
            (config, sizing)
        };
        let mut cases = Vec::new();
        for (file, cluster) in [
            (
                "11-mixed-bundle-7nodes-redacted-podcidr.json",
                "10.32.0.0/12",
            ),
            ("03-aks-kubenet-3nodes.json", "10.244.0.0/16"),
            ("05-aws-4nodes-no-podcidr.json", "10.244.0.0/23"),
        ] {
            let (config, sizing) = range(cluster, NodeMaskFlags::default());
            cases.push((file, config, sizing));
        }
        let (config, _) = range(
            "10.128.0.0/22",
            NodeMaskFlags {
                node_cidr_mask_size: Some(23),
                ..NodeMaskFlags::default()
            },
        );
        let masters = sizing(&config, &["node-role.kubernetes.io/master=:ipv4=25"]);
        cases.push((
            "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
            config,
            masters,
        ));
        let (config, _) = range("10.244.0.0/16", NodeMaskFlags::default());
        let pools = sizing(&config, &["agentpool=agentpool:ipv4=23"]);
        cases.push(("03-aks-kubenet-3nodes.json", config, pools));
        let (config, sizing) = range("10.32.0.0/12", NodeMaskFlags::default());
        cases.push((
            "11-mixed-bundle-7nodes-redacted-podcidr.json",
            config,
            sizing.with_node_selector(
                crate::labels::NodeSelector::parse(
                    "beta.kubernetes.io/instance-type notin (s-2vcpu-4gb)",
                )
                .expect("selector"),
            ),
        ));
        cases
    }

    /// `--node-selector` on the mixed support bundle: the Nodes it does not select are `ignore`
    /// (their podCIDRs as written; the kept ones' blocks named as reserved), do not make the exit
    /// status 1, and are left out of the diagnostics; the others are planned as without it. And
    /// the AKS Nodes of another CNI keep their blocks reserved: the pool counts them used.
    #[test]
    fn unselected_nodes_are_shown_as_ignored() {
        let file = "11-mixed-bundle-7nodes-redacted-podcidr.json";
        let nodes = crate::nodelist::parse_nodes(&fixture(file)).expect("parses");
        let config = nodeipam_core::config::validate("10.32.0.0/12", "", NodeMaskFlags::default())
            .expect("valid configuration");
        let selecting = |text: &str| {
            Sizing::range_allocator(&config)
                .with_node_selector(crate::labels::NodeSelector::parse(text).expect("selector"))
        };
        let skip = "spec.podCIDRs[0] \"***HIDDEN***/25\" is not a valid CIDR (not a CIDR: expected address/prefix-length, e.g. 10.244.0.0/16 or fd00:10:244::/56)";
        let report = plan_with_sizing(
            &config,
            selecting("beta.kubernetes.io/instance-type notin (s-2vcpu-4gb)"),
            &nodes,
        )
        .expect("plans");
        let rows: Vec<(&str, &str, Option<&str>)> = report
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.action, n.reason.as_deref()))
            .collect();
        let ignored = Some("not selected by --node-selector");
        assert_eq!(
            rows,
            [
                ("node-a", "assign", None),
                ("biggernode-3i745", "skip", Some(skip)),
                ("pool-yd23sqk7u-3i7i7", "ignore", ignored),
                ("pool-yd23sqk7u-3i7it", "ignore", ignored),
                ("pool-yd23sqk7u-3i7v3", "ignore", ignored),
                ("smallnode-3i74t", "skip", Some(skip)),
                ("ip-172-31-21-92", "keep", None),
            ]
        );
        assert_eq!(report.nodes[2].pod_cidrs, ["***HIDDEN***/25"]);
        // Only the redacted Nodes it serves make it fail; selecting none of them, it succeeds.
        assert!(!report.all_served());
        let others = plan_with_sizing(
            &config,
            selecting(
                "beta.kubernetes.io/instance-type notin (s-2vcpu-4gb,g-8vcpu-32gb,s-1vcpu-2gb)",
            ),
            &nodes,
        )
        .expect("plans");
        assert!(others.all_served(), "{others:?}");
        // The kept Node, not selected (no Node of the bundle is): its block stays reserved.
        let reserved =
            plan_with_sizing(&config, selecting("!kubernetes.io/os"), &nodes).expect("plans");
        let kept = reserved
            .nodes
            .iter()
            .find(|n| n.name == "ip-172-31-21-92")
            .expect("listed");
        assert_eq!(
            (kept.action, kept.reason.as_deref()),
            (
                "ignore",
                Some("not selected by --node-selector; 10.32.0.0/24 stays reserved")
            )
        );
        assert!(reserved.nodes.iter().all(|n| n.action == "ignore"));
        assert_eq!(reserved.pools[0].used, 1);
        // An unselected Node has no diagnostics: the k0s Node written IPv6-first (R10).
        let file = "12-k0s-dualstack-ipv6-primary-partial.json";
        let dual = nodeipam_core::config::validate(
            "10.244.0.0/16,fd00::/104",
            "",
            NodeMaskFlags {
                node_cidr_mask_size_ipv6: Some(110),
                ..NodeMaskFlags::default()
            },
        )
        .expect("valid configuration");
        let findings = |selector: &str| {
            let sizing = Sizing::range_allocator(&dual).with_node_selector(
                crate::labels::NodeSelector::parse(selector).expect("selector"),
            );
            let nodes =
                crate::nodelist::read_nodes(fixture(file).as_bytes(), file, &sizing.label_keys())
                    .expect("reads");
            Planner::with_sizing(&dual, sizing, nodes)
                .expect("planner")
                .findings()
        };
        assert_eq!(findings("kubernetes.io/os=linux").len(), 1);
        assert_eq!(findings("kubernetes.io/os=windows"), []);
    }

    /// The streamed writers print exactly what the collected report prints, on real fixtures
    /// (kept, assigned, skipped and failed Nodes; blocks sized by rules, kept podCIDRs of another
    /// size, the largest free block).
    #[test]
    fn streamed_output_equals_the_collected_report() {
        for (file, config, sizing) in cases() {
            let text = fixture(file);
            let whole = plan_with_sizing(
                &config,
                sizing.clone(),
                &crate::nodelist::parse_nodes(&text).expect("parses"),
            )
            .expect("plans");
            let nodes = crate::nodelist::read_nodes(text.as_bytes(), file, &sizing.label_keys())
                .expect("streams");
            let planner = Planner::with_sizing(&config, sizing, nodes).expect("planner");
            let mut json = Vec::new();
            let served = planner.write_json(&mut json).expect("writes");
            assert_eq!(
                String::from_utf8(json).expect("utf-8"),
                whole.to_json() + "\n",
                "{file}"
            );
            let mut table = Vec::new();
            assert_eq!(planner.write_table(&mut table).expect("writes"), served);
            assert_eq!(
                String::from_utf8(table).expect("utf-8"),
                whole.to_table(),
                "{file}"
            );
            assert_eq!(served, whole.all_served(), "{file}");
        }
    }

    /// [`Allocator::assign_untracked`] decides exactly as `decide` followed by `confirm` (the
    /// plan before it), with per-Node sizes too: every Decision (action, events, metrics) and the
    /// pools after the plan are equal, on the same cases.
    #[test]
    fn untracked_assignments_decide_as_confirmed_ones() {
        let mut sized = 0;
        let mut failed = 0;
        for (file, config, sizing) in cases() {
            let nodes = crate::nodelist::parse_nodes(&fixture(file)).expect("parses");
            let views: Vec<NodeView> = nodes.iter().map(NodeView::from_node).collect();
            let mut tracked = Allocator::with_sizing(&config, sizing.clone()).expect("allocator");
            let mut untracked = Allocator::with_sizing(&config, sizing).expect("allocator");
            let occupied: Vec<NodeView> = views
                .iter()
                .filter(|v| v.has_pod_cidrs())
                .cloned()
                .collect();
            assert_eq!(
                tracked.startup_occupy(&occupied),
                untracked.startup_occupy(&occupied),
                "{file}"
            );
            for view in views.iter().filter(|v| !v.has_pod_cidrs()) {
                let want = tracked.decide(view);
                if let Action::Assign { pod_cidrs, .. } = &want.action {
                    assert!(tracked.confirm(&view.name, pod_cidrs), "{file}");
                    sized += usize::from(pod_cidrs.iter().any(|c| c.prefix_len() == 25));
                }
                failed += usize::from(matches!(want.action, Action::Fail { .. }));
                assert_eq!(
                    untracked.assign_untracked(view),
                    want,
                    "{file} {}",
                    view.name
                );
            }
            assert_eq!(untracked.pool_stats(), tracked.pool_stats(), "{file}");
            assert_eq!(
                untracked.largest_free_blocks(),
                tracked.largest_free_blocks(),
                "{file}"
            );
        }
        assert_eq!(sized, 3, "the three masters get /25s");
        assert!(failed >= 2, "{failed} exhausted Nodes");
    }

    /// The AKS Nodes, the first with its podCIDR stored with leading zeros and the other two
    /// without podCIDRs, on a /23: the first keeps 10.244.0.0/24 (ParseCIDRSloppy's reading, with
    /// the R08 finding), so the second gets the other block and the third none. (Read strictly,
    /// the first was skipped and its block planned for the second Node: one block, two Nodes.)
    #[test]
    fn leading_zeros_pod_cidr_is_kept_and_never_planned_for_another_node() {
        let mut nodes =
            crate::nodelist::parse_nodes(&fixture("03-aks-kubenet-3nodes.json")).expect("parses");
        for (index, node) in nodes.iter_mut().enumerate() {
            let spec = node.spec.get_or_insert_with(Default::default);
            if index == 0 {
                spec.pod_cidr = Some("010.244.000.000/24".to_owned());
                spec.pod_cidrs = Some(vec!["010.244.000.000/24".to_owned()]);
            } else {
                spec.pod_cidr = None;
                spec.pod_cidrs = None;
            }
        }
        let config = nodeipam_core::config::validate("10.244.0.0/23", "", NodeMaskFlags::default())
            .expect("valid");
        let report = plan(&config, &nodes).expect("plans");
        let summary: Vec<(&str, Vec<&str>)> = report
            .nodes
            .iter()
            .map(|n| (n.action, n.pod_cidrs.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            summary,
            [
                ("keep", vec!["10.244.0.0/24"]),
                ("assign", vec!["10.244.1.0/24"]),
                ("fail", vec![]),
            ]
        );
        let views: Vec<NodeView> = nodes.iter().map(NodeView::from_node).collect();
        let findings: Vec<Finding> = views
            .iter()
            .flat_map(|v| crate::diagnostics::node_findings(&config, v))
            .collect();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].code(), "R08");
        assert!(findings[0].message().contains("leading zeros"));
    }

    /// Issue 32 item 6: a block two Nodes' podCIDRs contest goes to the first by name, as in the
    /// controller, not to the first in the file (fixture 03's Nodes listed in reverse).
    #[test]
    fn a_contested_block_goes_to_the_first_node_by_name_whatever_the_file_order() {
        let mut nodes =
            crate::nodelist::parse_nodes(&fixture("03-aks-kubenet-3nodes.json")).expect("parses");
        nodes.reverse();
        let last = nodes.len() - 1;
        for i in [0, last] {
            let spec = nodes[i].spec.get_or_insert_with(Default::default);
            spec.pod_cidr = Some("10.244.0.0/24".to_owned());
            spec.pod_cidrs = Some(vec!["10.244.0.0/24".to_owned()]);
        }
        let config = nodeipam_core::config::validate("10.244.0.0/23", "", NodeMaskFlags::default())
            .expect("valid");
        let report = plan(&config, &nodes).expect("plans");
        let (first, second) = (&report.nodes[last], &report.nodes[0]);
        assert!(first.name < second.name, "{} {}", first.name, second.name);
        assert_eq!(
            (first.action, second.action),
            ("keep", "skip"),
            "{report:?}"
        );
    }

    /// One entry point for a Node's findings (issue 32 item 6): a Node an IPv4-only ClusterCIDR
    /// serves in a dual-stack cluster is not "missing IPv6" in `plan` either (the controller's
    /// events were silent; plan and the start-up warnings read the flag CIDRs alone); one with a
    /// single-family block of the flag CIDRs still is.
    #[test]
    fn a_node_a_single_family_cluster_cidr_serves_is_not_missing_a_family() {
        let mut nodes =
            crate::nodelist::parse_nodes(&fixture("03-aks-kubenet-3nodes.json")).expect("parses");
        for (node, cidr) in nodes.iter_mut().zip(["10.9.3.0/24", "10.244.3.0/24"]) {
            let spec = node.spec.get_or_insert_with(Default::default);
            spec.pod_cidr = Some(cidr.to_owned());
            spec.pod_cidrs = Some(vec![cidr.to_owned()]);
        }
        let config = nodeipam_core::config::validate(
            "10.244.0.0/16,fd00:1::/56",
            "",
            NodeMaskFlags::default(),
        )
        .expect("valid");
        let pools = cluster_cidrs::read_cluster_cidrs(
            r#"{"kind":"ClusterCIDR","metadata":{"name":"v4"},
                "spec":{"perNodeHostBits":8,"ipv4":"10.9.0.0/16"}}"#
                .as_bytes(),
            "v4.json",
        )
        .expect("one ClusterCIDR");
        let input: Vec<InputNode> = nodes.iter().map(|n| InputNode::from_node(n, &[])).collect();
        let planner = Planner::new(&config, input)
            .expect("planner")
            .with_cluster_cidrs(pools);
        let r11: Vec<String> = planner
            .findings()
            .iter()
            .filter(|f| f.code() == "R11")
            .map(Finding::message)
            .collect();
        let name = |i: usize| nodes[i].metadata.name.clone().unwrap_or_default();
        assert!(!r11.iter().any(|m| m.contains(&name(0))), "{r11:?}");
        assert!(r11.iter().any(|m| m.contains(&name(1))), "{r11:?}");
        // What plan and the start-up warnings read before: the flag CIDRs alone, R11 for both.
        let flags_alone = nodes
            .iter()
            .map(NodeView::from_node)
            .flat_map(|v| crate::diagnostics::node_findings(&config, &v))
            .filter(|f| f.code() == "R11")
            .count();
        assert_eq!(flags_alone, r11.len() + 1);
    }

    #[test]
    fn control_characters_are_escaped_in_the_table() {
        let report = PlanReport {
            nodes: vec![PlanNode {
                name: "evil\nnode-b  assign  10.0.0.0/24\u{1b}[2J".to_owned(),
                pod_cidrs: vec!["10.0.0.0/24\n".to_owned()],
                action: "skip",
                reason: Some("x".to_owned()),
            }],
            pools: Vec::new(),
            cluster_cidrs: Vec::new(),
        };
        let table = report.to_table();
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(
            table.contains(r"evil\nnode-b  assign  10.0.0.0/24\u{1b}[2J"),
            "{table}"
        );
        assert!(table.contains(r"10.0.0.0/24\n"), "{table}");
        assert_eq!(escape_controls("plain-name"), Cow::Borrowed("plain-name"));
    }
}
