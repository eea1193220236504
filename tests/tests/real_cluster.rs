//! The controller as users run it, on a real cluster of one or two Nodes (issue 33): upstream's
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubelets
//! (tests/upstream/build.sh), Debian's containerd, runc and CNI plugins, and the controller image
//! as a Pod, brought up and torn down by `tests/cluster/cluster.sh` (README, "A real cluster").
//! Not part of `cargo test --workspace` (`test = false` in tests/Cargo.toml): it needs root,
//! changes the host (iptables, mounts, cgroups, network namespaces; `cluster.sh down` undoes
//! every change and fails when something is left) and one cluster per machine, so run it alone:
//!
//! ```sh
//! export NODEIPAM_UPSTREAM_BIN="$(tests/upstream/build.sh | tail -n 1)"
//! cargo test -p nodeipam-tests --test real_cluster -- --test-threads=1
//! ```
//!
//! The install tests start a cluster whose Node has no podCIDR (kube-controller-manager's range
//! allocator is off), install the controller the way the README tells users to, and check the
//! bootstrap deploy/deployment.yaml describes: the controller's Pod, scheduled on the NotReady
//! Node through its tolerations, takes the Lease with its in-cluster ServiceAccount credentials,
//! writes its own Node's podCIDR, goes Ready on its HTTPS probes; the Node goes Ready (containerd
//! renders the CNI config from the podCIDR), and a Pod on the Pod network gets an address inside
//! the Node's podCIDR. Issue 33's list: (1) `helm_chart_bootstraps_its_own_node_and_is_scraped`
//! and `kustomize_deploy_bootstraps_its_own_node`; (5) the scrape in the first test; (2) the
//! switch-over from kube-controller-manager and back, `switch_over::…` (its own module); (3) 100
//! hollow Nodes and 10 minutes of heartbeats, `scale::…`, ignored (long; run it with
//! `-- --ignored scale`); (4) `helm upgrade` to a new tag, `upgrade::…`, with the chart's two
//! replicas on two real Nodes (`cluster.sh up --nodes 2`: the second kubelet with its own
//! containerd in its own network namespace): the PodDisruptionBudget, at least one Ready replica
//! throughout the rollout, the Lease's hand-over, each podCIDR PATCHed once (kube-apiserver's
//! audit log).
//!
//! On a failure the cluster's logs are copied to `real-cluster-logs/<test>/` in the Cargo target
//! folder (`$CARGO_TARGET_DIR`, default `target/`).
#![allow(clippy::unwrap_used)]

#[path = "real_cluster/harness.rs"]
mod harness;
#[path = "real_cluster/scale.rs"]
mod scale;
#[path = "real_cluster/switch_over.rs"]
mod switch_over;
#[path = "real_cluster/upgrade.rs"]
mod upgrade;

use harness::{
    CLUSTER_CIDR, CONTROLLER_SELECTOR, Cluster, NODE_NAME, lease_holder_pod, metric_value,
    node_ready, pod_ready, render_deploy, scrape, test_pod_address, wait_for,
};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams};

/// The state before the controller is installed: the Node is registered without a podCIDR and
/// is NotReady (no Pod network: containerd has no CNI config before the podCIDR).
async fn assert_node_without_pod_cidr(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(NODE_NAME).await.unwrap();
    let spec = node.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.pod_cidr, None,
        "the Node has a podCIDR before the controller runs"
    );
    assert!(
        !node_ready(&node),
        "the Node is Ready without a Pod network"
    );
}

/// The bootstrap: the controller's Pod on the Node, the Lease, the podCIDR, the probes, the
/// Node Ready, a Pod's address in the podCIDR. Returns the Node's podCIDR.
async fn assert_controller_bootstraps_its_node(client: &Client, cluster: &Cluster) -> IpNet {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");

    let pod_cidr: IpNet = wait_for("the Node's podCIDR", || async {
        let node = nodes.get(NODE_NAME).await.ok()?;
        node.spec?.pod_cidr?.parse().ok()
    })
    .await;
    let node = nodes.get(NODE_NAME).await.unwrap();
    let spec = node.spec.clone().unwrap();
    assert_eq!(spec.pod_cidrs, Some(vec![pod_cidr.to_string()]));
    let cluster_cidr: IpNet = CLUSTER_CIDR.parse().unwrap();
    assert!(
        cluster_cidr.contains(&pod_cidr) && pod_cidr.prefix_len() == 24,
        "podCIDR {pod_cidr} is not a /24 of {CLUSTER_CIDR}"
    );

    // The Ready replica on our Node (with two replicas and one Node, the other stays Pending:
    // the replicas' anti-affinity).
    let controller_pod = wait_for("a Ready controller Pod", || async {
        let list = pods
            .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
            .await
            .ok()?;
        list.items.into_iter().find(pod_ready)
    })
    .await;
    let pod_name = controller_pod.metadata.name.clone().unwrap();
    let pod_spec = controller_pod.spec.clone().unwrap();
    assert_eq!(pod_spec.node_name.as_deref(), Some(NODE_NAME));
    assert_eq!(pod_spec.host_network, Some(true));
    let container = &pod_spec.containers[0];
    for (kind, probe) in [
        ("readiness", container.readiness_probe.as_ref()),
        ("liveness", container.liveness_probe.as_ref()),
    ] {
        let get = probe.and_then(|p| p.http_get.as_ref());
        assert_eq!(
            get.and_then(|g| g.scheme.as_deref()),
            Some("HTTPS"),
            "the {kind} probe is not HTTPS"
        );
    }
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    // Its only credentials are the in-cluster ServiceAccount token: the Lease it holds was taken
    // with them.
    assert_eq!(
        pod_spec.service_account_name.as_deref(),
        Some("nodeipam-controller")
    );
    let holder = lease_holder_pod(client).await;
    assert_eq!(holder, pod_name, "the Lease is not held by the Ready Pod");
    let pod_security = pod_spec.security_context.clone().unwrap();
    assert_eq!(pod_security.run_as_user, Some(65532));
    assert_eq!(pod_security.run_as_non_root, Some(true));
    // What it did, in its own words (read through the kubelet, as `kubectl logs` does).
    let log = cluster.kubectl(&["-n", "kube-system", "logs", &pod_name], None);
    assert!(
        log.contains(NODE_NAME),
        "the controller's log does not name its Node:\n{log}"
    );

    wait_for("the Node Ready (Pod network up)", || async {
        nodes.get(NODE_NAME).await.ok().filter(node_ready)
    })
    .await;

    // A Pod on the Pod network: its address comes from host-local over the Node's podCIDR.
    let pod_ip = test_pod_address(client, "podcidr-check", None).await;
    assert!(
        pod_cidr.contains(&pod_ip),
        "the test Pod's address {pod_ip} is not in its Node's podCIDR {pod_cidr}"
    );
    eprintln!("test Pod address {pod_ip} in the Node's podCIDR {pod_cidr}");
    // Nothing rewrote the podCIDR meanwhile.
    let node = nodes.get(NODE_NAME).await.unwrap();
    assert_eq!(
        node.spec.unwrap().pod_cidr,
        Some(pod_cidr.to_string()),
        "the podCIDR changed"
    );
    pod_cidr
}

/// The Prometheus Operator's ServiceMonitor kind, so the chart's `prometheus.serviceMonitor`
/// objects (the Service, the ServiceMonitor, the metrics-reader ClusterRole and its binding) can
/// be installed; no operator runs here — the scrape is done as Prometheus does it, with its
/// ServiceAccount's token.
const SERVICE_MONITOR_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_bootstraps_its_own_node_and_is_scraped() {
    let cluster = Cluster::up("helm");
    let client = cluster.client().await;
    assert_node_without_pod_cidr(&client).await;

    // Prometheus's side: the ServiceMonitor kind, its namespace and ServiceAccount (the chart's
    // default metricsReader, kube-prometheus's).
    cluster.kubectl(&["apply", "-f", "-"], Some(SERVICE_MONITOR_CRD));
    cluster.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/servicemonitors.monitoring.coreos.com",
        ],
        None,
    );
    cluster.kubectl(&["create", "namespace", "monitoring"], None);
    cluster.kubectl(
        &[
            "-n",
            "monitoring",
            "create",
            "serviceaccount",
            "prometheus-k8s",
        ],
        None,
    );

    // As the README tells users: the chart, kube-controller-manager's cluster CIDR and service
    // range, our image; everything else the chart's defaults (two replicas).
    cluster.helm_install(&["--set=prometheus.serviceMonitor.enabled=true"]);

    assert_controller_bootstraps_its_node(&client, &cluster).await;

    // (5) Scraped like Prometheus does: its ServiceAccount's token, bound to the chart's
    // metrics-reader ClusterRole, gets the metrics; no token gets 401; a token of a
    // ServiceAccount without the binding gets 403.
    let token = cluster.kubectl(
        &["-n", "monitoring", "create", "token", "prometheus-k8s"],
        None,
    );
    let (status, body) = scrape(Some(token.trim()));
    assert_eq!(
        status, "200",
        "scrape with the metrics-reader token: {body}"
    );
    assert_eq!(
        metric_value(
            &body,
            "node_ipam_controller_cidrset_cidrs_allocations_total"
        ),
        Some(1.0),
        "the leader allocated one block (its own Node's):\n{body}"
    );
    let (status, _) = scrape(None);
    assert_eq!(status, "401", "scrape without a token");
    let other = cluster.kubectl(&["-n", "default", "create", "token", "default"], None);
    let (status, _) = scrape(Some(other.trim()));
    assert_eq!(
        status, "403",
        "scrape with a token not bound to the metrics-reader role"
    );

    cluster.down();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_deploy_bootstraps_its_own_node() {
    let cluster = Cluster::up("kustomize");
    let client = cluster.client().await;
    assert_node_without_pod_cidr(&client).await;

    // As deploy/kustomization.yaml tells users: `kubectl kustomize deploy/`, kube-controller-
    // manager's cluster CIDR in place of the placeholder, our image in place of the default.
    let rendered = render_deploy(&cluster, &[format!("--cluster-cidr={CLUSTER_CIDR}")]);
    cluster.kubectl(&["apply", "-f", "-"], Some(&rendered));

    assert_controller_bootstraps_its_node(&client, &cluster).await;
    cluster.down();
}
