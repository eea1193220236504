//! The controller over time: Nodes added and deleted while it runs, an exhausted pool freed by a
//! deletion, dual-stack with an IPv6-first existing Node under an IPv4-first config, a restart
//! mid-run, and two instances with leader election. Each test ends with the docs/DESIGN.md §3
//! invariant check.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, assert_no_cidr_handed_out_twice, check_end_state, events_with_reason, fast_config,
    init_tracing, ipam, masks, node_like, pod_cidrs, spawn, template_node, unserved, used,
};
use nodeipam::leader::LeaseConfig;
use nodeipam::reasons;
use nodeipam_tests::sandbox::{PatchType, Sandbox, fixture};
use serde_json::json;

/// Nodes added and deleted while running: new Nodes are served, deleted Nodes' blocks are
/// released (the controller's count drops), a Node held by a finalizer keeps its CIDR while it
/// is terminating and releases it once gone; nothing leaks.
#[tokio::test]
async fn nodes_added_and_deleted_while_running() {
    init_tracing();
    let sb = Sandbox::start(fixture("03-aks-kubenet-3nodes.json")).await;
    let template = template_node("03-aks-kubenet-3nodes.json");
    let ipam = ipam("10.244.0.0/16", "10.0.0.0/16", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    let health = controller.health.clone();

    for i in 0..20 {
        sb.create_node(node_like(&template, &format!("added-{i:02}")))
            .unwrap();
    }
    let mut fin = node_like(&template, "with-finalizer");
    fin["metadata"]["finalizers"] = json!(["example.com/drain"]);
    sb.create_node(fin).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "unserved: {:?}",
        unserved(&sb)
    );
    assert!(sb.wait_until(WAIT, |_| used(&health) == [24]).await);
    let fin_cidrs = pod_cidrs(&sb, "with-finalizer");

    // The finalizer keeps the Node (deletionTimestamp set): its CIDR stays held.
    sb.delete_node("with-finalizer").unwrap();
    assert!(sb.node("with-finalizer").unwrap()["metadata"]["deletionTimestamp"].is_string());
    for i in (0..20).step_by(2) {
        sb.delete_node(&format!("added-{i:02}")).unwrap();
    }
    sb.delete_node("aks-agentpool-11223344-vmss000001").unwrap();
    // 24 − 11 deleted; the terminating Node still counts.
    assert!(
        sb.wait_until(WAIT, |_| used(&health) == [13]).await,
        "used {:?}",
        used(&health)
    );
    // A Node created after the deletions is reconciled after them (FIFO queue, ordered watch):
    // once it is served, the terminating Node has been seen and must still be held.
    sb.create_node(node_like(&template, "after-deletions"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "after-deletions").is_empty())
            .await
    );
    assert!(sb.wait_until(WAIT, |_| used(&health) == [14]).await);
    assert_eq!(pod_cidrs(&sb, "with-finalizer"), fin_cidrs);
    assert_ne!(pod_cidrs(&sb, "after-deletions"), fin_cidrs);

    // Finalizer removed → the object is gone → its block is released.
    sb.patch_node(
        "with-finalizer",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
    )
    .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| sb.node("with-finalizer").is_none())
            .await
    );
    assert!(
        sb.wait_until(WAIT, |_| used(&health) == [13]).await,
        "used {:?}",
        used(&health)
    );

    for i in 0..5 {
        sb.create_node(node_like(&template, &format!("late-{i}")))
            .unwrap();
    }
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let summary = controller.stop().await;
    assert_eq!(summary.pools[0].used_blocks, 18);
    let report = check_end_state(&sb, &ipam, &[], &summary);
    assert_eq!(report.served, 18);
    sb.shutdown().await;
}

/// A /22 cut into /24s holds 4 Nodes. A fifth waits with a `CIDRNotAvailable` Warning event;
/// deleting one Node frees its block and the waiting Node gets exactly that block, without a
/// restart.
#[tokio::test]
async fn exhausted_pool_then_a_deletion_serves_the_waiting_node() {
    init_tracing();
    let file = "05-aws-4nodes-no-podcidr.json";
    let sb = Sandbox::start(fixture(file)).await;
    let ipam = ipam("10.10.0.0/22", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);

    sb.create_node(node_like(&template_node(file), "waiting-node"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| {
            events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE)
                .iter()
                .any(|(n, ty, _)| n == "waiting-node" && ty == "Warning")
        })
        .await,
        "no CIDRNotAvailable event for waiting-node"
    );
    assert!(pod_cidrs(&sb, "waiting-node").is_empty());
    assert_eq!(used(&controller.health), [4]);

    let victim = "ip-10-1-1-34.eu-central-1.compute.internal";
    let freed = pod_cidrs(&sb, victim);
    sb.delete_node(victim).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "waiting-node").is_empty())
            .await,
        "the waiting Node was not served after a block was freed"
    );
    assert_eq!(pod_cidrs(&sb, "waiting-node"), freed);
    assert!(!controller.is_finished());
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}

/// Fixture 12's Node is IPv6-first (`[fd00::/110, 10.244.0.0/24]`); the config is IPv4-first.
/// The Node is kept (matched by family), new Nodes get `[IPv4, IPv6]` in config order avoiding
/// its blocks. With only 4 IPv6 blocks the fifth Node fails — and its IPv4 block is given back
/// (all-or-nothing, the controller's IPv4 count does not grow) — until a deletion frees a pair.
#[tokio::test]
async fn dual_stack_ipv6_first_node_ipv4_first_config() {
    init_tracing();
    let file = "12-k0s-dualstack-ipv6-primary-partial.json";
    let sb = Sandbox::start(fixture(file)).await;
    let template = template_node(file);
    let ipam = ipam(
        "10.244.0.0/16,fd00::/108",
        "10.96.0.0/12,fd00:ffff::/112",
        masks(None, Some(24), Some(110)),
    );
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    let health = controller.health.clone();
    assert_eq!(used(&health), [1, 1], "worker-1 occupied in both families");

    for i in 0..3 {
        sb.create_node(node_like(&template, &format!("dual-{i}")))
            .unwrap();
    }
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    for i in 0..3 {
        let name = format!("dual-{i}");
        let cidrs = pod_cidrs(&sb, &name);
        assert_eq!(cidrs.len(), 2, "{name}: {cidrs:?}");
        assert!(
            cidrs[0].starts_with("10.244."),
            "{name}: IPv4 first: {cidrs:?}"
        );
        assert!(
            cidrs[1].starts_with("fd00:"),
            "{name}: IPv6 second: {cidrs:?}"
        );
        let node = sb.node(&name).unwrap();
        assert_eq!(node["spec"]["podCIDR"], json!(cidrs[0]));
    }
    assert_eq!(
        pod_cidrs(&sb, "worker-1"),
        ["fd00::/110", "10.244.0.0/24"],
        "the IPv6-first Node is unchanged"
    );

    sb.create_node(node_like(&template, "dual-3")).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| {
            events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE)
                .iter()
                .any(|(n, _, _)| n == "dual-3")
        })
        .await
    );
    // IPv6 exhausted; the IPv4 block allocated for dual-3 went back to the IPv4 set.
    assert!(sb.wait_until(WAIT, |_| used(&health) == [4, 4]).await);
    assert_eq!(
        used(&health),
        [4, 4],
        "all-or-nothing: no IPv4 block leaked"
    );

    let freed = pod_cidrs(&sb, "dual-1");
    sb.delete_node("dual-1").unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "dual-3").is_empty())
            .await
    );
    let got = pod_cidrs(&sb, "dual-3");
    assert_eq!(got[1], freed[1], "the only free IPv6 block");
    assert!(got[0].starts_with("10.244."));
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}

/// The controller is shut down while Nodes are being created and another instance is started
/// on the same API server: the second one occupies what the first assigned, serves the rest,
/// and no CIDR is handed out twice (no Node gets two successful PATCHes, no CIDR goes to two
/// Nodes).
#[tokio::test]
async fn restart_mid_run_hands_out_no_cidr_twice() {
    init_tracing();
    let file = "05-aws-4nodes-no-podcidr.json";
    let sb = std::sync::Arc::new(Sandbox::start(fixture(file)).await);
    let template = template_node(file);
    let ipam = ipam("10.244.0.0/16", "10.96.0.0/12", masks(None, None, None));
    // Slow writes (50/s, burst 5) so the first instance has a backlog when it is stopped.
    let mut slow = fast_config(ipam.clone());
    slow.kube_api_qps = 50.0;
    slow.kube_api_burst = 5;
    let first = spawn(&sb, slow.clone());
    first.wait_allocating(&sb).await;

    const ADDED: usize = 80;
    let creator = {
        let sb = sb.clone();
        let template = template.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            for i in 0..ADDED {
                tick.tick().await;
                sb.create_node(node_like(&template, &format!("churn-{i:03}")))
                    .unwrap();
            }
        })
    };
    // Stop the first instance once it has served some of the new Nodes.
    assert!(
        sb.wait_until(WAIT, |sb| {
            sb.nodes().len() - unserved(sb).len() >= 4 + 10
        })
        .await
    );
    let first_summary = first.stop().await;
    let served_by_first = first_summary.held.len();
    let second = spawn(&sb, slow);
    second.wait_allocating(&sb).await;
    creator.await.unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| sb.nodes().len() == 4 + ADDED
            && unserved(sb).is_empty())
            .await,
        "unserved after the restart: {:?}",
        unserved(&sb)
    );
    let summary = second.stop().await;
    let patched = assert_no_cidr_handed_out_twice(&sb);
    assert_eq!(patched, 4 + ADDED, "one successful PATCH per Node");
    // Everything the first instance held is still on the Nodes, untouched.
    for (name, held) in &first_summary.held {
        let held: Vec<String> = held.iter().map(ToString::to_string).collect();
        assert_eq!(pod_cidrs(&sb, name), held, "{name}");
    }
    let report = check_end_state(&sb, &ipam, &[], &summary);
    println!(
        "restart: first instance held {served_by_first} Nodes when stopped; {} served in the end",
        report.served
    );
    sb.shutdown().await;
}

fn election(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: "kube-system".to_owned(),
        name: "nodeipam-controller".to_owned(),
        identity: identity.to_owned(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(200),
    }
}

/// Two instances with leader election on one Lease: exactly one allocates (never both), the
/// other stands by ready; when the leader shuts down it releases the Lease, the standby takes
/// over and serves new Nodes; no CIDR is handed out twice.
#[tokio::test]
async fn leader_election_only_the_leader_allocates() {
    init_tracing();
    let file = "10-minikube-single-node-no-podcidr.json";
    let sb = Sandbox::start(fixture(file)).await;
    let template = template_node(file);
    let ipam = ipam("10.244.0.0/16", "10.96.0.0/12", masks(None, None, None));
    let start = |identity: &str| {
        let mut config = fast_config(ipam.clone());
        config.leader_election = Some(election(identity));
        config.instance = Some(identity.to_owned());
        spawn(&sb, config)
    };
    let a = start("instance-a");
    let b = start("instance-b");
    let (ha, hb) = (a.health.clone(), b.health.clone());
    let mut both_leading = false;
    assert!(
        sb.wait_until(WAIT, |sb| {
            both_leading |= ha.is_leading() && hb.is_leading();
            (ha.is_leading() || hb.is_leading()) && unserved(sb).is_empty()
        })
        .await,
        "no instance took the Lease and served minikube"
    );
    let (leader, standby, h_standby, leader_id) = if ha.is_leading() {
        (a, b, hb.clone(), "instance-a")
    } else {
        (b, a, ha.clone(), "instance-b")
    };
    assert!(h_standby.is_ready(), "a clean standby is ready");
    let lease = sb.lease("kube-system", "nodeipam-controller").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], json!(leader_id));

    for i in 0..10 {
        sb.create_node(node_like(&template, &format!("first-{i}")))
            .unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |sb| {
            both_leading |= ha.is_leading() && hb.is_leading();
            unserved(sb).is_empty()
        })
        .await
    );
    assert!(!h_standby.is_leading(), "the standby never allocates");
    let leader_summary = leader.stop().await;
    assert_eq!(leader_summary.held.len(), 11);

    // The standby takes over (the Lease was released, not left to expire).
    for i in 0..5 {
        sb.create_node(node_like(&template, &format!("second-{i}")))
            .unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |sb| h_standby.is_leading() && unserved(sb).is_empty())
            .await,
        "the standby did not take over and serve new Nodes; unserved {:?}",
        unserved(&sb)
    );
    let summary = standby.stop().await;
    assert!(!both_leading, "two instances were leading at once");
    assert_eq!(assert_no_cidr_handed_out_twice(&sb), 16);
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}

/// A leader whose Lease is taken away (here: deleted by someone else) stops allocating at once,
/// fails its health check, and `run` returns an error — the process exits non-zero, as
/// kube-controller-manager does when it loses leadership, instead of allocating without a Lease.
#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_and_fails_health() {
    init_tracing();
    let file = "10-minikube-single-node-no-podcidr.json";
    let sb = Sandbox::start(fixture(file)).await;
    let template = template_node(file);
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let mut config = fast_config(ipam);
    config.leader_election = Some(election("only-instance"));
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let health = controller.health.clone();
    assert!(health.is_alive());

    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(sb.client(), "kube-system");
    leases
        .delete("nodeipam-controller", &Default::default())
        .await
        .unwrap();
    let result = controller.ended().await;
    assert!(
        matches!(
            result,
            Err(nodeipam::Error::LeaderElection(_) | nodeipam::Error::LeadershipLost)
        ),
        "{result:?}"
    );
    assert!(!health.is_alive(), "/healthz fails after the Lease is lost");
    assert!(!health.is_leading());
    // Nothing is allocated any more.
    sb.create_node(node_like(&template, "after-loss")).unwrap();
    // Kept: no marker can exist. `run` has returned, so only a task it leaked could still act,
    // and a leaked task answers to nothing the test could wait for.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(unserved(&sb).contains(&"after-loss".to_owned()));
    sb.shutdown().await;
}
