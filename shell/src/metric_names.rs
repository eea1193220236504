//! Metric names (Prometheus), label names and histogram buckets. The `cidrset` names and the
//! `clusterCIDR` label are kube-controller-manager's (`pkg/controller/nodeipam/ipam/cidrset/metrics.go`),
//! including its `cirdset` misspelling, so existing dashboards keep working.

/// Counter, per cluster CIDR, in grid blocks newly marked used: by an allocation (a pod CIDR of
/// k grid blocks adds k; 1 without node-pool sizes) and by occupying Nodes' existing podCIDRs (at
/// start-up, or a Node written by another party). Upstream's semantics (`cidrset/cidr_set.go`:
/// `AllocateNext` adds one per block it marks, `Occupy` one per block newly used, blocks already
/// used are not counted again), so allocations − releases = the used blocks.
pub const CIDRSET_ALLOCATIONS_TOTAL: &str = "node_ipam_controller_cidrset_cidrs_allocations_total";
/// Counter: grid blocks released, per cluster CIDR.
pub const CIDRSET_RELEASES_TOTAL: &str = "node_ipam_controller_cidrset_cidrs_releases_total";
/// Gauge (0–1): allocated grid blocks / total grid blocks, per cluster CIDR.
pub const CIDRSET_USAGE_CIDRS: &str = "node_ipam_controller_cidrset_usage_cidrs";
/// Histogram: candidate positions skipped per allocation (upstream counts tries; for one-block
/// requests, used blocks), per cluster CIDR.
pub const CIDRSET_ALLOCATION_TRIES_PER_REQUEST: &str =
    "node_ipam_controller_cidrset_allocation_tries_per_request";
/// Gauge: total grid blocks, per cluster CIDR (upstream's spelling, sic).
pub const CIDRSET_MAX_CIDRS: &str = "node_ipam_controller_cirdset_max_cidrs";
/// Gauge: blocks in use per cluster CIDR, counted in grid blocks (the finest node CIDR mask size
/// configured; the node CIDR mask size without node-pool rules): Nodes, pending writes, service
/// CIDRs, skipped Nodes' reserved ranges. Ours; upstream exports only the ratio.
pub const CIDRSET_USED_BLOCKS: &str = "node_ipam_controller_cidrset_used_blocks";
/// Gauge: the grid of each cluster CIDR — the prefix length, in bits, of the blocks the other
/// `cidrset` gauges count. Ours.
pub const CIDRSET_GRID_MASK_SIZE: &str = "node_ipam_controller_cidrset_grid_mask_size";
/// Gauge: grid blocks in the largest entirely free aligned block of each cluster CIDR (a power of
/// two; 0 when full). A Node of mask size `m` can be served while it is at least
/// `2^(grid − m)`. Ours: for an alert before a large-pool Node cannot be served.
pub const CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS: &str =
    "node_ipam_controller_cidrset_largest_free_aligned_blocks";
/// Gauge (0–1): saturation of the write token bucket (1 − remaining burst / burst). Upstream
/// registers it and never sets it.
pub const RATE_LIMITER_USE: &str = "node_ipam_controller_rate_limiter_use";
/// Gauge: Node names waiting in the work queue.
pub const WORKQUEUE_DEPTH: &str = "node_ipam_controller_workqueue_depth";
/// Histogram, seconds: how long one work-queue item takes, from the worker taking the Node name
/// to its reconcile being done (decision, write, events). client-go's `workqueue_work_duration_seconds`
/// (same meaning and buckets, [`WORK_DURATION_BUCKETS`]), named in our family.
pub const WORKQUEUE_WORK_DURATION_SECONDS: &str =
    "node_ipam_controller_workqueue_work_duration_seconds";
/// Counter: reconciles re-queued with backoff (exhausted pool, failed patch, API error).
pub const WORKQUEUE_RETRIES_TOTAL: &str = "node_ipam_controller_workqueue_retries_total";
/// Counter: Nodes skipped because their podCIDRs could not be occupied, or (without podCIDRs)
/// their node CIDR mask label cannot be used, by `reason`.
pub const SKIPPED_NODES_TOTAL: &str = "node_ipam_controller_skipped_nodes_total";
/// Gauge: Nodes currently skipped (their podCIDRs could not be occupied).
pub const SKIPPED_NODES: &str = "node_ipam_controller_skipped_nodes";
/// Counter: allocation attempts that found a cluster CIDR exhausted, per cluster CIDR.
pub const CIDRSET_EXHAUSTED_TOTAL: &str = "node_ipam_controller_cidrset_exhausted_total";
/// Counter: failed PATCHes of `spec.podCIDR(s)`, by `error` (an [`crate::Error::metric_label`]
/// or an HTTP status class).
pub const PATCH_FAILURES_TOTAL: &str = "node_ipam_controller_patch_failures_total";
/// Gauge, with leader election only: 1 while this replica holds the Lease named by the `name`
/// label, 0 while it stands by (or after it stopped leading). The name and label are client-go's
/// leader-election metric as kube-controller-manager exports it, so a dashboard or alert written
/// for kcm ("exactly one replica at 1") works unchanged.
pub const LEADER_ELECTION_MASTER_STATUS: &str = "leader_election_master_status";
/// Counter: events about Nodes not written, by `reason`: `spam_filter` (the Node's per-object
/// spam filter, client-go's 25 at once then one per 5 minutes) or `queue_full` (1,000 events
/// already waiting to be written). Ours.
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

/// Buckets of [`CIDRSET_ALLOCATION_TRIES_PER_REQUEST`] (upstream's exponential 1×5^n, n < 5).
pub const ALLOCATION_TRIES_BUCKETS: [f64; 5] = [1.0, 5.0, 25.0, 125.0, 625.0];
