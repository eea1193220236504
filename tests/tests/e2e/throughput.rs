//! Throughput against the sandbox: 2,000 Nodes, renamed copies of a real AWS Node (fixture 05),
//! on 10.0.0.0/12 cut into /24s (4,096 blocks), with the write token bucket opened wide.
//! Prints Nodes served per second and the test process's memory (controller + sandbox + both
//! copies of every Node) — run with `--nocapture` to see them. Asserts correctness only (every
//! Node served, the invariants), never wall-clock time.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::{check_end_state, fast_config, init_tracing, ipam, masks, node_like, spawn};
use nodeipam_tests::sandbox::{Resource, Sandbox, Verb, fixture};
use serde_json::{Value, json};

const NODES: usize = 2_000;

/// `VmHWM` and `VmRSS` of this process from `/proc/self/status`, e.g. `("123456 kB", …)`.
fn memory() -> (String, String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or_else(|| "n/a".to_owned(), |v| v.trim().to_owned())
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_nodes_throughput() {
    init_tracing();
    let template = fixture("05-aws-4nodes-no-podcidr.json")["items"][0].clone();
    let items: Vec<Value> = (0..NODES)
        .map(|i| {
            node_like(
                &template,
                &format!("ip-10-1-{}-{}.compute.internal", i / 250, i % 250),
            )
        })
        .collect();
    let sb = Sandbox::start(json!({"kind": "NodeList", "apiVersion": "v1", "items": items})).await;
    let ipam = ipam("10.0.0.0/12", "10.96.0.0/12", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.kube_api_qps = 100_000.0;
    config.kube_api_burst = 100_000;
    let (hwm_before, rss_before) = memory();
    let started = Instant::now();
    let controller = spawn(&sb, config);
    let health = controller.health.clone();
    // Cheap condition (the controller's own count), checked on every write; the Nodes themselves
    // are checked once at the end.
    let done = sb
        .wait_until(Duration::from_secs(60), |_| {
            health
                .pools()
                .first()
                .is_some_and(|p| p.used_blocks as usize == NODES)
        })
        .await;
    assert!(done, "not all {NODES} Nodes allocated within 60 s");
    // The last allocation's PATCH may still be in flight.
    let patched = sb
        .wait_until(Duration::from_secs(10), |sb| {
            sb.requests_of(Verb::Patch, Resource::Nodes).len() == NODES
        })
        .await;
    let elapsed = started.elapsed();
    assert!(patched, "not every allocation was written");
    let (hwm, rss) = memory();
    let summary = controller.stop().await;
    let patches = sb.requests_of(Verb::Patch, Resource::Nodes);
    assert_eq!(patches.len(), NODES, "one PATCH per Node");
    assert!(patches.iter().all(|r| r.status == Some(200)));
    let report = check_end_state(&sb, &ipam, &[], &summary);
    assert_eq!(report.served, NODES);
    println!(
        "throughput: {NODES} Nodes served in {:.2} s from controller start = {:.0} Nodes/s \
         (sandbox on 127.0.0.1, debug={}, same process)",
        elapsed.as_secs_f64(),
        NODES as f64 / elapsed.as_secs_f64(),
        cfg!(debug_assertions)
    );
    println!(
        "memory (whole test process: controller + sandbox + 2 copies of {NODES} real Nodes): \
         VmHWM {hwm} (before controller start {hwm_before}), VmRSS {rss} (before {rss_before})"
    );
    sb.shutdown().await;
}
