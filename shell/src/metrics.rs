//! Applying [`MetricEvent`]s and pool gauges to the `metrics` facade, and installing the
//! Prometheus exporter. Names and buckets: [`crate::metric_names`].

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::Error;
use crate::metric_names as m;
use crate::reconcile::{MetricEvent, PoolStats};

/// A Prometheus builder with our histogram buckets (1, 5, 25, 125, 625 tries). Tests use
/// `prometheus_builder().build_recorder()` and render its handle without a port.
pub fn prometheus_builder() -> PrometheusBuilder {
    let builder = PrometheusBuilder::new();
    match builder.set_buckets_for_metric(
        Matcher::Full(m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST.to_owned()),
        &m::ALLOCATION_TRIES_BUCKETS,
    ) {
        Ok(builder) => builder,
        // Only fails for an empty bucket list, which ours is not.
        Err(_) => PrometheusBuilder::new(),
    }
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
        m::RATE_LIMITER_USE,
        "A metric measuring the saturation of the rate limiter."
    );
    describe_gauge!(m::WORKQUEUE_DEPTH, "Node names waiting in the work queue.");
    describe_counter!(
        m::WORKQUEUE_RETRIES_TOTAL,
        "Reconciles re-queued with backoff."
    );
    describe_counter!(
        m::SKIPPED_NODES_TOTAL,
        "Nodes skipped because their podCIDRs could not be occupied."
    );
    describe_gauge!(m::SKIPPED_NODES, "Nodes currently skipped.");
    describe_counter!(
        m::CIDRSET_EXHAUSTED_TOTAL,
        "Allocations that found the cluster CIDR exhausted."
    );
    describe_counter!(
        m::PATCH_FAILURES_TOTAL,
        "PATCHes of spec.podCIDR(s) that did not succeed, by outcome (label error)."
    );
}

/// Records one metric update.
pub fn apply(event: &MetricEvent) {
    match *event {
        MetricEvent::Allocated {
            cluster_cidr,
            tries,
        } => {
            let label = cluster_cidr.to_string();
            counter!(m::CIDRSET_ALLOCATIONS_TOTAL, m::LABEL_CLUSTER_CIDR => label.clone())
                .increment(1);
            histogram!(m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST, m::LABEL_CLUSTER_CIDR => label)
                .record(f64::from(tries));
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

/// Sets the per-cluster-CIDR gauges (usage 0–1, max blocks) and the skipped-Node gauge.
pub fn set_pool_gauges(stats: &[PoolStats], skipped_nodes: usize) {
    for s in stats {
        let label = s.cluster_cidr.to_string();
        let usage = if s.capacity == 0 {
            0.0
        } else {
            f64::from(s.used) / f64::from(s.capacity)
        };
        gauge!(m::CIDRSET_USAGE_CIDRS, m::LABEL_CLUSTER_CIDR => label.clone()).set(usage);
        gauge!(m::CIDRSET_MAX_CIDRS, m::LABEL_CLUSTER_CIDR => label).set(f64::from(s.capacity));
    }
    gauge!(m::SKIPPED_NODES).set(skipped_nodes as f64);
}
