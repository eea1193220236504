//! Applying [`MetricEvent`]s and pool gauges to the `metrics` facade, and installing the
//! Prometheus exporter. Names and buckets: [`crate::metric_names`].

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use nodeipam_core::{Cidr, FreeBlock};

use crate::Error;
use crate::metric_names as m;
use crate::reconcile::{MetricEvent, PoolStats};

/// A Prometheus builder with the buckets of every histogram in [`m::METRICS`]. Tests use
/// `prometheus_builder().build_recorder()` and render its handle without a port.
pub fn prometheus_builder() -> PrometheusBuilder {
    let mut builder = PrometheusBuilder::new();
    for metric in m::METRICS.iter().filter(|m| !m.buckets.is_empty()) {
        builder = match builder
            .set_buckets_for_metric(Matcher::Full(metric.name.to_owned()), metric.buckets)
        {
            Ok(builder) => builder,
            // Only fails for an empty bucket list, which the filter leaves out.
            Err(_) => return PrometheusBuilder::new(),
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

/// Registers the help text of every metric in [`m::METRICS`] with the installed recorder.
pub fn describe() {
    for metric in &m::METRICS {
        let (name, help) = (metric.name, metric.help);
        match metric.kind {
            m::Kind::Counter => metrics::describe_counter!(name, help),
            m::Kind::Gauge => metrics::describe_gauge!(name, help),
            m::Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
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
        let usage = if s.capacity_blocks == 0 {
            0.0
        } else {
            f64::from(s.used_blocks) / f64::from(s.capacity_blocks)
        };
        gauge!(m::CIDRSET_USAGE_CIDRS, m::LABEL_CLUSTER_CIDR => label.clone()).set(usage);
        gauge!(m::CIDRSET_MAX_CIDRS, m::LABEL_CLUSTER_CIDR => label.clone())
            .set(f64::from(s.capacity_blocks));
        gauge!(m::CIDRSET_USED_BLOCKS, m::LABEL_CLUSTER_CIDR => label.clone())
            .set(f64::from(s.used_blocks));
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

    /// Registration covers the whole table: after `describe` and one sample of each metric, the
    /// exporter renders each with its help text and type.
    #[test]
    fn every_metric_is_registered_with_its_help_and_type() {
        let recorder = prometheus_builder().build_recorder();
        let handle = recorder.handle();
        let _guard = metrics::set_default_local_recorder(&recorder);
        describe();
        for metric in &m::METRICS {
            match metric.kind {
                m::Kind::Counter => counter!(metric.name).increment(1),
                m::Kind::Gauge => gauge!(metric.name).set(1.0),
                m::Kind::Histogram => histogram!(metric.name).record(1.0),
            }
        }
        let text = handle.render();
        for metric in &m::METRICS {
            let help = format!("# HELP {} {}\n", metric.name, metric.help);
            let kind = format!("# TYPE {} {}\n", metric.name, metric.kind.as_str());
            assert!(text.contains(&help), "{help}in:\n{text}");
            assert!(text.contains(&kind), "{kind}in:\n{text}");
            if let Some(last) = metric.buckets.last() {
                let bucket = format!("{}_bucket{{le=\"{last}\"}} 1", metric.name);
                assert!(text.contains(&bucket), "{bucket}");
            }
        }
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
