//! Tests of the sandbox API server alone, through a real `kube::Client`.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt};
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, LateAnswer, LateWriteOutcome, PatchType, Resource, Sandbox,
    SandboxHandle, SandboxOptions, Verb, fixture,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn api_status(r: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String, Value) {
    match r {
        Err(kube::Error::Api(s)) => (
            s.code,
            s.reason.clone(),
            serde_json::to_value(&s.details).unwrap_or(Value::Null),
        ),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn start(file: &str) -> (SandboxHandle, Api<Node>) {
    let sb = Sandbox::start(fixture(file)).await;
    let nodes: Api<Node> = Api::all(sb.client());
    (sb, nodes)
}

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
async fn list_pagination_is_a_consistent_snapshot() {
    let (sb, nodes) = start("08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json").await;
    let first = nodes
        .list(&ListParams::default().limit(4))
        .await
        .expect("page 1");
    assert_eq!(first.items.len(), 4);
    let token = first.metadata.continue_.clone().expect("continue token");
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    // A write between pages must not show up in later pages (snapshot semantics).
    let last_name = sb
        .nodes()
        .last()
        .and_then(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .expect("a node");
    sb.patch_node(
        &last_name,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .expect("label");
    let second = nodes
        .list(&ListParams::default().limit(4).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(second.items.len(), 2);
    assert!(
        second
            .metadata
            .continue_
            .as_deref()
            .unwrap_or("")
            .is_empty()
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let labelled = second
        .items
        .iter()
        .find(|n| n.name_any() == last_name)
        .expect("last node on page 2");
    assert!(
        labelled.labels().get("x").is_none(),
        "page 2 is served at the snapshot resourceVersion"
    );
    let mut names: Vec<String> = first
        .items
        .iter()
        .chain(&second.items)
        .map(|n| n.name_any())
        .collect();
    names.dedup();
    assert_eq!(names.len(), 6);
    // Selectors.
    let by_name = nodes
        .list(&ListParams::default().fields(&format!("metadata.name={last_name}")))
        .await
        .expect("field selector");
    assert_eq!(by_name.items.len(), 1);
    let by_label = nodes
        .list(&ListParams::default().labels("x=y"))
        .await
        .expect("label selector");
    assert_eq!(by_label.items.len(), 1);
    // Continue token older than the history → 410 Expired.
    sb.compact();
    let (code, reason, _) = api_status(
        nodes
            .list(&ListParams::default().limit(4).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
    sb.shutdown().await;
}

#[tokio::test]
async fn watch_from_resource_version_then_410_when_too_old() {
    let (sb, nodes) = start("07-eks-2nodes-no-podcidr.json").await;
    let list = nodes.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.clone().expect("rv");
    let name = list.items[0].name_any();
    sb.patch_node(
        &name,
        PatchType::Strategic,
        &json!({"metadata": {"labels": {"a": "b"}}}),
    )
    .expect("patch");
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("event in time")
        .expect("ok")
        .expect("some");
    match ev {
        WatchEvent::Modified(n) => assert_eq!(n.labels().get("a").map(String::as_str), Some("b")),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // Live events too.
    sb.delete_node(&name).expect("delete");
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("event in time")
        .expect("ok")
        .expect("some");
    assert!(
        matches!(ev, WatchEvent::Deleted(ref n) if n.name_any() == name),
        "{ev:?}"
    );
    // Too old: the stream carries an ERROR event with a 410 Expired Status.
    sb.compact();
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("event in time")
        .expect("ok")
        .expect("some");
    match ev {
        WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    sb.shutdown().await;
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

#[tokio::test]
async fn kube_runtime_watcher_lists_watches_and_recovers() {
    let opts = SandboxOptions {
        bookmark_interval: Duration::from_millis(200),
        ..SandboxOptions::default()
    };
    let sb = Sandbox::try_start(fixture("06-kvm-onprem-4nodes-no-podcidr.json"), opts)
        .await
        .expect("start");
    let nodes: Api<Node> = Api::all(sb.client());
    let cfg = watcher::Config::default().page_size(3);
    // Drive the watcher in its own task (its stream only makes progress while polled).
    let (tx, mut stream) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut events = watcher(nodes, cfg).boxed();
        while let Some(ev) = events.next().await {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let mut initial = Vec::new();
    loop {
        match next(&mut stream).await {
            watcher::Event::Init => {}
            watcher::Event::InitApply(n) => initial.push(n.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial.len(), 4);
    let new_node =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "new-1"}, "spec": {}});
    sb.create_node(new_node).expect("create");
    match next(&mut stream).await {
        watcher::Event::Apply(n) => assert_eq!(n.name_any(), "new-1"),
        other => panic!("expected Apply, got {other:?}"),
    }
    // Dropped streams: the watcher re-watches from its last resourceVersion.
    sb.drop_watches();
    sb.patch_node(
        "new-1",
        PatchType::Strategic,
        &json!({"spec": {"podCIDRs": ["10.1.0.0/24"]}}),
    )
    .expect("patch");
    match next(&mut stream).await {
        watcher::Event::Apply(n) => assert_eq!(
            n.spec.and_then(|s| s.pod_cidr).as_deref(),
            Some("10.1.0.0/24")
        ),
        other => panic!("expected Apply, got {other:?}"),
    }
    // Too old after a drop: 410 makes the watcher relist (Init … InitDone). The re-watch is held
    // back 300 ms so that the delete and the compaction happen before it is served.
    sb.inject(FaultRule::new(
        Verb::Watch,
        Resource::Nodes,
        1,
        FaultAction::Delay(Duration::from_millis(300)),
    ));
    sb.drop_watches();
    assert!(
        sb.wait_until(WAIT, |s| s.pending_faults().is_empty()).await,
        "re-watch arrived"
    );
    sb.delete_node("new-1").expect("delete");
    sb.compact();
    let mut saw_init = false;
    loop {
        match tokio::time::timeout(WAIT, stream.recv())
            .await
            .expect("in time")
            .expect("open")
        {
            Ok(watcher::Event::Init) => saw_init = true,
            Ok(watcher::Event::InitDone) if saw_init => break,
            Ok(_) => {}
            Err(e) => tracing_free_note(&e),
        }
    }
    assert!(saw_init);
    let watches = sb.requests_of(Verb::Watch, Resource::Nodes);
    assert!(watches.len() >= 3, "re-watched: {}", watches.len());
    assert!(
        watches
            .iter()
            .all(|r| r.query.contains("allowWatchBookmarks=true"))
    );
    let lists = sb.requests_of(Verb::List, Resource::Nodes);
    assert!(
        lists.len() >= 3,
        "paginated lists with page size 3 (4 nodes), then relist"
    );
    driver.abort();
    sb.shutdown().await;
}

type WatcherRx = tokio::sync::mpsc::UnboundedReceiver<Result<watcher::Event<Node>, watcher::Error>>;

async fn next(rx: &mut WatcherRx) -> watcher::Event<Node> {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("watcher event in time")
        .expect("stream open")
        .expect("no error")
}

/// A watcher error (here: 410 from a too-old resourceVersion) is reported and then recovered.
fn tracing_free_note(e: &watcher::Error) {
    assert!(
        e.to_string().contains("410")
            || e.to_string().contains("Expired")
            || e.to_string().contains("too old"),
        "{e}"
    );
}

#[tokio::test]
async fn recorder_creates_then_patches_events() {
    let (sb, nodes) = start("10-minikube-single-node-no-podcidr.json").await;
    let node = nodes.get("minikube").await.expect("node");
    let recorder = Recorder::new(
        sb.client(),
        Reporter {
            controller: "nodeipam".into(),
            instance: Some("test-0".into()),
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "CIDRNotAvailable".into(),
        note: Some("no free CIDR".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &node.object_ref(&()))
        .await
        .expect("first publish");
    recorder
        .publish(&ev, &node.object_ref(&()))
        .await
        .expect("second publish");
    let events = sb.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["metadata"]["namespace"], "default");
    assert_eq!(events[0]["regarding"]["name"], "minikube");
    assert_eq!(events[0]["series"]["count"], 2);
    assert_eq!(sb.requests_of(Verb::Create, Resource::Events).len(), 1);
    let patches = sb.requests_of(Verb::Patch, Resource::Events);
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let api: Api<K8sEvent> = Api::namespaced(sb.client(), "default");
    assert_eq!(
        api.list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .len(),
        1
    );
    // An event without required fields is rejected like the real API does.
    let bad = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x"}, "type": "Normal"});
    let bad: K8sEvent = serde_json::from_value(bad).expect("event");
    let (code, _, _) = api_status(api.create(&PostParams::default(), &bad).await);
    assert_eq!(code, 422);
    sb.shutdown().await;
}

#[tokio::test]
async fn faults_fail_delay_and_commit_then_fail() {
    let (sb, nodes) = start("07-eks-2nodes-no-podcidr.json").await;
    let name = sb.nodes()[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let patch = json!({"metadata": {"labels": {"f": "1"}}});
    sb.fail_next(Verb::Patch, Resource::Nodes, 1, FaultAction::Status(500));
    let (code, _, _) = api_status(
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 500);
    assert!(
        sb.node(&name).expect("node")["metadata"]["labels"]["f"].is_null(),
        "500 fault does not run the request"
    );
    // 429: kube's default client retries, honouring Retry-After.
    sb.clear_requests();
    sb.fail_next(
        Verb::Get,
        Resource::Nodes,
        1,
        FaultAction::TooManyRequests {
            retry_after_secs: 1,
        },
    );
    let started = std::time::Instant::now();
    nodes.get(&name).await.expect("kube retries a 429");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited for Retry-After"
    );
    let statuses: Vec<Option<u16>> = sb
        .requests_of(Verb::Get, Resource::Nodes)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [Some(429), Some(200)]);
    // Without the retry layer the client sees the Status.
    let mut cfg = sb.kube_config();
    cfg.default_retry = false;
    let no_retry: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    sb.fail_next(
        Verb::Get,
        Resource::Nodes,
        1,
        FaultAction::TooManyRequests {
            retry_after_secs: 2,
        },
    );
    let (code, reason, details) = api_status(no_retry.get(&name).await);
    assert_eq!((code, reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(details["retryAfterSeconds"], 2);
    assert!(sb.pending_faults().is_empty());
    no_retry.get(&name).await.expect("faults are used up");
    // The write happens but the client sees a 500.
    sb.fail_next(
        Verb::Patch,
        Resource::Nodes,
        1,
        FaultAction::CommitThenStatus(500),
    );
    let (code, _, _) = api_status(
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 500);
    assert_eq!(
        sb.node(&name).expect("node")["metadata"]["labels"]["f"],
        "1"
    );
    // A hang outlasting the client's timeout.
    let mut cfg = sb.kube_config();
    cfg.read_timeout = Some(Duration::from_millis(300));
    let impatient: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    sb.fail_next(
        Verb::Get,
        Resource::Nodes,
        1,
        FaultAction::Hang(Duration::from_secs(5)),
    );
    let r = impatient.get(&name).await;
    // The client's own read timeout ended it, not the server's 504 after the hang.
    assert!(
        matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_))),
        "{r:?}"
    );
    // Delay.
    sb.set_delay(Duration::from_millis(200));
    let started = std::time::Instant::now();
    nodes.get(&name).await.expect("delayed get");
    assert!(started.elapsed() >= Duration::from_millis(200));
    sb.set_delay(Duration::ZERO);
    // The log shows the verbs and statuses (it was cleared before the 429 check).
    let patches = sb.requests_of(Verb::Patch, Resource::Nodes);
    assert_eq!(
        patches.iter().map(|r| r.status).collect::<Vec<_>>(),
        [Some(500)]
    );
    assert!(
        patches
            .iter()
            .all(|r| r.content_type.as_deref() == Some("application/merge-patch+json"))
    );
    sb.shutdown().await;
}

/// A request whose client gives up while the answer is held (`Hang`, `CommitThenHang`) is still
/// in the request log, without a status: the committed PATCH shows up although it was never
/// answered, and so does the hung PATCH that ran nothing. (Before the fix, such requests were
/// only logged once answered, i.e. never.)
#[tokio::test]
async fn requests_whose_client_gave_up_are_logged() {
    let (sb, _) = start("07-eks-2nodes-no-podcidr.json").await;
    let name = |i: usize| {
        sb.nodes()[i]["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned()
    };
    let (committed, hung) = (name(0), name(1));
    let mut cfg = sb.kube_config();
    cfg.read_timeout = Some(Duration::from_secs(1));
    let impatient: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    let hold = Duration::from_secs(3);
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::CommitThenHang(hold),
        )
        .named(committed.clone()),
    );
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1, FaultAction::Hang(hold))
            .named(hung.clone()),
    );
    let patch = json!({"metadata": {"labels": {"hung": "1"}}});
    let started = std::time::Instant::now();
    for n in [&committed, &hung] {
        let r = impatient
            .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        // The client's read timeout ended it (a transport error), not the server's 504.
        assert!(
            matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_))),
            "{n}: the client gave up: {r:?}"
        );
    }
    assert!(sb.pending_faults().is_empty());
    assert_eq!(
        sb.node(&committed).expect("node")["metadata"]["labels"]["hung"],
        "1",
        "CommitThenHang commits the write"
    );
    assert!(
        sb.node(&hung).expect("node")["metadata"]["labels"]["hung"].is_null(),
        "Hang does not run the request"
    );
    let logged = |sb: &SandboxHandle| -> Vec<(Option<String>, Option<u16>, Option<Value>)> {
        sb.requests_of(Verb::Patch, Resource::Nodes)
            .into_iter()
            .map(|r| (r.name, r.status, r.body))
            .collect()
    };
    let expected = [
        (Some(committed.clone()), None, Some(patch.clone())),
        (Some(hung.clone()), None, Some(patch.clone())),
    ];
    assert_eq!(logged(&sb), expected, "both abandoned PATCHes are logged");
    // The server cancels a request whose client went away: no 504 is recorded after the hold.
    tokio::time::sleep((hold + Duration::from_millis(500)).saturating_sub(started.elapsed())).await;
    assert_eq!(logged(&sb), expected, "after the hold");
    // Answered requests still get their status.
    impatient.get(&hung).await.expect("get");
    let gets: Vec<Option<u16>> = sb
        .requests_of(Verb::Get, Resource::Nodes)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(gets, [Some(200)]);
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

/// The commit observer sees every committed write in commit order, synchronously: an invariant
/// monitor built on it ("no two Nodes' podCIDRs overlap") checks every state the server passes
/// through and catches an overlap at the very write that makes it, while concurrent clients write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_observer_sees_every_state_in_order() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use nodeipam_tests::sandbox::{ChangeType, Commit, CommitObserver};

    #[derive(Default)]
    struct Monitor {
        cidrs: BTreeMap<String, Vec<ipnet::IpNet>>,
        rvs: Vec<u64>,
        overlaps: Vec<(u64, String, String)>,
    }
    let (sb, nodes) = start("08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json").await;
    let names: Vec<String> = sb
        .nodes()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().expect("name").to_owned())
        .collect();
    let monitor: Arc<Mutex<Monitor>> = Arc::default();
    let sink = Arc::clone(&monitor);
    let observer: CommitObserver = Arc::new(move |c: &Commit<'_>| {
        let Ok(mut m) = sink.lock() else { return };
        m.rvs.push(c.resource_version);
        let name = c.key.name.clone();
        let mine: Vec<ipnet::IpNet> = c.after["spec"]["podCIDRs"]
            .as_array()
            .map(|l| l.iter().filter_map(|s| s.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        if c.change == ChangeType::Deleted {
            m.cidrs.remove(&name);
            return;
        }
        let clash: Vec<String> = m
            .cidrs
            .iter()
            .filter(|(other, theirs)| {
                **other != name
                    && theirs
                        .iter()
                        .any(|t| mine.iter().any(|c| c.contains(t) || t.contains(c)))
            })
            .map(|(other, _)| other.clone())
            .collect();
        for other in clash {
            m.overlaps.push((c.resource_version, name.clone(), other));
        }
        m.cidrs.insert(name, mine);
    });
    let id = sb.on_commit(observer);
    let start_rv = sb.resource_version();
    // Six clients at once, each serving one Node with its own block.
    let writers: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let nodes = nodes.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let cidr = format!("10.128.{i}.0/24");
                let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                    .map(|n| n.resource_version())
            })
        })
        .collect();
    for w in writers {
        w.await.expect("task").expect("patch");
    }
    // Delete one (its block is free again), then a new Node takes the block of another: overlap.
    sb.delete_node(&names[0]).expect("delete");
    let dup = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dup"},
        "spec": {"podCIDR": "10.128.1.0/25"}});
    let created = sb.create_node(dup).expect("create");
    let dup_rv: u64 = created["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("rv");
    assert!(sb.remove_commit_observer(id));
    sb.patch_node(
        &names[2],
        PatchType::Merge,
        &json!({"metadata": {"labels": {"after": "removal"}}}),
    )
    .expect("label");
    {
        let m = monitor.lock().expect("monitor");
        let want: Vec<u64> = (start_rv + 1..=start_rv + 8).collect();
        assert_eq!(m.rvs, want, "every commit, in order, none after removal");
        assert_eq!(m.overlaps, [(dup_rv, "dup".to_owned(), names[1].clone())]);
        assert!(!m.cidrs.contains_key(&names[0]));
    }
    sb.shutdown().await;
}

/// Sends one raw HTTP/1.1 request and reads until the server closes: `(bytes, read error)`.
async fn raw_http(
    sb: &SandboxHandle,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (Vec<u8>, Option<std::io::Error>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(sb.addr())
        .await
        .expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    let err = tokio::time::timeout(WAIT, conn.read_to_end(&mut out))
        .await
        .expect("server answers or closes in time")
        .err();
    (out, err)
}

fn no_retry_nodes(sb: &SandboxHandle) -> Api<Node> {
    let mut cfg = sb.kube_config();
    cfg.default_retry = false;
    Api::all(kube::Client::try_from(cfg).expect("client"))
}

/// Late writes: the client is answered early (504 in the timeout filter's shape, or the
/// connection dropped: a transport error) and the write is committed later against the state at
/// commit time, so it fails — visibly only in the request log — when the Node was deleted, was
/// re-created with another uid (the write pins the uid) or got other podCIDRs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_writes_commit_against_the_state_at_commit_time() {
    let (sb, _) = start("05-aws-4nodes-no-podcidr.json").await;
    let nodes = no_retry_nodes(&sb);
    let names: Vec<String> = sb
        .nodes()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().expect("name").to_owned())
        .collect();
    let uid = |sb: &SandboxHandle, n: &str| {
        sb.node(n).expect("node")["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_owned()
    };
    // Committed long after the answer, so that the test's own writes come first.
    let later = Duration::from_secs(5);
    let timeout = LateAnswer::Timeout {
        after: Duration::ZERO,
    };
    for (i, answer) in [
        timeout,
        timeout,
        LateAnswer::DropConnection,
        LateAnswer::DropConnection,
    ]
    .into_iter()
    .enumerate()
    {
        sb.inject(
            FaultRule::new(
                Verb::Patch,
                Resource::Nodes,
                1,
                FaultAction::LateWrite {
                    commit_after: later,
                    answer,
                },
            )
            .named(names[i].clone()),
        );
    }
    let patch = |i: usize, uid: Option<String>| {
        let cidr = format!("10.200.{i}.0/24");
        let mut p = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
        if let Some(u) = uid {
            p["metadata"] = json!({"uid": u});
        }
        p
    };
    // 0: raw request — the exact 504 of kube-apiserver's timeout filter.
    let (resp, err) = raw_http(
        &sb,
        "PATCH",
        &format!("/api/v1/nodes/{}", names[0]),
        "Content-Type: application/strategic-merge-patch+json\r\n",
        &patch(0, None).to_string(),
    )
    .await;
    assert!(err.is_none(), "{err:?}");
    let text = String::from_utf8(resp).expect("utf-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; charset=utf-8"),
        "{head}"
    );
    assert_eq!(
        body,
        "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Timeout: request did not complete within the allotted timeout\",\"reason\":\"Timeout\",\"details\":{},\"code\":504}\n"
    );
    // 1: kube-rs sees the 504 as an API error.
    let (code, reason, _) = api_status(
        nodes
            .patch(
                &names[1],
                &PatchParams::default(),
                &Patch::Strategic(&patch(1, None)),
            )
            .await,
    );
    assert_eq!((code, reason.as_str()), (504, "Timeout"));
    // 2: dropped connection — a transport error for kube-rs, not an HTTP status.
    let r = nodes
        .patch(
            &names[2],
            &PatchParams::default(),
            &Patch::Strategic(&patch(2, Some(uid(&sb, &names[2])))),
        )
        .await;
    assert!(
        matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_))),
        "{r:?}"
    );
    // 3: dropped connection, raw: not one byte of an answer.
    let (resp, _) = raw_http(
        &sb,
        "PATCH",
        &format!("/api/v1/nodes/{}", names[3]),
        "Content-Type: application/strategic-merge-patch+json\r\n",
        &patch(3, None).to_string(),
    )
    .await;
    assert!(resp.is_empty(), "{}", String::from_utf8_lossy(&resp));
    // Before the commits: 1 is deleted, 2 re-created (new uid), 3 gets other podCIDRs.
    let pending =
        |sb: &SandboxHandle| -> Vec<(Option<String>, Option<u16>, Option<LateWriteOutcome>)> {
            sb.requests_of(Verb::Patch, Resource::Nodes)
                .into_iter()
                .map(|r| (r.name, r.status, r.late_write))
                .collect()
        };
    assert!(
        pending(&sb)
            .iter()
            .all(|(_, _, l)| *l == Some(LateWriteOutcome::Pending)),
        "{:?}",
        pending(&sb)
    );
    sb.delete_node(&names[1]).expect("delete 1");
    let mut again = sb
        .nodes()
        .into_iter()
        .find(|n| n["metadata"]["name"] == names[2])
        .expect("2");
    sb.delete_node(&names[2]).expect("delete 2");
    for f in ["uid", "resourceVersion", "creationTimestamp"] {
        again["metadata"].as_object_mut().expect("meta").remove(f);
    }
    sb.create_node(again).expect("re-create 2");
    sb.patch_node(
        &names[3],
        PatchType::Strategic,
        &json!({"spec": {"podCIDRs": ["10.201.0.0/24"]}}),
    )
    .expect("other podCIDRs for 3");
    assert!(
        sb.wait_until(Duration::from_secs(30), |sb| pending(sb)
            .iter()
            .all(|(_, _, l)| *l != Some(LateWriteOutcome::Pending)))
            .await,
        "late writes ran: {:?}",
        pending(&sb)
    );
    let log = pending(&sb);
    let outcome = |i: usize| log[i].2.clone().expect("late write");
    assert_eq!(
        log.iter()
            .map(|(n, s, _)| (n.clone(), *s))
            .collect::<Vec<_>>(),
        [
            (Some(names[0].clone()), Some(504)),
            (Some(names[1].clone()), Some(504)),
            (Some(names[2].clone()), None),
            (Some(names[3].clone()), None),
        ]
    );
    let rv0 = sb.node(&names[0]).expect("0")["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("rv");
    assert_eq!(
        outcome(0),
        LateWriteOutcome::Committed {
            resource_version: rv0
        }
    );
    assert_eq!(
        sb.node(&names[0]).expect("0")["spec"]["podCIDRs"],
        json!(["10.200.0.0/24"])
    );
    assert!(
        matches!(outcome(1), LateWriteOutcome::Failed { code: 404, .. }),
        "{:?}",
        outcome(1)
    );
    assert!(
        sb.node(&names[1]).is_none(),
        "a failed late write creates nothing"
    );
    match outcome(2) {
        LateWriteOutcome::Failed {
            code: 422, message, ..
        } => {
            assert!(message.contains("metadata.uid"), "{message}")
        }
        other => panic!("2: {other:?}"),
    }
    assert!(sb.node(&names[2]).expect("2")["spec"]["podCIDRs"].is_null());
    match outcome(3) {
        LateWriteOutcome::Failed {
            code: 422, message, ..
        } => {
            assert!(message.contains("spec.podCIDRs"), "{message}")
        }
        other => panic!("3: {other:?}"),
    }
    assert_eq!(
        sb.node(&names[3]).expect("3")["spec"]["podCIDRs"],
        json!(["10.201.0.0/24"])
    );
    sb.shutdown().await;
}

/// The commit of a late write runs on its own task: it happens although the client gave up and
/// disconnected long before, and the request stays unanswered in the log.
#[tokio::test]
async fn late_write_commits_after_the_client_disconnected() {
    let (sb, _) = start("07-eks-2nodes-no-podcidr.json").await;
    let name = sb.nodes()[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let mut cfg = sb.kube_config();
    cfg.default_retry = false;
    cfg.read_timeout = Some(Duration::from_millis(300));
    let impatient: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    sb.fail_next(
        Verb::Patch,
        Resource::Nodes,
        1,
        FaultAction::LateWrite {
            commit_after: Duration::from_secs(1),
            answer: LateAnswer::Timeout {
                after: Duration::from_secs(60),
            },
        },
    );
    let patch = json!({"spec": {"podCIDRs": ["10.202.0.0/24"]}});
    let r = impatient
        .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await;
    assert!(r.is_err(), "the client gave up: {r:?}");
    assert!(
        sb.wait_until(WAIT, |sb| {
            !sb.node(&name).expect("node")["spec"]["podCIDRs"].is_null()
        })
        .await,
        "committed after the client left"
    );
    let rec = sb.requests_of(Verb::Patch, Resource::Nodes).remove(0);
    assert_eq!(rec.status, None);
    assert!(
        matches!(rec.late_write, Some(LateWriteOutcome::Committed { .. })),
        "{rec:?}"
    );
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

/// List and watch options are validated as `ValidateListOptions` does (422 ListOptions).
#[tokio::test]
async fn list_and_watch_options_are_validated() {
    let (sb, _) = start("07-eks-2nodes-no-podcidr.json").await;
    for (query, message) in [
        (
            "resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "sendInitialEvents=true",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            "watch=1&sendInitialEvents=true",
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            "watch=1&resourceVersion=3&resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
    ] {
        let (resp, _) = raw_http(&sb, "GET", &format!("/api/v1/nodes?{query}"), "", "").await;
        let text = String::from_utf8_lossy(&resp).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        assert!(head.starts_with("HTTP/1.1 422"), "{query}: {head}");
        let body: Value = serde_json::from_str(body).expect("status");
        assert_eq!(
            (body["reason"].as_str(), body["message"].as_str()),
            (
                Some("Invalid"),
                Some(format!("ListOptions.meta.k8s.io \"\" is invalid: {message}").as_str())
            ),
            "{query}"
        );
        assert_eq!(body["details"]["kind"], "ListOptions");
        assert_eq!(body["details"]["group"], "meta.k8s.io");
    }
    sb.shutdown().await;
}

/// A streaming list (`sendInitialEvents=true`): ADDED for every Node, a BOOKMARK annotated
/// `k8s.io/initial-events-end`, then live events — through kube-rs's watcher with the
/// `StreamingList` strategy and on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_sends_initial_events_then_the_end_bookmark() {
    let (sb, nodes) = start("06-kvm-onprem-4nodes-no-podcidr.json").await;
    // On the wire.
    let mut stream = nodes
        .watch(&WatchParams::streaming_lists().timeout(30), "")
        .await
        .expect("watch")
        .boxed();
    let mut added = Vec::new();
    let end_rv = loop {
        match tokio::time::timeout(WAIT, stream.try_next())
            .await
            .expect("in time")
            .expect("ok")
            .expect("some")
        {
            WatchEvent::Added(n) => added.push(n.name_any()),
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break b.metadata.resource_version;
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(added.len(), 4);
    assert_eq!(end_rv, sb.resource_version().to_string());
    sb.patch_node(
        &added[0],
        PatchType::Merge,
        &json!({"metadata": {"labels": {"live": "1"}}}),
    )
    .expect("patch");
    match tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("some")
    {
        WatchEvent::Modified(n) => assert_eq!(n.name_any(), added[0]),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // kube-rs's watcher with the StreamingList strategy.
    let cfg = watcher::Config::default().streaming_lists();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let api = nodes.clone();
    let driver = tokio::spawn(async move {
        let mut events = watcher(api, cfg).boxed();
        while let Some(ev) = events.next().await {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let mut initial = Vec::new();
    loop {
        match next(&mut rx).await {
            watcher::Event::Init => {}
            watcher::Event::InitApply(n) => initial.push(n.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial.len(), 4);
    assert!(
        sb.requests_of(Verb::List, Resource::Nodes).is_empty(),
        "no LIST at all"
    );
    let watches = sb.requests_of(Verb::Watch, Resource::Nodes);
    assert!(
        watches
            .iter()
            .all(|r| r.query.contains("sendInitialEvents=true")),
        "{watches:?}"
    );
    driver.abort();
    sb.shutdown().await;
}

/// With the WatchList switch off the sandbox answers a streaming list as a server without the
/// feature (422), and kube-rs's default list-then-watch still works.
#[tokio::test]
async fn streaming_list_is_refused_without_watch_list() {
    let opts = SandboxOptions {
        watch_list: false,
        ..SandboxOptions::default()
    };
    let sb = Sandbox::try_start(fixture("07-eks-2nodes-no-podcidr.json"), opts)
        .await
        .expect("start");
    let nodes: Api<Node> = Api::all(sb.client());
    let err = match nodes
        .watch(&WatchParams::streaming_lists().timeout(5), "")
        .await
    {
        Err(e) => e,
        Ok(_) => panic!("a streaming list must be refused"),
    };
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    );
    // A legacy watch from "" still gets the initial ADDED events, without the end bookmark.
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .expect("legacy watch")
        .boxed();
    let mut added = 0;
    while let Some(ev) = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
    {
        match ev {
            WatchEvent::Added(_) => added += 1,
            WatchEvent::Bookmark(b) => {
                assert!(
                    !b.metadata
                        .annotations
                        .contains_key("k8s.io/initial-events-end")
                )
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, 2);
    let list = nodes
        .list(&ListParams::default().limit(1))
        .await
        .expect("paged list");
    assert_eq!(list.items.len(), 1);
    sb.shutdown().await;
}

/// A small history (3 changes): a watch or a continue token from before it is 410, in the stream
/// and as an answer.
#[tokio::test]
async fn small_history_gives_410_for_older_versions() {
    let opts = SandboxOptions {
        history_limit: 3,
        ..SandboxOptions::default()
    };
    let sb = Sandbox::try_start(fixture("06-kvm-onprem-4nodes-no-podcidr.json"), opts)
        .await
        .expect("start");
    let nodes: Api<Node> = Api::all(sb.client());
    let first = nodes
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    let rv = first.metadata.resource_version.clone().expect("rv");
    let token = first.metadata.continue_.clone().expect("token");
    let name = first.items[0].name_any();
    for i in 0..3 {
        sb.patch_node(
            &name,
            PatchType::Merge,
            &json!({"metadata": {"labels": {"i": i.to_string()}}}),
        )
        .expect("patch");
    }
    // Three changes fit: the watch from the list's resourceVersion still works…
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("some");
    assert!(matches!(ev, WatchEvent::Modified(_)), "{ev:?}");
    // …a fourth pushes it out of the history.
    sb.patch_node(
        &name,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"i": "3"}}}),
    )
    .expect("patch");
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    match tokio::time::timeout(WAIT, stream.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("some")
    {
        WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    let (code, reason, _) = api_status(
        nodes
            .list(&ListParams::default().limit(2).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
    sb.shutdown().await;
}

/// The `sandbox-apiserver` process: 1,000 copies of a real AWS Node from `--replicate`, the
/// summary, a late write injected through the admin API, every flag in `--help`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_process_replicates_nodes_and_takes_admin_faults() {
    let bin = env!("CARGO_BIN_EXE_sandbox-apiserver");
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for flag in [
        "--listen",
        "--nodes",
        "--replicate",
        "--history-limit",
        "--request-log-size",
        "--request-body-limit",
        "--bookmark-interval-ms",
        "--delay-ms",
        "--no-watch-list",
        "--admin",
    ] {
        assert!(help.contains(flag), "{flag} in --help:\n{help}");
    }
    let fixture = format!(
        "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
        env!("CARGO_MANIFEST_DIR")
    );
    /// Kills the process when the test ends, passing or not.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(
        std::process::Command::new(bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "--history-limit",
                "50",
            ])
            .args(["--request-log-size", "10", "--no-watch-list"])
            .args([
                "--replicate",
                &format!("{fixture}:1:1000"),
                "--replicate",
                &format!("{fixture}:0:2:extra"),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        }),
    )
    .await
    .expect("started in time")
    .expect("task")
    .expect("a line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_owned();
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("uri"))).expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let summary = |client: kube::Client| async move {
        let req = axum::http::Request::get("/sandbox/summary")
            .body(Vec::new())
            .expect("request");
        client.request::<Value>(req).await.expect("summary")
    };
    let s = summary(client.clone()).await;
    assert_eq!(s["nodes"], 1002);
    assert_eq!(s["nodesWithPodCIDRs"], 0);
    let page = nodes
        .list(&ListParams::default().limit(500))
        .await
        .expect("list");
    assert_eq!(page.items.len(), 500);
    assert_eq!(page.metadata.remaining_item_count, Some(502));
    let copy = nodes.get("node-999").await.expect("copy");
    let other = nodes.get("node-0").await.expect("copy");
    assert_ne!(copy.metadata.uid, other.metadata.uid);
    assert!(
        copy.spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_ref())
            .is_none()
    );
    nodes.get("extra-1").await.expect("second --replicate");
    // A late write through the admin API.
    let rule = json!({"verb": "patch", "resource": "nodes", "name": "node-7",
        "lateWrite": {"commitAfterMs": 200, "answer": "drop"}});
    let req = axum::http::Request::post("/sandbox/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&rule).expect("json"))
        .expect("request");
    client.request::<Value>(req).await.expect("fault injected");
    let mut cfg = kube::Config::new(url.parse().expect("uri"));
    cfg.default_retry = false;
    let no_retry: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    let patch = json!({"spec": {"podCIDRs": ["10.5.0.0/24"]}});
    let r = no_retry
        .patch("node-7", &PatchParams::default(), &Patch::Strategic(&patch))
        .await;
    assert!(
        matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_))),
        "{r:?}"
    );
    let mut served = false;
    for _ in 0..100 {
        let s = summary(client.clone()).await;
        if s["nodesWithPodCIDRs"] == 1 {
            assert_eq!(s["patches"], 1);
            assert_eq!(s["lists"], 1);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the late write was committed");
    // --no-watch-list: a streaming list is refused.
    let refused = nodes
        .watch(&WatchParams::streaming_lists().timeout(5), "")
        .await;
    assert!(
        matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 422),
        "{:?}",
        refused.err()
    );
    // --request-log-size 10: the log is a ring.
    let req = axum::http::Request::get("/sandbox/requests")
        .body(Vec::new())
        .expect("request");
    let log: Vec<Value> = client.request(req).await.expect("log");
    assert!(log.len() <= 10, "{}", log.len());
    drop(child);
}

/// `(VmHWM kB, VmRSS kB, CPU seconds user+system)` of a process, from `/proc/PID/status` and
/// `/proc/PID/stat` (clock ticks at the usual 100 Hz).
fn process_usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
    (kb("VmHWM:"), kb("VmRSS:"), cpu)
}

/// The scale driver (not a test: `#[ignore]`d, no timing assertions). Starts `sandbox-apiserver`
/// as its own process with N copies of the second AWS Node of fixture 05 (`--replicate`), then
/// does what a controller does: a paged LIST (limit 500), a WATCH from the list's
/// resourceVersion, and a PATCH of every Node's podCIDRs with 30 requests in flight; it waits
/// until the watch has seen every change and `GET /sandbox/summary` says every Node is served,
/// and prints the sandbox process's peak memory (VmHWM) and CPU time at each phase.
///
/// ```text
/// cargo build -p nodeipam-tests --release --bin sandbox-apiserver
/// SANDBOX_SCALE_BIN=target/release/sandbox-apiserver SANDBOX_SCALE_NODES=50000 \
///   cargo test -p nodeipam-tests --test e2e -- --ignored sandbox_api::scale_driver --nocapture
/// ```
/// `SANDBOX_SCALE_BIN` defaults to the test build's binary, `SANDBOX_SCALE_NODES` to 50000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale benchmark, run by hand (see its doc)"]
async fn scale_driver() {
    use futures::stream;
    let count: usize = std::env::var("SANDBOX_SCALE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let bin = std::env::var("SANDBOX_SCALE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sandbox-apiserver").to_owned());
    let fixture = format!(
        "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
        env!("CARGO_MANIFEST_DIR")
    );
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let started = std::time::Instant::now();
    let mut child = Kill(
        std::process::Command::new(&bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "--request-log-size",
                "1000",
            ])
            .args(["--replicate", &format!("{fixture}:1:{count}")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let pid = child.0.id();
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .expect("task")
    .expect("a line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_owned();
    let report = |phase: &str| {
        let (hwm, rss, cpu) = process_usage(pid);
        println!(
            "{phase:<28} VmHWM {:>7.1} MiB  VmRSS {:>7.1} MiB  sandbox CPU {cpu:>6.1} s  (wall {:>6.1} s)",
            hwm as f64 / 1024.0,
            rss as f64 / 1024.0,
            started.elapsed().as_secs_f64()
        );
    };
    report(&format!("loaded {count} Nodes"));
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("uri"))).expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    // Paged LIST, as a reflector does.
    let mut names = Vec::with_capacity(count);
    let mut token: Option<String> = None;
    let list_rv = loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = nodes.list(&lp).await.expect("page");
        names.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break page.metadata.resource_version.expect("rv");
        }
    };
    assert_eq!(names.len(), count);
    report("paged LIST (500/page)");
    // WATCH from the list's resourceVersion, counting MODIFIED events.
    let mut watch = nodes
        .watch(&WatchParams::default().timeout(290), &list_rv)
        .await
        .expect("watch")
        .boxed();
    let watcher = tokio::spawn(async move {
        let mut modified = 0usize;
        while modified < count {
            match watch.try_next().await {
                Ok(Some(WatchEvent::Modified(_))) => modified += 1,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        modified
    });
    // PATCH every Node, 30 in flight.
    let results: Vec<bool> = stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let nodes = nodes.clone();
            async move {
                let cidr = format!("10.{}.{}.0/24", i / 256, i % 256);
                let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(30)
        .collect()
        .await;
    assert!(results.iter().all(|ok| *ok), "every PATCH succeeded");
    report("PATCHed all (30 in flight)");
    let modified = tokio::time::timeout(Duration::from_secs(600), watcher)
        .await
        .expect("watch events in time")
        .expect("watch task");
    assert_eq!(modified, count, "the watch saw every change");
    report("WATCH saw every MODIFIED");
    let req = axum::http::Request::get("/sandbox/summary")
        .body(Vec::new())
        .expect("request");
    let summary: Value = client.request(req).await.expect("summary");
    println!("summary: {summary}");
    assert_eq!(summary["nodesWithPodCIDRs"], count);
    drop(child);
}

/// The `WatchError` fault: the WATCH is answered 200 with one `ERROR` event carrying the code,
/// then ends (what the real kube-apiserver sends for a watch it cannot serve, tests/FIDELITY.md).
#[tokio::test]
async fn watch_error_fault_ends_a_watch_with_one_error_event() {
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    sb.inject(FaultRule::new(
        Verb::Watch,
        Resource::Nodes,
        1,
        FaultAction::WatchError(500),
    ));
    let watch = |client: kube::Client| async move {
        let request = http::Request::get("/api/v1/nodes?watch=true&timeoutSeconds=1")
            .body(Vec::new())
            .unwrap();
        client.request_text(request).await.unwrap()
    };
    let first: Vec<Value> = watch(sb.client())
        .await
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        (&first[0]["type"], &first[0]["object"]["code"]),
        (&json!("ERROR"), &json!(500))
    );
    // Spent: the next watch is served.
    let second = watch(sb.client()).await;
    assert!(!second.contains("ERROR"), "{second}");
    sb.shutdown().await;
}

/// The real kube-apiserver can end a watch with an `ERROR` event that is not 410: without the
/// watch cache, a watch starting exactly at etcd's compaction revision gets `500 InternalError`
/// "etcd event received with PrevKv=nil" (tests/FIDELITY.md). Like client-go's reflector (the
/// error ends `ListAndWatch`, which runs again after its backoff), the informer lists again after
/// a backoff; before the fix it re-opened the watch from the same resourceVersion at once and, on
/// the real server, met the same error again until a compaction turned it into a 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_lists_again_after_a_watch_error_event_that_is_not_410() {
    use nodeipam::controller::informer::{self, InformerSettings, NodeCache, Outputs, SyncState};
    use nodeipam::controller::{InitialList, WorkQueue, window::WriteWindow};
    use std::sync::Arc;
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    let (synced_tx, mut synced) = tokio::sync::watch::channel(SyncState::default());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (broken, _) = tokio::sync::watch::channel(None);
    let task = tokio::spawn(informer::run(
        kube::Api::all(sb.client()),
        Outputs {
            cache: Arc::new(NodeCache::new()),
            queue: Arc::new(WorkQueue::new()),
            window: Arc::new(WriteWindow::new(1000)),
        },
        synced_tx,
        InformerSettings {
            initial_list: InitialList::Streaming,
            retry_min_delay: Duration::from_millis(20),
            retry_max_delay: Duration::from_millis(200),
        },
        stop_rx,
        broken,
    ));
    let wait = Duration::from_secs(10);
    tokio::time::timeout(wait, synced.wait_for(|s| s.lists >= 1))
        .await
        .expect("no initial list")
        .unwrap();
    // The re-opened watch ends with ERROR 500.
    sb.inject(FaultRule::new(
        Verb::Watch,
        Resource::Nodes,
        1,
        FaultAction::WatchError(500),
    ));
    sb.drop_watches();
    let relisted = tokio::time::timeout(wait, synced.wait_for(|s| s.lists >= 2))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(sb.pending_faults().is_empty(), "the fault never fired");
    let _ = stop.send(true);
    let _ = task.await;
    sb.shutdown().await;
    assert!(
        relisted,
        "after a watch ERROR event (500) the informer watched again from the same resourceVersion instead of listing again"
    );
}
