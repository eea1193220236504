//! Several cluster CIDRs per family (issue 18 §1) on the real kube-apiserver: the controller
//! serves fixture 05's four AWS Nodes from a dual-stack cluster whose IPv4 range holds two blocks
//! (two served, two waiting with `CIDRNotAvailable`, no IPv6 block for them either: all or
//! nothing), is stopped, and is started again with a second IPv4 CIDR appended. The real server
//! shows that the two served Nodes were not written to (their `resourceVersion` is unchanged) and
//! that the two waiting ones got blocks of the new CIDR and IPv6 blocks of the one IPv6 CIDR.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::common::{fast_config, init_tracing, ipam, masks, spawn_with_client};
use super::{create_fixture_nodes, pod_cidrs_and_versions as state};

fn served(state: &BTreeMap<String, (Vec<String>, String)>) -> usize {
    state
        .values()
        .filter(|(cidrs, _)| !cidrs.is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appending_a_cluster_cidr_serves_the_waiting_nodes_on_the_real_server() {
    init_tracing();
    let cluster = super::start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    create_fixture_nodes(&nodes, "05-aws-4nodes-no-podcidr.json").await;

    let before = ipam("10.10.0.0/23,fd00:10::/62", "", masks(None, None, Some(64)));
    let first = spawn_with_client(
        super::controller_client(&cluster).await,
        fast_config(before),
    );
    assert!(
        super::wait_for(|| async { served(&state(&nodes).await) == 2 }).await,
        "two Nodes should be served from 10.10.0.0/23: {:?}",
        state(&nodes).await
    );
    first.stop().await;
    let after_first = state(&nodes).await;
    assert_eq!(served(&after_first), 2, "{after_first:?}");
    for (name, (cidrs, _)) in &after_first {
        assert!(
            cidrs.is_empty() || (cidrs.len() == 2 && cidrs[0].starts_with("10.10.")),
            "{name}: {cidrs:?}: a served Node has one block of each family, IPv4 from the first CIDR"
        );
    }

    let appended = ipam(
        "10.10.0.0/23,fd00:10::/62,10.20.0.0/23",
        "",
        masks(None, Some(24), Some(64)),
    );
    let second = spawn_with_client(
        super::controller_client(&cluster).await,
        fast_config(appended),
    );
    assert!(
        super::wait_for(|| async { served(&state(&nodes).await) == 4 }).await,
        "the waiting Nodes should be served from the appended CIDR: {:?}",
        state(&nodes).await
    );
    second.stop().await;
    let end = state(&nodes).await;
    let mut blocks = BTreeSet::new();
    for (name, (cidrs, rv)) in &end {
        let (was, was_rv) = &after_first[name];
        if was.is_empty() {
            assert!(
                cidrs.len() == 2
                    && cidrs[0].starts_with("10.20.")
                    && cidrs[1].starts_with("fd00:10:"),
                "{name}: {cidrs:?}: a waiting Node gets the appended CIDR's block and an IPv6 block"
            );
        } else {
            assert_eq!(
                (cidrs, rv),
                (was, was_rv),
                "{name}: a served Node is not written to after the restart"
            );
        }
        for cidr in cidrs {
            assert!(blocks.insert(cidr.clone()), "{cidr} given twice: {end:?}");
        }
    }
    eprintln!("several cluster CIDRs on the real server: {end:?}");
}
