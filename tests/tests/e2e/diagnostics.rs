//! The per-Node diagnostics of the controller's start-up (R10, R11) reach the API server as
//! Warning events on the Nodes concerned, through the controller's event path; the Nodes keep
//! their podCIDRs.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;

use common::{
    WAIT, check_end_state, events_with_reason, fast_config, init_tracing, ipam, masks, spawn,
};
use nodeipam::reasons;
use nodeipam_tests::invariants::{name_of, pod_cidrs_of};
use nodeipam_tests::sandbox::{Sandbox, SandboxOptions, fixture};

/// R11: the three IPv4-only AKS Nodes under a dual-stack configuration each get a
/// `PodCIDRMissingFamily` event, and keep their podCIDRs.
#[tokio::test]
async fn missing_family_is_an_event_on_each_node() {
    init_tracing();
    let doc = fixture("03-aks-kubenet-3nodes.json");
    let names: BTreeSet<String> = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(name_of)
        .collect();
    let sb = Sandbox::start(doc.clone()).await;
    let before: Vec<Vec<String>> = names
        .iter()
        .map(|n| pod_cidrs_of(&sb.node(n).unwrap()))
        .collect();
    let controller = spawn(
        &sb,
        fast_config(ipam(
            "10.244.0.0/16,fd00::/48",
            "10.96.0.0/12",
            masks(None, None, None),
        )),
    );
    controller.wait_allocating(&sb).await;
    let seen = sb
        .wait_until(WAIT, |sb| {
            let warned: BTreeSet<String> = events_with_reason(sb, reasons::POD_CIDR_MISSING_FAMILY)
                .into_iter()
                .map(|(node, _, _)| node)
                .collect();
            warned == names
        })
        .await;
    assert!(
        seen,
        "a PodCIDRMissingFamily event on every Node within {WAIT:?}"
    );
    let (_, _, note) = events_with_reason(&sb, reasons::POD_CIDR_MISSING_FAMILY)
        .into_iter()
        .next()
        .unwrap();
    assert!(note.contains("will never get one from fd00::/48"), "{note}");
    controller.stop().await;
    let after: Vec<Vec<String>> = names
        .iter()
        .map(|n| pod_cidrs_of(&sb.node(n).unwrap()))
        .collect();
    assert_eq!(before, after, "kept as they were");
}

/// R10: the k0s Node written IPv6-first under an IPv4-first configuration gets a
/// `PodCIDRFamilyOrder` event and is kept.
#[tokio::test]
async fn family_order_is_an_event_on_the_node() {
    init_tracing();
    let sb = Sandbox::start(fixture("12-k0s-dualstack-ipv6-primary-partial.json")).await;
    let controller = spawn(
        &sb,
        fast_config(ipam(
            "10.244.0.0/16,fd00::/104",
            "10.96.0.0/12",
            masks(None, None, Some(110)),
        )),
    );
    controller.wait_allocating(&sb).await;
    let seen = sb
        .wait_until(WAIT, |sb| {
            events_with_reason(sb, reasons::POD_CIDR_FAMILY_ORDER)
                .iter()
                .any(|(node, _, _)| node == "worker-1")
        })
        .await;
    assert!(
        seen,
        "a PodCIDRFamilyOrder event on worker-1 within {WAIT:?}"
    );
    controller.stop().await;
    assert_eq!(
        pod_cidrs_of(&sb.node("worker-1").unwrap()),
        ["fd00::/110", "10.244.0.0/24"]
    );
}

/// R08 while running: a Node created with a non-canonical podCIDR (`10.244.9.9/24`, a copy of
/// the real AKS Node with only its name and podCIDR changed) after start-up gets the same
/// `PodCIDRNotCanonical` event as at start-up, keeps its podCIDR as written, and its block
/// (10.244.9.0/24) is reserved. It got nothing before: the findings ran only at start-up.
/// kube-apiserver 1.36 refuses such a write (`StrictIPCIDRValidation`, on by default), so the
/// sandbox plays a server before 1.36, where the Node is stored as written.
#[tokio::test]
async fn non_canonical_pod_cidr_at_run_time_is_an_event_on_the_node() {
    init_tracing();
    let doc = fixture("03-aks-kubenet-3nodes.json");
    let template = doc["items"][0].clone();
    let sb = Sandbox::try_start(
        doc,
        SandboxOptions {
            strict_cidr_validation: false,
            ..SandboxOptions::default()
        },
    )
    .await
    .expect("sandbox starts");
    let controller = spawn(
        &sb,
        fast_config(ipam(
            "10.244.0.0/16",
            "10.96.0.0/12",
            masks(None, None, None),
        )),
    );
    controller.wait_allocating(&sb).await;
    assert!(
        events_with_reason(&sb, reasons::POD_CIDR_NOT_CANONICAL).is_empty(),
        "the fixture's podCIDRs are canonical"
    );
    let mut late = common::node_like(&template, "late-joiner");
    late["spec"]["podCIDR"] = "10.244.9.9/24".into();
    late["spec"]["podCIDRs"] = serde_json::json!(["10.244.9.9/24"]);
    sb.create_node(late).unwrap();
    let seen = sb
        .wait_until(WAIT, |sb| {
            !events_with_reason(sb, reasons::POD_CIDR_NOT_CANONICAL).is_empty()
        })
        .await;
    assert!(seen, "a PodCIDRNotCanonical event within {WAIT:?}");
    let events = events_with_reason(&sb, reasons::POD_CIDR_NOT_CANONICAL);
    assert_eq!(events.len(), 1, "{events:?}");
    let (node, _, note) = &events[0];
    assert_eq!(node, "late-joiner");
    assert!(
        note.contains("has podCIDR \"10.244.9.9/24\", which is not canonical: the controller reserves 10.244.9.0/24"),
        "{note}"
    );
    let summary = controller.stop().await;
    assert_eq!(
        pod_cidrs_of(&sb.node("late-joiner").unwrap()),
        ["10.244.9.9/24"]
    );
    assert_eq!(
        summary.held.get("late-joiner"),
        Some(&vec![nodeipam_core::Cidr::parse("10.244.9.0/24").unwrap()])
    );
}

/// Issue 31, item 1: Nodes holding IPv4-mapped IPv6 podCIDRs, as servers before 1.36's strict
/// validation stored them, are read as Go's `net.ParseCIDR` reads them — the IPv4 ranges
/// `10.9.1.0/24` (`::ffff:10.9.1.0/120`, seen at start-up) and `10.9.0.60/30`
/// (`::ffff:10.9.0.60/126`, created while the controller runs) — kept with the R08 warning that
/// names the IPv4 range and never says IPv6, and neither range goes to another Node. Four /24
/// blocks, two of them reserved that way: of three new Nodes two get 10.9.2.0/24 and
/// 10.9.3.0/24, the third waits. Before the fix both legacy Nodes were skipped as "IPv6, no IPv6
/// cluster CIDR" and the new Nodes got 10.9.0.0/24 and 10.9.1.0/24: a duplicate for every Go
/// reader of the Nodes.
#[tokio::test]
async fn ipv4_mapped_pod_cidrs_are_read_as_go_reads_them() {
    init_tracing();
    let mut doc = fixture("05-aws-4nodes-no-podcidr.json");
    let template = doc["items"][0].clone();
    let legacy = |name: &str, cidr: &str| {
        let mut node = common::node_like(&template, name);
        node["spec"]["podCIDR"] = cidr.into();
        node["spec"]["podCIDRs"] = serde_json::json!([cidr]);
        node
    };
    doc["items"] = serde_json::json!([legacy("legacy-120", "::ffff:10.9.1.0/120")]);
    let sb = Sandbox::try_start(
        doc,
        SandboxOptions {
            strict_cidr_validation: false,
            ..SandboxOptions::default()
        },
    )
    .await
    .expect("sandbox starts");
    let ipam = ipam("10.9.0.0/22", "", masks(Some(24), None, None));
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    sb.create_node(legacy("legacy-126", "::ffff:10.9.0.60/126"))
        .unwrap();
    let decided = |sb: &nodeipam_tests::sandbox::SandboxHandle, node: &str| {
        [
            reasons::POD_CIDR_NOT_CANONICAL,
            reasons::POD_CIDR_OUT_OF_RANGE,
            reasons::POD_CIDR_INVALID,
        ]
        .iter()
        .any(|r| events_with_reason(sb, r).iter().any(|(n, _, _)| n == node))
    };
    assert!(
        sb.wait_until(WAIT, |sb| decided(sb, "legacy-120")
            && decided(sb, "legacy-126"))
            .await,
        "no event on the legacy Nodes within {WAIT:?}"
    );
    for name in ["new-1", "new-2", "new-3"] {
        sb.create_node(common::node_like(&template, name)).unwrap();
    }
    let served = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        ["new-1", "new-2", "new-3"]
            .iter()
            .filter(|n| !common::pod_cidrs(sb, n).is_empty())
            .count()
    };
    assert!(
        sb.wait_until(WAIT, |sb| served(sb) >= 2
            && !events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE).is_empty())
            .await,
        "two new Nodes served and one waiting within {WAIT:?}: {:?}",
        common::all_pod_cidrs(&sb)
    );
    let mut given: Vec<String> = ["new-1", "new-2", "new-3"]
        .iter()
        .flat_map(|n| common::pod_cidrs(&sb, n))
        .collect();
    given.sort();
    assert_eq!(given, ["10.9.2.0/24", "10.9.3.0/24"]);
    let notes = events_with_reason(&sb, reasons::POD_CIDR_NOT_CANONICAL);
    for (node, range) in [
        ("legacy-120", "10.9.1.0/24"),
        ("legacy-126", "10.9.0.60/30"),
    ] {
        let (_, kind, note) = notes
            .iter()
            .find(|(n, _, _)| n == node)
            .unwrap_or_else(|| panic!("no PodCIDRNotCanonical event on {node}: {notes:?}"));
        assert_eq!(kind, "Warning");
        assert!(note.contains(&format!("reserves {range}")), "{note}");
        assert!(!note.contains("IPv6"), "{note}");
    }
    for reason in [reasons::POD_CIDR_OUT_OF_RANGE, reasons::POD_CIDR_INVALID] {
        assert!(events_with_reason(&sb, reason).is_empty(), "{reason}");
    }
    let summary = controller.stop().await;
    assert_eq!(
        summary.held.get("legacy-120"),
        Some(&vec![nodeipam_core::Cidr::parse("10.9.1.0/24").unwrap()])
    );
    assert_eq!(
        summary.held.get("legacy-126"),
        Some(&vec![nodeipam_core::Cidr::parse("10.9.0.60/30").unwrap()])
    );
    let waiting: Vec<&str> = ["new-1", "new-2", "new-3"]
        .into_iter()
        .filter(|n| common::pod_cidrs(&sb, n).is_empty())
        .collect();
    assert_eq!(waiting.len(), 1);
    // The oracle reads podCIDRs as Go does: the legacy Nodes' ranges count, and overlap no one.
    check_end_state(
        &sb,
        &ipam,
        &[&["legacy-120", "legacy-126"][..], &waiting].concat(),
        &summary,
    );
}
