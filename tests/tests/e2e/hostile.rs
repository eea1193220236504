//! Hostile state for the controller against the sandbox: invalid, conflicting, out-of-range and
//! service-overlapping podCIDRs loaded as the initial NodeList (which bypasses the API's
//! validation), a Node deleted while its PATCH is in flight, a Node deleted and re-created under
//! the same name, and a dropped watch plus compaction in the middle of it. Each ends with the
//! docs/DESIGN.md §3 invariant check and the controller still serving.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, check_end_state, events_with_reason, fast_config, init_tracing, ipam, masks, node_like,
    pod_cidrs, spawn, template_node, unserved,
};
use nodeipam_tests::sandbox::{FaultAction, FaultRule, Resource, Sandbox, Verb, fixture};
use serde_json::{Value, json};

const FIXTURE: &str = "05-aws-4nodes-no-podcidr.json";

/// A real fixture Node renamed, with `spec` pod CIDR fields set to `spec`.
fn hostile(name: &str, spec: Value) -> Value {
    let mut node = node_like(&template_node(FIXTURE), name);
    let fields = node["spec"].as_object_mut().unwrap();
    for (k, v) in spec.as_object().unwrap() {
        fields.insert(k.clone(), v.clone());
    }
    node
}

#[tokio::test]
async fn hostile_initial_state_is_skipped_and_the_rest_is_served() {
    init_tracing();
    let mut list = fixture(FIXTURE);
    let items = list["items"].as_array_mut().unwrap();
    items.extend([
        hostile("keeper", json!({"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]})),
        hostile("later-same", json!({"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]})),
        hostile("overlap-23", json!({"podCIDR": "10.244.0.0/23", "podCIDRs": ["10.244.0.0/23"]})),
        hostile("banana", json!({"podCIDR": "banana", "podCIDRs": ["banana"]})),
        hostile("spaces", json!({"podCIDR": " 10.244.7.0/24", "podCIDRs": [" 10.244.7.0/24"]})),
        hostile("in-services", json!({"podCIDR": "10.244.130.0/24", "podCIDRs": ["10.244.130.0/24"]})),
        hostile(
            "three",
            json!({"podCIDR": "10.244.9.0/24", "podCIDRs": ["10.244.9.0/24", "fd00::/64", "10.244.10.0/24"]}),
        ),
        hostile("mismatch", json!({"podCIDR": "10.244.11.0/24", "podCIDRs": ["10.244.12.0/24"]})),
        hostile("other-family", json!({"podCIDR": "fd00::/64", "podCIDRs": ["fd00::/64"]})),
    ]);
    let sb = Sandbox::start(list).await;
    let ipam = ipam("10.244.0.0/16", "10.244.128.0/20", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    let unservable = [
        "later-same",
        "overlap-23",
        "banana",
        "spaces",
        "in-services",
        "three",
        "mismatch",
        "other-family",
    ];
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb)
            .iter()
            .all(|n| unservable.contains(&n.as_str())))
            .await,
        "unserved: {:?}",
        unserved(&sb)
    );
    // One Warning event per skipped Node.
    let mut warned: Vec<String> = ["PodCIDRInvalid", "PodCIDROutOfRange", "PodCIDRConflict"]
        .iter()
        .flat_map(|r| events_with_reason(&sb, r))
        .map(|(name, ..)| name)
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while warned.len() < unservable.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        warned = ["PodCIDRInvalid", "PodCIDROutOfRange", "PodCIDRConflict"]
            .iter()
            .flat_map(|r| events_with_reason(&sb, r))
            .map(|(name, ..)| name)
            .collect();
    }
    warned.sort();
    let mut want: Vec<String> = unservable.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(warned, want);

    // Still serving: a new Node is served and the conflicting one's range is never handed out.
    sb.create_node(node_like(&template_node(FIXTURE), "late"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "late").is_empty())
            .await
    );
    // Deleting the keeper must not free 10.244.0.0/24 (later-same and overlap-23 still claim it).
    sb.delete_node("keeper").unwrap();
    sb.create_node(node_like(&template_node(FIXTURE), "after-keeper"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "after-keeper").is_empty())
            .await
    );
    assert!(!controller.is_finished());
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &unservable, &summary);
}

/// A podCIDR covering the whole cluster CIDR fences off the pool: that Node is skipped, the
/// others fail with CIDRNotAvailable, and the controller keeps running.
#[tokio::test]
async fn pod_cidr_covering_the_cluster_cidr_is_skipped_not_kept() {
    init_tracing();
    let mut list = fixture(FIXTURE);
    list["items"].as_array_mut().unwrap().push(hostile(
        "whole-world",
        json!({"podCIDR": "10.0.0.0/8", "podCIDRs": ["10.0.0.0/8"]}),
    ));
    let sb = Sandbox::start(list).await;
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| events_with_reason(sb, "PodCIDROutOfRange").len()
            == 1)
            .await,
        "{:?}",
        sb.events()
    );
    assert!(
        sb.wait_until(WAIT, |sb| !events_with_reason(sb, "CIDRNotAvailable")
            .is_empty())
            .await
    );
    assert!(!controller.is_finished());
    let summary = controller.stop().await;
    let mut unservable: Vec<String> = unserved(&sb);
    unservable.push("whole-world".to_owned());
    let unservable: Vec<&str> = unservable.iter().map(String::as_str).collect();
    check_end_state(&sb, &ipam, &unservable, &summary);
}

#[tokio::test]
async fn delete_while_patch_in_flight_and_recreate_same_name() {
    init_tracing();
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let template = template_node(FIXTURE);

    // 1. Deleted while its PATCH is held by the server.
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::Delay(Duration::from_millis(800)),
        )
        .named("doomed"),
    );
    sb.create_node(node_like(&template, "doomed")).unwrap();
    // The PATCH has arrived (the fault fired) and is held: delete the Node under it.
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().is_empty())
            .await
    );
    sb.delete_node("doomed").unwrap();

    // 2. Deleted and re-created under one name, several times, quickly.
    for round in 0..5 {
        sb.create_node(node_like(&template, "phoenix")).unwrap();
        if round % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        sb.delete_node("phoenix").unwrap();
    }
    sb.create_node(node_like(&template, "phoenix")).unwrap();

    // 3. A dropped watch and a compaction in the middle.
    sb.drop_watches();
    sb.create_node(node_like(&template, "after-drop")).unwrap();
    sb.compact();
    assert!(
        sb.wait_until(WAIT, |sb| sb.node("doomed").is_none()
            && unserved(sb).is_empty())
            .await,
        "unserved: {:?}",
        unserved(&sb)
    );
    // Let the controller settle (the late DELETE/PATCH answers), then check nothing leaked.
    let health = controller.health.clone();
    assert!(
        sb.wait_until(WAIT, |sb| {
            health.pools().first().map(|p| p.used_blocks) == Some(sb.nodes().len() as u32)
        })
        .await,
        "used {:?} for {} Nodes",
        health.pools(),
        sb.nodes().len()
    );
    assert!(!controller.is_finished());
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
}

/// Nodes that another actor creates with podCIDRs while the controller runs (here the real AKS
/// kubenet Nodes, whose podCIDRs its own allocator chose) are occupied, and the pool usage the
/// controller reports (health, gauges) counts them at once — not only at the next allocation or
/// release (found by the chaos suite: usage lagged the Nodes by 14 blocks after settling).
#[tokio::test]
async fn podcidrs_set_by_another_actor_are_counted_at_once() {
    init_tracing();
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    // 10.244.0.0/24–10.244.2.0/24 (the AKS Nodes' blocks) are free: ours start at 10.240.0.0/24.
    let ipam = ipam("10.240.0.0/12", "", masks(None, None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let health = controller.health.clone();
    assert_eq!(common::used(&health), vec![4]);
    let aks = fixture("03-aks-kubenet-3nodes.json");
    for node in aks["items"].as_array().unwrap() {
        // Created anew under its own name with its own podCIDRs (server-set metadata dropped).
        let name = node["metadata"]["name"].as_str().unwrap();
        let mut created = node_like(node, name);
        created["spec"]["podCIDR"] = node["spec"]["podCIDR"].clone();
        created["spec"]["podCIDRs"] = node["spec"]["podCIDRs"].clone();
        sb.create_node(created).unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |_| common::used(&health) == vec![7])
            .await,
        "pool usage {:?} with 7 Nodes holding one block each",
        common::used(&health)
    );
    // Nothing of theirs was re-patched.
    assert!(
        common::node_patches(&sb)
            .keys()
            .all(|name| !name.starts_with("aks-")),
        "{:?}",
        common::node_patches(&sb).keys()
    );
    let summary = controller.stop().await;
    check_end_state(&sb, &ipam, &[], &summary);
}
