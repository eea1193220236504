//! Leader election against the sandbox: two real kube-lease-manager instances.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_lease_manager::LeaseManagerBuilder;
use nodeipam_tests::sandbox::{Resource, Sandbox, Verb};
use serde_json::{Value, json};
use tokio::sync::watch::Receiver;

const LEASE: &str = "nodeipam-test";
const NS: &str = "kube-system";

async fn wait_for(rx: &mut Receiver<bool>, want: bool, within: Duration) -> bool {
    tokio::time::timeout(within, rx.wait_for(|v| *v == want))
        .await
        .is_ok_and(|r| r.is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lease_managers_elect_one_leader_and_hand_over() {
    let sb = Sandbox::start(Value::Null).await;
    let build = |id: &str| {
        LeaseManagerBuilder::new(sb.client(), LEASE)
            .with_namespace(NS)
            .with_identity(id)
            .with_duration(3)
            .with_grace(1)
            .build()
    };
    let a = build("a").await.expect("manager a");
    let b = build("b").await.expect("manager b");
    let (rx_a, task_a) = a.watch().await;
    let (rx_b, task_b) = b.watch().await;

    // Exactly one leader.
    let (mut wa, mut wb) = (rx_a.clone(), rx_b.clone());
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            _ = wa.wait_for(|v| *v) => "a",
            _ = wb.wait_for(|v| *v) => "b",
        }
    })
    .await
    .expect("a leader within 10 s");
    drop((wa, wb));
    let ((mut leader_rx, leader_task), (mut follower_rx, _follower_task), follower) =
        if first == "a" {
            ((rx_a, task_a), (rx_b, task_b), "b")
        } else {
            ((rx_b, task_b), (rx_a, task_a), "a")
        };
    // Stay stable for more than a lease duration: renewals keep it, the other never takes over.
    assert!(
        !wait_for(&mut follower_rx, true, Duration::from_secs(4)).await,
        "the follower must not lead too"
    );
    assert!(*leader_rx.borrow_and_update());
    let lease = sb.lease(NS, LEASE).expect("lease exists");
    assert_eq!(lease["spec"]["holderIdentity"], first);
    assert!(
        lease["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );

    // The leader releases (dropping its receiver makes its task release and exit): the other takes over.
    drop(leader_rx);
    tokio::time::timeout(Duration::from_secs(10), leader_task)
        .await
        .expect("leader task ends")
        .expect("join")
        .expect("released cleanly");
    assert!(
        wait_for(&mut follower_rx, true, Duration::from_secs(15)).await,
        "follower takes over"
    );
    assert_eq!(
        sb.lease(NS, LEASE).expect("lease")["spec"]["holderIdentity"],
        follower
    );
    // Apply patches carried a field manager; some were refused with 409 while the other held it.
    let patches = sb.requests_of(Verb::Patch, Resource::Leases);
    assert!(
        patches
            .iter()
            .any(|r| r.content_type.as_deref() == Some("application/apply-patch+yaml"))
    );
    drop(follower_rx);
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_taken_over() {
    let sb = Sandbox::start(Value::Null).await;
    // A dead holder: a lease held by "ghost" whose renewTime is long past.
    let leases: Api<Lease> = Api::namespaced(sb.client(), NS);
    let ghost = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE},
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 1,
                 "acquireTime": "2020-01-01T00:00:00.000000Z", "renewTime": "2020-01-01T00:00:00.000000Z"}
    });
    leases
        .patch(
            LEASE,
            &PatchParams::apply("ghost-manager"),
            &Patch::Apply(&ghost),
        )
        .await
        .expect("ghost applies");
    let m = LeaseManagerBuilder::new(sb.client(), LEASE)
        .with_namespace(NS)
        .with_identity("c")
        .with_duration(3)
        .with_grace(1)
        .build()
        .await
        .expect("manager");
    let (mut rx, _task) = m.watch().await;
    assert!(
        wait_for(&mut rx, true, Duration::from_secs(15)).await,
        "expired lease taken over"
    );
    assert_eq!(
        sb.lease(NS, LEASE).expect("lease")["spec"]["holderIdentity"],
        "c"
    );
    drop(rx);
    sb.shutdown().await;
}

#[tokio::test]
async fn apply_conflicts_and_update_conflicts_on_leases() {
    let sb = Sandbox::start(Value::Null).await;
    let leases: Api<Lease> = Api::namespaced(sb.client(), NS);
    let hold = |id: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": id}});
    leases
        .patch("l", &PatchParams::apply("m1"), &Patch::Apply(hold("one")))
        .await
        .expect("create by apply");
    // Same value from another manager: shared, no conflict.
    leases
        .patch("l", &PatchParams::apply("m2"), &Patch::Apply(hold("one")))
        .await
        .expect("same value");
    // Different value: 409 Conflict naming the owner, unless forced.
    let err = leases
        .patch("l", &PatchParams::apply("m3"), &Patch::Apply(hold("three")))
        .await;
    match err {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(s.message.contains(".spec.holderIdentity"), "{}", s.message);
        }
        other => panic!("expected 409, got {other:?}"),
    }
    let forced = leases
        .patch(
            "l",
            &PatchParams::apply("m3").force(),
            &Patch::Apply(hold("three")),
        )
        .await
        .expect("force");
    assert_eq!(
        forced.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("three")
    );
    // Optimistic concurrency on PUT.
    let current = leases.get("l").await.expect("get");
    let mut stale = current.clone();
    leases
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseTransitions": 1}})),
        )
        .await
        .expect("bump");
    stale
        .spec
        .get_or_insert_with(Default::default)
        .lease_transitions = Some(5);
    match leases.replace("l", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("expected 409, got {other:?}"),
    }
    // Create of an existing lease: AlreadyExists; validation: 422.
    let mut again = current.clone();
    again.metadata.resource_version = None;
    match leases.create(&PostParams::default(), &again).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    let bad = json!({"spec": {"leaseDurationSeconds": 0}});
    match leases
        .patch("l", &PatchParams::default(), &Patch::Merge(bad))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("expected 422, got {other:?}"),
    }
    sb.shutdown().await;
}
