//! `nodeipam-controller plan`: the controller's start-up occupy and allocation, offline, over a
//! NodeList, in list order (so results are reproducible).
//!
//! JSON output (`--output json`), exactly:
//! `{"nodes":[{"name":…,"podCIDRs":[…],"action":"keep"|"assign"|"skip"|"fail","reason":null|"…"}],
//!   "pools":[{"clusterCIDR":…,"nodeMaskSize":…,"capacity":…,"used":…,"free":…,
//!   "largestFreeBlock":null|"…"}]}`
//! where `podCIDRs` is what the Node has (keep, skip) or would get (assign), empty for fail;
//! `capacity`/`used`/`free` count node blocks after the plan (service CIDRs and skipped Nodes'
//! reserved ranges count as used) — with node-pool rules, grid blocks of `nodeMaskSize` (the
//! finest configured size); `largestFreeBlock` is the largest entirely free aligned block left.
//! With node-pool rules, `reason` also says which rule or label sized an assigned block, and
//! names kept podCIDRs whose size differs from what their labels select now (they keep them:
//! podCIDRs cannot change once set).

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Node;
use nodeipam_core::IpamConfig;
use serde::Serialize;

use crate::Error;
use crate::node_pools::{MaskSource, Sizing};
use crate::reconcile::{Action, Allocator, NodeView};

/// What `plan` says about one Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanNode {
    /// `metadata.name`.
    pub name: String,
    /// CIDR texts: kept or assigned (canonical), or as written on a skipped Node.
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    /// `keep`, `assign`, `skip` or `fail`.
    pub action: &'static str,
    /// Why (skip, fail), else `None`.
    pub reason: Option<String>,
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
    /// One entry per cluster CIDR, flag order.
    pub pools: Vec<PlanPool>,
}

impl PlanReport {
    /// Whether every Node is kept or assigned (exit status 0).
    pub fn all_served(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.action == "keep" || n.action == "assign")
    }

    /// The JSON text (one line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// A human-readable table: Nodes, then pools.
    pub fn to_table(&self) -> String {
        let name_width = self
            .nodes
            .iter()
            .map(|n| n.name.len())
            .chain([4])
            .max()
            .unwrap_or(4);
        let cidr_texts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                if n.pod_cidrs.is_empty() {
                    "-".to_owned()
                } else {
                    n.pod_cidrs.join(",")
                }
            })
            .collect();
        let cidr_width = cidr_texts
            .iter()
            .map(String::len)
            .chain([8])
            .max()
            .unwrap_or(8);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:name_width$}  {:6}  {:cidr_width$}  REASON",
            "NODE", "ACTION", "PODCIDRS"
        );
        for (node, cidrs) in self.nodes.iter().zip(&cidr_texts) {
            let _ = writeln!(
                out,
                "{:name_width$}  {:6}  {:cidr_width$}  {}",
                node.name,
                node.action,
                cidrs,
                node.reason.as_deref().unwrap_or("-")
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:24}  {:8}  {:>10}  {:>10}  {:>10}  LARGEST FREE",
            "CLUSTER CIDR", "NODEMASK", "CAPACITY", "USED", "FREE"
        );
        for pool in &self.pools {
            let _ = writeln!(
                out,
                "{:24}  {:8}  {:>10}  {:>10}  {:>10}  {}",
                pool.cluster_cidr,
                format!("/{}", pool.node_mask_size),
                pool.capacity,
                pool.used,
                pool.free,
                pool.largest_free_block.as_deref().unwrap_or("-")
            );
        }
        out
    }
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
/// [`crate::node_pools::NodePools::sizing`]), as the controller applies them.
///
/// # Errors
/// [`Error::Pool`] if the configuration leaves a cluster CIDR no free block.
pub fn plan_with_sizing(
    config: &IpamConfig,
    sizing: Sizing,
    nodes: &[Node],
) -> Result<PlanReport, Error> {
    let mut allocator = Allocator::with_sizing(config, sizing).map_err(Error::Pool)?;
    let views: Vec<NodeView> = nodes.iter().map(NodeView::from_node).collect();
    let mut startup = allocator.startup_occupy(&views).into_iter();
    let mut entries = Vec::with_capacity(views.len());
    for view in &views {
        let decision = if view.has_pod_cidrs() {
            match startup.next() {
                Some((_, decision)) => decision,
                None => allocator.decide(view),
            }
        } else {
            let decision = allocator.decide(view);
            if let Action::Assign { pod_cidrs } = &decision.action {
                allocator.confirm(&view.name, pod_cidrs);
            }
            decision
        };
        let note = size_note(&allocator, view, &decision.action);
        let mut planned = entry(view, decision.action);
        if planned.reason.is_none() {
            planned.reason = note;
        }
        entries.push(planned);
    }
    let largest = allocator.largest_free_blocks();
    let pools = allocator
        .pool_stats()
        .into_iter()
        .zip(largest)
        .map(|(s, (_, free))| PlanPool {
            cluster_cidr: s.cluster_cidr.to_string(),
            node_mask_size: s.node_mask_size,
            capacity: s.capacity,
            used: s.used,
            free: s.free,
            largest_free_block: free.map(|f| f.cidr.to_string()),
        })
        .collect();
    Ok(PlanReport {
        nodes: entries,
        pools,
    })
}

/// With node-pool sizes: which rule or label sized an assigned block (`None` for the default
/// sizes), or which kept podCIDRs differ from the size the Node's labels select now.
fn size_note(allocator: &Allocator, view: &NodeView, action: &Action) -> Option<String> {
    match action {
        Action::Keep { pod_cidrs } => allocator.size_mismatch(view, pod_cidrs),
        Action::Assign { pod_cidrs } => {
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

fn entry(view: &NodeView, action: Action) -> PlanNode {
    let texts = |cidrs: &[nodeipam_core::Cidr]| cidrs.iter().map(ToString::to_string).collect();
    let (pod_cidrs, action, reason) = match action {
        Action::Keep { pod_cidrs } => (texts(&pod_cidrs), "keep", None),
        Action::Assign { pod_cidrs } => (texts(&pod_cidrs), "assign", None),
        Action::Skip { reason } => (view.raw_pod_cidrs(), "skip", Some(reason)),
        Action::Fail { reason } => (Vec::new(), "fail", Some(reason)),
        Action::Released { .. } => (Vec::new(), "fail", Some("released".to_owned())),
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
