//! The controller as users run it, on a real one-node cluster (issue 33): upstream's etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler and kubelet (tests/upstream/build.sh),
//! Debian's containerd, runc and CNI plugins, and the controller image as a Pod, brought up and
//! torn down by `tests/cluster/cluster.sh` (README, "A real cluster"). Not part of
//! `cargo test --workspace` (`test = false` in tests/Cargo.toml): it needs root, changes the host
//! (iptables, mounts, cgroups; `cluster.sh down` undoes every change and fails when something is
//! left) and one cluster per machine, so run it alone:
//!
//! ```sh
//! export NODEIPAM_UPSTREAM_BIN="$(tests/upstream/build.sh | tail -n 1)"
//! cargo test -p nodeipam-tests --test real_cluster -- --test-threads=1
//! ```
//!
//! Each test starts its own cluster whose Node has no podCIDR (kube-controller-manager's range
//! allocator is off), installs the controller the way the README tells users to, and checks the
//! bootstrap deploy/deployment.yaml describes: the controller's Pod, scheduled on the NotReady
//! Node through its tolerations, takes the Lease with its in-cluster ServiceAccount credentials,
//! writes its own Node's podCIDR, goes Ready on its HTTPS probes; the Node goes Ready (containerd
//! renders the CNI config from the podCIDR), and a Pod on the Pod network gets an address inside
//! the Node's podCIDR. Issue 33's list: (1) `helm_chart_bootstraps_its_own_node_and_is_scraped`
//! and `kustomize_deploy_bootstraps_its_own_node`; (5) the scrape in the first test.
//!
//! On a failure the cluster's logs are copied to `real-cluster-logs/<test>/` in the Cargo target
//! folder (`$CARGO_TARGET_DIR`, default `target/`).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// The Node `cluster.sh` registers, its address on the bridge `cluster.sh` creates, and the
/// cluster CIDR given to the controller.
const NODE_NAME: &str = "nodeipam-node-0";
const NODE_IP: &str = "10.99.0.1";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
const SERVICE_CIDR: &str = "10.96.0.0/24";
/// The images `cluster.sh` builds and imports (the controller's tag is its version, in the state
/// folder's `controller-tag`).
const CONTROLLER_REPOSITORY: &str = "localhost/nodeipam-controller";
const BUSYBOX_IMAGE: &str = "localhost/nodeipam/busybox:1";
/// The controller's secure port (chart and deploy/ default).
const SECURE_PORT: u16 = 10260;
/// Liveness bounds only (a failure names what did not happen); never asserted as speeds.
const WAIT: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A running cluster (`cluster.sh up --no-controller`); `down` on drop, also when a test panics.
struct Cluster {
    state: PathBuf,
    logs: PathBuf,
    torn_down: bool,
}

impl Cluster {
    fn up(test: &str) -> Cluster {
        let state = std::env::var_os("NODEIPAM_CLUSTER_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp/nodeipam-cluster"), PathBuf::from);
        let logs = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| repo_root().join("target"), PathBuf::from)
            .join("real-cluster-logs")
            .join(test);
        let _ = std::fs::remove_dir_all(&logs);
        let started = Instant::now();
        let status = Command::new(repo_root().join("tests/cluster/cluster.sh"))
            .args(["up", "--no-controller"])
            .env("NODEIPAM_CLUSTER_DIR", &state)
            .env("NODEIPAM_CLUSTER_KEEP_LOGS", &logs)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "cluster.sh up failed ({status}); logs in {}",
            logs.display()
        );
        eprintln!("cluster up in {:?}", started.elapsed());
        Cluster {
            state,
            logs,
            torn_down: false,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    fn controller_tag(&self) -> String {
        std::fs::read_to_string(self.state.join("controller-tag"))
            .unwrap()
            .trim()
            .to_owned()
    }

    async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
        Client::try_from(config).unwrap()
    }

    /// `kubectl ARGS` against the cluster (with STDIN when given); its stdout, or a panic with
    /// its stderr.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args);
        run(command, stdin)
    }

    /// `cluster.sh down`: must succeed and report nothing left behind.
    fn down(mut self, keep_logs: bool) {
        self.torn_down = true;
        let started = Instant::now();
        let status = self.down_command(keep_logs).status().unwrap();
        assert!(
            status.success(),
            "cluster.sh down failed ({status}): something was left behind"
        );
        eprintln!("cluster down in {:?}", started.elapsed());
    }

    fn down_command(&self, keep_logs: bool) -> Command {
        let mut command = Command::new(repo_root().join("tests/cluster/cluster.sh"));
        command.arg("down").env("NODEIPAM_CLUSTER_DIR", &self.state);
        if keep_logs {
            command.env("NODEIPAM_CLUSTER_KEEP_LOGS", &self.logs);
        }
        command
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.torn_down {
            let status = self.down_command(true).status();
            eprintln!(
                "cluster.sh down after a failure: {status:?}; logs in {}",
                self.logs.display()
            );
        }
    }
}

fn run(mut command: Command, stdin: Option<&str>) -> String {
    let shown = format!("{command:?}");
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{shown}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{shown} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Polls `probe` every 500 ms until it gives `Some`; panics naming `what` after [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            eprintln!("{what}: after {:?}", started.elapsed());
            return value;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn condition_true(conditions: Option<&Vec<impl Conditioned>>, type_: &str) -> bool {
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_() == type_ && c.status() == "True")
}

trait Conditioned {
    fn type_(&self) -> &str;
    fn status(&self) -> &str;
}
impl Conditioned for k8s_openapi::api::core::v1::NodeCondition {
    fn type_(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}
impl Conditioned for k8s_openapi::api::core::v1::PodCondition {
    fn type_(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}

fn node_ready(node: &Node) -> bool {
    condition_true(
        node.status.as_ref().and_then(|s| s.conditions.as_ref()),
        "Ready",
    )
}

fn pod_ready(pod: &Pod) -> bool {
    condition_true(
        pod.status.as_ref().and_then(|s| s.conditions.as_ref()),
        "Ready",
    )
}

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
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");

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
    let selector = "app.kubernetes.io/name=nodeipam-controller";
    let controller_pod = wait_for("a Ready controller Pod", || async {
        let list = pods
            .list(&ListParams::default().labels(selector))
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
    // The holder identity is `$POD_NAME_<pid>` (shell/src/controller/mod.rs).
    let holder = wait_for("the Lease held by the Ready Pod", || async {
        let lease = leases.get("nodeipam-controller").await.ok()?;
        let holder = lease.spec?.holder_identity?;
        holder
            .strip_prefix(&format!("{pod_name}_"))
            .is_some_and(|pid| pid.parse::<u32>().is_ok())
            .then_some(holder)
    })
    .await;
    eprintln!("Lease kube-system/nodeipam-controller held by {holder}");
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
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let test_pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "podcidr-check"},
        "spec": {
            "containers": [{
                "name": "sleep",
                "image": BUSYBOX_IMAGE,
                "args": ["sleep", "3600"],
                "imagePullPolicy": "Never",
            }],
            "terminationGracePeriodSeconds": 0,
        },
    }))
    .unwrap();
    default_pods
        .create(&PostParams::default(), &test_pod)
        .await
        .unwrap();
    let pod_ip: IpAddr = wait_for("the test Pod's address", || async {
        let pod = default_pods.get("podcidr-check").await.ok()?;
        let status = pod.status?;
        (status.phase.as_deref() == Some("Running")).then_some(())?;
        status.pod_ip?.parse().ok()
    })
    .await;
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

/// `curl -sk` GET of the secure port's `/metrics`: (HTTP status, body).
fn scrape(token: Option<&str>) -> (String, String) {
    let body = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new("curl");
    command
        .args(["-sk", "--max-time", "10", "-o"])
        .arg(body.path())
        .args(["-w", "%{http_code}"]);
    if let Some(token) = token {
        command
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"));
    }
    command.arg(format!("https://{NODE_IP}:{SECURE_PORT}/metrics"));
    let status = run(command, None);
    (status, std::fs::read_to_string(body.path()).unwrap())
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
    let helm = PathBuf::from(std::env::var_os("NODEIPAM_UPSTREAM_BIN").expect(
        "NODEIPAM_UPSTREAM_BIN is not set (export NODEIPAM_UPSTREAM_BIN=\"$(tests/upstream/build.sh | tail -n 1)\")",
    ))
    .join("helm");
    let mut install = Command::new(helm);
    install
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["install", "nodeipam"])
        .arg(repo_root().join("charts/nodeipam"))
        .args(["--namespace", "kube-system"])
        .arg(format!("--set=controller.clusterCIDR={CLUSTER_CIDR}"))
        .arg(format!(
            "--set=controller.serviceClusterIPRange={SERVICE_CIDR}"
        ))
        .arg(format!("--set=image.repository={CONTROLLER_REPOSITORY}"))
        .arg(format!("--set=image.tag={}", cluster.controller_tag()))
        .arg("--set=prometheus.serviceMonitor.enabled=true");
    run(install, None);

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
    let allocations = body
        .lines()
        .find(|l| l.starts_with("node_ipam_controller_cidrset_cidrs_allocations_total"))
        .unwrap_or_else(|| panic!("no allocations counter in the metrics:\n{body}"));
    assert!(
        allocations.ends_with(" 1"),
        "the leader allocated one block (its own Node's): {allocations}"
    );
    let (status, _) = scrape(None);
    assert_eq!(status, "401", "scrape without a token");
    let other = cluster.kubectl(&["-n", "default", "create", "token", "default"], None);
    let (status, _) = scrape(Some(other.trim()));
    assert_eq!(
        status, "403",
        "scrape with a token not bound to the metrics-reader role"
    );

    cluster.down(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_deploy_bootstraps_its_own_node() {
    let cluster = Cluster::up("kustomize");
    let client = cluster.client().await;
    assert_node_without_pod_cidr(&client).await;

    // As deploy/kustomization.yaml tells users: `kubectl kustomize deploy/`, kube-controller-
    // manager's cluster CIDR in place of the placeholder, our image in place of the default.
    let rendered = run(
        {
            let mut c = Command::new("kubectl");
            c.arg("kustomize").arg(repo_root().join("deploy"));
            c
        },
        None,
    );
    let placeholder = "--cluster-cidr=REPLACE-WITH-KUBE-CONTROLLER-MANAGER-CLUSTER-CIDR";
    assert_eq!(rendered.matches(placeholder).count(), 1, "{rendered}");
    assert_eq!(
        rendered.matches("image: nodeipam-controller:").count(),
        1,
        "{rendered}"
    );
    let rendered: String = rendered
        .replace(placeholder, &format!("--cluster-cidr={CLUSTER_CIDR}"))
        .lines()
        .map(
            |line| match line.split_once("image: nodeipam-controller:") {
                Some((indent, _)) => format!(
                    "{indent}image: {CONTROLLER_REPOSITORY}:{}\n",
                    cluster.controller_tag()
                ),
                None => format!("{line}\n"),
            },
        )
        .collect();
    cluster.kubectl(&["apply", "-f", "-"], Some(&rendered));

    assert_controller_bootstraps_its_node(&client, &cluster).await;
    cluster.down(false);
}
