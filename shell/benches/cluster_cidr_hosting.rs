//! What hosting ClusterCIDRs costs (issue 32 item 8): one `Allocator::sync_cluster_cidrs` of `n`
//! disjoint ClusterCIDRs at once (the controller's start-up list, or `plan --cluster-cidrs`), each
//! in a backing set of its own, for `n` in 8, 16, 31, 62 (with the two flag CIDRs, 64 =
//! `MAX_BACKING_SETS`):
//! - `big`: IPv6 `fd00:N00::/40` with `perNodeHostBits: 64` — 2^24 blocks, a 2 MiB bitmap each;
//! - `small`: IPv4 `10.N.0.0/24` with `perNodeHostBits: 4` — 16 blocks each.
//!
//! Hosting grows linearly in pools when the time per pool stays flat as `n` doubles. Results in
//! BENCHMARKS.md. Run: `cargo bench -p nodeipam --bench cluster_cidr_hosting`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use nodeipam::cluster_cidr::{ClusterCidrObject, ClusterCidrPool};
use nodeipam::reconcile::Allocator;
use nodeipam_core::{IpamConfig, NodeMaskFlags};

fn config() -> IpamConfig {
    let flags = NodeMaskFlags {
        node_cidr_mask_size_ipv4: Some(24),
        node_cidr_mask_size_ipv6: Some(112),
        ..NodeMaskFlags::default()
    };
    nodeipam_core::config::validate("10.255.0.0/16,fd00:ff00::/104", "", flags)
        .expect("valid configuration")
}

fn pool(name: String, spec: serde_json::Value) -> ClusterCidrPool {
    let object: ClusterCidrObject = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a ClusterCIDR");
    ClusterCidrPool::from_object(&object).expect("valid")
}

fn pools(kind: &str, n: usize) -> Vec<ClusterCidrPool> {
    (0..n)
        .map(|i| match kind {
            "big" => pool(
                format!("big-{i:02}"),
                serde_json::json!({"ipv6": format!("fd00:{i:x}00::/40"), "perNodeHostBits": 64}),
            ),
            _ => pool(
                format!("small-{i:02}"),
                serde_json::json!({"ipv4": format!("10.{i}.0.0/24"), "perNodeHostBits": 4}),
            ),
        })
        .collect()
}

fn hosting(c: &mut Criterion) {
    let config = config();
    for kind in ["big", "small"] {
        let mut group = c.benchmark_group(format!("host_{kind}"));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(if kind == "big" { 20 } else { 3 }));
        for n in [8usize, 16, 31, 62] {
            let given = pools(kind, n);
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &given, |b, given| {
                b.iter_batched(
                    || Allocator::new(&config).expect("allocator"),
                    |mut a| {
                        let sync = a.sync_cluster_cidrs(given);
                        assert_eq!(sync.added.len(), given.len(), "{:?}", sync.refused);
                        black_box(a)
                    },
                    BatchSize::PerIteration,
                );
            });
        }
        group.finish();
    }
}

criterion_group!(benches, hosting);
criterion_main!(benches);
