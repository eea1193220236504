//! Leases through `kube::Api<Lease>`: field ownership of plain writes, optimistic concurrency,
//! AlreadyExists and validation. The controller's own election against the sandbox is tested in
//! `leader_election` and `handover`.

use super::api_status;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeipam_tests::sandbox::Sandbox;
use serde_json::{Value, json};

const NS: &str = "kube-system";

fn post_as(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.into()),
        ..PostParams::default()
    }
}

/// `(manager, operation, owned fields)` of each `metadata.managedFields` entry.
fn owners(lease: &Lease) -> Vec<(String, String, Value)> {
    lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
                serde_json::to_value(&e.fields_v1).unwrap_or(Value::Null),
            )
        })
        .collect()
}

#[tokio::test]
async fn lease_writes_record_owners_and_get_conflicts_already_exists_and_validation() {
    let sb = Sandbox::start(Value::Null).await;
    let leases: Api<Lease> = Api::namespaced(sb.client(), NS);
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "one"}
    }))
    .expect("lease");
    let created = leases.create(&post_as("m1"), &lease).await.expect("create");
    assert_eq!(
        owners(&created),
        [(
            "m1".into(),
            "Update".into(),
            json!({"f:spec": {"f:holderIdentity": {}}})
        )]
    );
    // Another manager changes the field: it owns it now, the first entry is gone.
    let taken = leases
        .patch(
            "l",
            &PatchParams {
                field_manager: Some("m2".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"holderIdentity": "two"}})),
        )
        .await
        .expect("take over");
    assert_eq!(
        owners(&taken),
        [(
            "m2".into(),
            "Update".into(),
            json!({"f:spec": {"f:holderIdentity": {}}})
        )]
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
    let (code, reason, _) = api_status(leases.replace("l", &PostParams::default(), &stale).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    // Create of an existing lease: AlreadyExists; validation: 422.
    let mut again = current.clone();
    again.metadata.resource_version = None;
    let (code, reason, _) = api_status(leases.create(&PostParams::default(), &again).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let bad = json!({"spec": {"leaseDurationSeconds": 0}});
    let (code, _, _) = api_status(
        leases
            .patch("l", &PatchParams::default(), &Patch::Merge(bad))
            .await,
    );
    assert_eq!(code, 422);
    sb.shutdown().await;
}

/// Server-side apply is not served (the controller never sends it): 415 naming the patch types
/// the sandbox accepts, for an existing Lease and a missing one, and nothing written.
#[tokio::test]
async fn an_apply_patch_is_refused_with_415_and_writes_nothing() {
    let sb = Sandbox::start(Value::Null).await;
    let leases: Api<Lease> = Api::namespaced(sb.client(), NS);
    let hold = |name: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name}, "spec": {"holderIdentity": "applied"}})
    };
    let lease: Lease = serde_json::from_value(hold("l")).expect("lease");
    let created = leases.create(&post_as("m1"), &lease).await.expect("create");
    for name in ["l", "missing"] {
        let refused = leases
            .patch(
                name,
                &PatchParams::apply("m2").force(),
                &Patch::Apply(hold(name)),
            )
            .await;
        match refused {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
                // What it accepts (before the echoed content type): the three other patch types.
                let accepted = s.message.split(" (got").next().unwrap_or_default();
                assert!(
                    accepted.contains("application/merge-patch+json")
                        && !accepted.contains("apply"),
                    "{}",
                    s.message
                );
            }
            other => panic!("expected 415, got {other:?}"),
        }
    }
    let after = leases.get("l").await.expect("get");
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(owners(&after), owners(&created));
    assert!(
        leases.get_opt("missing").await.expect("get").is_none(),
        "an apply must not create"
    );
    sb.shutdown().await;
}
