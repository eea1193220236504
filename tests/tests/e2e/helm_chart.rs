//! The Helm chart (`charts/nodeipam`, issue 21) against the kustomize manifests it stands for:
//! its default render is the same set of objects as `kubectl kustomize deploy` (the same RBAC
//! rules, args, security context, probes, resources…), with Prometheus and the dashboard switched
//! on it is `kubectl kustomize overlays/prometheus`, each value reaches its flag (and the flags
//! pass the controller's own parser and validation), and values that cannot work (a misspelt
//! key, replicas without leader election…) fail the render with a message naming the value.
//!
//! Helm's own labels (`app.kubernetes.io/instance`, `managed-by`, `version`, `helm.sh/chart`) are
//! the only difference allowed. The tests need the Helm CLI (`deploy::helm`: the pinned one built
//! by tests/upstream/build.sh, via `NODEIPAM_UPSTREAM_BIN`): without it they say so and pass,
//! unless `NODEIPAM_REQUIRE_HELM` is set, as `.ci/run` does. The existing manifest tests (RBAC =
//! code, typed manifests, alerts, dashboard) run on the chart's render with
//! `NODEIPAM_MANIFESTS=chart` (`.ci/run`).
#![allow(clippy::unwrap_used)]

use crate::deploy;

use std::collections::BTreeMap;

use deploy::{
    CLUSTER_CIDRS_VALUES, HELM_HINT, PROMETHEUS_VALUES, helm_template, kustomized, named,
    round_trip,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use serde_json::Value;

/// The labels Helm charts add that kustomize's base does not.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// The chart rendered with `args`, or `None` (with a note) when helm cannot run here.
fn chart(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let out = helm_template(args);
    if out.is_none() {
        eprintln!("helm cannot run here ({HELM_HINT}): chart test skipped");
    }
    out
}

/// `docs` by (kind, namespace, name), with Helm's own labels removed (an emptied `labels` map
/// too).
fn by_identity(docs: Vec<Value>) -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    for mut doc in docs {
        let metadata = doc["metadata"].as_object_mut().unwrap();
        // Helm's keep policy on the CRD (uninstalling must not delete every ClusterCIDR).
        if let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.remove("helm.sh/resource-policy");
            if annotations.is_empty() {
                metadata.remove("annotations");
            }
        }
        if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
            for label in HELM_LABELS {
                labels.remove(label);
            }
            if labels.is_empty() {
                metadata.remove("labels");
            }
        }
        let key = (
            doc["kind"].as_str().unwrap().to_owned(),
            doc["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            doc["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        assert!(
            out.insert(key.clone(), doc).is_none(),
            "{key:?} rendered twice"
        );
    }
    out
}

/// The chart rendered with `args` is the kustomization `dir`, object for object.
fn assert_same_objects(args: &[&str], dir: &str) {
    let Some(chart) = chart(args) else { return };
    let chart = by_identity(chart.unwrap_or_else(|e| panic!("helm template: {e}")));
    let kustomize = by_identity(kustomized(dir));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        kustomize.keys().collect::<Vec<_>>(),
        "the chart renders the objects of {dir}"
    );
    for (key, want) in &kustomize {
        assert_eq!(
            &chart[key], want,
            "{key:?}: the chart's render (left) differs from kubectl kustomize {dir} (right)"
        );
    }
}

#[test]
fn the_default_render_is_the_kustomize_base() {
    assert_same_objects(&[], "deploy");
}

#[test]
fn prometheus_and_the_dashboard_switched_on_render_the_prometheus_overlay() {
    assert_same_objects(&PROMETHEUS_VALUES, "overlays/prometheus");
}

/// With the MultiCIDRRangeAllocator the chart renders `overlays/cluster-cidrs`: the CRD (the same
/// as `deploy/crds/clustercidrs.yaml`, but for Helm's keep annotation), the flag, the RBAC rules.
/// Without `clusterCidrs.installCRD` the CRD is left out and nothing else changes.
#[test]
fn the_multi_cidr_allocator_type_renders_the_cluster_cidrs_overlay() {
    assert_same_objects(&CLUSTER_CIDRS_VALUES, "overlays/cluster-cidrs");
    let mut without_crd = CLUSTER_CIDRS_VALUES.to_vec();
    without_crd.extend(["--set", "clusterCidrs.installCRD=false"]);
    let Some(Ok(docs)) = chart(&without_crd) else {
        return;
    };
    assert!(docs.iter().all(|d| d["kind"] != "CustomResourceDefinition"));
    assert!(docs.iter().any(|d| d["kind"] == "ClusterRole"
        && d["metadata"]["name"] == "nodeipam-controller-cluster-cidrs"));
}

/// Every flag-valued setting, none at its default.
const EVERY_VALUE: &str = r#"
controller:
  clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
  serviceClusterIPRange: 10.96.0.0/12,fd00:10:96::/112
  nodeCIDRMaskSizeIPv4: 25
  nodeCIDRMaskSizeIPv6: 72
  cidrAllocatorType: CloudAllocator
  nodeCIDRMaskSizeRules:
    - agentpool=big:ipv4=23,ipv6=64
    - agentpool=small:ipv4=26,ipv6=80
  allowNodeMaskLabel: true
  nodeMaskLabelRange: ipv4=22-26,ipv6=64-80
  servedNodeSelector: "example.com/cni in (cilium,overlay),!example.com/legacy"
  kubeAPIQPS: 50
  kubeAPIBurst: 100
  nodeCIDRUpdateWorkers: 10
  verbosity: 4
  loggingFormat: json
  extraArgs: ["--authorization-always-allow-paths=/healthz,/readyz"]
leaderElection:
  resourceName: nodeipam-test
  resourceNamespace: nodeipam-leases
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 4s
securePort: 10300
bindAddress: 127.0.0.1
tlsSecretName: nodeipam-tls
image: {repository: registry.example/nodeipam-controller, tag: 0.1.0-rc.1, pullPolicy: Always}
replicas: 3
serviceAccount: {name: ipam}
nodeSelector: {kubernetes.io/arch: arm64}
"#;

#[test]
fn every_value_reaches_its_flag_and_the_controller_accepts_them() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, EVERY_VALUE).unwrap();
    let Some(docs) = chart(&["--values", values.to_str().unwrap()]) else {
        return;
    };
    let docs = docs.unwrap_or_else(|e| panic!("helm template: {e}"));
    let deployment: Deployment = round_trip(named(&docs, "Deployment", "nodeipam-controller"));
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("ipam"));
    assert_eq!(
        pod.node_selector.unwrap().get("kubernetes.io/arch"),
        Some(&"arm64".to_owned())
    );
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example/nodeipam-controller:0.1.0-rc.1")
    );
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 10300);
    let args = container.args.clone().unwrap();
    assert_eq!(
        args,
        [
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--service-cluster-ip-range=10.96.0.0/12,fd00:10:96::/112",
            "--node-cidr-mask-size-ipv4=25",
            "--node-cidr-mask-size-ipv6=72",
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rule=agentpool=big:ipv4=23,ipv6=64",
            "--node-cidr-mask-size-rule=agentpool=small:ipv4=26,ipv6=80",
            "--allow-node-mask-label=true",
            "--node-mask-label-range=ipv4=22-26,ipv6=64-80",
            "--node-selector=example.com/cni in (cilium,overlay),!example.com/legacy",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--node-cidr-update-workers=10",
            "--leader-elect=true",
            "--leader-elect-resource-namespace=nodeipam-leases",
            "--leader-elect-resource-name=nodeipam-test",
            "--leader-elect-lease-duration=30s",
            "--leader-elect-renew-deadline=20s",
            "--leader-elect-retry-period=4s",
            "--secure-port=10300",
            "--bind-address=127.0.0.1",
            "--tls-cert-file=/etc/nodeipam/tls/tls.crt",
            "--tls-private-key-file=/etc/nodeipam/tls/tls.key",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--v=4",
            "--logging-format=json",
            "--authorization-always-allow-paths=/healthz,/readyz",
        ]
    );
    // The controller's own parser and start-up validation accept them.
    let parsed = nodeipam::flags::parse_from(
        std::iter::once("nodeipam-controller".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the rendered args do not parse: {e}"));
    assert!(parsed.ignored.is_empty(), "{:?}", parsed.ignored);
    let cli = parsed.cli;
    cli.ipam
        .validate()
        .unwrap_or_else(|e| panic!("the rendered IPAM flags are refused: {e}"));
    cli.ipam
        .node_pools()
        .unwrap_or_else(|e| panic!("the rendered node-pool flags are refused: {e}"));
    cli.controller
        .validate()
        .unwrap_or_else(|e| panic!("the rendered controller flags are refused: {e}"));
    // The TLS Secret is mounted where the flags point.
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.name.as_str(), mount.mount_path.as_str()),
        ("tls", "/etc/nodeipam/tls")
    );
    let volume = &pod.volumes.unwrap()[0];
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("nodeipam-tls")
    );
    // The leader-election Role follows the Lease; every binding names the ServiceAccount.
    let lease_role: Role = round_trip(named(&docs, "Role", "nodeipam-controller-leader-election"));
    assert_eq!(
        lease_role.metadata.namespace.as_deref(),
        Some("nodeipam-leases")
    );
    let rules = lease_role.rules.unwrap();
    assert_eq!(
        rules[1].resource_names,
        Some(vec!["nodeipam-test".to_owned()])
    );
    let lease_binding: RoleBinding = round_trip(named(
        &docs,
        "RoleBinding",
        "nodeipam-controller-leader-election",
    ));
    assert_eq!(
        lease_binding.metadata.namespace.as_deref(),
        Some("nodeipam-leases")
    );
    let cluster_binding: ClusterRoleBinding =
        round_trip(named(&docs, "ClusterRoleBinding", "nodeipam-controller"));
    for subjects in [
        lease_binding.subjects.unwrap(),
        cluster_binding.subjects.unwrap(),
    ] {
        assert_eq!(
            (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
            ("ipam", Some("kube-system"))
        );
    }
    named(&docs, "ServiceAccount", "ipam");
}

#[test]
fn values_that_cannot_work_fail_the_render_naming_the_value() {
    let cases: [(&[&str], &str); 5] = [
        // values.schema.json: a misspelt flag value, and a secure port of 0 (the probes need it).
        (
            &["--set", "controller.clusterCidr=10.244.0.0/16"],
            "additional properties 'clusterCidr' not allowed",
        ),
        (&["--set", "securePort=0"], "/securePort"),
        (
            &[
                "--set",
                "leaderElection.enabled=false",
                "--set",
                "replicas=2",
            ],
            "replicas > 1 needs leaderElection.enabled=true",
        ),
        (
            &["--set", "controller.clusterCIDR="],
            "controller.clusterCIDR is required",
        ),
        (
            &[
                "--set",
                "serviceAccount.create=false",
                "--set",
                "serviceAccount.name=",
            ],
            "serviceAccount.name is required when serviceAccount.create is false",
        ),
    ];
    for (args, message) in cases {
        let Some(out) = chart(args) else { return };
        let error = out.err().unwrap_or_else(|| panic!("{args:?} rendered"));
        assert!(error.contains(message), "{args:?}: {error}");
    }
    // One replica without leader election is a valid choice: the flag is off, no Lease Role.
    let Some(out) = chart(&[
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "replicas=1",
    ]) else {
        return;
    };
    let docs = out.unwrap();
    let deployment: Deployment = round_trip(named(&docs, "Deployment", "nodeipam-controller"));
    let args = deployment.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.contains(&"--leader-elect=false".to_owned()),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--leader-elect-")),
        "{args:?}"
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["metadata"]["name"] == "nodeipam-controller-leader-election"),
        "no leader-election Role without leader election"
    );
}

/// The marker every YAML-breaking payload carries: in a render that keeps a payload whole, a
/// string (or key) holding the marker holds the whole payload; a fragment of it means the payload
/// was read as YAML structure.
const MARK: &str = "PWNED";

/// A ClusterRoleBinding of the chart's ServiceAccount to `cluster-admin` (issue 31, item 3),
/// after `prefix`.
fn admin_binding(prefix: &str) -> String {
    format!(
        "{prefix}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata:\n  name: {MARK}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
         kind: ClusterRole\n  name: cluster-admin\nsubjects:\n  - kind: ServiceAccount\n    \
         name: nodeipam-controller\n    namespace: kube-system"
    )
}

/// Values that break out of a YAML scalar written unquoted, double-quoted or single-quoted, or
/// that YAML reads as structure: newline + `---` + a ClusterRoleBinding to cluster-admin (bare,
/// and after a closing `"`), a newline with an indented key after a closing `'`, flow
/// collection, alias and comment indicators, and CRLF line breaks.
fn breakers() -> Vec<String> {
    vec![
        admin_binding("10.244.0.0/16"),
        admin_binding(&format!("{MARK}\"")),
        format!("{MARK}'\n          {MARK}-key: true\n  # {MARK}"),
        format!("{{{MARK}: [1]}} *{MARK} #{MARK}"),
        format!("{MARK}\r\n---\r\nkind: Secret\r\nmetadata: {{name: {MARK}}}"),
    ]
}

/// Where a value is a list or map that is empty by default, the entry the test adds for a payload
/// `p` (so that every string the chart can be given is tried).
fn entry_for_empty(path: &str, p: &str) -> Option<Value> {
    let entry = match path {
        "controller.nodeCIDRMaskSizeRules" | "controller.extraArgs" => serde_json::json!([p]),
        "imagePullSecrets" => serde_json::json!([{ "name": p }]),
        "extraVolumes" => serde_json::json!([{ "name": p, "emptyDir": {} }]),
        "extraVolumeMounts" => serde_json::json!([{ "name": p, "mountPath": "/x" }]),
        "serviceAccount.annotations"
        | "podAnnotations"
        | "podLabels"
        | "nodeSelector"
        | "grafanaDashboard.annotations" => serde_json::json!({ "example.com/key": p }),
        _ => return None,
    };
    Some(entry)
}

/// A value's place in values.yaml: keys and list indexes (a key may hold dots, as label keys do).
type ValuePath = Vec<String>;

/// The paths of every string in `value`, and of every empty list or map.
fn string_paths(
    value: &Value,
    path: &ValuePath,
    strings: &mut Vec<ValuePath>,
    empty: &mut Vec<ValuePath>,
) {
    let join = |key: String| {
        let mut longer = path.clone();
        longer.push(key);
        longer
    };
    match value {
        Value::String(_) => strings.push(path.clone()),
        Value::Array(items) if items.is_empty() => empty.push(path.clone()),
        Value::Object(map) if map.is_empty() => empty.push(path.clone()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_paths(item, &join(i.to_string()), strings, empty);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                string_paths(item, &join(key.clone()), strings, empty);
            }
        }
        _ => {}
    }
}

/// `values` with the value at `path` replaced by `new`.
fn with_value(values: &Value, path: &ValuePath, new: Value) -> Value {
    let mut out = values.clone();
    let mut at = &mut out;
    for key in path {
        at = match at {
            Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
            Value::Object(map) => map.get_mut(key).unwrap(),
            other => panic!("{path:?}: {other} has no {key}"),
        };
    }
    *at = new;
    out
}

/// Every string and map key in `value` that holds [`MARK`] but not the whole `payload`.
fn fragments(value: &Value, payload: &str, out: &mut Vec<String>) {
    let partial = |text: &str| text.contains(MARK) && !text.contains(payload);
    match value {
        Value::String(text) if partial(text) => out.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|v| fragments(v, payload, out)),
        Value::Object(map) => {
            for (key, item) in map {
                if partial(key) {
                    out.push(key.clone());
                }
                fragments(item, payload, out);
            }
        }
        _ => {}
    }
}

/// (kind, namespace, name) of every document, sorted, duplicates kept.
fn identities(docs: &[Value]) -> Vec<(String, String, String)> {
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let mut out: Vec<_> = docs
        .iter()
        .map(|d| {
            let metadata = &d["metadata"];
            (
                text(&d["kind"]),
                text(&metadata["namespace"]),
                text(&metadata["name"]),
            )
        })
        .collect();
    out.sort();
    out
}

/// Why the render of `values` with `payload` at `path` is neither refused nor the expected
/// objects, if it is not.
fn injection(
    values: &Value,
    path: &str,
    payload: &str,
    expected: &[(String, String, String)],
) -> Option<String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), values.to_string()).unwrap();
    let mut args = PROMETHEUS_VALUES.to_vec();
    args.extend(["--values", file.path().to_str().unwrap()]);
    let Ok(text) = deploy::helm_template_text(&args)? else {
        return None; // refused
    };
    let docs: Result<Vec<Value>, _> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            use serde::Deserialize as _;
            Value::deserialize(doc)
        })
        .collect();
    let docs: Vec<Value> = match docs {
        Ok(docs) => docs.into_iter().filter(|d| !d.is_null()).collect(),
        Err(e) => {
            return Some(format!(
                "{path}: helm printed YAML that does not parse: {e}"
            ));
        }
    };
    let got = identities(&docs);
    if got != expected {
        let extra: Vec<_> = got.iter().filter(|k| !expected.contains(k)).collect();
        let missing: Vec<_> = expected.iter().filter(|k| !got.contains(k)).collect();
        return Some(format!(
            "{path}: rendered other objects: extra {extra:?}, missing {missing:?}"
        ));
    }
    let admin = docs.iter().any(|d| d["roleRef"]["name"] == "cluster-admin");
    let mut broken = Vec::new();
    docs.iter().for_each(|d| fragments(d, payload, &mut broken));
    if admin || !broken.is_empty() {
        return Some(format!(
            "{path}: the payload became YAML structure (cluster-admin bound: {admin}; \
             fragments: {broken:?})"
        ));
    }
    None
}

/// Issue 31, item 3: every string the chart takes — each string in values.yaml, and an entry of
/// each list or map that is empty by default — set to each YAML-breaking payload ([`breakers`])
/// either fails the render (values.schema.json's patterns, a `required`…) or renders exactly
/// the objects of the default render (same kinds, namespaces and names; no ClusterRoleBinding to
/// cluster-admin), with the payload kept whole as one string. Rendered with Prometheus and the
/// dashboard on, so that their values are used too.
#[test]
fn yaml_breaking_values_are_refused_or_stay_one_string() {
    let Some(base) = chart(&PROMETHEUS_VALUES) else {
        return;
    };
    let expected = identities(&base.unwrap_or_else(|e| panic!("helm template: {e}")));
    let text =
        std::fs::read_to_string(deploy::repo_root().join("charts/nodeipam/values.yaml")).unwrap();
    let defaults: Value = serde_yaml_ng::from_str(&text).unwrap();
    let (mut strings, mut empty) = (Vec::new(), Vec::new());
    string_paths(&defaults, &Vec::new(), &mut strings, &mut empty);
    // Integer-or-string values whose default is an integer.
    strings.push(vec![
        "podDisruptionBudget".to_owned(),
        "minAvailable".to_owned(),
    ]);
    let mut cases = Vec::new();
    for payload in breakers() {
        for path in &strings {
            let values = with_value(&defaults, path, Value::String(payload.clone()));
            cases.push((path.join("."), payload.clone(), values));
        }
        for path in &empty {
            let name = path.join(".");
            let entry = entry_for_empty(&name, &payload).unwrap_or_else(|| {
                panic!("{name} is empty by default: say in entry_for_empty what to try there")
            });
            cases.push((name, payload.clone(), with_value(&defaults, path, entry)));
        }
    }
    assert!(cases.len() > 200, "{} cases", cases.len());
    let cases = std::sync::Mutex::new(cases.into_iter());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let Some((path, payload, values)) = cases.lock().unwrap().next() else {
                        return;
                    };
                    if let Some(failure) = injection(&values, &path, &payload, &expected) {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{failure}\n  payload {payload:?}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} renders took a YAML-breaking value as structure:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
