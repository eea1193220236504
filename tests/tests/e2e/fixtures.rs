//! Every real NodeList in `fixtures/nodes/` loaded as the cluster, the real controller
//! (`nodeipam::controller::run`) run in-process against the sandbox API server.
//!
//! Each test proves: Nodes without podCIDRs get them (exactly one PATCH each, and exactly the
//! CIDRs `plan` predicts for the same NodeList and flags); Nodes with podCIDRs keep them
//! byte-for-byte and get no PATCH; Nodes whose podCIDRs are unusable are skipped with a Warning
//! event and no PATCH; the pool figures equal `plan`'s; then the docs/DESIGN.md §3 invariants.
//!
//! Config per fixture (what the cluster plausibly ran with; same table as shell/tests/plan.rs,
//! plus service CIDRs where the distribution has a well-known default):
//! | fixture | `--cluster-cidr` | masks | `--service-cluster-ip-range` | skipped |
//! |---|---|---|---|---|
//! | 01 k3s | 10.42.0.0/16 | 24 | 10.43.0.0/16 | – |
//! | 03 AKS kubenet | 10.244.0.0/16 | 24 | 10.0.0.0/16 | – |
//! | 05 AWS | 10.244.0.0/16 | 24 | 10.96.0.0/12 | – |
//! | 06 KVM on-prem | 10.2.0.0/16 | 24 | 10.2.0.0/24 (inside!) | – |
//! | 07 EKS | 10.100.0.0/16 | 26 | – | – |
//! | 08 OpenShift GCP | 10.128.0.0/14 | 23 | 172.30.0.0/16 | – |
//! | 09 OpenShift bare metal | 10.128.0.0/14 | 23 | 172.30.0.0/16 | – |
//! | 10 minikube | 10.244.0.0/16 | 24 | 10.96.0.0/12 | – |
//! | 11 mixed bundle | 10.32.0.0/12 (Weave) | 24 | – | the five `***HIDDEN***/25` |
//! | 12 k0s dual-stack | 10.244.0.0/16,fd00::/104 | v4 24, v6 110 | 10.96.0.0/12 | – |
//! | 13 kind dual-stack | 10.244.0.0/16,fd00:10:244::/56 | 24, 64 | – | – |
//! | 13 kind, single-stack config | 10.244.0.0/16 | 24 | – | the dual-stack Node |
//! | 20 GKE preemptible | 10.48.0.0/14 | 24 | – | – |
//! | 21 GKE COS | 10.40.0.0/14 | 24 | – | – |
//! | 22 GCE NotReady | 10.244.0.0/16 | 24 | – | – |
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{
    WAIT, check_end_state, events_with_reason, fast_config, init_tracing, ipam, masks,
    node_patches, spawn,
};
use nodeipam::plan::plan;
use nodeipam::reasons;
use nodeipam_core::NodeMaskFlags;
use nodeipam_tests::invariants::{name_of, pod_cidrs_of};
use nodeipam_tests::sandbox::{Sandbox, fixture};
use serde_json::Value;

const SKIP_REASONS: [&str; 3] = [
    reasons::POD_CIDR_INVALID,
    reasons::POD_CIDR_OUT_OF_RANGE,
    reasons::POD_CIDR_CONFLICT,
];

/// The `spec.podCIDR` / `spec.podCIDRs` fields exactly as written.
fn cidr_fields(node: &Value) -> (Value, Value) {
    (
        node["spec"]["podCIDR"].clone(),
        node["spec"]["podCIDRs"].clone(),
    )
}

async fn run_fixture(
    file: &str,
    cluster: &str,
    service: &str,
    mask_flags: NodeMaskFlags,
    expect_skipped: &[&str],
) {
    init_tracing();
    let doc = fixture(file);
    let ipam = ipam(cluster, service, mask_flags);
    let lacking: BTreeSet<String> = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| pod_cidrs_of(n).is_empty())
        .map(name_of)
        .collect();

    // What `plan` predicts for the same NodeList and flags.
    let nodes = nodeipam::nodelist::parse_nodes(&doc.to_string()).unwrap();
    let predicted = plan(&ipam, &nodes).unwrap();
    let predicted_skips: BTreeSet<&str> = predicted
        .nodes
        .iter()
        .filter(|n| n.action == "skip")
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(
        predicted_skips,
        expect_skipped.iter().copied().collect(),
        "{file}: plan's skips"
    );

    let sb = Sandbox::start(doc.clone()).await;
    // As the API server stores them (it defaults `podCIDRs` from a lone `podCIDR`).
    let original: BTreeMap<String, (Value, Value)> = sb
        .nodes()
        .iter()
        .map(|n| (name_of(n), cidr_fields(n)))
        .collect();
    let controller = spawn(&sb, fast_config(ipam.clone()));
    controller.wait_allocating(&sb).await;
    let done = sb
        .wait_until(WAIT, |sb| {
            let served = lacking
                .iter()
                .all(|n| sb.node(n).is_some_and(|n| !pod_cidrs_of(&n).is_empty()));
            let warned: BTreeSet<String> = SKIP_REASONS
                .iter()
                .flat_map(|r| events_with_reason(sb, r))
                .map(|(n, _, _)| n)
                .collect();
            served && expect_skipped.iter().all(|s| warned.contains(*s))
        })
        .await;
    assert!(
        done,
        "{file}: not every Node served / skip event seen in {WAIT:?}"
    );
    let summary = controller.stop().await;

    // Kept Nodes (and skipped ones) are untouched; lacking ones got plan's CIDRs.
    for p in &predicted.nodes {
        let now = sb.node(&p.name).unwrap();
        if lacking.contains(&p.name) {
            assert_eq!(p.action, "assign", "{file}: {}", p.name);
            assert_eq!(
                pod_cidrs_of(&now),
                p.pod_cidrs,
                "{file}: Node {} did not get what plan predicted",
                p.name
            );
        } else {
            assert_eq!(
                cidr_fields(&now),
                original[&p.name],
                "{file}: Node {} had podCIDRs and they changed",
                p.name
            );
        }
    }
    // Exactly one PATCH per Node that lacked podCIDRs, none for the others.
    let patches = node_patches(&sb);
    for name in original.keys() {
        let sent = patches.get(name).map_or(0, Vec::len);
        let expected = usize::from(lacking.contains(name));
        assert_eq!(
            sent, expected,
            "{file}: PATCHes of Node {name}: {patches:?}"
        );
    }
    assert!(
        patches
            .values()
            .flatten()
            .all(|(status, _)| *status == Some(200))
    );
    // A Warning event for each skipped Node, with one of the skip reasons; nothing else warned.
    let mut warned = BTreeSet::new();
    for reason in SKIP_REASONS {
        for (node, ty, note) in events_with_reason(&sb, reason) {
            assert_eq!(ty, "Warning", "{file}: {reason} on {node}");
            assert!(!note.is_empty(), "{file}: {reason} on {node} has no note");
            warned.insert(node);
        }
    }
    assert_eq!(
        warned,
        expect_skipped.iter().map(|s| (*s).to_owned()).collect(),
        "{file}: skip events"
    );
    for reason in [reasons::CIDR_NOT_AVAILABLE, reasons::CIDR_ASSIGNMENT_FAILED] {
        assert!(
            events_with_reason(&sb, reason).is_empty(),
            "{file}: {reason}"
        );
    }
    // The controller's pool figures equal plan's.
    common::assert_pools_match_plan(&summary, &predicted, file);

    let report = check_end_state(&sb, &ipam, expect_skipped, &summary);
    assert_eq!(report.served + report.unservable, original.len(), "{file}");
    sb.shutdown().await;
}

#[tokio::test]
async fn fixture_01_k3s_keeps_its_cidr() {
    run_fixture(
        "01-k3s-single-node-flannel-hostgw.json",
        "10.42.0.0/16",
        "10.43.0.0/16",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_03_aks_keeps_all_three() {
    run_fixture(
        "03-aks-kubenet-3nodes.json",
        "10.244.0.0/16",
        "10.0.0.0/16",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_05_aws_assigns_four() {
    run_fixture(
        "05-aws-4nodes-no-podcidr.json",
        "10.244.0.0/16",
        "10.96.0.0/12",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_06_kvm_avoids_the_service_block() {
    run_fixture(
        "06-kvm-onprem-4nodes-no-podcidr.json",
        "10.2.0.0/16",
        "10.2.0.0/24",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_07_eks_with_mask_26() {
    run_fixture(
        "07-eks-2nodes-no-podcidr.json",
        "10.100.0.0/16",
        "",
        masks(Some(26), None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_08_openshift_gcp_with_mask_23() {
    run_fixture(
        "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
        "10.128.0.0/14",
        "172.30.0.0/16",
        masks(Some(23), None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_09_openshift_baremetal_with_mask_23() {
    run_fixture(
        "09-openshift-baremetal-2nodes-no-podcidr.json",
        "10.128.0.0/14",
        "172.30.0.0/16",
        masks(Some(23), None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_10_minikube() {
    run_fixture(
        "10-minikube-single-node-no-podcidr.json",
        "10.244.0.0/16",
        "10.96.0.0/12",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_11_mixed_skips_redacted_with_events() {
    run_fixture(
        "11-mixed-bundle-7nodes-redacted-podcidr.json",
        "10.32.0.0/12",
        "",
        masks(None, None, None),
        &[
            "biggernode-3i745",
            "pool-yd23sqk7u-3i7i7",
            "pool-yd23sqk7u-3i7it",
            "pool-yd23sqk7u-3i7v3",
            "smallnode-3i74t",
        ],
    )
    .await;
}

#[tokio::test]
async fn fixture_12_k0s_ipv6_first_kept_by_ipv4_first_config() {
    run_fixture(
        "12-k0s-dualstack-ipv6-primary-partial.json",
        "10.244.0.0/16,fd00::/104",
        "10.96.0.0/12",
        masks(None, Some(24), Some(110)),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_13_kind_dual_stack() {
    run_fixture(
        "13-kind-dualstack-single-node-abridged.json",
        "10.244.0.0/16,fd00:10:244::/56",
        "",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_13_kind_under_single_stack_config_is_skipped() {
    run_fixture(
        "13-kind-dualstack-single-node-abridged.json",
        "10.244.0.0/16",
        "",
        masks(None, None, None),
        &["dual-stack-control-plane"],
    )
    .await;
}

#[tokio::test]
async fn fixture_20_gke_preemptible_podcidr_only() {
    run_fixture(
        "20-gke-preemptible-single-node-podcidr.json",
        "10.48.0.0/14",
        "",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_21_gke_cos_podcidr_only() {
    run_fixture(
        "21-gke-cos-single-node-podcidr.json",
        "10.40.0.0/14",
        "",
        masks(None, None, None),
        &[],
    )
    .await;
}

#[tokio::test]
async fn fixture_22_gce_notready() {
    run_fixture(
        "22-gce-notready-single-node-podcidr.json",
        "10.244.0.0/16",
        "",
        masks(None, None, None),
        &[],
    )
    .await;
}

/// Guards the table above: a fixture added to `fixtures/nodes/` must get a test here.
#[test]
fn every_fixture_has_a_test() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/nodes");
    let this = include_str!("fixtures.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") && !this.contains(&format!("\"{name}\"")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "fixtures without an e2e test: {missing:?}"
    );
}
