//! Objects: fixtures loaded, resourceVersion conflicts, strategic merge of podCIDRs, finalizers,
//! uid preconditions, no-op writes, content negotiation.

use super::{WAIT, api_status, raw_http, start};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use nodeipam_tests::sandbox::{PatchType, Sandbox, fixture};
use serde_json::{Value, json};

#[tokio::test]
async fn every_fixture_loads_with_fresh_resource_versions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/nodes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "fixtures found: {files:?}");
    for f in files {
        let doc = fixture(&f);
        let count = doc["items"].as_array().map_or(0, Vec::len);
        let sb = Sandbox::start(doc).await;
        let nodes: Api<Node> = Api::all(sb.client());
        let list = nodes
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(list.items.len(), count, "{f}");
        let list_rv: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("list rv");
        let mut rvs: Vec<u64> = list
            .items
            .iter()
            .map(|n| {
                n.resource_version()
                    .and_then(|r| r.parse().ok())
                    .expect("item rv")
            })
            .collect();
        rvs.sort_unstable();
        rvs.dedup();
        assert_eq!(rvs.len(), count, "{f}: distinct resourceVersions");
        assert!(rvs.iter().all(|r| *r <= list_rv), "{f}");
        for n in &list.items {
            let spec = n.spec.clone().unwrap_or_default();
            if let Some(c) = &spec.pod_cidr {
                assert_eq!(
                    spec.pod_cidrs.as_ref().and_then(|l| l.first()),
                    Some(c),
                    "{f}: podCIDR == podCIDRs[0]"
                );
            }
        }
        sb.shutdown().await;
    }
}

#[tokio::test]
async fn stale_resource_version_gets_409_conflict() {
    let (sb, nodes) = start("05-aws-4nodes-no-podcidr.json").await;
    let name = sb.nodes()[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let old = nodes.get(&name).await.expect("get");
    sb.patch_node(
        &name,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"bump": "1"}}}),
    )
    .expect("bump");
    let (code, reason, _) = api_status(nodes.replace(&name, &PostParams::default(), &old).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // A patch carrying a stale resourceVersion is a precondition too.
    let stale = json!({"metadata": {"resourceVersion": old.resource_version()}, "spec": {"podCIDR": "10.0.0.0/24"}});
    let (code, reason, _) = api_status(
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&stale))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // A current resourceVersion passes.
    let mut fresh = nodes.get(&name).await.expect("get");
    fresh.labels_mut().insert("c".into(), "d".into());
    let updated = nodes
        .replace(&name, &PostParams::default(), &fresh)
        .await
        .expect("replace");
    assert!(updated.resource_version() > fresh.resource_version());
    sb.shutdown().await;
}

#[tokio::test]
async fn strategic_merge_sets_pod_cidrs_once_then_422_on_change() {
    let (sb, nodes) = start("05-aws-4nodes-no-podcidr.json").await;
    let name = sb.nodes()[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let before = sb.resource_version();
    let patch = json!({"spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]}});
    let n = nodes
        .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("set podCIDRs");
    let spec = n.spec.expect("spec");
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.3.0/24"));
    assert_eq!(spec.pod_cidrs, Some(vec!["10.244.3.0/24".to_owned()]));
    assert!(sb.resource_version() > before);
    // The same patch again is a no-op: no new resourceVersion.
    let rv = sb.resource_version();
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("no-op");
    assert_eq!(sb.resource_version(), rv);
    // Changing it: the strategic merge makes ["10.244.9.0/24","10.244.3.0/24"] → 422 Invalid.
    let change = json!({"spec": {"podCIDR": "10.244.9.0/24", "podCIDRs": ["10.244.9.0/24"]}});
    let (code, reason, details) = api_status(
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Strategic(&change))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    let fields: Vec<&str> = details["causes"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["field"].as_str()).collect())
        .unwrap_or_default();
    assert!(fields.contains(&"spec.podCIDRs"), "{details}");
    // Adding a second family after the first is set is a change too.
    let add = json!({"spec": {"podCIDRs": ["10.244.3.0/24", "fd00:1::/64"]}});
    let (code, _, _) = api_status(
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Strategic(&add))
            .await,
    );
    assert_eq!(code, 422);
    // Invalid values on a fresh node.
    let other = sb.nodes()[1]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    for bad in [
        json!({"spec": {"podCIDRs": ["10.0.0.0/24", "10.0.1.0/24"]}}),
        json!({"spec": {"podCIDRs": ["10.0.0.0/24", "fd00::/64", "fd01::/64"]}}),
        json!({"spec": {"podCIDRs": ["nonsense"]}}),
        // Strict CIDR validation (on by default since Kubernetes 1.36): no host bits.
        json!({"spec": {"podCIDRs": ["10.0.0.1/24"]}}),
    ] {
        let (code, reason, _) = api_status(
            nodes
                .patch(&other, &PatchParams::default(), &Patch::Merge(&bad))
                .await,
        );
        assert_eq!((code, reason.as_str()), (422, "Invalid"), "{bad}");
    }
    // Dual-stack in one go is fine; JSON patch works too.
    let dual =
        json!([{"op": "add", "path": "/spec/podCIDRs", "value": ["10.0.0.0/24", "fd00::/64"]}]);
    let jp: json_patch::Patch = serde_json::from_value(dual).expect("json patch");
    let n = nodes
        .patch(&other, &PatchParams::default(), &Patch::Json::<()>(jp))
        .await
        .expect("dual-stack");
    assert_eq!(
        n.spec.and_then(|s| s.pod_cidr).as_deref(),
        Some("10.0.0.0/24")
    );
    // podCIDR ≠ podCIDRs[0]: not refused; the v1 conversion makes podCIDR authoritative (as the
    // real kube-apiserver v1.36.3 answers, tests/FIDELITY.md).
    let third = sb.nodes()[2]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let mismatch = json!({"spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.0.0/24"]}});
    let n = nodes
        .patch(&third, &PatchParams::default(), &Patch::Merge(&mismatch))
        .await
        .expect("podCIDR wins");
    assert_eq!(
        n.spec.and_then(|s| s.pod_cidrs),
        Some(vec!["10.0.1.0/24".to_owned()])
    );
    // 404 for a missing node.
    let (code, reason, _) = api_status(nodes.get("nope").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    sb.shutdown().await;
}

#[tokio::test]
async fn finalizers_hold_deletion_until_emptied() {
    let (sb, nodes) = start("01-k3s-single-node-flannel-hostgw.json").await;
    let rv = sb.resource_version().to_string();
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .expect("delete");
    let node = sb.node("node-a").expect("still there");
    assert!(node["metadata"]["deletionTimestamp"].is_string());
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("some");
    assert!(matches!(ev, WatchEvent::Modified(_)), "{ev:?}");
    nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove finalizers");
    assert!(sb.node("node-a").is_none());
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("some");
    assert!(matches!(ev, WatchEvent::Deleted(_)), "{ev:?}");
    sb.shutdown().await;
}

/// `metadata.uid` in a write, as kube-apiserver answers it: a PATCH carrying another uid is an
/// immutable-field change (422, patch.go `applyPatch` → `rest.BeforeUpdate` →
/// `ValidateImmutableField`); a PUT carrying another uid fails its storage precondition (409,
/// `Preconditions.Check` → `InterpretUpdateError`); a matching uid lets the write through; a
/// PATCH of a missing Node is 404 whatever uid it names.
#[tokio::test]
async fn uid_pinned_writes_fail_as_kube_apiserver_answers() {
    let (sb, nodes) = start("05-aws-4nodes-no-podcidr.json").await;
    let name = sb.nodes()[1]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let ours = sb.node(&name).expect("node")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let theirs = "0e4b8a1e-1111-4222-8333-444455556666";
    let rv = sb.resource_version();
    let pinned = |uid: &str| json!({"metadata": {"uid": uid}, "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]}});
    // PATCH with another uid: 422, nothing written.
    let err = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(&pinned(theirs)),
        )
        .await
        .expect_err("uid mismatch");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        format!(
            "Node \"{name}\" is invalid: metadata.uid: Invalid value: \"{theirs}\": field is immutable"
        )
    );
    let details = status.details.expect("details");
    assert_eq!(
        (details.kind.as_str(), details.name.as_str()),
        ("Node", name.as_str())
    );
    assert!(
        details.causes.iter().any(|c| c.field == "metadata.uid"
            && c.reason == "FieldValueInvalid"
            && c.message == format!("Invalid value: \"{theirs}\": field is immutable")),
        "{:?}",
        details.causes
    );
    assert_eq!(sb.resource_version(), rv, "nothing was written");
    assert!(sb.node(&name).expect("node")["spec"]["podCIDRs"].is_null());
    // The same for a merge patch and a JSON patch replacing the uid.
    let merge = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&pinned(theirs)),
        )
        .await;
    assert_eq!(api_status(merge).0, 422);
    let jp: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/metadata/uid", "value": theirs}]),
    )
    .expect("json patch");
    let json = nodes
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(jp))
        .await;
    assert_eq!(api_status(json).0, 422);
    // Missing Node: 404 whatever the uid.
    let (code, reason, _) = api_status(
        nodes
            .patch(
                "gone",
                &PatchParams::default(),
                &Patch::Strategic(&pinned(theirs)),
            )
            .await,
    );
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    // PATCH with our uid: written.
    let n = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(&pinned(&ours)),
        )
        .await
        .expect("uid matches");
    assert_eq!(n.metadata.uid.as_deref(), Some(ours.as_str()));
    assert_eq!(
        n.spec.and_then(|s| s.pod_cidrs),
        Some(vec!["10.244.1.0/24".to_owned()])
    );
    // PUT with another uid: 409 Conflict from the storage precondition.
    let mut put = nodes.get(&name).await.expect("get");
    put.metadata.uid = Some(theirs.to_owned());
    put.labels_mut().insert("put".into(), "1".into());
    let err = nodes
        .replace(&name, &PostParams::default(), &put)
        .await
        .expect_err("precondition");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        format!(
            "Operation cannot be fulfilled on nodes \"{name}\": StorageError: invalid object, Code: 4, Key: /registry/minions/{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {theirs}, UID in object meta: {ours}"
        )
    );
    assert!(sb.node(&name).expect("node")["metadata"]["labels"]["put"].is_null());
    // PUT with our uid: written.
    put.metadata.uid = Some(ours.clone());
    let replaced = nodes
        .replace(&name, &PostParams::default(), &put)
        .await
        .expect("uid matches");
    assert_eq!(replaced.labels().get("put").map(String::as_str), Some("1"));
    sb.shutdown().await;
}

/// Re-sending the podCIDRs a Node already has (the controller's idempotent retry) succeeds with
/// no write: 200, same resourceVersion, no watch event (etcd3 `GuaranteedUpdate` skips a write
/// whose bytes are unchanged) — also from another field manager and with the uid pinned.
#[tokio::test]
async fn re_sending_the_same_pod_cidrs_is_a_no_op() {
    let (sb, nodes) = start("05-aws-4nodes-no-podcidr.json").await;
    let name = sb.nodes()[1]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let uid = sb.node(&name).expect("node")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let patch = json!({"metadata": {"uid": uid},
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24", "fd00:10:244:7::/64"]}});
    let params = PatchParams::default();
    let first = nodes
        .patch(&name, &params, &Patch::Strategic(&patch))
        .await
        .expect("first");
    let rv = first.resource_version().expect("rv");
    let global = sb.resource_version();
    let mut watch = nodes
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    for params in [
        PatchParams::default(),
        PatchParams {
            field_manager: Some("another".into()),
            ..PatchParams::default()
        },
    ] {
        let again = nodes
            .patch(&name, &params, &Patch::Strategic(&patch))
            .await
            .expect("same podCIDRs again");
        assert_eq!(again.resource_version().as_deref(), Some(rv.as_str()));
        assert_eq!(again.spec, first.spec);
    }
    // Without the uid and without podCIDR too.
    let bare = json!({"spec": {"podCIDRs": ["10.244.7.0/24", "fd00:10:244:7::/64"]}});
    let again = nodes
        .patch(&name, &PatchParams::default(), &Patch::Strategic(&bare))
        .await
        .expect("same podCIDRs again");
    assert_eq!(again.resource_version().as_deref(), Some(rv.as_str()));
    assert_eq!(sb.resource_version(), global, "no write");
    // The watch from the write's resourceVersion sees nothing until it times out.
    let next = tokio::time::timeout(WAIT, watch.try_next())
        .await
        .expect("watch ends in time")
        .expect("ok");
    assert!(next.is_none(), "no event: {next:?}");
    sb.shutdown().await;
}

/// `Accept` is negotiated as kube-apiserver does: JSON (or a wildcard) is served, a header that
/// names only what the sandbox cannot produce (protobuf, a Table) is 406 NotAcceptable.
#[tokio::test]
async fn accept_header_is_negotiated() {
    let (sb, nodes) = start("07-eks-2nodes-no-podcidr.json").await;
    let status_of = |resp: &[u8]| -> (String, Value) {
        let text = String::from_utf8_lossy(resp).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        let status = head.lines().next().unwrap_or("").to_owned();
        let body = serde_json::from_str(body).unwrap_or(Value::Null);
        (status, body)
    };
    for (accept, want) in [
        ("", "200"),
        ("Accept: application/json\r\n", "200"),
        ("Accept: application/json;charset=utf-8\r\n", "200"),
        ("Accept: */*\r\n", "200"),
        ("Accept: application/*\r\n", "200"),
        (
            "Accept: application/vnd.kubernetes.protobuf, */*\r\n",
            "200",
        ),
        ("Accept: application/vnd.kubernetes.protobuf\r\n", "406"),
        (
            "Accept: application/json;as=Table;v=v1;g=meta.k8s.io\r\n",
            "406",
        ),
    ] {
        let (resp, _) = raw_http(&sb, "GET", "/api/v1/nodes?limit=1", accept, "").await;
        let (status, body) = status_of(&resp);
        assert!(
            status.starts_with(&format!("HTTP/1.1 {want}")),
            "{accept:?}: {status}"
        );
        if want == "200" {
            assert_eq!(body["kind"], "NodeList", "{accept:?}");
        } else {
            assert_eq!(
                body,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "only the following media types are accepted: application/json",
                    "reason": "NotAcceptable", "code": 406}),
                "{accept:?}"
            );
        }
    }
    // A write is negotiated too (before it runs).
    let name = sb.nodes()[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let (resp, _) = raw_http(
        &sb,
        "PATCH",
        &format!("/api/v1/nodes/{name}"),
        "Accept: application/vnd.kubernetes.protobuf\r\nContent-Type: application/merge-patch+json\r\n",
        "{\"metadata\":{\"labels\":{\"a\":\"b\"}}}",
    )
    .await;
    assert!(status_of(&resp).0.starts_with("HTTP/1.1 406"));
    assert!(sb.node(&name).expect("node")["metadata"]["labels"]["a"].is_null());
    // kube-rs asks for JSON.
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    sb.shutdown().await;
}
