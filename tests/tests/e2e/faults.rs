//! API faults: 500s, a 429 and a 409, a timeout without the write, a timeout and a 500 *after*
//! the write landed, failed initial lists, a dropped watch and a compaction (`410`).
//! The controller recovers every time and never hands a block out twice; each test ends with the
//! docs/DESIGN.md §3 invariant check.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, assert_no_cidr_handed_out_twice, check_end_state, events_with_reason, fast_config,
    init_tracing, ipam, masks, node_like, node_patches, pod_cidrs, spawn, template_node, unserved,
    used,
};
use nodeipam::controller::InitialList;
use nodeipam::reasons;
use nodeipam_tests::sandbox::{FaultAction, FaultRule, Resource, Sandbox, Verb, fixture};

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const A: &str = "ip-10-1-1-15.eu-central-1.compute.internal";
const B: &str = "ip-10-1-1-34.eu-central-1.compute.internal";
const C: &str = "ip-10-1-1-41.eu-central-1.compute.internal";
const D: &str = "ip-10-1-1-42.eu-central-1.compute.internal";
const E: &str = "extra-e";

/// A pool of exactly 8 blocks (10.10.0.0/21 in /24s) so a block wrongly released after a
/// committed-but-failed PATCH would be handed out again (and show up as an overlap) or be
/// missing from the count. Every failure below leaves the outcome unknown or asks for a retry,
/// so the reservation is kept and exactly the same CIDRs are sent again until a definite answer:
///
/// - A: PATCH → 500, 500, 500 (may have been applied) → `CIDRAssignmentFailed` after the third
///   (upstream's `cidrUpdateRetries`), then 200;
/// - B: PATCH hangs past the 1 s request timeout, not committed → sent again → 200;
/// - C: PATCH committed, answer hangs past the timeout → sent again (a no-op 200) or seen landed
///   by the watch first;
/// - D: PATCH committed, answered 500 → likewise;
/// - E: PATCH → 429 (Retry-After 1), then 409 → sent again → 200.
///
/// Then 4 more Nodes: 3 fit, the 4th must wait (the pool is full, nothing leaked).
#[tokio::test]
async fn patch_failures_timeouts_and_committed_errors() {
    init_tracing();
    let sb = Sandbox::start(fixture(AWS)).await;
    let template = template_node(AWS);
    sb.create_node(node_like(&template, E)).unwrap();
    let patch = |name: &str, times, action| {
        sb.inject(FaultRule::new(Verb::Patch, Resource::Nodes, times, action).named(name));
    };
    patch(A, 3, FaultAction::Status(500));
    patch(B, 1, FaultAction::Hang(Duration::from_secs(3)));
    patch(C, 1, FaultAction::CommitThenHang(Duration::from_secs(3)));
    patch(D, 1, FaultAction::CommitThenStatus(500));
    patch(
        E,
        1,
        FaultAction::TooManyRequests {
            retry_after_secs: 1,
        },
    );
    patch(E, 1, FaultAction::Status(409));

    let ipam = ipam("10.10.0.0/21", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.request_timeout = Duration::from_secs(1);
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()
            && sb.pending_faults().is_empty())
            .await,
        "unserved {:?}, faults left {:?}",
        unserved(&sb),
        sb.pending_faults()
    );
    assert!(
        sb.wait_until(WAIT, |_| used(&controller.health) == [5])
            .await
    );

    let patches = node_patches(&sb);
    // A PATCH whose client gave up mid-hang is logged without a status (`None`).
    let statuses = |n: &str| -> Vec<Option<u16>> {
        patches
            .get(n)
            .map(|p| p.iter().map(|(s, _)| *s).collect())
            .unwrap_or_default()
    };
    let cidrs_sent = |n: &str| -> Vec<String> {
        patches[n]
            .iter()
            .map(|(_, b)| b.as_ref().unwrap()["spec"]["podCIDRs"].to_string())
            .collect()
    };
    let uids_sent = |n: &str| -> Vec<String> {
        patches[n]
            .iter()
            .map(|(_, b)| b.as_ref().unwrap()["metadata"]["uid"].to_string())
            .collect()
    };
    assert_eq!(
        statuses(A),
        [Some(500), Some(500), Some(500), Some(200)],
        "A"
    );
    assert_eq!(statuses(B), [None, Some(200)], "B: timed out, sent again");
    for (name, first) in [(C, None), (D, Some(500))] {
        let got = statuses(name);
        assert_eq!(got[0], first, "{name}: {got:?}");
        assert!(
            got.len() == 1 || got[1..] == [Some(200)],
            "{name}: committed, then at most one no-op re-send: {got:?}"
        );
    }
    assert_eq!(statuses(E), [Some(429), Some(409), Some(200)], "E");
    for name in [A, B, C, D, E] {
        let sent = cidrs_sent(name);
        assert!(
            sent.windows(2).all(|w| w[0] == w[1]),
            "{name}: the kept reservation is re-sent unchanged: {sent:?}"
        );
        assert_eq!(
            sent[0],
            serde_json::to_string(&pod_cidrs(&sb, name)).unwrap(),
            "{name}: the CIDRs sent are the ones the Node has"
        );
        let uid = sb.node(name).unwrap()["metadata"]["uid"].to_string();
        assert!(
            uids_sent(name).iter().all(|u| *u == uid),
            "{name}: every PATCH is pinned to the Node's uid"
        );
    }
    let failed: Vec<String> = events_with_reason(&sb, reasons::CIDR_ASSIGNMENT_FAILED)
        .into_iter()
        .map(|(n, ty, _)| {
            assert_eq!(ty, "Warning");
            n
        })
        .collect();
    assert_eq!(failed, [A], "only A failed three times in a row");

    for i in 0..4 {
        sb.create_node(node_like(&template, &format!("more-{i}")))
            .unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |sb| {
            unserved(sb).len() == 1
                && !events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE).is_empty()
        })
        .await,
        "unserved {:?}",
        unserved(&sb)
    );
    let waiting = unserved(&sb);
    let summary = controller.stop().await;
    assert_eq!(summary.pools[0].used_blocks, 8);
    assert_no_cidr_handed_out_twice(&sb);
    let waiting: Vec<&str> = waiting.iter().map(String::as_str).collect();
    check_end_state(&sb, &ipam, &waiting, &summary);
    sb.shutdown().await;
}

/// Requests that gave the controller its initial state: LISTs, or streaming-list WATCHes
/// (`sendInitialEvents=true`).
fn initial_lists(sb: &nodeipam_tests::sandbox::SandboxHandle) -> usize {
    sb.requests()
        .iter()
        .filter(|r| {
            r.resource == Some(Resource::Nodes)
                && (r.verb == Some(Verb::List)
                    || (r.verb == Some(Verb::Watch) && r.query.contains("sendInitialEvents=true")))
        })
        .count()
}

/// Start-up lists fail twice (500), later the watch stream is dropped, and then the watch's
/// resourceVersion is compacted away while Nodes change (so the re-watch gets `410 Expired` and
/// the controller lists again). A Node deleted while the controller was not watching is released
/// (found through the re-list), Nodes created meanwhile are served. Run with each initial-list
/// strategy: a streaming list, and the paged LIST.
async fn lists_fail_watch_drops_and_history_is_compacted(initial_list: InitialList) {
    init_tracing();
    let file = "03-aks-kubenet-3nodes.json";
    let sb = Sandbox::start(fixture(file)).await;
    let template = template_node(file);
    let first_verb = match initial_list {
        InitialList::Streaming => Verb::Watch,
        InitialList::Paged => Verb::List,
    };
    sb.fail_next(first_verb, Resource::Nodes, 2, FaultAction::Status(500));
    let ipam = ipam("10.244.0.0/16", "10.0.0.0/16", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.initial_list = initial_list;
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(sb.pending_faults().is_empty(), "both failures were seen");
    let health = controller.health.clone();

    // Dropped watch: the controller re-watches and sees new Nodes.
    sb.drop_watches();
    for i in 0..5 {
        sb.create_node(node_like(&template, &format!("x-{i}")))
            .unwrap();
    }
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    assert!(sb.wait_until(WAIT, |_| used(&health) == [8]).await);
    let lists_before = initial_lists(&sb);

    // Drop the watch, change Nodes and compact — all before the controller can run again (the
    // test runtime is single-threaded and nothing here yields) — so its re-watch gets 410.
    sb.drop_watches();
    let gone = pod_cidrs(&sb, "x-0");
    sb.delete_node("x-0").unwrap();
    sb.create_node(node_like(&template, "y-0")).unwrap();
    sb.create_node(node_like(&template, "y-1")).unwrap();
    sb.compact();
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty() && used(&health) == [9])
            .await,
        "unserved {:?}, used {:?}",
        unserved(&sb),
        used(&health)
    );
    assert!(
        initial_lists(&sb) > lists_before,
        "no re-list after the 410"
    );
    let summary = controller.stop().await;
    assert!(!summary.held.contains_key("x-0"), "x-0's {gone:?} leaked");
    assert_no_cidr_handed_out_twice(&sb);
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}

#[tokio::test]
async fn streaming_list_fails_watch_drops_and_history_is_compacted() {
    lists_fail_watch_drops_and_history_is_compacted(InitialList::Streaming).await;
}

#[tokio::test]
async fn paged_list_fails_watch_drops_and_history_is_compacted() {
    lists_fail_watch_drops_and_history_is_compacted(InitialList::Paged).await;
}

/// Someone else sets the Node's podCIDRs while our PATCH is on its way: the API answers `422`
/// (podCIDRs are immutable once set), the controller re-reads the Node, occupies what it has and
/// gives its own reservation back (the count equals what the Nodes hold; nothing leaks).
#[tokio::test]
async fn podcidrs_set_by_someone_else_during_our_patch() {
    init_tracing();
    let sb = Sandbox::start(fixture(AWS)).await;
    let template = template_node(AWS);
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);

    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::Delay(Duration::from_millis(500)),
        )
        .named("raced"),
    );
    sb.create_node(node_like(&template, "raced")).unwrap();
    // Our PATCH has arrived (the fault fired) and is held; the other writer goes first.
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().is_empty())
            .await
    );
    sb.patch_node(
        "raced",
        nodeipam_tests::sandbox::PatchType::Merge,
        &serde_json::json!({"spec": {"podCIDR": "10.244.200.0/24", "podCIDRs": ["10.244.200.0/24"]}}),
    )
    .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| {
            node_patches(sb)
                .get("raced")
                .is_some_and(|p| p.iter().any(|(s, _)| *s == Some(422)))
        })
        .await,
        "our PATCH was not rejected: {:?}",
        node_patches(&sb).get("raced")
    );
    assert!(
        sb.wait_until(WAIT, |_| used(&controller.health) == [5])
            .await
    );
    assert_eq!(pod_cidrs(&sb, "raced"), ["10.244.200.0/24"]);
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}

/// A 404 that is not kube-apiserver's NotFound for a Node (the sandbox's injected 404 has no
/// `details`, as a proxy's page or a route that is not served) says nothing about the Node. Read
/// as "gone", it dropped the record of a Node that still exists and left it unserved for good
/// ("the API server says this Node object is gone; waiting for the watch to catch up" — the watch
/// never shows a deletion that did not happen; found by a hostile run). Now its reservation is
/// kept and the same block is sent again.
#[tokio::test]
async fn a_404_that_is_not_about_the_node_keeps_its_reservation() {
    init_tracing();
    let sb = Sandbox::start(fixture(AWS)).await;
    sb.inject(FaultRule::new(Verb::Patch, Resource::Nodes, 2, FaultAction::Status(404)).named(A));
    let ipam = ipam("10.10.0.0/22", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "unserved {:?}: a Node answered 404 by something other than the API server must still be served",
        unserved(&sb)
    );
    let patches = node_patches(&sb);
    let sent: Vec<(Option<u16>, String)> = patches[A]
        .iter()
        .map(|(s, b)| (*s, b.as_ref().unwrap()["spec"]["podCIDRs"].to_string()))
        .collect();
    assert_eq!(
        sent.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [Some(404), Some(404), Some(200)],
        "{sent:?}"
    );
    assert!(
        sent.windows(2).all(|w| w[0].1 == w[1].1),
        "the kept reservation is re-sent unchanged: {sent:?}"
    );
    assert_eq!(pod_cidrs(&sb, A).len(), 1);
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
}
