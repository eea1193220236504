//! `deploy/` (the kustomize base) and `overlays/prometheus` (base + the Prometheus component):
//! every document deserialises into its k8s-openapi type (or, for the Prometheus Operator's
//! CRDs, a strict schema of the fields we use) without losing a field; the Deployment is the
//! hardened, leader-elected, secure-port-only one the operator guide describes, and its
//! arguments parse with the controller's real command line; alerts and the Grafana dashboard's
//! queries use metric names the controller exports.
//!
//! With `NODEIPAM_MANIFESTS=chart` every test here reads the Helm chart's render instead
//! (`deploy/mod.rs`); `.ci/run` runs them both ways.
#![allow(clippy::unwrap_used)]

use crate::deploy;

use std::collections::BTreeSet;

use clap::Parser as _;
use deploy::{named, of_kind, rendered, round_trip};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The Prometheus Operator's `ServiceMonitor`, only the fields we use (unknown ones fail).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitorSpec {
    selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    namespace_selector: NamespaceSelector,
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespaceSelector {
    match_names: Vec<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Endpoint {
    port: String,
    scheme: String,
    path: String,
    interval: String,
    bearer_token_file: String,
    tls_config: TlsConfig,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TlsConfig {
    insecure_skip_verify: bool,
}

/// The Prometheus Operator's `PrometheusRule`, only the fields we use.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrometheusRule {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: PrometheusRuleSpec,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PrometheusRuleSpec {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<AlertRule>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct AlertRule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
}

/// Deserialises every document into its type; returns the kinds seen.
fn check_types(docs: &[Value]) -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        match (doc["apiVersion"].as_str().unwrap(), kind.as_str()) {
            ("v1", "ServiceAccount") => drop(round_trip::<ServiceAccount>(doc)),
            ("v1", "Service") => drop(round_trip::<Service>(doc)),
            ("v1", "ConfigMap") => drop(round_trip::<ConfigMap>(doc)),
            ("apps/v1", "Deployment") => drop(round_trip::<Deployment>(doc)),
            ("policy/v1", "PodDisruptionBudget") => drop(round_trip::<PodDisruptionBudget>(doc)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                drop(round_trip::<ClusterRole>(doc));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                drop(round_trip::<ClusterRoleBinding>(doc));
            }
            ("rbac.authorization.k8s.io/v1", "Role") => drop(round_trip::<Role>(doc)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                drop(round_trip::<RoleBinding>(doc));
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                drop(round_trip::<ServiceMonitor>(doc));
            }
            ("monitoring.coreos.com/v1", "PrometheusRule") => {
                drop(round_trip::<PrometheusRule>(doc));
            }
            (api, kind) => panic!("unexpected {api} {kind}: add it to this test"),
        }
        kinds.insert(kind);
    }
    kinds
}

#[test]
fn every_manifest_deserialises_into_its_type() {
    let base = rendered("deploy");
    let kinds = check_types(&base);
    let want: BTreeSet<String> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(kinds, want);
    let overlay = rendered("overlays/prometheus");
    let kinds = check_types(&overlay);
    for extra in ["Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(kinds.contains(extra), "{extra} in the Prometheus overlay");
    }
    assert!(
        overlay.len() > base.len() && base.iter().all(|d| overlay.contains(d)),
        "the overlay is the base plus its own documents"
    );
}

fn deployment() -> Deployment {
    let docs = rendered("deploy");
    round_trip(named(&docs, "Deployment", "nodeipam-controller"))
}

#[test]
fn the_deployment_is_hardened_leader_elected_and_serves_only_the_secure_port() {
    let deployment = deployment();
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some("kube-system")
    );
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let template = spec.template.spec.unwrap();
    assert_eq!(
        template.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_eq!(
        template.host_network,
        Some(true),
        "the pod network needs podCIDRs first"
    );
    assert_eq!(
        template.service_account_name.as_deref(),
        Some("nodeipam-controller")
    );
    let pod_security = template.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(
        pod_security.seccomp_profile.unwrap().type_,
        "RuntimeDefault"
    );
    // Control-plane nodes: tolerated and required.
    let tolerations = template.tolerations.unwrap();
    for key in [
        "node-role.kubernetes.io/control-plane",
        "node.kubernetes.io/not-ready",
    ] {
        assert!(
            tolerations.iter().any(|t| t.key.as_deref() == Some(key)),
            "{key}"
        );
    }
    let affinity = template.affinity.unwrap();
    let required = affinity
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap();
    assert!(required.node_selector_terms.iter().any(|t| {
        t.match_expressions
            .iter()
            .flatten()
            .any(|e| e.key == "node-role.kubernetes.io/control-plane" && e.operator == "Exists")
    }));
    assert!(
        affinity.pod_anti_affinity.is_some(),
        "replicas on different nodes"
    );

    assert_eq!(template.containers.len(), 1);
    let container = &template.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.capabilities.unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    assert!(
        container.env.iter().flatten().any(|e| e.name == "POD_NAME"
            && e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
                == Some("metadata.name")),
        "the Lease identity is the Pod name"
    );

    // The arguments are the controller's real command line.
    let args = container.args.clone().unwrap();
    let cli = nodeipam::flags::Cli::try_parse_from(
        std::iter::once("nodeipam-controller".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the Deployment's args do not parse: {e}"));
    assert!(cli.controller.leader_elect);
    assert_eq!(
        cli.controller.metrics_bind_address.0, None,
        "no plain /metrics"
    );
    assert_eq!(
        cli.controller.health_probe_bind_address.0, None,
        "no plain probes"
    );
    assert!(cli.serving.enabled());
    assert!(
        cli.ipam.validate().is_err(),
        "the placeholder --cluster-cidr must fail until the operator sets it"
    );
    let port = i32::from(cli.serving.secure_port);
    assert_ne!(
        port, 10257,
        "kube-controller-manager's port on the same host network"
    );
    let ports = container.ports.clone().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].container_port, port);
    assert_eq!(ports[0].name.as_deref(), Some("https"));
    for (probe, path) in [
        (container.liveness_probe.clone(), "/healthz"),
        (container.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe.unwrap().http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(get.port, IntOrString::String("https".to_owned()));
        assert!(
            cli.serving.authorization_always_allow_paths.allows(path),
            "the kubelet probes {path} without a token"
        );
    }

    // Sized from measured RSS (docs/operations.md): a request and a memory limit above it.
    let resources = container.resources.clone().unwrap();
    let requests = resources.requests.unwrap();
    let limits = resources.limits.unwrap();
    let mib = |q: &Quantity| {
        q.0.strip_suffix("Mi")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap()
    };
    assert!(requests.contains_key("cpu"));
    assert!(mib(&limits["memory"]) > mib(&requests["memory"]));
}

#[test]
fn the_disruption_budget_covers_the_deployment() {
    let docs = rendered("deploy");
    let pdb: PodDisruptionBudget =
        round_trip(named(&docs, "PodDisruptionBudget", "nodeipam-controller"));
    let spec = pdb.spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    let selector = spec.selector.unwrap().match_labels.unwrap();
    let deployment = deployment();
    let labels = deployment.spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "{k}");
    }
}

/// Metric names in a PromQL expression (`node_ipam_controller_…`, histogram suffixes removed).
fn metric_names_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("node_ipam_controller_"))
        .map(|w| {
            w.trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count")
                .to_owned()
        })
        .collect()
}

#[test]
fn alerts_cover_usage_exhaustion_and_patch_failures_with_real_metric_names() {
    use nodeipam::metric_names as m;
    let exported = [
        m::CIDRSET_ALLOCATIONS_TOTAL,
        m::CIDRSET_RELEASES_TOTAL,
        m::CIDRSET_USAGE_CIDRS,
        m::CIDRSET_ALLOCATION_TRIES_PER_REQUEST,
        m::CIDRSET_MAX_CIDRS,
        m::CIDRSET_USED_BLOCKS,
        m::CIDRSET_GRID_MASK_SIZE,
        m::CIDRSET_LARGEST_FREE_ALIGNED_BLOCKS,
        m::RATE_LIMITER_USE,
        m::WORKQUEUE_DEPTH,
        m::WORKQUEUE_RETRIES_TOTAL,
        m::SKIPPED_NODES_TOTAL,
        m::SKIPPED_NODES,
        m::CIDRSET_EXHAUSTED_TOTAL,
        m::PATCH_FAILURES_TOTAL,
    ];
    let docs = rendered("overlays/prometheus");
    let rule: PrometheusRule = round_trip(named(&docs, "PrometheusRule", "nodeipam-controller"));
    let alerts: Vec<&AlertRule> = rule.spec.groups.iter().flat_map(|g| &g.rules).collect();
    let by_metric = |metric: &str| {
        alerts
            .iter()
            .find(|a| metric_names_in(&a.expr).iter().any(|n| n == metric))
            .unwrap_or_else(|| panic!("an alert on {metric}"))
    };
    assert!(by_metric(m::CIDRSET_USED_BLOCKS).expr.contains("> 0.9"));
    assert!(
        by_metric(m::CIDRSET_EXHAUSTED_TOTAL)
            .expr
            .contains("increase(")
    );
    assert!(by_metric(m::PATCH_FAILURES_TOTAL).expr.contains("rate("));
    for alert in &alerts {
        for name in metric_names_in(&alert.expr) {
            assert!(
                exported.contains(&name.as_str()),
                "{}: {name} is not a metric the controller exports",
                alert.alert
            );
        }
        assert!(alert.labels.contains_key("severity"), "{}", alert.alert);
        assert!(alert.annotations.contains_key("summary"), "{}", alert.alert);
    }
}

/// The usage alert is per address family, over all its cluster CIDRs: with several per family
/// (issue 18 §1) the earlier ones are full by design while a later one serves, and the old
/// per-`clusterCIDR` ratio fired for good (hostile-run finding). Checked on the parsed
/// expression: a ratio of two sums grouped by `family` alone, compared with 0.9, the family
/// derived from `clusterCIDR`.
#[test]
fn the_pool_usage_alert_is_per_family_not_per_cluster_cidr() {
    use promql_parser::parser::{Expr, LabelModifier};
    let docs = rendered("overlays/prometheus");
    let rule: PrometheusRule = round_trip(named(&docs, "PrometheusRule", "nodeipam-controller"));
    let alert = rule
        .spec
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .find(|a| a.alert == "NodeIpamPoolUsageHigh")
        .expect("the usage alert");
    let expr = &alert.expr;
    let parsed = promql_parser::parser::parse(expr)
        .unwrap_or_else(|e| panic!("{expr}: not valid PromQL: {e}"));
    let Expr::Binary(compare) = &parsed else {
        panic!("{expr}: not a comparison");
    };
    assert!(
        matches!(&*compare.rhs, Expr::NumberLiteral(n) if n.val == 0.9),
        "{expr}: not compared with 0.9"
    );
    let Expr::Binary(ratio) = &*compare.lhs else {
        panic!("{expr}: the compared value is not a ratio");
    };
    for side in [&ratio.lhs, &ratio.rhs] {
        let Expr::Aggregate(sum) = &**side else {
            panic!("{expr}: {side:?} is not an aggregation");
        };
        let grouping = match &sum.modifier {
            Some(LabelModifier::Include(labels)) => labels.labels.clone(),
            other => panic!("{expr}: grouped {other:?}"),
        };
        assert_eq!(grouping, ["family"], "{expr}");
    }
    assert!(
        expr.contains(r#""family", "IPv6", "clusterCIDR", ".*:.*""#),
        "{expr}: the family is not derived from clusterCIDR"
    );
    assert!(
        alert.annotations["summary"].contains("$labels.family"),
        "{:?}",
        alert.annotations
    );
}

/// The metric names every selector of a PromQL expression names, parsed by a PromQL parser (so a
/// query that is not valid PromQL fails too). Grafana's interval variables are replaced by a
/// duration first; any other `$variable` fails.
fn selector_names(expr: &str) -> Vec<String> {
    fn walk(expr: &promql_parser::parser::Expr, out: &mut Vec<String>) {
        use promql_parser::parser::Expr;
        match expr {
            Expr::VectorSelector(vs) => out.push(vs.name.clone().unwrap_or_default()),
            Expr::MatrixSelector(ms) => out.push(ms.vs.name.clone().unwrap_or_default()),
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                if let Some(param) = &a.param {
                    walk(param, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(q) => walk(&q.expr, out),
            Expr::Call(c) => c.args.args.iter().for_each(|arg| walk(arg, out)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
            Expr::Extension(_) => panic!("{expr:?}: not PromQL"),
        }
    }
    let substituted = expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m");
    assert!(
        !substituted.contains('$'),
        "{expr}: a Grafana variable the dashboard does not define"
    );
    let parsed = promql_parser::parser::parse(&substituted)
        .unwrap_or_else(|e| panic!("{expr}: not valid PromQL: {e}"));
    let mut names = Vec::new();
    walk(&parsed, &mut names);
    names
}

/// The Grafana dashboard (issue 21): the Prometheus overlay's (and the chart's) ConfigMap for
/// Grafana's sidecar holds the committed JSON — one file, copied byte for byte into the chart —;
/// every panel query is valid PromQL whose every selector names a metric the controller exports
/// (shell/src/metric_names.rs; a histogram's `_bucket`/`_sum`/`_count` series count as its name);
/// and the panels cover pool usage, allocations and releases, PATCH errors, the work queue (depth,
/// retries, work duration), the write rate limiter and the leader.
#[test]
fn the_dashboard_queries_only_metrics_the_controller_exports() {
    use nodeipam::metric_names as m;
    let docs = rendered("overlays/prometheus");
    let config_map: ConfigMap =
        round_trip(named(&docs, "ConfigMap", "nodeipam-controller-dashboard"));
    assert_eq!(
        config_map
            .metadata
            .labels
            .unwrap_or_default()
            .get("grafana_dashboard")
            .map(String::as_str),
        Some("1"),
        "the label Grafana's dashboard sidecar looks for"
    );
    let data = config_map.data.unwrap_or_default();
    let text = data.get("nodeipam.json").expect("data key nodeipam.json");
    for copy in [
        "deploy/components/prometheus/grafana-dashboard.json",
        "charts/nodeipam/dashboards/nodeipam.json",
    ] {
        let committed = std::fs::read_to_string(deploy::repo_root().join(copy)).unwrap();
        assert_eq!(
            &committed, text,
            "{copy} is the dashboard the ConfigMap holds"
        );
    }
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    let exported: Vec<&str> = m::METRICS.iter().map(|metric| metric.name).collect();
    let is_exported = |name: &str| {
        exported.contains(&name)
            || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|base| exported.contains(&base))
            })
    };
    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{title}: id");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let names = selector_names(expr);
            assert!(!names.is_empty(), "{title}: {expr} selects no metric");
            for name in names {
                assert!(
                    is_exported(&name),
                    "{title}: {expr}: {name:?} is not a metric the controller exports"
                );
                // A histogram's series count as the histogram.
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .filter(|base| exported.iter().any(|e| e == base))
                    .map(str::to_owned);
                used.extend(base);
                used.insert(name);
            }
        }
    }
    assert!(
        dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "the ${{datasource}} variable the panels use"
    );
    for wanted in [
        m::CIDRSET_USAGE_CIDRS,
        m::CIDRSET_ALLOCATIONS_TOTAL,
        m::CIDRSET_RELEASES_TOTAL,
        m::PATCH_FAILURES_TOTAL,
        m::WORKQUEUE_DEPTH,
        m::WORKQUEUE_RETRIES_TOTAL,
        m::WORKQUEUE_WORK_DURATION_SECONDS,
        m::RATE_LIMITER_USE,
        m::LEADER_ELECTION_MASTER_STATUS,
    ] {
        assert!(used.contains(wanted), "no panel shows {wanted}");
    }
}

#[test]
fn prometheus_scrapes_the_secure_port_with_its_token() {
    let docs = rendered("overlays/prometheus");
    let monitor: ServiceMonitor = round_trip(named(&docs, "ServiceMonitor", "nodeipam-controller"));
    let service: Service = round_trip(named(&docs, "Service", "nodeipam-controller-metrics"));
    let endpoint = &monitor.spec.endpoints[0];
    assert_eq!(
        (endpoint.scheme.as_str(), endpoint.path.as_str()),
        ("https", "/metrics")
    );
    assert!(
        endpoint
            .bearer_token_file
            .ends_with("/serviceaccount/token")
    );
    let service_spec = service.spec.unwrap();
    let port = service_spec
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.name.as_deref() == Some(endpoint.port.as_str()))
        .expect("the ServiceMonitor's port is the Service's");
    assert_eq!(
        port.target_port,
        Some(IntOrString::String("https".to_owned()))
    );
    let selector = service_spec.selector.unwrap();
    let wanted = monitor.spec.selector.match_labels.unwrap();
    let service_labels = service.metadata.labels.unwrap();
    for (k, v) in &wanted {
        assert_eq!(
            service_labels.get(k),
            Some(v),
            "ServiceMonitor selects the Service: {k}"
        );
    }
    let deployment = deployment();
    let pod_labels = deployment.spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in &selector {
        assert_eq!(
            pod_labels.get(k),
            Some(v),
            "the Service selects the Pods: {k}"
        );
    }
    // Prometheus's ServiceAccount may get /metrics (nothing else).
    let reader: ClusterRole = round_trip(named(
        &docs,
        "ClusterRole",
        "nodeipam-controller-metrics-reader",
    ));
    let rules = reader.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].non_resource_urls,
        Some(vec!["/metrics".to_owned()])
    );
    assert_eq!(rules[0].verbs, vec!["get".to_owned()]);
    assert_eq!(of_kind(&docs, "ClusterRoleBinding").len(), 2);
}

/// The string values of the `pub const NAME: &str = "…";` items of a source file of the shell
/// crate whose name does not start with one of `skip` (the one place the names are defined).
fn string_consts(file: &str, skip: &[&str]) -> Vec<String> {
    let path = deploy::repo_root().join("shell/src").join(file);
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut values = Vec::new();
    for item in source.split("pub const ").skip(1) {
        let Some((name, rest)) = item.split_once(": &str =") else {
            continue;
        };
        if skip.iter().any(|prefix| name.starts_with(prefix)) {
            continue;
        }
        let value = rest
            .trim_start()
            .strip_prefix('"')
            .and_then(|v| v.split_once('"'))
            .map(|(value, _)| value.to_owned())
            .unwrap_or_else(|| panic!("{file}: {name} is not a string literal"));
        values.push(value);
    }
    values
}

/// The operator guide lists every metric the controller exports and every event reason it
/// writes, each in backticks (issue 9: "every metric with type, labels, meaning and upstream
/// name, every event reason").
#[test]
fn the_operator_guide_lists_every_metric_and_event_reason() {
    let guide = std::fs::read_to_string(deploy::repo_root().join("docs/operations.md"))
        .expect("docs/operations.md");
    let metrics: Vec<String> = nodeipam::metric_names::METRICS
        .iter()
        .map(|metric| metric.name.to_owned())
        .collect();
    let reasons: Vec<String> = string_consts("reasons.rs", &["ACTION_"]);
    assert!(metrics.len() >= 15, "{metrics:?}");
    assert!(reasons.len() >= 9, "{reasons:?}");
    for name in metrics.iter().chain(&reasons) {
        assert!(
            guide.contains(&format!("| `{name}` |")),
            "docs/operations.md has no table row for `{name}`"
        );
    }
}
