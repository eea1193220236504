//! The Node watch keeps up with the controller's own writes: thousands of Nodes (renamed copies of
//! a real AWS Node, fixture 05's second Node, without podCIDRs) served against a sandbox whose
//! watch history holds only 100 changes and whose watch stream is slow (a pause of 1 ms before
//! every change: at most ~1,000 changes a second, while 30 concurrent writers make several
//! thousand) never produce a `410 Gone` — neither through the streaming list
//! (`sendInitialEvents`) nor, with the streaming list refused as a server without WatchList does,
//! through the paged-LIST fallback. A watch that fell behind by more than 100 changes would get
//! `ERROR 410` in its stream and re-list (both counted by the sandbox). Without the controller's
//! write window (`controller::window`: writes wait until the watch has delivered their changes)
//! these tests fail: the writes run ahead, the watch gets 410, and every re-list falls behind
//! again.
//!
//! The CI-sized tests use 3,000 Nodes; the `#[ignore]`d ones 50,000 (run them in release:
//! `cargo test --release -p nodeipam-tests --test e2e watch_scale:: -- --ignored`).
//! Correctness only is asserted, never time.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{check_end_state, fast_config, init_tracing, ipam, masks, spawn};
use nodeipam_tests::sandbox::{Replicas, Sandbox, SandboxOptions, fixture};
use serde_json::Value;

/// The sandbox's watch history (changes kept); kube-apiserver's watch cache is never smaller.
const HISTORY: usize = 100;
/// The sandbox's pause before each change it sends on a watch.
const SLOW_WATCH: Duration = Duration::from_millis(1);

/// Serves `nodes` replicated Nodes against a sandbox with a 100-change history and a slow watch;
/// checks that no 410 happened, that the initial state was read once, and the end state.
async fn serve_all(nodes: usize, watch_list: bool, dual_stack: bool, within: Duration) {
    init_tracing();
    let options = SandboxOptions {
        history_limit: HISTORY,
        watch_event_delay: SLOW_WATCH,
        watch_list,
        replicas: vec![Replicas {
            template: fixture("05-aws-4nodes-no-podcidr.json")["items"][1].clone(),
            prefix: "node".to_owned(),
            count: nodes,
        }],
        ..SandboxOptions::default()
    };
    let sb = Sandbox::try_start(Value::Null, options).await.unwrap();
    let ipam = if dual_stack {
        ipam("10.0.0.0/8,fd00::/48", "", masks(None, None, None))
    } else {
        ipam("10.0.0.0/8", "", masks(None, None, None))
    };
    let mut config = fast_config(ipam.clone());
    config.kube_api_qps = 100_000.0;
    config.kube_api_burst = 100_000;
    config.request_timeout = Duration::from_secs(10);
    let controller = spawn(&sb, config);
    let served = sb
        .wait_until(within, |sb| sb.summary().nodes_with_pod_cidrs == nodes)
        .await;
    let summary = sb.summary();
    assert!(
        served,
        "not every Node was served within {within:?}: {summary:?}"
    );
    let end = controller.stop().await;
    let summary = sb.summary();
    assert_eq!(summary.gone410, 0, "a 410 Gone: {summary:?}");
    let pages = nodes.div_ceil(500) as u64;
    if watch_list {
        assert_eq!(
            summary.lists, 0,
            "the streaming list needs no LIST: {summary:?}"
        );
    } else {
        assert_eq!(
            summary.lists, pages,
            "one paged LIST, 500 a page: {summary:?}"
        );
    }
    // One watch: the streaming list itself, or (paged) the refused streaming attempt and the
    // watch after the LIST. A 410 would force another.
    let watches = if watch_list { 1 } else { 2 };
    assert_eq!(summary.watches, watches, "no re-watch: {summary:?}");
    assert_eq!(
        summary.patches, nodes as u64,
        "one PATCH per Node: {summary:?}"
    );
    let report = check_end_state(&sb, &ipam, &[], &end);
    assert_eq!(report.served, nodes);
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_nodes_streaming_list_no_410() {
    serve_all(3_000, true, false, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_nodes_paged_list_no_410() {
    serve_all(3_000, false, false, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "50,000 Nodes: minutes in debug; run in release (see the module doc)"]
async fn fifty_thousand_nodes_streaming_list_no_410() {
    serve_all(50_000, true, false, Duration::from_secs(1800)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "50,000 Nodes: minutes in debug; run in release (see the module doc)"]
async fn fifty_thousand_nodes_paged_list_no_410() {
    serve_all(50_000, false, false, Duration::from_secs(1800)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "50,000 Nodes: minutes in debug; run in release (see the module doc)"]
async fn fifty_thousand_nodes_dual_stack_no_410() {
    serve_all(50_000, true, true, Duration::from_secs(1800)).await;
}
