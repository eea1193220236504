//! The ClusterCIDR CRD (`deploy/crds/clustercidrs.yaml`, issue 18) installed on the real
//! kube-apiserver: every admission rule it declares is enforced by the server itself (OpenAPI
//! schema and CEL), checked object by object — valid ones stored, each invalid one refused with
//! 422 and the rule's own message.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The CRD manifest as shipped.
fn crd_manifest() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crds/clustercidrs.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn cluster_cidrs(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nodeipam.io", "v1alpha1", "ClusterCIDR");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Installs the CRD and waits until the server serves it (`Established`).
pub(super) async fn install(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(crd_manifest()).unwrap();
    crds.create(&PostParams::default(), &crd)
        .await
        .unwrap_or_else(|e| panic!("the real server refused the ClusterCIDR CRD: {e}"));
    let established = super::wait_for(|| async {
        crds.get("clustercidrs.nodeipam.io")
            .await
            .ok()
            .and_then(|crd| crd.status)
            .and_then(|status| status.conditions)
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    })
    .await;
    assert!(established, "the ClusterCIDR CRD never became Established");
    // Discovery of a new group can lag Established by a moment.
    let api = cluster_cidrs(client);
    assert!(
        super::wait_for(|| async { api.list(&Default::default()).await.is_ok() }).await,
        "clustercidrs are not listable"
    );
}

fn object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// `(status code, message)` of a refused request; panics on success or a transport error.
fn refusal<T>(result: Result<T, kube::Error>, what: &str) -> (u16, String) {
    match result {
        Ok(_) => panic!("{what}: accepted, but the CRD should refuse it"),
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        Err(e) => panic!("{what}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cidr_crd_rules_are_enforced_by_the_real_server() {
    let cluster = super::start().await;
    let client = cluster.admin_client().await.unwrap();
    install(&client).await;
    let api = cluster_cidrs(&client);
    let create = PostParams::default();

    // Stored as written.
    let valid = [
        (
            "v4-only",
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16"}),
        ),
        (
            "v6-only",
            json!({"perNodeHostBits": 64, "ipv6": "fd00:10:245::/48"}),
        ),
        (
            "dual-stack-selector",
            json!({
                "perNodeHostBits": 6,
                "ipv4": "10.246.0.0/20",
                "ipv6": "fd00:10:246::/104",
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["Standard_D4s_v3"]},
                    {"key": "kubernetes.azure.com/mode", "operator": "Exists"}
                ]}]}
            }),
        ),
        // 2^24 blocks exactly: the allocator's limit.
        (
            "v4-2-to-the-24-blocks",
            json!({"perNodeHostBits": 4, "ipv4": "16.0.0.0/4"}),
        ),
    ];
    for (name, spec) in valid {
        let stored = api
            .create(&create, &object(name, spec.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        assert_eq!(stored.data["spec"], spec, "{name}: stored spec");
    }

    // Refused at admission, each with its rule's message.
    let invalid = [
        (
            "no-range",
            json!({"perNodeHostBits": 8}),
            "at least one of ipv4 and ipv6",
        ),
        (
            "no-host-bits",
            json!({"ipv4": "10.247.0.0/16"}),
            "perNodeHostBits: Required",
        ),
        (
            "host-bits-set",
            json!({"perNodeHostBits": 8, "ipv4": "10.247.0.1/16"}),
            "canonical IPv4 CIDR",
        ),
        (
            "leading-zero",
            json!({"perNodeHostBits": 8, "ipv4": "010.247.0.0/16"}),
            "canonical IPv4 CIDR",
        ),
        (
            "not-a-cidr",
            json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0"}),
            "canonical IPv4 CIDR",
        ),
        (
            "v6-in-ipv4",
            json!({"perNodeHostBits": 8, "ipv4": "fd00::/64"}),
            "canonical IPv4 CIDR",
        ),
        (
            "v4-in-ipv6",
            json!({"perNodeHostBits": 8, "ipv6": "10.0.0.0/8"}),
            "canonical IPv6 CIDR",
        ),
        (
            "mapped-v6",
            json!({"perNodeHostBits": 8, "ipv6": "::ffff:10.0.0.0/104"}),
            "canonical IPv6 CIDR",
        ),
        (
            "host-bits-below-4",
            json!({"perNodeHostBits": 3, "ipv4": "10.247.0.0/16"}),
            "should be greater than or equal to 4",
        ),
        (
            "block-larger-than-range",
            json!({"perNodeHostBits": 9, "ipv4": "10.247.0.0/24"}),
            "must not exceed the host bits of ipv4",
        ),
        (
            "v6-block-larger-than-range",
            json!({"perNodeHostBits": 80, "ipv6": "fd00::/64"}),
            "must not exceed the host bits of ipv6",
        ),
        (
            "too-many-blocks",
            json!({"perNodeHostBits": 4, "ipv4": "32.0.0.0/3"}),
            "more than 2^24 blocks",
        ),
        (
            "too-many-v6-blocks",
            json!({"perNodeHostBits": 64, "ipv6": "fd00::/39"}),
            "more than 2^24 blocks",
        ),
        (
            "in-without-values",
            json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]}}),
            "In and NotIn need values",
        ),
        (
            "bad-operator",
            json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Matches", "values": ["x"]}]}]}}),
            "Unsupported value: \"Matches\"",
        ),
    ];
    let mut report = Vec::new();
    for (name, spec, expected) in invalid {
        let (code, message) = refusal(api.create(&create, &object(name, spec)).await, name);
        report.push(format!("{name}: {code} {message}"));
        assert_eq!(code, 422, "{name}: {message}");
        assert!(
            message.contains(expected),
            "{name}: {message:?} lacks {expected:?}"
        );
    }
    eprintln!("real refusals:\n{}", report.join("\n"));

    // spec is immutable; metadata and status are not.
    let patch = PatchParams::default();
    let (code, message) = refusal(
        api.patch(
            "v4-only",
            &patch,
            &Patch::Merge(json!({"spec": {"ipv4": "10.248.0.0/16"}})),
        )
        .await,
        "changing spec",
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec is immutable"), "{message}");
    let labelled = api
        .patch(
            "v4-only",
            &patch,
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.labels().get("team").map(String::as_str), Some("a"));
    let status = json!({"status": {"ipv4": {"capacity": 256, "used": 3, "free": 253}}});
    let with_status = api
        .patch_status("v4-only", &patch, &Patch::Merge(status))
        .await
        .unwrap();
    assert_eq!(with_status.data["status"]["ipv4"]["free"], 253);
    assert_eq!(
        with_status.data["spec"]["ipv4"], "10.245.0.0/16",
        "the status write left spec alone"
    );
}

const CLUSTER_CIDRS: &str = "/apis/nodeipam.io/v1alpha1/clustercidrs";
const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

fn cluster_cidr_body(name: &str, spec: Value, rest: Value) -> String {
    let mut body = json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": spec,
    });
    if let (Some(body), Some(rest)) = (body.as_object_mut(), rest.as_object()) {
        body.extend(rest.clone());
    }
    body.to_string()
}

/// The requests a ClusterCIDR controller makes and an operator's writes it must live with:
/// create (with a status and an unknown field), duplicates and refusals, LIST, a spec change
/// (immutable), an update without a resourceVersion, a strategic merge patch (415 on a custom
/// resource), metadata and status writes through the main resource and `/status`, a finalizer
/// added by JSON patch, DELETE held by it, a new finalizer refused while deleting, the finalizer
/// removed, and a WATCH from the first create over all of it.
fn cluster_cidr_steps() -> Vec<super::fidelity::Step> {
    use super::fidelity::Step;
    let one = format!("{CLUSTER_CIDRS}/pool-a");
    let shape = [
        "/spec",
        "/status",
        "/metadata/generation",
        "/metadata/labels",
        "/metadata/finalizers",
        "/metadata/deletionTimestamp#present",
    ];
    let spec = json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16"});
    vec![
        Step::new("GET a ClusterCIDR that does not exist", "GET", &one),
        Step::new("create (with a status and an unknown field)", "POST", CLUSTER_CIDRS)
            .body(
                JSON,
                cluster_cidr_body(
                    "pool-a",
                    json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16", "unknown": 1}),
                    json!({"status": {"ipv4": {"capacity": 1}}, "extra": true}),
                ),
            )
            .compare(&shape)
            .compare(&["/extra", "/kind", "/apiVersion"])
            .capture("rv0", "/metadata/resourceVersion"),
        Step::new("create it again", "POST", CLUSTER_CIDRS)
            .body(JSON, cluster_cidr_body("pool-a", spec.clone(), json!({}))),
        Step::new("create one with no range", "POST", CLUSTER_CIDRS).body(
            JSON,
            cluster_cidr_body("no-range", json!({"perNodeHostBits": 8}), json!({})),
        ),
        Step::new("create one with host bits set", "POST", CLUSTER_CIDRS).body(
            JSON,
            cluster_cidr_body(
                "host-bits",
                json!({"perNodeHostBits": 8, "ipv4": "10.247.0.1/16"}),
                json!({}),
            ),
        ),
        Step::new("create a dual-stack one with a selector", "POST", CLUSTER_CIDRS)
            .body(
                JSON,
                cluster_cidr_body(
                    "pool-b",
                    json!({"perNodeHostBits": 6, "ipv4": "10.246.0.0/20", "ipv6": "fd00:10:246::/104",
                           "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                               {"key": "kubernetes.azure.com/mode", "operator": "Exists"}]}]}}),
                    json!({}),
                ),
            )
            .compare(&shape),
        Step::new("GET", "GET", &one)
            .compare(&shape)
            .capture("rv1", "/metadata/resourceVersion"),
        Step::new("LIST", "GET", CLUSTER_CIDRS).compare(&["/kind", "/items#names"]),
        Step::new("change spec (PUT)", "PUT", &one).body(
            JSON,
            cluster_cidr_body(
                "pool-a",
                json!({"perNodeHostBits": 8, "ipv4": "10.248.0.0/16"}),
                json!({"metadata": {"name": "pool-a", "resourceVersion": "$(rv1)"}}),
            ),
        ),
        Step::new("PUT without a resourceVersion", "PUT", &one)
            .body(JSON, cluster_cidr_body("pool-a", spec.clone(), json!({}))),
        Step::new("strategic merge patch", "PATCH", &one).body(
            "application/strategic-merge-patch+json",
            r#"{"metadata":{"labels":{"team":"a"}}}"#,
        ),
        Step::new("label and status through the main resource", "PATCH", &one)
            .body(
                MERGE,
                r#"{"metadata":{"labels":{"team":"a"}},"status":{"ipv4":{"free":1}}}"#,
            )
            .compare(&shape),
        Step::new("status, spec and a label through /status", "PATCH", format!("{one}/status"))
            .body(
                MERGE,
                r#"{"metadata":{"labels":{"team":"b"}},"spec":{"perNodeHostBits":9},"status":{"ipv4":{"capacity":256,"used":1,"free":255},"conditions":[{"type":"Ready","status":"True","observedGeneration":1,"lastTransitionTime":"2026-12-02T10:00:00Z","reason":"Serving","message":"ok","extra":1}]}}"#,
            )
            .compare(&shape),
        Step::new("the same status again (no change)", "PATCH", format!("{one}/status"))
            .body(MERGE, r#"{"status":{"ipv4":{"capacity":256,"used":1,"free":255}}}"#)
            .compare(&shape),
        Step::new("a finalizer (JSON patch)", "PATCH", &one)
            .body(
                "application/json-patch+json",
                r#"[{"op":"add","path":"/metadata/finalizers","value":["nodeipam.io/in-use"]}]"#,
            )
            .compare(&shape),
        Step::new("DELETE (held by the finalizer)", "DELETE", &one).compare(&shape),
        Step::new("GET while deleting", "GET", &one).compare(&shape),
        Step::new("a new finalizer while deleting", "PATCH", &one).body(
            MERGE,
            r#"{"metadata":{"finalizers":["nodeipam.io/in-use","other"]}}"#,
        ),
        Step::new("status while deleting", "PATCH", format!("{one}/status"))
            .body(MERGE, r#"{"status":{"ipv4":{"used":0,"free":256}}}"#)
            .compare(&shape),
        Step::new("the finalizer removed", "PATCH", &one)
            .body(MERGE, r#"{"metadata":{"finalizers":null}}"#)
            .compare(&shape),
        Step::new("GET after the finalizer went", "GET", &one),
        Step::new(
            "WATCH from the first create",
            "GET",
            format!("{CLUSTER_CIDRS}?watch=true&resourceVersion=$(rv0)&timeoutSeconds=1"),
        ),
        Step::new("LIST at the end", "GET", CLUSTER_CIDRS).compare(&["/items#names"]),
    ]
}

/// Issue 18's sandbox fidelity for the ClusterCIDR custom resource: the same requests on the real
/// kube-apiserver (the CRD installed) and on the sandbox, compared as the other fidelity sets are
/// (status code, `reason`, the fields a controller reads; tests/FIDELITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cidrs_are_answered_like_the_sandbox_answers_them() {
    let steps = cluster_cidr_steps();
    let cluster = super::start().await;
    let admin = cluster.admin_client().await.unwrap();
    install(&admin).await;
    let sb = nodeipam_tests::sandbox::Sandbox::start(Value::Null).await;
    let sandbox_client = sb.client();
    let mut captures = std::collections::BTreeMap::new();
    let real = super::fidelity::replay(&admin, &steps, &mut captures).await;
    let mut captures = std::collections::BTreeMap::new();
    let sandbox = super::fidelity::replay(&sandbox_client, &steps, &mut captures).await;
    sb.shutdown().await;
    let mut tally = super::fidelity::Tally::default();
    tally.compare("ClusterCIDRs", steps.iter(), &real, &sandbox);
    eprintln!(
        "{} requests compared, {} differences, {} kept",
        tally.compared,
        tally.differences.len(),
        tally.kept
    );
    assert!(tally.differences.is_empty(), "{:#?}", tally.differences);
}
