//! ClusterCIDR objects at run time (issue 18 §2, `--cidr-allocator-type=MultiCIDRRangeAllocator`),
//! end to end on the sandbox (which serves the CRD's resource as kube-apiserver does) with real
//! fixtures:
//! - fixture 05 (four AWS Nodes without podCIDRs), the flag CIDR full after two: a ClusterCIDR
//!   created at run time serves the two waiting Nodes without a restart; it gets the finalizer and
//!   a status; a restart writes nothing (0 PATCHes of Nodes or ClusterCIDRs); deleted, it stays
//!   (serving no new Node) until the last Node holding one of its blocks is gone, then it goes;
//! - fixture 08 (six OpenShift Nodes, three labelled `node-role.kubernetes.io/worker`): a
//!   selector pool serves the workers, the flag CIDR the others, and a worker joining later;
//! - fixture 05 dual-stack: a pool whose IPv6 range is full gives no IPv4 block either (all or
//!   nothing within one ClusterCIDR), the Node is served by the next pool;
//! - a ClusterCIDR the allocator cannot host: `Invalid`, one `ClusterCIDRInvalid` event, no
//!   finalizer;
//! - the CRD not served: the controller stops with an error naming the `kubectl apply` command.
#![allow(clippy::unwrap_used)]

use crate::common;

mod finalizer_race;

use common::{
    WAIT, all_pod_cidrs, assert_all_served, assert_cluster_cidr, assert_no_cidr_handed_out_twice,
    cluster_cidr, cluster_cidr_writer_passed, condition, create_cluster_cidr, delete_cluster_cidr,
    events_with_reason, four_aws_nodes, has_finalizer, init_tracing, node_like, pod_cidrs,
    ready_reason_is, served_from, spawn, template_node, unserved, usage, with_cluster_cidrs,
};
use nodeipam_tests::sandbox::{FaultAction, Resource, Sandbox, Verb, fixture};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_cidr_serves_waiting_nodes_keeps_its_finalizer_until_the_last_leaves() {
    let sb = four_aws_nodes().await;
    let mut config = with_cluster_cidrs("10.10.0.0/23", None);
    // A waiting Node's safety re-check only after 10 minutes: only the wake on the new pool
    // can serve the waiting Nodes within the test.
    config.retry_max_delay = std::time::Duration::from_secs(60);
    let first = spawn(&sb, config.clone());
    first.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).len() == 2
            && !events_with_reason(sb, "CIDRNotAvailable").is_empty())
            .await,
        "two Nodes served, two waiting: {:?}",
        all_pod_cidrs(&sb)
    );
    let waiting = unserved(&sb);

    // Exhaustion → a ClusterCIDR (no selector: a fallback pool) → the waiting Nodes served, no
    // restart.
    create_cluster_cidr(
        &sb,
        "grow",
        json!({"ipv4": "10.20.0.0/23", "perNodeHostBits": 8}),
    )
    .await;
    assert_all_served(
        &sb,
        "the waiting Nodes were not served from the new ClusterCIDR",
    )
    .await;
    let mut grown = served_from(&sb, "10.20.");
    grown.sort();
    assert_eq!(grown, waiting, "{:?}", all_pod_cidrs(&sb));
    // Its finalizer and its status: two /24s, both used.
    assert_cluster_cidr(&sb, "grow", "finalizer and status", |o| {
        has_finalizer(o) && o.is_some_and(|o| o["status"]["ipv4"] == usage(2, 2))
    })
    .await;
    let object = cluster_cidr(&sb, "grow").await.unwrap();
    assert_eq!(
        condition(&object, "Invalid"),
        ("False".into(), "Valid".into())
    );
    assert_eq!(
        condition(&object, "Ready"),
        ("False".into(), "Exhausted".into())
    );
    let summary = first.stop().await;
    assert!(summary.held.len() == 4, "{:?}", summary.held);

    // Restart: nothing to write, to any Node or ClusterCIDR.
    sb.clear_requests();
    let second = spawn(&sb, config.clone());
    second.wait_allocating(&sb).await;
    // Every Node decided and written, every event out, the ClusterCIDR writer caught up: a write
    // the restart decided has arrived by now.
    second.wait_quiet(&sb).await;
    let patches: Vec<String> = sb
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" || r.method == "PUT")
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(patches, Vec::<String>::new(), "a restart writes nothing");

    // Deleted: held by the finalizer while Nodes hold its blocks; serves no new Node.
    delete_cluster_cidr(&sb, "grow").await;
    assert_cluster_cidr(&sb, "grow", "Ready: Deleting", |o| {
        ready_reason_is(o, "Deleting")
    })
    .await;
    sb.create_node(node_like(
        &template_node("05-aws-4nodes-no-podcidr.json"),
        "ip-10-1-1-99.eu-central-1.compute.internal",
    ))
    .unwrap();
    // A block of the deleting pool freed: it serves no new Node, so the new one still waits.
    sb.delete_node(&waiting[0]).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| events_with_reason(sb, "CIDRNotAvailable")
            .iter()
            .any(|(node, _, _)| node.starts_with("ip-10-1-1-99")))
            .await
    );
    assert_eq!(
        pod_cidrs(&sb, "ip-10-1-1-99.eu-central-1.compute.internal"),
        Vec::<String>::new()
    );
    // The status counting one holder is decided in the same `decide` call as the finalizer's
    // removal (shell/src/controller/cluster_cidrs/decide.rs): the round that wrote it saw the
    // freed block and kept the finalizer.
    assert_cluster_cidr(&sb, "grow", "Deleting with one holder left", |o| {
        ready_reason_is(o, "Deleting")
            && o.is_some_and(|o| {
                o["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains(" 1 Node(s)"))
                    })
            })
    })
    .await;
    assert!(
        has_finalizer(cluster_cidr(&sb, "grow").await.as_ref()),
        "one Node still holds a block: the finalizer stays"
    );
    // The last holder leaves: the finalizer goes, and the object with it.
    sb.delete_node(&waiting[1]).unwrap();
    assert_cluster_cidr(&sb, "grow", "not released after its last Node left", |o| {
        o.is_none()
    })
    .await;
    let _ = second.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// A selector pool for the labelled workers beside the default (flag) pool; a worker joining
/// later is served from it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_pool_serves_the_labelled_nodes_beside_the_default_pool() {
    init_tracing();
    const FIXTURE: &str = "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json";
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    create_cluster_cidr(
        &sb,
        "workers",
        json!({
            "ipv4": "10.40.0.0/24",
            "perNodeHostBits": 6,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role.kubernetes.io/worker", "operator": "Exists"}
            ]}]},
        }),
    )
    .await;
    let running = spawn(&sb, with_cluster_cidrs("10.10.0.0/16", None));
    running.wait_allocating(&sb).await;
    assert_all_served(&sb, "workers from their pool, the others from the flags").await;
    for (name, cidrs) in all_pod_cidrs(&sb) {
        let (prefix, size) = if name.contains("-worker-") {
            ("10.40.0.", "/26")
        } else {
            ("10.10.", "/24")
        };
        assert!(
            cidrs.len() == 1 && cidrs[0].starts_with(prefix) && cidrs[0].ends_with(size),
            "Node {name}: {cidrs:?}"
        );
    }
    let worker = fixture(FIXTURE)["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["labels"]["node-role.kubernetes.io/worker"].is_string())
        .cloned()
        .unwrap();
    sb.create_node(node_like(
        &worker,
        "ci-ln-d53y532-f76d1-2btqq-worker-e-late",
    ))
    .unwrap();
    assert_all_served(&sb, "the late worker").await;
    let late = pod_cidrs(&sb, "ci-ln-d53y532-f76d1-2btqq-worker-e-late");
    assert!(
        late.len() == 1 && late[0].starts_with("10.40.0.") && late[0].ends_with("/26"),
        "{late:?}"
    );
    assert_cluster_cidr(&sb, "workers", "all four blocks used", |o| {
        o.is_some_and(|o| o["status"]["ipv4"] == usage(4, 4))
    })
    .await;
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// Dual-stack, all or nothing within one ClusterCIDR: its IPv6 range has two blocks, its IPv4
/// range four; of the four Nodes it selects, two get both families from it, the other two get
/// no IPv4 block from it (its IPv6 range is full) but both families from the flag pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_is_all_or_nothing_within_a_cluster_cidr() {
    let sb = four_aws_nodes().await;
    create_cluster_cidr(
        &sb,
        "both",
        json!({
            "ipv4": "10.30.0.0/22",
            "ipv6": "fd00:30::/119",
            "perNodeHostBits": 8,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["eu-central-1c"]}
            ]}]},
        }),
    )
    .await;
    let running = spawn(
        &sb,
        with_cluster_cidrs("10.10.0.0/23,fd00:10::/62", Some(64)),
    );
    running.wait_allocating(&sb).await;
    assert_all_served(&sb, "two Nodes from the pool, two from the flags").await;
    let all = all_pod_cidrs(&sb);
    let from_pool: Vec<&(String, Vec<String>)> = all
        .iter()
        .filter(|(_, c)| c[0].starts_with("10.30."))
        .collect();
    let from_flags: Vec<&(String, Vec<String>)> = all
        .iter()
        .filter(|(_, c)| c[0].starts_with("10.10."))
        .collect();
    assert_eq!((from_pool.len(), from_flags.len()), (2, 2), "{all:?}");
    for (name, cidrs) in from_pool {
        assert!(
            cidrs[1].starts_with("fd00:30::") && cidrs[1].ends_with("/120"),
            "{name}: {cidrs:?}"
        );
    }
    for (name, cidrs) in from_flags {
        assert!(
            cidrs[1].starts_with("fd00:10:") && cidrs[1].ends_with("/64"),
            "{name}: {cidrs:?}"
        );
    }
    // The pool's IPv4 range lent nothing to the Nodes its IPv6 range could not serve.
    assert_cluster_cidr(&sb, "both", "IPv4 half used, IPv6 full", |o| {
        o.is_some_and(|o| o["status"]["ipv4"] == usage(4, 2) && o["status"]["ipv6"] == usage(2, 2))
    })
    .await;
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// The CRD not served (the list answers 404): the controller stops with an error that names the
/// command installing it, exit status 1 as the other API errors at start-up, `/healthz` failing;
/// no Node is listed or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_the_controller_stops_naming_the_command_that_installs_it() {
    let sb = four_aws_nodes().await;
    sb.fail_next(
        Verb::List,
        Resource::ClusterCidrs,
        1,
        FaultAction::Status(404),
    );
    let running = spawn(&sb, with_cluster_cidrs("10.10.0.0/23", None));
    let health = running.health.clone();
    let error = running.ended().await.expect_err("stops");
    let text = error.to_string();
    assert!(
        text.contains("kubectl apply -f deploy/crds/clustercidrs.yaml")
            && text.contains("MultiCIDRRangeAllocator"),
        "{text}"
    );
    assert_eq!(error.exit_code(), 1);
    assert!(!health.is_ready() && !health.is_alive());
    assert!(
        health
            .failure()
            .is_some_and(|f| f.contains("kubectl apply"))
    );
    assert!(
        sb.requests_of(Verb::List, Resource::Nodes).is_empty()
            && sb.requests_of(Verb::Patch, Resource::Nodes).is_empty()
    );
    assert!(unserved(&sb).len() == 4);
}

/// A ClusterCIDR the allocator cannot host (inside the flag CIDR with blocks so fine that the
/// shared set would need more than 2^24 of them) is not used: `Invalid=True` with the reason, one
/// `ClusterCIDRInvalid` Warning event on it, no finalizer; the Nodes are served from the flag
/// CIDR as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_cidr_the_allocator_cannot_host_is_invalid_with_one_event() {
    let sb = four_aws_nodes().await;
    let running = spawn(&sb, with_cluster_cidrs("fd00:10::/48", Some(64)));
    running.wait_allocating(&sb).await;
    create_cluster_cidr(
        &sb,
        "too-fine",
        json!({"ipv6": "fd00:10::/112", "perNodeHostBits": 4}),
    )
    .await;
    assert_cluster_cidr(&sb, "too-fine", "Invalid: InvalidSpec", |o| {
        o.is_some_and(|o| condition(o, "Invalid") == ("True".to_owned(), "InvalidSpec".to_owned()))
    })
    .await;
    assert!(
        sb.wait_until(WAIT, |sb| !events_with_reason(sb, "ClusterCIDRInvalid")
            .is_empty())
            .await
    );
    assert_all_served(&sb, "the Nodes from the flag CIDR").await;
    // A later writer round decided `too-fine` (and sent any event it wanted) before writing the
    // sentinel's status; no Node matches the sentinel, so the Nodes stay as they are.
    cluster_cidr_writer_passed(&sb, "zz-sentinel", "fd00:99::/63").await;
    let events = events_with_reason(&sb, "ClusterCIDRInvalid");
    assert_eq!(events.len(), 1, "one event per generation: {events:?}");
    // Published once, not repeated (a repeat would be a series on the same Event).
    let repeated: Vec<Value> = sb
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "ClusterCIDRInvalid" && !e["series"].is_null())
        .collect();
    assert!(repeated.is_empty(), "{repeated:?}");
    let (regarding, kind, note) = &events[0];
    assert_eq!((regarding.as_str(), kind.as_str()), ("too-fine", "Warning"));
    assert!(note.contains("cannot be hosted"), "{note}");
    let object = cluster_cidr(&sb, "too-fine").await.unwrap();
    assert!(!has_finalizer(Some(&object)), "{object:?}");
    assert_eq!(condition(&object, "Ready").0, "False");
    for (name, cidrs) in all_pod_cidrs(&sb) {
        assert!(
            cidrs[0].starts_with("fd00:10:") && cidrs[0].ends_with("/64"),
            "{name}: {cidrs:?}"
        );
    }
    let _ = running.stop().await;
}

/// Leader only: two replicas with leader election, a ClusterCIDR to finalize and report on —
/// every ClusterCIDR write (finalizer, status) comes from the replica holding the Lease, none
/// from the standby, which reads them (it lists only once it leads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_cluster_cidrs() {
    let sb = four_aws_nodes().await;
    create_cluster_cidr(
        &sb,
        "grow",
        json!({"ipv4": "10.20.0.0/23", "perNodeHostBits": 8}),
    )
    .await;
    let mut first = with_cluster_cidrs("10.10.0.0/23", None);
    first.leader_election = Some(common::election("replica-a"));
    let a = common::spawn_as(&sb, first, "replica-a");
    a.wait_allocating(&sb).await;
    let mut second = with_cluster_cidrs("10.10.0.0/23", None);
    second.leader_election = Some(common::election("replica-b"));
    let b = common::spawn_as(&sb, second, "replica-b");
    assert_all_served(&sb, "the leader serves every Node").await;
    assert_cluster_cidr(&sb, "grow", "finalized, two blocks used", |o| {
        has_finalizer(o) && o.is_some_and(|o| o["status"]["ipv4"]["used"] == 2)
    })
    .await;
    // The standby's elector tried the Lease twice more after `grow` settled (every 200 ms) and
    // stayed standby: alive and deciding, it had the chance to write. (A standby runs no writer,
    // so there is no decision of its own to wait for: this is its closest sign of life.)
    let b_lease_requests = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        sb.requests()
            .iter()
            .filter(|r| {
                r.resource == Some(Resource::Leases) && r.user_agent == common::agent("replica-b")
            })
            .count()
    };
    let seen = b_lease_requests(&sb);
    assert!(
        sb.wait_until(WAIT, |sb| b_lease_requests(sb) >= seen + 2)
            .await
    );
    let writers: std::collections::BTreeSet<String> = sb
        .requests_of(Verb::Patch, Resource::ClusterCidrs)
        .into_iter()
        .map(|r| r.user_agent)
        .collect();
    assert_eq!(
        writers,
        std::collections::BTreeSet::from([common::agent("replica-a")]),
        "ClusterCIDR writers"
    );
    assert!(!b.health.is_leading());
    let _ = b.stop().await;
    let _ = a.stop().await;
}
