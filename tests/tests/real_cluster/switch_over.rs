//! Issue 33 (2): the switch-over from kube-controller-manager's range allocator, following
//! docs/operations.md ("Switching over from kube-controller-manager") step by step, and its
//! rollback. kcm serves the cluster's Node and kubemark hollow Nodes (upstream's kubelet code,
//! each with its own `system:node:` credentials) first; then the documented steps: kcm's IPAM
//! flags taken from its command line, `plan` on `kubectl get nodes -o json` with exactly those
//! flags, `deploy/` rendered with them, kcm restarted with `--controllers=*,-nodeipam`, the
//! render applied, the verification; then the documented rollback. Nodes are never deleted here
//! and a podCIDR is immutable once set, so the final check that no two Nodes share a podCIDR
//! covers every moment of the run.

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::harness::{
    CONTROLLER_SELECTOR, Cluster, all_served, lease_holder_pod, metric_value, pod_cidr_writers,
    pod_cidrs, render_deploy, run_status, scrape, wait_for,
};

/// kube-controller-manager's range allocator as a kubeadm cluster runs it (its
/// `--service-cluster-ip-range` is among cluster.sh's usual flags).
const KCM_IPAM: [&str; 3] = [
    "--allocate-node-cidrs=true",
    "--cluster-cidr=10.244.0.0/16",
    "--node-cidr-mask-size=24",
];

/// The flags docs/operations.md step 1 says to collect, as they appear on a command line.
const IPAM_FLAG_NAMES: [&str; 7] = [
    "--cluster-cidr",
    "--service-cluster-ip-range",
    "--node-cidr-mask-size",
    "--node-cidr-mask-size-ipv4",
    "--node-cidr-mask-size-ipv6",
    "--allocate-node-cidrs",
    "--cidr-allocator-type",
];

async fn wait_registered(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(&format!("Node {name} registered"), || async {
        nodes.get(name).await.ok()
    })
    .await;
}

/// kube-controller-manager's IPAM flags, read from its running command line (step 1).
fn kcm_ipam_flags(cluster: &Cluster) -> Vec<String> {
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    for arg in cluster.kcm_command_line() {
        if let Some((name, _)) = arg.split_once('=')
            && IPAM_FLAG_NAMES.contains(&name)
        {
            // The last value of a flag wins, as in kcm's own parsing.
            flags.insert(name.to_owned(), arg.clone());
        }
    }
    flags.into_values().collect()
}

/// A token that may GET /metrics (a ClusterRole as the chart's metrics-reader).
fn metrics_token(cluster: &Cluster) -> String {
    cluster.kubectl(
        &["-n", "default", "create", "serviceaccount", "ipam-check"],
        None,
    );
    cluster.kubectl(
        &[
            "create",
            "clusterrole",
            "ipam-check",
            "--verb=get",
            "--non-resource-url=/metrics",
        ],
        None,
    );
    cluster.kubectl(
        &[
            "create",
            "clusterrolebinding",
            "ipam-check",
            "--clusterrole=ipam-check",
            "--serviceaccount=default:ipam-check",
        ],
        None,
    );
    cluster
        .kubectl(&["-n", "default", "create", "token", "ipam-check"], None)
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_over_from_kcm_as_operations_md_says_and_back() {
    let cluster = Cluster::up_with_kcm("switch-over", &KCM_IPAM);
    let client = cluster.client().await;

    // kcm's own range allocator serves the Node and four hollow Nodes.
    cluster.cluster_sh(&[
        "hollow", "add", "hollow-0", "hollow-1", "hollow-2", "hollow-3",
    ]);
    let before = all_served(&client, "kcm serving 5 Nodes", 5).await;
    let writers_before = pod_cidr_writers(&client).await;
    eprintln!("served by kcm: {before:?}; written by {writers_before:?}");

    // 1. Collect kcm's flags.
    let flags = kcm_ipam_flags(&cluster);
    eprintln!("kcm's IPAM flags: {flags:?}");
    assert!(
        flags.contains(&"--cluster-cidr=10.244.0.0/16".to_owned()),
        "{flags:?}"
    );

    // 2. Pre-flight with `plan` on `kubectl get nodes -o json` with exactly those flags: exit 0,
    // every Node `keep`.
    let nodes_json = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        nodes_json.path(),
        cluster.kubectl(&["get", "nodes", "-o", "json"], None),
    )
    .unwrap();
    let mut plan = Command::new(cluster.controller_bin());
    plan.arg("plan")
        .args(&flags)
        .args(["--output", "json"])
        .arg(nodes_json.path());
    let (status, stdout, stderr) = run_status(plan, None);
    assert_eq!(status, Some(0), "plan: {stdout}\n{stderr}");
    let planned: Value = serde_json::from_str(&stdout).unwrap();
    let actions: Vec<(&str, &str)> = planned["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["action"].as_str().unwrap()))
        .collect();
    assert_eq!(actions.len(), 5, "{stdout}");
    assert!(actions.iter().all(|(_, a)| *a == "keep"), "{stdout}");

    // 3. Prepare the manifests: deploy/ with kcm's flags in place of the placeholder.
    let rendered = render_deploy(&cluster, &flags);

    // 4. Stop kcm's allocator: restart it with `--controllers=*,-nodeipam` after its flags.
    let mut restart = vec!["kcm"];
    restart.extend(KCM_IPAM);
    restart.push("--controllers=*,-nodeipam");
    cluster.cluster_sh(&restart);
    assert!(
        cluster
            .kcm_command_line()
            .contains(&"--controllers=*,-nodeipam".to_owned())
    );
    let kcm_log = cluster.log("kube-controller-manager");
    let restarted = &kcm_log[kcm_log.rfind("--- restarted with").unwrap()..];
    assert!(
        restarted
            .contains(r#""Warning: controller is disabled" controller="node-ipam-controller""#),
        "kcm did not disable its node-ipam-controller:\n{restarted}"
    );
    // The window without an allocator: a new Node waits.
    cluster.cluster_sh(&["hollow", "add", "hollow-4"]);
    wait_registered(&client, "hollow-4").await;
    assert_eq!(pod_cidrs(&client).await["hollow-4"], Vec::<String>::new());

    // 5. Apply.
    cluster.kubectl(&["apply", "-f", "-"], Some(&rendered));
    let holder = lease_holder_pod(&client).await;
    let log = wait_for("the leader's `leading; allocating`", || async {
        let log = cluster.kubectl(&["-n", "kube-system", "logs", &holder], None);
        log.contains("leading; allocating").then_some(log)
    })
    .await;

    // 6. Verify: every Node has podCIDRs, kcm's kept as they were and still written by kcm
    // alone (ours PATCHed none of them), the waiting Node served by us; no surprise events; the
    // pool as `plan` predicted.
    let after = all_served(&client, "every Node served after the switch-over", 6).await;
    for (node, cidrs) in &before {
        assert_eq!(&after[node], cidrs, "{node}'s podCIDRs changed");
    }
    let writers_after = pod_cidr_writers(&client).await;
    for (node, writers) in &writers_before {
        assert_eq!(
            &writers_after[node], writers,
            "{node}'s podCIDR was written again"
        );
    }
    let ours = &writers_after["hollow-4"];
    assert!(
        ours.len() == 1 && !writers_before.values().flatten().any(|w| w == &ours[0]),
        "hollow-4's podCIDR was not written by the new controller alone: {ours:?} (kcm: {writers_before:?})"
    );
    let events = cluster.kubectl(
        &[
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            "reportingComponent=nodeipam-controller",
            "-o",
            "jsonpath={range .items[*]}{.type} {.reason} {.involvedObject.name}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(
        !events.lines().any(|l| l.starts_with("Warning")),
        "warnings after the switch-over:\n{events}"
    );
    let token = metrics_token(&cluster);
    let (status, body) = scrape(Some(&token));
    assert_eq!(status, "200", "{body}");
    // Blocks newly marked used, occupied ones included (upstream's cidrset counts them so, the
    // writes are the managedFields check above): kcm's five and hollow-4's.
    assert_eq!(
        metric_value(
            &body,
            "node_ipam_controller_cidrset_cidrs_allocations_total"
        ),
        Some(6.0),
        "allocations after the switch-over:\n{body}"
    );
    assert_eq!(
        metric_value(&body, "node_ipam_controller_cidrset_usage_cidrs").map(|u| u * 256.0),
        Some(6.0),
        "usage after the switch-over (6 /24s of a /16):\n{body}"
    );

    // It serves new Nodes.
    cluster.cluster_sh(&["hollow", "add", "hollow-5"]);
    all_served(&client, "hollow-5 served by the new controller", 7).await;
    eprintln!("controller log:\n{log}");

    // Rollback: delete the Deployment, wait until its Pods are gone, re-enable kcm's allocator.
    cluster.kubectl(
        &[
            "-n",
            "kube-system",
            "delete",
            "deploy",
            "nodeipam-controller",
        ],
        None,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    wait_for("the controller's Pods gone", || async {
        let list = pods
            .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
            .await
            .ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    let mut restart = vec!["kcm"];
    restart.extend(KCM_IPAM);
    cluster.cluster_sh(&restart);
    let served = pod_cidrs(&client).await;
    cluster.cluster_sh(&["hollow", "add", "hollow-6"]);
    let back = all_served(&client, "hollow-6 served by kcm after the rollback", 8).await;
    for (node, cidrs) in &served {
        assert_eq!(
            &back[node], cidrs,
            "{node}'s podCIDRs changed at the rollback"
        );
    }
    let writers_back = pod_cidr_writers(&client).await;
    assert!(
        writers_back["hollow-6"]
            .iter()
            .all(|w| writers_before.values().flatten().any(|k| k == w)),
        "hollow-6 not written by kcm: {writers_back:?}"
    );
    eprintln!("after the rollback: {back:?}");
    cluster.down();
}
