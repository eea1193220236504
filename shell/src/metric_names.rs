//! Every metric the controller exports, described once: [`METRICS`] (name, kind, unit, labels,
//! help text, where name and help come from, buckets, meaning). Registration iterates it
//! ([`crate::metrics::describe`], [`crate::metrics::prometheus_builder`]) and docs/operations.md's
//! metric table is rendered from it ([`operations_table`], checked by a test). The constants
//! below are the names the code records under.
//!
//! The `cidrset` names and the `clusterCIDR` label are kube-controller-manager's
//! (`pkg/controller/nodeipam/ipam/cidrset/metrics.go` at the pinned v1.36.3), including its
//! `cirdset` misspelling, so existing dashboards keep working.

use std::fmt::Write as _;

/// `node_ipam_controller_cidrset_cidrs_allocations_total` (see [`METRICS`]).
pub const CIDRSET_ALLOCATIONS_TOTAL: &str = "node_ipam_controller_cidrset_cidrs_allocations_total";
/// `node_ipam_controller_cidrset_cidrs_releases_total` (see [`METRICS`]).
pub const CIDRSET_RELEASES_TOTAL: &str = "node_ipam_controller_cidrset_cidrs_releases_total";
/// `node_ipam_controller_cidrset_usage_cidrs` (see [`METRICS`]).
pub const CIDRSET_USAGE_CIDRS: &str = "node_ipam_controller_cidrset_usage_cidrs";
/// `node_ipam_controller_cidrset_allocation_tries_per_request` (see [`METRICS`]).
pub const CIDRSET_ALLOCATION_TRIES_PER_REQUEST: &str =
    "node_ipam_controller_cidrset_allocation_tries_per_request";
/// `node_ipam_controller_cirdset_max_cidrs`, upstream's spelling (see [`METRICS`]).
pub const CIDRSET_MAX_CIDRS: &str = "node_ipam_controller_cirdset_max_cidrs";
/// `node_ipam_controller_cidrset_used_blocks` (see [`METRICS`]).
pub const CIDRSET_USED_BLOCKS: &str = "node_ipam_controller_cidrset_used_blocks";
/// `node_ipam_controller_cidrset_grid_mask_size` (see [`METRICS`]).
pub const CIDRSET_GRID_MASK_SIZE: &str = "node_ipam_controller_cidrset_grid_mask_size";
/// `node_ipam_controller_cidrset_largest_free_aligned_blocks` (see [`METRICS`]).
pub const CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS: &str =
    "node_ipam_controller_cidrset_largest_free_aligned_blocks";
/// `node_ipam_controller_rate_limiter_use` (see [`METRICS`]).
pub const RATE_LIMITER_USE: &str = "node_ipam_controller_rate_limiter_use";
/// `node_ipam_controller_workqueue_depth` (see [`METRICS`]).
pub const WORKQUEUE_DEPTH: &str = "node_ipam_controller_workqueue_depth";
/// `node_ipam_controller_workqueue_work_duration_seconds` (see [`METRICS`]).
pub const WORKQUEUE_WORK_DURATION_SECONDS: &str =
    "node_ipam_controller_workqueue_work_duration_seconds";
/// `node_ipam_controller_workqueue_retries_total` (see [`METRICS`]).
pub const WORKQUEUE_RETRIES_TOTAL: &str = "node_ipam_controller_workqueue_retries_total";
/// `node_ipam_controller_skipped_nodes_total` (see [`METRICS`]).
pub const SKIPPED_NODES_TOTAL: &str = "node_ipam_controller_skipped_nodes_total";
/// `node_ipam_controller_skipped_nodes` (see [`METRICS`]).
pub const SKIPPED_NODES: &str = "node_ipam_controller_skipped_nodes";
/// `node_ipam_controller_cidrset_exhausted_total` (see [`METRICS`]).
pub const CIDRSET_EXHAUSTED_TOTAL: &str = "node_ipam_controller_cidrset_exhausted_total";
/// `node_ipam_controller_patch_failures_total` (see [`METRICS`]).
pub const PATCH_FAILURES_TOTAL: &str = "node_ipam_controller_patch_failures_total";
/// `leader_election_master_status`, client-go's (see [`METRICS`]).
pub const LEADER_ELECTION_MASTER_STATUS: &str = "leader_election_master_status";
/// `node_ipam_controller_events_dropped_total` (see [`METRICS`]).
pub const EVENTS_DROPPED_TOTAL: &str = "node_ipam_controller_events_dropped_total";

/// Label: the Lease name (`--leader-elect-resource-name`) of [`LEADER_ELECTION_MASTER_STATUS`].
pub const LABEL_NAME: &str = "name";
/// Label: the cluster CIDR, canonical text (`10.244.0.0/16`).
pub const LABEL_CLUSTER_CIDR: &str = "clusterCIDR";
/// Label: why a Node was skipped (`invalid`, `out_of_range`, `conflict`, `mask_label`), or why an
/// event was dropped (`spam_filter`, `queue_full`).
pub const LABEL_REASON: &str = "reason";
/// Label: a bounded error kind.
pub const LABEL_ERROR: &str = "error";

/// Buckets of [`WORKQUEUE_WORK_DURATION_SECONDS`], seconds: client-go's workqueue metrics
/// (`k8s.io/component-base/metrics/prometheus/workqueue`: `ExponentialBuckets(10e-9, 10, 10)`),
/// 10 ns to 10 s.
pub const WORK_DURATION_BUCKETS: [f64; 10] =
    [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Buckets of [`CIDRSET_ALLOCATION_TRIES_PER_REQUEST`] (upstream's `ExponentialBuckets(1, 5, 5)`).
pub const ALLOCATION_TRIES_BUCKETS: [f64; 5] = [1.0, 5.0, 25.0, 125.0, 625.0];

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets ([`Metric::buckets`]).
    Histogram,
}

impl Kind {
    /// The Prometheus `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Where a metric's name and help text come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Upstream's name, and upstream's help text copied; the field names the source.
    Upstream(&'static str),
    /// Upstream's name, our help text; the fields name the source and why the help differs.
    UpstreamName(&'static str, &'static str),
    /// Ours, name and help.
    Ours,
}

/// One exported metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// The Prometheus name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// What one unit of the value is (`grid blocks`, `seconds`, `ratio 0–1`, …).
    pub unit: &'static str,
    /// Label names (values described in the meaning).
    pub labels: &'static [&'static str],
    /// The `# HELP` text exported.
    pub help: &'static str,
    /// Where name and help come from.
    pub origin: Origin,
    /// Histogram bucket upper bounds (empty for counters and gauges).
    pub buckets: &'static [f64],
    /// What it counts or shows, for operators (docs/operations.md).
    pub meaning: &'static str,
}

const CIDRSET: &str = "kube-controller-manager's `cidrset` metrics";
const CLUSTER_CIDR: &[&str] = &[LABEL_CLUSTER_CIDR];

/// Every metric the controller exports, in the order docs/operations.md lists them.
pub const METRICS: [Metric; 18] = [
    Metric {
        name: CIDRSET_ALLOCATIONS_TOTAL,
        kind: Kind::Counter,
        unit: "grid blocks",
        labels: CLUSTER_CIDR,
        help: "Counter measuring total number of CIDR allocations.",
        origin: Origin::Upstream(CIDRSET),
        buckets: &[],
        meaning: "grid blocks newly marked used: by an allocation (a pod CIDR of k grid blocks adds k; 1 without node-pool sizes) and by occupying Nodes' existing podCIDRs (at start-up, or written by another party) — upstream's `CidrSet` counts occupied podCIDRs the same way (`AllocateNext` one per block, `Occupy` one per block newly marked used, never twice); allocations − releases = used blocks",
    },
    Metric {
        name: CIDRSET_RELEASES_TOTAL,
        kind: Kind::Counter,
        unit: "grid blocks",
        labels: CLUSTER_CIDR,
        help: "Counter measuring total number of CIDR releases.",
        origin: Origin::Upstream(CIDRSET),
        buckets: &[],
        meaning: "grid blocks freed (a Node deleted, a write that can never apply)",
    },
    Metric {
        name: CIDRSET_USAGE_CIDRS,
        kind: Kind::Gauge,
        unit: "ratio 0–1",
        labels: CLUSTER_CIDR,
        help: "Gauge measuring percentage of allocated CIDRs.",
        origin: Origin::Upstream(CIDRSET),
        buckets: &[],
        meaning: "used grid blocks / all grid blocks (a ratio, as upstream sets it, despite its help text)",
    },
    Metric {
        name: CIDRSET_MAX_CIDRS,
        kind: Kind::Gauge,
        unit: "grid blocks",
        labels: CLUSTER_CIDR,
        help: "Maximum number of CIDRs that can be allocated.",
        origin: Origin::Upstream(CIDRSET),
        buckets: &[],
        meaning: "grid blocks in the cluster CIDR (sic: upstream's spelling `cirdset`)",
    },
    Metric {
        name: CIDRSET_ALLOCATION_TRIES_PER_REQUEST,
        kind: Kind::Histogram,
        unit: "blocks",
        labels: CLUSTER_CIDR,
        help: "Number of used blocks skipped per CIDR allocation.",
        origin: Origin::UpstreamName(
            CIDRSET,
            "upstream's help text, \"Number of endpoints added on each Service sync\", belongs to another metric",
        ),
        buckets: &ALLOCATION_TRIES_BUCKETS,
        meaning: "candidate positions skipped per allocation (for one-block requests: used blocks; upstream counts tries)",
    },
    Metric {
        name: RATE_LIMITER_USE,
        kind: Kind::Gauge,
        unit: "ratio 0–1",
        labels: &[],
        help: "Saturation of the write token bucket (1 - remaining burst / burst).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "saturation of the write token bucket (`--kube-api-qps`/`--kube-api-burst`); kube-controller-manager v1.36.3 exports no metric of this name",
    },
    Metric {
        name: CIDRSET_EXHAUSTED_TOTAL,
        kind: Kind::Counter,
        unit: "allocation attempts",
        labels: CLUSTER_CIDR,
        help: "Allocations that found the cluster CIDR exhausted.",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "allocations that found the cluster CIDR full (a Node waits)",
    },
    Metric {
        name: CIDRSET_USED_BLOCKS,
        kind: Kind::Gauge,
        unit: "grid blocks",
        labels: CLUSTER_CIDR,
        help: "Blocks in use per cluster CIDR, in grid blocks (the finest configured node CIDR mask size).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "blocks in use: Nodes (served or not), pending writes, service CIDRs, skipped Nodes' reserved ranges (upstream exports only the ratio)",
    },
    Metric {
        name: CIDRSET_GRID_MASK_SIZE,
        kind: Kind::Gauge,
        unit: "bits",
        labels: CLUSTER_CIDR,
        help: "Prefix length (bits) of the grid blocks the cidrset gauges count.",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "prefix length of the grid blocks the `cidrset` metrics count: the finest node CIDR mask size configured (without node-pool rules, the node CIDR mask size)",
    },
    Metric {
        name: CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS,
        kind: Kind::Gauge,
        unit: "grid blocks",
        labels: CLUSTER_CIDR,
        help: "Grid blocks in the largest entirely free aligned block (0 when full); a Node of mask size m needs 2^(grid - m).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "grid blocks in the largest entirely free aligned block (0 when full; refreshed every 5 s); a Node of mask size `m` fits while it is at least `2^(grid − m)`",
    },
    Metric {
        name: PATCH_FAILURES_TOTAL,
        kind: Kind::Counter,
        unit: "PATCHes",
        labels: &[LABEL_ERROR],
        help: "PATCHes of spec.podCIDR(s) that did not succeed, by outcome (label error).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "failed PATCHes of `spec.podCIDR(s)`, `error`: `unknown_outcome` (timeout, dropped connection, 5xx — the block stays reserved), `too_many_requests`, `conflict`, `refused`, `not_sent`, `not_found`, `pod_cidrs_already_set`, `node_replaced`, `invalid`",
    },
    Metric {
        name: WORKQUEUE_DEPTH,
        kind: Kind::Gauge,
        unit: "Node names",
        labels: &[],
        help: "Node names waiting in the work queue.",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "Node names waiting in the work queue",
    },
    Metric {
        name: WORKQUEUE_WORK_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: "seconds",
        labels: &[],
        help: "How long in seconds processing an item from workqueue takes.",
        origin: Origin::Upstream(
            "client-go's workqueue metric `workqueue_work_duration_seconds` (k8s.io/component-base), named in our family",
        ),
        buckets: &WORK_DURATION_BUCKETS,
        meaning: "one work-queue item, from a worker taking the Node name to its reconcile being done (decision, PATCH, events)",
    },
    Metric {
        name: WORKQUEUE_RETRIES_TOTAL,
        kind: Kind::Counter,
        unit: "reconciles",
        labels: &[],
        help: "Reconciles re-queued with a delay (backoff, Retry-After, a waiting Node's safety re-check).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "reconciles re-queued with a delay: backoff after an API error, a server's `Retry-After`, a waiting Node's safety re-check (10 × the 30 s retry delay cap: every 5 minutes)",
    },
    Metric {
        name: EVENTS_DROPPED_TOTAL,
        kind: Kind::Counter,
        unit: "events",
        labels: &[LABEL_REASON],
        help: "Events about Nodes not written, by reason (spam_filter: per-Node spam filter; queue_full: event queue full).",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "events about Nodes not written, `reason`: `spam_filter` (held back by the Node's spam filter, client-go's: 25 at once, then one per 5 minutes per Node) or `queue_full` (1,000 already queued)",
    },
    Metric {
        name: SKIPPED_NODES,
        kind: Kind::Gauge,
        unit: "Nodes",
        labels: &[],
        help: "Nodes currently skipped.",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "served Nodes currently skipped (their podCIDRs could not be occupied); Nodes `--node-selector` does not select are never counted",
    },
    Metric {
        name: SKIPPED_NODES_TOTAL,
        kind: Kind::Counter,
        unit: "Nodes",
        labels: &[LABEL_REASON],
        help: "Nodes skipped because their podCIDRs could not be occupied or their mask label cannot be used.",
        origin: Origin::Ours,
        buckets: &[],
        meaning: "Nodes skipped, `reason`: `invalid`, `out_of_range`, `conflict`, `mask_label` (no podCIDRs and an unusable mask label)",
    },
    Metric {
        name: LEADER_ELECTION_MASTER_STATUS,
        kind: Kind::Gauge,
        unit: "0 or 1",
        labels: &[LABEL_NAME],
        help: "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
        origin: Origin::Upstream(
            "client-go's leader-election metric as kube-controller-manager exports it (k8s.io/component-base)",
        ),
        buckets: &[],
        meaning: "with leader election: 1 while this replica holds the Lease `name` (`--leader-elect-resource-name`; including a stopping leader's wait for its writes in doubt), 0 while it stands by or after it stopped leading. Alert on `sum by (name) (…) != 1`",
    },
];

/// docs/operations.md's metric table (Markdown, one row per [`METRICS`] entry, in order).
pub fn operations_table() -> String {
    let mut out = String::from(
        "| metric | type | unit | labels | meaning | help text | name and help from |\n|---|---|---|---|---|---|---|\n",
    );
    for metric in &METRICS {
        let kind = if metric.buckets.is_empty() {
            metric.kind.as_str().to_owned()
        } else {
            let buckets: Vec<String> = metric.buckets.iter().map(|b| format!("{b}")).collect();
            format!("{} ({})", metric.kind.as_str(), buckets.join(", "))
        };
        let labels = if metric.labels.is_empty() {
            "—".to_owned()
        } else {
            metric
                .labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let origin = match metric.origin {
            Origin::Upstream(source) => format!("upstream's name and help text: {source}"),
            Origin::UpstreamName(source, why) => {
                format!("upstream's name ({source}); our help text: {why}")
            }
            Origin::Ours => "ours".to_owned(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {kind} | {} | {labels} | {} | {} | {origin} |",
            metric.name, metric.unit, metric.meaning, metric.help
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name once; histograms and only they have buckets; counters end in `_total`.
    #[test]
    fn the_table_is_consistent() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
        for metric in &METRICS {
            assert_eq!(
                metric.kind == Kind::Histogram,
                !metric.buckets.is_empty(),
                "{}",
                metric.name
            );
            assert_eq!(
                metric.kind == Kind::Counter,
                metric.name.ends_with("_total"),
                "{}",
                metric.name
            );
        }
    }

    /// docs/operations.md shows the table between its markers, exactly as rendered.
    #[test]
    fn the_operator_guide_shows_this_table() {
        let path = format!("{}/../docs/operations.md", env!("CARGO_MANIFEST_DIR"));
        let guide = std::fs::read_to_string(path).expect("docs/operations.md");
        let table = guide
            .split("<!-- metrics:begin -->\n")
            .nth(1)
            .and_then(|rest| rest.split("<!-- metrics:end -->").next())
            .expect("docs/operations.md has the metric table markers");
        assert!(
            table == operations_table(),
            "docs/operations.md's metric table is out of date; replace it with:\n{}",
            operations_table()
        );
    }
}
