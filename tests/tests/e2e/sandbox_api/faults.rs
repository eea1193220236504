//! Injected faults, the request log, the commit observer and late writes.

use super::{WAIT, api_status, raw_http, start};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, LateAnswer, LateWriteOutcome, PatchType, Resource, SandboxHandle, Verb,
};
use serde_json::{Value, json};

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
