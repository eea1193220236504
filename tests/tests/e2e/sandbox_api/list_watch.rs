//! Lists and watches: pagination, resourceVersions and 410, kube's watcher, streaming lists,
//! option validation, watch error events.

use super::{WAIT, api_status, raw_http, start};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, PatchType, Resource, Sandbox, SandboxOptions, Verb, fixture,
};
use serde_json::{Value, json};

type WatcherRx = tokio::sync::mpsc::UnboundedReceiver<Result<watcher::Event<Node>, watcher::Error>>;

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
