//! Issue 16 (2) and (3): a stale uid-pinned PATCH, and the podCIDR writes answered like the
//! sandbox answers them.

use super::{WAIT, common, controller_client, creatable, start, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;

use common::{fast_config, init_tracing, ipam, masks, spawn_with_client};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use nodeipam_tests::invariants::name_of;
use nodeipam_tests::sandbox::fixture;
use serde_json::Value;

/// Issue 16 (2): a Node deleted and re-created under the same name while a PATCH for the old
/// object is pending. The controller pins every PATCH to the Node's uid
/// (`{"metadata":{"uid":…},"spec":{…}}`, `reconcile::pod_cidrs_patch`); sent for the old uid to
/// the new object, the real kube-apiserver (v1.36.3) answers **422 Invalid**, `reason: Invalid`,
/// message `Node "<name>" is invalid: metadata.uid: Invalid value: "<old uid>": field is
/// immutable`, `details.causes`: `FieldValueInvalid` on `metadata.uid` (listed twice) — the patch
/// is applied to the new object and the uid change fails `ValidateObjectMetaUpdate`; there is no
/// uid precondition on PATCH, hence no 409. The controller classifies exactly that as
/// `NodeReplaced` (`controller::patch::classify_status`), and the new Node then gets its own
/// block from the running controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_uid_pinned_patch_is_refused_and_the_new_node_gets_its_own_block() {
    init_tracing();
    let cluster = start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let template = fixture("05-aws-4nodes-no-podcidr.json")["items"][0].clone();
    let name = name_of(&template);
    let node: Node = serde_json::from_value(creatable(&template)).unwrap();
    let old = nodes.create(&PostParams::default(), &node).await.unwrap();
    let old_uid = old.uid().unwrap();
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    let new = nodes.create(&PostParams::default(), &node).await.unwrap();
    let new_uid = new.uid().unwrap();
    assert_ne!(old_uid, new_uid);

    // The controller's PATCH for the old object, through the controller's own write path.
    let client = controller_client(&cluster).await;
    let cidr = nodeipam_core::Cidr::parse("10.244.0.0/24").unwrap();
    let body = nodeipam::reconcile::pod_cidrs_patch(&[cidr], Some(&old_uid));
    let result = nodeipam::controller::patch::patch_pod_cidrs(
        &client,
        nodeipam::controller::CONTROLLER_NAME,
        &name,
        &body,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        result.outcome,
        nodeipam::reconcile::PatchOutcome::CannotApply {
            kind: nodeipam::reconcile::CannotApplyKind::NodeReplaced,
            message: result_message(&result.outcome),
        },
        "the stale PATCH's outcome"
    );
    // The raw answer, recorded.
    let raw = admin
        .request::<Node>(
            http::Request::patch(format!("/api/v1/nodes/{name}"))
                .header("Content-Type", "application/strategic-merge-patch+json")
                .body(serde_json::to_vec(&body).unwrap())
                .unwrap(),
        )
        .await;
    let status = match raw {
        Ok(node) => panic!("the stale PATCH was accepted: {node:?}"),
        Err(kube::Error::Api(status)) => status,
        Err(e) => panic!("the stale PATCH: {e}"),
    };
    eprintln!(
        "stale uid-pinned PATCH: {} {} {:?}",
        status.code, status.reason, status.message
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.clone())
        .unwrap_or_default();
    // v1.36.3 lists the same cause twice (recorded in tests/FIDELITY.md).
    assert!(
        !causes.is_empty()
            && causes
                .iter()
                .all(|c| (c.reason.as_str(), c.field.as_str())
                    == ("FieldValueInvalid", "metadata.uid")),
        "{status:?}"
    );
    assert!(
        status.message.contains("field is immutable"),
        "{}",
        status.message
    );
    // Nothing was written to the new Node.
    let now = nodes.get(&name).await.unwrap();
    assert_eq!(now.uid().unwrap(), new_uid);
    assert!(
        now.spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .is_none()
    );

    // The running controller serves the new Node with its own block.
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let running = spawn_with_client(client, fast_config(ipam));
    let served = wait_for(|| async {
        nodes
            .get(&name)
            .await
            .ok()
            .and_then(|n| n.spec.and_then(|s| s.pod_cidrs))
            .is_some_and(|c| c == ["10.244.0.0/24"])
    })
    .await;
    running.stop().await;
    assert!(served, "the re-created Node was not served within {WAIT:?}");
    assert_eq!(nodes.get(&name).await.unwrap().uid().unwrap(), new_uid);
}

/// The message of a `CannotApply` outcome (compared separately: it is the server's text).
fn result_message(outcome: &nodeipam::reconcile::PatchOutcome) -> String {
    match outcome {
        nodeipam::reconcile::PatchOutcome::CannotApply { message, .. } => message.clone(),
        other => format!("{other:?}"),
    }
}

/// One answer, reduced to what the controller reads — status code, `reason`, the causes'
/// `(reason, field)` pairs (sorted), on success the stored `spec.podCIDR` / `spec.podCIDRs` — and
/// the message (uids replaced by `<uid>`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    code: u16,
    reason: String,
    causes: Vec<(String, String)>,
    pod_cidr: Value,
    pod_cidrs: Value,
    message: String,
}

/// Sends one PATCH of Node `name` (content type `patch_type`) and reduces the answer.
async fn send_patch(client: &Client, name: &str, patch_type: &str, body: &Value) -> Answer {
    let request = http::Request::patch(format!(
        "/api/v1/nodes/{name}?fieldManager={}",
        nodeipam::controller::CONTROLLER_NAME
    ))
    .header("Content-Type", patch_type)
    .body(serde_json::to_vec(body).unwrap())
    .unwrap();
    match client.request::<Value>(request).await {
        Ok(node) => Answer {
            code: 200,
            reason: String::new(),
            causes: Vec::new(),
            pod_cidr: node["spec"]["podCIDR"].clone(),
            pod_cidrs: node["spec"]["podCIDRs"].clone(),
            message: String::new(),
        },
        Err(kube::Error::Api(status)) => {
            let mut causes: Vec<(String, String)> = status
                .details
                .as_ref()
                .map(|d| {
                    d.causes
                        .iter()
                        .map(|c| (c.reason.clone(), c.field.clone()))
                        .collect()
                })
                .unwrap_or_default();
            causes.sort();
            Answer {
                code: status.code,
                reason: status.reason.clone(),
                causes,
                pod_cidr: Value::Null,
                pod_cidrs: Value::Null,
                message: status.message.clone(),
            }
        }
        Err(e) => panic!("PATCH {name}: {e}"),
    }
}

const STRATEGIC: &str = "application/strategic-merge-patch+json";

const MERGE: &str = "application/merge-patch+json";

/// The writes of `spec.podCIDR(s)` the controller can make (and the malformed ones it must never
/// make but whose refusal it relies on), in order, as `(what, Node, content type, body)`; `UID`
/// in a body is replaced with the target Node's uid on that server, `OTHER-UID` with another
/// Node's. Each refused write has a Node of its own, so one difference cannot hide behind
/// another.
const POD_CIDR_WRITES: &[(&str, &str, &str, &str)] = &[
    (
        "assign to an empty Node",
        "a",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"]}}"#,
    ),
    (
        "the same write again",
        "a",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"]}}"#,
    ),
    (
        "change once set",
        "a",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.4.0/24","podCIDRs":["10.244.4.0/24"]}}"#,
    ),
    (
        "add a second family once set",
        "a",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24","fd00::/64"]}}"#,
    ),
    (
        "remove once set",
        "a",
        STRATEGIC,
        r#"{"spec":{"podCIDR":null,"podCIDRs":null}}"#,
    ),
    (
        "change podCIDRs alone once set (strategic merge)",
        "a",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDRs":["10.244.4.0/24"]}}"#,
    ),
    (
        "change podCIDRs alone once set (JSON merge)",
        "a",
        MERGE,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDRs":["10.244.4.0/24"]}}"#,
    ),
    (
        "prefix length out of range",
        "b",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.0/33","podCIDRs":["10.244.5.0/33"]}}"#,
    ),
    (
        "not a CIDR",
        "c",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.0","podCIDRs":["10.244.5.0"]}}"#,
    ),
    (
        "host bits set",
        "d",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.1/24","podCIDRs":["10.244.5.1/24"]}}"#,
    ),
    (
        "prefix length with a leading 0",
        "e",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.0/024","podCIDRs":["10.244.5.0/024"]}}"#,
    ),
    (
        "IPv4-mapped IPv6",
        "f",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"::ffff:10.244.5.0/120","podCIDRs":["::ffff:10.244.5.0/120"]}}"#,
    ),
    (
        "three CIDRs",
        "g",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.0/24","podCIDRs":["10.244.5.0/24","fd00::/64","10.244.6.0/24"]}}"#,
    ),
    (
        "two IPv4 CIDRs",
        "h",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.5.0/24","podCIDRs":["10.244.5.0/24","10.244.6.0/24"]}}"#,
    ),
    (
        "podCIDR is not podCIDRs[0]",
        "i",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.7.0/24","podCIDRs":["10.244.8.0/24"]}}"#,
    ),
    (
        "uid of another Node",
        "j",
        STRATEGIC,
        r#"{"metadata":{"uid":"OTHER-UID"},"spec":{"podCIDR":"10.244.9.0/24","podCIDRs":["10.244.9.0/24"]}}"#,
    ),
    (
        "Node that does not exist",
        "missing",
        STRATEGIC,
        r#"{"spec":{"podCIDR":"10.244.10.0/24","podCIDRs":["10.244.10.0/24"]}}"#,
    ),
    (
        "dual-stack, IPv6 first",
        "k",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"fd00:0:0:1::/64","podCIDRs":["fd00:0:0:1::/64","10.244.11.0/24"]}}"#,
    ),
    (
        "dual-stack write again, same values",
        "k",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"fd00:0:0:1::/64","podCIDRs":["fd00:0:0:1::/64","10.244.11.0/24"]}}"#,
    ),
    (
        "podCIDRs alone",
        "l",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDRs":["10.244.12.0/24"]}}"#,
    ),
    (
        "podCIDR alone",
        "m",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.13.0/24"}}"#,
    ),
    (
        "JSON merge patch",
        "n",
        MERGE,
        r#"{"metadata":{"uid":"UID"},"spec":{"podCIDR":"10.244.14.0/24","podCIDRs":["10.244.14.0/24"]}}"#,
    ),
    (
        "uid-pinned PATCH without podCIDRs (a no-op)",
        "o",
        STRATEGIC,
        r#"{"metadata":{"uid":"UID"}}"#,
    ),
];

/// Creates the Nodes of [`POD_CIDR_WRITES`] and sends every write, in order.
async fn replay_pod_cidr_writes(client: &Client) -> Vec<Answer> {
    let nodes: Api<Node> = Api::all(client.clone());
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    let mut uids: BTreeMap<&str, String> = BTreeMap::new();
    for &(_, name, _, _) in POD_CIDR_WRITES {
        if name == "missing" || uids.contains_key(name) {
            continue;
        }
        let node: Node = serde_json::from_value(common::node_like(&template, name)).unwrap();
        let created = nodes.create(&PostParams::default(), &node).await.unwrap();
        uids.insert(name, created.uid().unwrap());
    }
    let mut answers = Vec::new();
    for &(_, name, patch_type, body) in POD_CIDR_WRITES {
        let text = body
            .replace("OTHER-UID", &uids["a"])
            .replace("UID", uids.get(name).map_or("", String::as_str));
        let body: Value = serde_json::from_str(&text).unwrap();
        let mut answer = send_patch(client, name, patch_type, &body).await;
        // Messages quote uids, which differ between the servers.
        for uid in uids.values() {
            answer.message = answer.message.replace(uid.as_str(), "<uid>");
        }
        answers.push(answer);
    }
    answers
}

/// Issue 16 (3), the start of the sandbox fidelity table (tests/FIDELITY.md): every write of
/// `spec.podCIDR(s)` the controller can make, and the malformed ones whose refusal it relies on,
/// sent in the same order to the real kube-apiserver and to the sandbox; status code, `reason`,
/// the causes' `(reason, field)`, the stored podCIDRs and the message text must be equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cidr_writes_are_answered_like_the_sandbox_answers_them() {
    init_tracing();
    let cluster = start().await;
    let real = replay_pod_cidr_writes(&cluster.admin_client().await.unwrap()).await;
    let sb = nodeipam_tests::sandbox::Sandbox::start(Value::Null).await;
    let sandbox = replay_pod_cidr_writes(&sb.client()).await;
    sb.shutdown().await;

    let mut differences = Vec::new();
    for (((what, _, _, _), real), sandbox) in POD_CIDR_WRITES.iter().zip(&real).zip(&sandbox) {
        eprintln!(
            "| {what} | {} {} {:?} {} {} | {} {} {:?} | {:?} / {:?} |",
            real.code,
            real.reason,
            real.causes,
            real.pod_cidr,
            real.pod_cidrs,
            sandbox.code,
            sandbox.reason,
            sandbox.causes,
            real.message,
            sandbox.message
        );
        if real != sandbox {
            differences.push(format!("{what}: real {real:?}, sandbox {sandbox:?}"));
        }
    }
    eprintln!(
        "{} writes compared, {} differences",
        real.len(),
        differences.len()
    );
    assert!(differences.is_empty(), "{differences:#?}");
}
