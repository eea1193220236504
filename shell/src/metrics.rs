//! Applying [`MetricEvent`]s and pool gauges to the `metrics` facade, and installing the
//! Prometheus exporter. Names and buckets: [`crate::metric_names`].

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use nodeipam_core::{Cidr, FreeBlock};

use crate::Error;
use crate::metric_names as m;
use crate::reconcile::{MetricEvent, PoolStats};

/// A Prometheus builder with our histogram buckets (allocation tries: 1, 5, 25, 125, 625; work
/// duration: client-go's, 10 ns to 10 s). Tests use `prometheus_builder().build_recorder()` and
/// render its handle without a port.
pub fn prometheus_builder() -> PrometheusBuilder {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in [
        (
            m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST,
            &m::ALLOCATION_TRIES_BUCKETS[..],
        ),
        (
            m::WORKQUEUE_WORK_DURATION_SECONDS,
            &m::WORK_DURATION_BUCKETS[..],
        ),
    ] {
        builder = match builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets) {
            Ok(builder) => builder,
            // Only fails for an empty bucket list, which ours are not.
            Err(_) => PrometheusBuilder::new(),
        };
    }
    builder
}

/// Installs the process-wide recorder; its handle renders the Prometheus text (served by the
/// controller's own `/metrics` route, see `controller::metrics_router`).
///
/// # Errors
/// [`Error::Metrics`] if a recorder is installed already.
pub fn install_recorder() -> Result<PrometheusHandle, Error> {
    let recorder = prometheus_builder().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| Error::Metrics(e.to_string()))?;
    describe();
    Ok(handle)
}

/// Registers help texts for our metrics with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        m::CIDRSET_ALLOCATIONS_TOTAL,
        "Counter measuring total number of CIDR allocations."
    );
    describe_counter!(
        m::CIDRSET_RELEASES_TOTAL,
        "Counter measuring total number of CIDR releases."
    );
    describe_gauge!(
        m::CIDRSET_USAGE_CIDRS,
        "Gauge measuring percentage of allocated CIDRs."
    );
    describe_histogram!(
        m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST,
        "Number of used blocks skipped per CIDR allocation."
    );
    describe_gauge!(
        m::CIDRSET_MAX_CIDRS,
        "Maximum number of CIDRs that can be allocated."
    );
    describe_gauge!(
        m::CIDRSET_USED_BLOCKS,
        "Blocks in use per cluster CIDR, in grid blocks (the finest configured node CIDR mask size)."
    );
    describe_gauge!(
        m::CIDRSET_GRID_MASK_SIZE,
        "Prefix length (bits) of the grid blocks the cidrset gauges count."
    );
    describe_gauge!(
        m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS,
        "Grid blocks in the largest entirely free aligned block (0 when full); a Node of mask size m needs 2^(grid - m)."
    );
    describe_gauge!(
        m::RATE_LIMITER_USE,
        "A metric measuring the saturation of the rate limiter."
    );
    describe_gauge!(m::WORKQUEUE_DEPTH, "Node names waiting in the work queue.");
    describe_histogram!(
        m::WORKQUEUE_WORK_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "How long in seconds processing an item from workqueue takes."
    );
    describe_counter!(
        m::WORKQUEUE_RETRIES_TOTAL,
        "Reconciles re-queued with a delay (backoff, Retry-After, a waiting Node's safety re-check)."
    );
    describe_counter!(
        m::SKIPPED_NODES_TOTAL,
        "Nodes skipped because their podCIDRs could not be occupied or their mask label cannot be used."
    );
    describe_gauge!(m::SKIPPED_NODES, "Nodes currently skipped.");
    describe_counter!(
        m::CIDRSET_EXHAUSTED_TOTAL,
        "Allocations that found the cluster CIDR exhausted."
    );
    describe_gauge!(
        m::LEADER_ELECTION_MASTER_STATUS,
        "1 while this replica holds the Lease given by label name, 0 while it stands by."
    );
    describe_counter!(
        m::EVENTS_DROPPED_TOTAL,
        "Events about Nodes not written, by reason (spam_filter: per-Node spam filter; queue_full: event queue full)."
    );
    describe_counter!(
        m::PATCH_FAILURES_TOTAL,
        "PATCHes of spec.podCIDR(s) that did not succeed, by outcome (label error)."
    );
}

/// Sets [`m::LEADER_ELECTION_MASTER_STATUS`] for the Lease `lease_name`: 1 if `leading`, else 0.
pub fn set_leader_status(lease_name: &str, leading: bool) {
    metrics::gauge!(m::LEADER_ELECTION_MASTER_STATUS, m::LABEL_NAME => lease_name.to_owned())
        .set(if leading { 1.0 } else { 0.0 });
}

/// Records one metric update.
pub fn apply(event: &MetricEvent) {
    match *event {
        MetricEvent::Allocated {
            cluster_cidr,
            tries,
            blocks,
        } => {
            let label = cluster_cidr.to_string();
            counter!(m::CIDRSET_ALLOCATIONS_TOTAL, m::LABEL_CLUSTER_CIDR => label.clone())
                .increment(u64::from(blocks));
            histogram!(m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST, m::LABEL_CLUSTER_CIDR => label)
                .record(f64::from(tries));
        }
        MetricEvent::Occupied {
            cluster_cidr,
            blocks,
        } => {
            counter!(m::CIDRSET_ALLOCATIONS_TOTAL, m::LABEL_CLUSTER_CIDR => cluster_cidr.to_string())
                .increment(u64::from(blocks));
        }
        MetricEvent::Released {
            cluster_cidr,
            blocks,
        } => {
            counter!(m::CIDRSET_RELEASES_TOTAL, m::LABEL_CLUSTER_CIDR => cluster_cidr.to_string())
                .increment(u64::from(blocks));
        }
        MetricEvent::Exhausted { cluster_cidr } => {
            counter!(m::CIDRSET_EXHAUSTED_TOTAL, m::LABEL_CLUSTER_CIDR => cluster_cidr.to_string())
                .increment(1);
        }
        MetricEvent::NodeSkipped { kind } => {
            counter!(m::SKIPPED_NODES_TOTAL, m::LABEL_REASON => kind.metric_label()).increment(1);
        }
        MetricEvent::PatchFailed { error } => {
            counter!(m::PATCH_FAILURES_TOTAL, m::LABEL_ERROR => error).increment(1);
        }
    }
}

/// Sets the per-cluster-CIDR gauges (usage 0–1, max blocks, used blocks, grid — all in grid
/// blocks) and the skipped-Node gauge.
pub fn set_pool_gauges(stats: &[PoolStats], skipped_nodes: usize) {
    for s in stats {
        let label = s.cluster_cidr.to_string();
        let usage = if s.capacity == 0 {
            0.0
        } else {
            f64::from(s.used) / f64::from(s.capacity)
        };
        gauge!(m::CIDRSET_USAGE_CIDRS, m::LABEL_CLUSTER_CIDR => label.clone()).set(usage);
        gauge!(m::CIDRSET_MAX_CIDRS, m::LABEL_CLUSTER_CIDR => label.clone())
            .set(f64::from(s.capacity));
        gauge!(m::CIDRSET_USED_BLOCKS, m::LABEL_CLUSTER_CIDR => label.clone())
            .set(f64::from(s.used));
        gauge!(m::CIDRSET_GRID_MASK_SIZE, m::LABEL_CLUSTER_CIDR => label)
            .set(f64::from(s.node_mask_size));
    }
    gauge!(m::SKIPPED_NODES).set(skipped_nodes as f64);
}

/// Sets the largest-free-block gauge of each cluster CIDR (grid blocks; 0 when full), from
/// [`crate::reconcile::Allocator::largest_free_blocks`].
pub fn set_largest_free_gauges(largest: &[(Cidr, Option<FreeBlock>)]) {
    for (cluster_cidr, free) in largest {
        let blocks = free.map_or(0, |f| f.block_count);
        gauge!(m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS, m::LABEL_CLUSTER_CIDR => cluster_cidr.to_string())
            .set(f64::from(blocks));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node_pools::{MaskRule, NodePools, RuleOrigin};
    use crate::reconcile::{Allocator, NodeView};

    /// 10.244.0.0/22 on a /26 grid: `agentpool=big` Nodes get /23s, `agentpool=small` /26s.
    fn node_pool_allocator() -> Allocator {
        let config =
            nodeipam_core::config::validate("10.244.0.0/22", "", Default::default()).unwrap();
        let pools = NodePools {
            rules: vec![
                MaskRule::parse("agentpool=big:ipv4=23", RuleOrigin::Flag { index: 1 }).unwrap(),
                MaskRule::parse("agentpool=small:ipv4=26", RuleOrigin::Flag { index: 2 }).unwrap(),
            ],
            ..NodePools::default()
        };
        Allocator::with_sizing(&config, pools.sizing(&config).unwrap()).unwrap()
    }

    /// A Node of node pool `pool`.
    fn node(name: &str, pool: &str) -> NodeView {
        NodeView {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            labels: [("agentpool".to_owned(), pool.to_owned())].into(),
            ..NodeView::default()
        }
    }

    /// The value of metric `name` for the cluster CIDR 10.244.0.0/22, as rendered.
    fn rendered_value(handle: &PrometheusHandle, name: &str) -> Option<f64> {
        handle.render().lines().find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix("{clusterCIDR=\"10.244.0.0/22\"} ")?
                .parse()
                .ok()
        })
    }

    /// The pool gauges of a node-pool cluster count grid blocks, and the largest free block
    /// shrinks as a large-pool Node is served.
    #[test]
    fn pool_gauges_count_grid_blocks() {
        let recorder = prometheus_builder().build_recorder();
        let handle = recorder.handle();
        let _guard = metrics::set_default_local_recorder(&recorder);
        let mut allocator = node_pool_allocator();
        let value = |name: &str| rendered_value(&handle, name);
        set_largest_free_gauges(&allocator.largest_free_blocks());
        assert_eq!(value(m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS), Some(16.0));
        for (name, pool) in [("small-1", "small"), ("big-1", "big")] {
            allocator.decide(&node(name, pool));
        }
        set_pool_gauges(&allocator.pool_stats(), 0);
        set_largest_free_gauges(&allocator.largest_free_blocks());
        // A /26 (1 block) from the cursor at 10.244.0.0, a /23 (8 blocks) first fit at 10.244.2.0.
        assert_eq!(value(m::CIDRSET_USED_BLOCKS), Some(9.0));
        assert_eq!(value(m::CIDRSET_MAX_CIDRS), Some(16.0));
        assert_eq!(value(m::CIDRSET_GRID_MASK_SIZE), Some(26.0));
        assert_eq!(value(m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS), Some(4.0));
        allocator.decide(&node("big-2", "big"));
        set_largest_free_gauges(&allocator.largest_free_blocks());
        assert_eq!(
            value(m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS),
            Some(4.0),
            "no second /23 fits: the largest free block is still the /24 at 10.244.1.0"
        );
    }

    /// `cidrs_allocations_total` counts grid blocks newly marked used, as upstream's `CidrSet`
    /// does (`AllocateNext` one per block, `Occupy` one per block newly used), so allocations
    /// minus releases is the used blocks: a /23 on a /26 grid adds 8, as its release frees 8.
    #[test]
    fn allocations_and_releases_count_the_same_grid_blocks() {
        let recorder = prometheus_builder().build_recorder();
        let handle = recorder.handle();
        let _guard = metrics::set_default_local_recorder(&recorder);
        let mut allocator = node_pool_allocator();
        let value = |name: &str| rendered_value(&handle, name);
        for (name, pool) in [("small-1", "small"), ("big-1", "big")] {
            for event in &allocator.decide(&node(name, pool)).metrics {
                apply(event);
            }
        }
        assert_eq!(value(m::CIDRSET_ALLOCATIONS_TOTAL), Some(9.0));
        for event in &allocator.remove("big-1").metrics {
            apply(event);
        }
        assert_eq!(value(m::CIDRSET_RELEASES_TOTAL), Some(8.0));
        set_pool_gauges(&allocator.pool_stats(), 0);
        assert_eq!(value(m::CIDRSET_USED_BLOCKS), Some(1.0));
    }
}
