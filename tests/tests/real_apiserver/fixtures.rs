//! Issue 16 (1): every fixture of `fixtures/nodes/` ends with `plan`'s podCIDRs on the real server.

use super::{
    SKIP_REASONS, WAIT, common, controller_client, creatable, nodes_by_name, start, wait_for,
};
use std::collections::{BTreeMap, BTreeSet};

use common::{fast_config, init_tracing, ipam, masks, spawn_with_client};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodeipam::plan::plan;
use nodeipam::reasons;
use nodeipam_core::NodeMaskFlags;
use nodeipam_tests::invariants::{name_of, pod_cidrs_of};
use nodeipam_tests::sandbox::fixture;
use serde_json::json;

/// One fixture of `fixtures/nodes/` with the flags `plan` is given for it (README's and docs/plan.md's
/// `plan` examples; the same table as tests/tests/e2e/fixtures.rs and shell/tests/plan.rs).
struct FixtureCase {
    file: &'static str,
    cluster: &'static str,
    service: &'static str,
    masks: NodeMaskFlags,
}

fn fixture_cases() -> Vec<FixtureCase> {
    let case = |file, cluster, service, masks| FixtureCase {
        file,
        cluster,
        service,
        masks,
    };
    let plain = || masks(None, None, None);
    vec![
        case(
            "01-k3s-single-node-flannel-hostgw.json",
            "10.42.0.0/16",
            "10.43.0.0/16",
            plain(),
        ),
        case(
            "03-aks-kubenet-3nodes.json",
            "10.244.0.0/16",
            "10.0.0.0/16",
            plain(),
        ),
        case(
            "05-aws-4nodes-no-podcidr.json",
            "10.244.0.0/16",
            "10.96.0.0/12",
            plain(),
        ),
        case(
            "06-kvm-onprem-4nodes-no-podcidr.json",
            "10.2.0.0/16",
            "10.2.0.0/24",
            plain(),
        ),
        case(
            "07-eks-2nodes-no-podcidr.json",
            "10.100.0.0/16",
            "",
            masks(Some(26), None, None),
        ),
        case(
            "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
            "10.128.0.0/14",
            "172.30.0.0/16",
            masks(Some(23), None, None),
        ),
        case(
            "09-openshift-baremetal-2nodes-no-podcidr.json",
            "10.128.0.0/14",
            "172.30.0.0/16",
            masks(Some(23), None, None),
        ),
        case(
            "10-minikube-single-node-no-podcidr.json",
            "10.244.0.0/16",
            "10.96.0.0/12",
            plain(),
        ),
        case(
            "11-mixed-bundle-7nodes-redacted-podcidr.json",
            "10.32.0.0/12",
            "",
            plain(),
        ),
        case(
            "12-k0s-dualstack-ipv6-primary-partial.json",
            "10.244.0.0/16,fd00::/104",
            "10.96.0.0/12",
            masks(None, Some(24), Some(110)),
        ),
        case(
            "13-kind-dualstack-single-node-abridged.json",
            "10.244.0.0/16,fd00:10:244::/56",
            "",
            plain(),
        ),
        // The dual-stack Node under a single-stack config: skipped with a Warning event.
        case(
            "13-kind-dualstack-single-node-abridged.json",
            "10.244.0.0/16",
            "",
            plain(),
        ),
        case(
            "20-gke-preemptible-single-node-podcidr.json",
            "10.48.0.0/14",
            "",
            plain(),
        ),
        case(
            "21-gke-cos-single-node-podcidr.json",
            "10.40.0.0/14",
            "",
            plain(),
        ),
        case(
            "22-gce-notready-single-node-podcidr.json",
            "10.244.0.0/16",
            "",
            plain(),
        ),
    ]
}

/// Issue 16 (1): every fixture's Nodes created through the real API (spec and status), the
/// controller run with `plan`'s flags for that file: every Node the real server accepted ends
/// with exactly `plan`'s podCIDRs (kept ones unchanged), every skip `plan` predicts is a stored,
/// readable Warning event on that Node (`events.k8s.io/v1`, read back from the server), and the
/// Nodes the real server refuses to create are exactly those whose podCIDRs are not CIDRs
/// (`422 Invalid`). One control plane for all fixtures; the Nodes are deleted between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_ends_with_plans_pod_cidrs_on_the_real_server() {
    init_tracing();
    let cluster = start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let mut compared = 0;
    for case in fixture_cases() {
        let doc = fixture(case.file);
        let ipam = ipam(case.cluster, case.service, case.masks);
        let parsed = nodeipam::nodelist::parse_nodes(&doc.to_string()).unwrap();
        let predicted = plan(&ipam, &parsed).unwrap();

        // Create every Node with its status, as a kubelet registers it.
        let mut refused: BTreeMap<String, (u16, String)> = BTreeMap::new();
        let mut uids: BTreeSet<String> = BTreeSet::new();
        for item in doc["items"].as_array().unwrap() {
            let name = name_of(item);
            let node: Node = serde_json::from_value(creatable(item)).unwrap();
            match nodes.create(&PostParams::default(), &node).await {
                Ok(mut created) => {
                    uids.insert(created.uid().unwrap());
                    if let Some(status) = node.status.clone() {
                        created.status = Some(status);
                        nodes
                            .replace_status(&name, &PostParams::default(), &created)
                            .await
                            .unwrap_or_else(|e| panic!("{}: status of {name}: {e}", case.file));
                    }
                }
                Err(kube::Error::Api(status)) => {
                    refused.insert(name, (status.code, status.message));
                }
                Err(e) => panic!("{}: creating {name}: {e}", case.file),
            }
        }
        // Only Nodes whose podCIDRs are not CIDRs are refused, with 422.
        for (name, (code, message)) in &refused {
            let item = doc["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| name_of(n) == *name)
                .unwrap();
            let invalid = pod_cidrs_of(item)
                .iter()
                .any(|c| c.parse::<ipnet::IpNet>().is_err());
            assert!(
                invalid && *code == 422 && message.contains("spec.podCIDRs"),
                "{}: the real server refused Node {name}: {code} {message}",
                case.file
            );
        }
        let before = nodes_by_name(&nodes).await;

        let running =
            spawn_with_client(controller_client(&cluster).await, fast_config(ipam.clone()));
        let expected: BTreeMap<&str, &Vec<String>> = predicted
            .nodes
            .iter()
            .filter(|p| p.action != "skip" && !refused.contains_key(&p.name))
            .map(|p| (p.name.as_str(), &p.pod_cidrs))
            .collect();
        let skipped: BTreeSet<&str> = predicted
            .nodes
            .iter()
            .filter(|p| p.action == "skip" && !refused.contains_key(&p.name))
            .map(|p| p.name.as_str())
            .collect();
        let warned = |list: &[Event]| -> BTreeSet<String> {
            list.iter()
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter(|e| SKIP_REASONS.contains(&e.reason.as_deref().unwrap_or_default()))
                .filter(|e| {
                    e.regarding
                        .as_ref()
                        .and_then(|r| r.uid.clone())
                        .is_some_and(|uid| uids.contains(&uid))
                })
                .filter_map(|e| e.regarding.as_ref().and_then(|r| r.name.clone()))
                .collect()
        };
        let planned_used: Vec<u32> = predicted.pools.iter().map(|p| p.used).collect();
        let done = wait_for(|| async {
            // Ready (start-up occupy done) and holding what plan says: Nodes that already had
            // podCIDRs need no write, so their end state alone proves nothing.
            if !running.health.is_ready() || common::used(&running.health) != planned_used {
                return false;
            }
            let now = nodes_by_name(&nodes).await;
            let served = expected
                .iter()
                .all(|(name, cidrs)| now.get(*name).map(pod_cidrs_of).as_ref() == Some(*cidrs));
            let list = events.list(&ListParams::default()).await.unwrap().items;
            let seen = warned(&list);
            served && skipped.iter().all(|s| seen.contains(*s))
        })
        .await;
        let summary = running.stop().await;
        let after = nodes_by_name(&nodes).await;
        assert!(
            done,
            "{}: not every Node got plan's podCIDRs / skip event within {WAIT:?}: plan {:?}, server {:?}",
            case.file,
            expected,
            after
                .iter()
                .map(|(n, v)| (n, pod_cidrs_of(v)))
                .collect::<Vec<_>>()
        );
        // Exactly plan's podCIDRs; Nodes that had some (and skipped ones) unchanged.
        for p in &predicted.nodes {
            if refused.contains_key(&p.name) {
                assert!(!after.contains_key(&p.name));
                continue;
            }
            let now = pod_cidrs_of(&after[&p.name]);
            if p.action == "skip" {
                assert_eq!(
                    now,
                    pod_cidrs_of(&before[&p.name]),
                    "{}: {}",
                    case.file,
                    p.name
                );
            } else {
                assert_eq!(now, p.pod_cidrs, "{}: Node {}", case.file, p.name);
            }
            compared += 1;
        }
        // The events are stored and readable, with the reasons the controller uses.
        let list = events.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(
            warned(&list),
            skipped.iter().map(|s| (*s).to_owned()).collect()
        );
        for e in list.iter().filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.uid.clone())
                .is_some_and(|uid| uids.contains(&uid))
        }) {
            let reason = e.reason.as_deref().unwrap_or_default();
            eprintln!(
                "{}: event {} {reason} on {}: {}",
                case.file,
                e.type_.as_deref().unwrap_or_default(),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            );
            assert!(
                SKIP_REASONS.contains(&reason)
                    || [
                        reasons::POD_CIDR_FAMILY_ORDER,
                        reasons::POD_CIDR_NOT_CANONICAL,
                        reasons::POD_CIDR_MISSING_FAMILY,
                    ]
                    .contains(&reason)
                        && e.note.as_deref().is_some_and(|n| !n.is_empty())
                        && e.reporting_controller.as_deref()
                            == Some(nodeipam::controller::CONTROLLER_NAME),
                "{}: unexpected event {e:?}",
                case.file
            );
        }
        // The controller's own accounting agrees with plan's.
        common::assert_pools_match_plan(&summary, &predicted, case.file);
        eprintln!(
            "{}: {} Nodes created, {} refused by the real server ({:?}), {} skipped with events",
            case.file,
            before.len(),
            refused.len(),
            refused.values().map(|(c, _)| *c).collect::<Vec<_>>(),
            skipped.len()
        );

        // Next fixture on an empty cluster (fixture 01's Node carries k3s's finalizer
        // `wrangler.cattle.io/node`: nothing here removes it but the test).
        for (name, node) in &before {
            if node["metadata"]["finalizers"].is_array() {
                let clear = json!({"metadata": {"finalizers": null}});
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(&clear))
                    .await
                    .unwrap();
            }
            nodes.delete(name, &DeleteParams::default()).await.unwrap();
        }
        assert!(wait_for(|| async { nodes_by_name(&nodes).await.is_empty() }).await);
    }
    assert!(compared > 30, "only {compared} Nodes compared");
}
