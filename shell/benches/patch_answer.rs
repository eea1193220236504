//! What reading a Node PATCH answer costs the controller (issue 34 item 3, "read PATCH answers
//! only as far as the controller needs them"). The answers are real: kube-apiserver's answers to
//! the null writer's strategic-merge PATCH of a replicated AWS Node (fixture 05's second Node,
//! created through the API by `scale-bench --server real`), kept by the null writer as
//! `<answers>.first-answer.json`, in `fixtures/patch-answers/`:
//! - `controller_today`: what `kube::Client::request::<SlimNode>` does with the answer — the
//!   body copied into a `String` (UTF-8 checked), then `serde_json::from_str` into
//!   [`SlimNode`] (every field of the Node is still tokenised; only the slim fields are kept);
//! - `slim_from_slice`: the same parse from the body's bytes (no copy, no separate UTF-8 pass);
//! - `resource_version_only`: only `metadata.resourceVersion` kept (all a 2xx answer needs when
//!   the controller trusts the podCIDRs it sent); the parser still walks the whole document;
//! - `whole_node`: a whole `k8s_openapi` Node, for reference;
//! - `metadata_answer_slim`: the answer asked for as `PartialObjectMetadata`
//!   (`Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`), parsed into
//!   [`SlimNode`] — shorter by the Node's `spec` and `status`, not by its `managedFields`.
//!
//! Run: `cargo bench -p nodeipam --bench patch_answer`. Results in BENCHMARKS.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Node;
use nodeipam::controller::node::SlimNode;
use serde::Deserialize;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../fixtures/patch-answers/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Only `metadata.resourceVersion`; every other field is skipped (serde's default for unknown
/// fields).
#[derive(Deserialize)]
struct VersionOnly {
    metadata: VersionMeta,
}

#[derive(Deserialize)]
struct VersionMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

fn answers(c: &mut Criterion) {
    let full = fixture("node-smp-full.json");
    let metadata = fixture("node-smp-metadata.json");
    // The fixtures are what they say: a Node with podCIDRs, and its metadata only.
    let node: SlimNode = serde_json::from_slice(&full).expect("a Node");
    assert!(!node.pod_cidrs.is_empty(), "the answer has podCIDRs");
    let meta: SlimNode = serde_json::from_slice(&metadata).expect("PartialObjectMetadata");
    assert!(meta.pod_cidrs.is_empty() && meta.metadata.resource_version.is_some());

    let mut group = c.benchmark_group("patch_answer");
    group.throughput(Throughput::Bytes(full.len() as u64));
    group.bench_function("controller_today", |b| {
        b.iter(|| {
            let text = String::from_utf8(black_box(&full).to_vec()).expect("UTF-8");
            let node: SlimNode = serde_json::from_str(&text).expect("a Node");
            black_box(node)
        });
    });
    group.bench_function("slim_from_slice", |b| {
        b.iter(|| {
            let node: SlimNode = serde_json::from_slice(black_box(&full)).expect("a Node");
            black_box(node)
        });
    });
    group.bench_function("resource_version_only", |b| {
        b.iter(|| {
            let v: VersionOnly = serde_json::from_slice(black_box(&full)).expect("a Node");
            black_box(v.metadata.resource_version)
        });
    });
    group.bench_function("whole_node", |b| {
        b.iter(|| {
            let node: Node = serde_json::from_slice(black_box(&full)).expect("a Node");
            black_box(node)
        });
    });
    group.throughput(Throughput::Bytes(metadata.len() as u64));
    group.bench_function("metadata_answer_slim", |b| {
        b.iter(|| {
            let text = String::from_utf8(black_box(&metadata).to_vec()).expect("UTF-8");
            let node: SlimNode = serde_json::from_str(&text).expect("metadata");
            black_box(node)
        });
    });
    group.finish();
}

criterion_group!(benches, answers);
criterion_main!(benches);
