//! Parallel workers: one Node's PATCH hangs (the API server holds it and never answers while the
//! test looks), and 100 other Nodes are served meanwhile, each with exactly one PATCH. With a
//! single worker (the controller before this change) every other Node waited behind the hung
//! request for the whole request timeout.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, assert_no_cidr_handed_out_twice, fast_config, init_tracing, ipam, masks, node_like,
    node_patches, spawn, unserved,
};
use nodeipam_tests::invariants::assert_invariants;
use nodeipam_tests::sandbox::{FaultAction, FaultRule, Resource, Sandbox, Verb, fixture};
use serde_json::{Value, json};

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const HUNG: &str = "hung-node";
const OTHERS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hung_patch_does_not_stall_the_other_nodes() {
    init_tracing();
    // Real AWS Node (fixture 05's second Node) under new names.
    let template = fixture(AWS)["items"][1].clone();
    let mut items: Vec<Value> = vec![node_like(&template, HUNG)];
    items.extend((0..OTHERS).map(|i| node_like(&template, &format!("node-{i:03}"))));
    let sb = Sandbox::start(json!({"kind": "NodeList", "apiVersion": "v1", "items": items})).await;
    // Held far longer than the test looks; the sandbox's shutdown ends it.
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::Hang(Duration::from_secs(3600)),
        )
        .named(HUNG),
    );
    let ipam = ipam("10.20.0.0/16", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    // The hung request stays in flight for the whole test.
    config.request_timeout = Duration::from_secs(3000);
    config.workers = 30;
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;

    // Served, and every answer written to the log (a commit is visible a moment before its
    // answer is recorded).
    let all_answered = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        node_patches(sb)
            .iter()
            .filter(|(name, _)| name.as_str() != HUNG)
            .all(|(_, sent)| sent.iter().all(|(status, _)| status.is_some()))
    };
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb) == [HUNG] && all_answered(sb))
            .await,
        "the other Nodes were not served while one PATCH hung: {} unserved",
        unserved(&sb).len()
    );
    let patches = node_patches(&sb);
    assert_eq!(
        patches[HUNG].iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [None],
        "the hung PATCH is still in flight (unanswered) while the others were served"
    );
    assert_eq!(patches.len(), OTHERS + 1);
    for (name, sent) in &patches {
        if name != HUNG {
            assert_eq!(
                sent.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                [Some(200)],
                "{name}: exactly one PATCH"
            );
        }
    }
    // The hung Node's block stays reserved for it: nobody else got it.
    let hung_cidrs = patches[HUNG][0].1.as_ref().unwrap()["spec"]["podCIDRs"].clone();
    assert_no_cidr_handed_out_twice(&sb);
    let spec = common::spec_of(&ipam);
    let report = assert_invariants(&sb.nodes(), &spec, &[HUNG], None);
    assert_eq!(report.served, OTHERS);
    for node in sb.nodes() {
        assert_ne!(
            node["spec"]["podCIDRs"], hung_cidrs,
            "the hung Node's reserved block went to {}",
            node["metadata"]["name"]
        );
    }

    // Ending the hang (the server goes away) must not free the reservation either: the write's
    // outcome is unknown.
    sb.shutdown().await;
    let summary = controller.stop().await;
    assert_eq!(
        summary
            .held
            .get(HUNG)
            .map(|c| json!(c.iter().map(ToString::to_string).collect::<Vec<_>>())),
        Some(hung_cidrs)
    );
    assert_eq!(summary.pools[0].used_blocks as usize, OTHERS + 1);
}
