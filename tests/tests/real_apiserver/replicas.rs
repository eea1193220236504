//! Issue 16 (4), (5) and (8): replicas on real Leases, a kube-apiserver restart mid-allocation,
//! the informer against a real compaction.

use super::{
    WAIT, common, controller_client, create_and_wait_served, lease_holder, pod_cidrs_by_node,
    start, wait_for,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{election, fast_config, init_tracing, ipam, masks, spawn_with_client};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use nodeipam_tests::real_apiserver::RealCluster;
use serde_json::json;

/// Issue 16 (5): replicas with leader election on the real server's `coordination.k8s.io/v1`
/// Leases. `kill -9` of the leader (its task aborted: nothing released, requests cut): the standby
/// takes the Lease once it expires and serves a Node created after the kill. SIGTERM of that
/// leader (a clean stop) releases the Lease — it is no longer held by the stopped replica when the
/// stop returns — and a third replica takes over and serves the next Node. Every Node gets its own
/// block. The times are printed (BENCHMARKS.md), not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_fail_over_on_real_leases_after_kill_and_hand_over_on_sigterm() {
    init_tracing();
    let cluster = start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let replica = |identity: &str| {
        let mut config = fast_config(ipam.clone());
        config.leader_election = Some(election(identity));
        config
    };

    let a = spawn_with_client(controller_client(&cluster).await, replica("replica-a"));
    assert!(
        wait_for(|| async { a.health.is_leading() }).await,
        "replica-a never led"
    );
    let b = spawn_with_client(controller_client(&cluster).await, replica("replica-b"));
    assert!(
        wait_for(|| async { b.health.is_ready() }).await,
        "replica-b not standing by"
    );
    assert!(!b.health.is_leading());
    assert_eq!(lease_holder(&admin).await.as_deref(), Some("replica-a"));
    let first = create_and_wait_served(&nodes, &template, "node-1").await;

    // kill -9 of the leader, then a new Node.
    a.abort().await;
    let killed = tokio::time::Instant::now();
    let second = create_and_wait_served(&nodes, &template, "node-2").await;
    let failover = killed.elapsed();
    assert!(b.health.is_leading());
    assert_eq!(lease_holder(&admin).await.as_deref(), Some("replica-b"));

    // SIGTERM of the new leader hands the Lease over.
    let c = spawn_with_client(controller_client(&cluster).await, replica("replica-c"));
    assert!(
        wait_for(|| async { c.health.is_ready() }).await,
        "replica-c not standing by"
    );
    assert!(!c.health.is_leading());
    let stopping = tokio::time::Instant::now();
    b.stop().await;
    let holder = lease_holder(&admin).await;
    assert_ne!(
        holder.as_deref(),
        Some("replica-b"),
        "the stopped leader still holds the Lease"
    );
    assert!(
        wait_for(|| async { c.health.is_leading() }).await,
        "replica-c never led"
    );
    let handover = stopping.elapsed();
    let third = create_and_wait_served(&nodes, &template, "node-3").await;
    assert_eq!(lease_holder(&admin).await.as_deref(), Some("replica-c"));
    c.stop().await;

    let all: BTreeSet<&String> = [&first, &second, &third].into_iter().flatten().collect();
    assert_eq!(all.len(), 3, "{first:?} {second:?} {third:?}");
    eprintln!(
        "real Leases (2 s lease, 200 ms retry): kill -9 → new Node served by the standby in {:.1} s; \
         SIGTERM → Lease after the stop: {holder:?}, next replica leading {:.1} s after the stop began",
        failover.as_secs_f64(),
        handover.as_secs_f64()
    );
}

/// Issue 16 (8): kube-apiserver killed (`kill -9`) and started again on the same etcd while the
/// controller allocates for 2,000 Nodes: after it is back, every Node is served, no block is
/// handed out twice, and the controller is still running, ready and leading (it rode out the
/// outage: broken watch, failed writes, refused connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_mid_allocation_of_2000_nodes() {
    use futures::StreamExt as _;
    const NODES: usize = 2000;
    init_tracing();
    let mut cluster = start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    let create = |i: usize| {
        let nodes = nodes.clone();
        let node: Node =
            serde_json::from_value(common::node_like(&template, &format!("node-{i:04}"))).unwrap();
        async move { nodes.create(&PostParams::default(), &node).await }
    };
    // The first half before the controller starts, the second while it allocates.
    let created = futures::stream::iter(0..NODES / 2)
        .map(create)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(created.iter().all(Result::is_ok));
    let ipam = ipam("10.0.0.0/12", "", masks(None, None, None));
    let running = spawn_with_client(controller_client(&cluster).await, fast_config(ipam));
    let created = futures::stream::iter(NODES / 2..NODES)
        .map(create)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(created.iter().all(Result::is_ok));

    // Restart once some, not all, are served.
    let served =
        |map: &BTreeMap<String, Vec<String>>| map.values().filter(|c| !c.is_empty()).count();
    let mut before_restart = 0;
    for _ in 0..600 {
        before_restart = served(&pod_cidrs_by_node(&nodes).await);
        if before_restart >= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        (100..NODES).contains(&before_restart),
        "{before_restart} Nodes served before the restart (want some, not all)"
    );
    cluster.kill_apiserver();
    // Pacing, kept: the server stays down a while (nothing is asserted about that second).
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster
        .restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("kube-apiserver did not come back: {e}"));

    let mut last = BTreeMap::new();
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(300) {
        last = pod_cidrs_by_node(&nodes).await;
        if last.len() == NODES && served(&last) == NODES {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        (last.len(), served(&last)),
        (NODES, NODES),
        "every Node served after the restart"
    );
    let blocks: BTreeSet<&String> = last.values().flatten().collect();
    assert_eq!(blocks.len(), NODES, "a block was handed out twice");
    assert!(last.values().all(|c| c.len() == 1));
    assert!(!running.is_finished(), "the controller stopped");
    assert!(running.health.is_ready() && running.health.is_leading());
    let summary = running.stop().await;
    assert_eq!(summary.pools[0].used_blocks as usize, NODES);
    eprintln!(
        "kube-apiserver restarted with {before_restart} of {NODES} Nodes served; all {NODES} served \
         {:.1} s after it was back, {} distinct blocks",
        start.elapsed().as_secs_f64(),
        blocks.len()
    );
}

/// The controller's informer (`controller::informer::run`) on the real server, with the
/// kube-apiserver flags that put etcd's own compaction in the watch path: `--watch-cache=false`
/// (watches go to etcd) and `--etcd-compaction-interval=1s`.
struct InformerRun {
    cache: std::sync::Arc<nodeipam::controller::informer::NodeCache>,
    synced: tokio::sync::watch::Receiver<nodeipam::controller::informer::SyncState>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn run_informer(client: Client) -> InformerRun {
    use nodeipam::controller::informer::{self, InformerSettings, NodeCache, Outputs, SyncState};
    use nodeipam::controller::{InitialList, WorkQueue, window::WriteWindow};
    let cache = std::sync::Arc::new(NodeCache::new());
    let (synced_tx, synced) = tokio::sync::watch::channel(SyncState::default());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (broken, _) = tokio::sync::watch::channel(None);
    let task = tokio::spawn(informer::run(
        Api::all(client),
        Outputs {
            cache: cache.clone(),
            queue: std::sync::Arc::new(WorkQueue::new()),
            window: std::sync::Arc::new(WriteWindow::new(1000)),
        },
        synced_tx,
        InformerSettings {
            initial_list: InitialList::Streaming,
            retry_min_delay: Duration::from_millis(100),
            retry_max_delay: Duration::from_secs(1),
        },
        stop_rx,
        broken,
    ));
    InformerRun {
        cache,
        synced,
        stop,
        task,
    }
}

/// Issue 16 (4): the informer's initial state is a real streaming list (`sendInitialEvents`,
/// ended by the server's `k8s.io/initial-events-end` BOOKMARK); then, with its watch behind real
/// etcd compaction — other writes move etcd's revision on, kube-apiserver compacts every second,
/// kube-apiserver restarts so the watch must be re-opened from the informer's old resourceVersion
/// — the server answers `410 Gone`, the informer lists again (a second complete list) and sees a
/// Node created afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_streams_its_list_and_relists_after_a_410_from_real_compaction() {
    init_tracing();
    let options = nodeipam_tests::real_apiserver::Options {
        etcd_args: Vec::new(),
        apiserver_args: vec![
            "--watch-cache=false".to_owned(),
            "--etcd-compaction-interval=1s".to_owned(),
        ],
    };
    let mut cluster = RealCluster::start_with(options)
        .await
        .unwrap_or_else(|e| panic!("the real control plane did not start: {e}"));
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    for i in 1..=3 {
        let node: Node =
            serde_json::from_value(common::node_like(&template, &format!("node-{i}"))).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    let mut informer = run_informer(controller_client(&cluster).await);
    let first = tokio::time::timeout(WAIT, informer.synced.wait_for(|s| s.lists >= 1))
        .await
        .expect("no initial list")
        .unwrap()
        .to_owned();
    assert!(
        first.streamed,
        "the real server did not serve a streaming list"
    );
    assert_eq!(informer.cache.len(), 3);

    // Move etcd's revision on without touching Nodes, let the compactor pass the informer's
    // resourceVersion, then make it re-open its watch from there.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "default");
    for i in 0..20 {
        let map =
            serde_json::from_value(json!({"metadata": {"name": format!("churn-{i}")}})).unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    // Kept: waits for etcd's compactor (outside the controller); the check after it is positive
    // (a second list), so too short a wait can only fail the test, not pass it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster
        .restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("kube-apiserver did not come back: {e}"));
    let relisted = tokio::time::timeout(WAIT, informer.synced.wait_for(|s| s.lists >= 2))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(
        relisted,
        "no second list after the compaction (informer state {:?})",
        *informer.synced.borrow()
    );
    let node: Node = serde_json::from_value(common::node_like(&template, "node-4")).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    assert!(
        wait_for(|| async { informer.cache.get("node-4").is_some() }).await,
        "the informer did not see a Node created after the re-list"
    );
    eprintln!(
        "informer: first list streamed = {}, lists after the compaction = {}",
        first.streamed,
        informer.synced.borrow().lists
    );
    let _ = informer.stop.send(true);
    let _ = informer.task.await;
}
