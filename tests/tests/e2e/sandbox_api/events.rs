//! Events through kube's `Recorder`.

use super::{api_status, start};

use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Resource as _;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use nodeipam_tests::sandbox::{Resource, Verb};
use serde_json::json;

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
