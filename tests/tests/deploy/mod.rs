//! The `deploy/` manifests as the tests read them: rendered by `kubectl kustomize` (what
//! operators apply), or — where kubectl is missing and `NODEIPAM_REQUIRE_KUBECTL` is unset — the
//! files the kustomizations list, read as they are. `.ci/run` sets `NODEIPAM_REQUIRE_KUBECTL=1`,
//! so CI always checks the rendered form.
//!
//! With `NODEIPAM_MANIFESTS=chart` the same tests read the Helm chart (`charts/nodeipam`) instead,
//! rendered by `helm template` with the values that stand for each kustomization (see
//! [`rendered`]); `.ci/run` runs the manifest tests both ways.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `--set` values that make the chart render `overlays/prometheus` (the base plus the
/// Prometheus component: Service, ServiceMonitor, metrics reader, PrometheusRule, dashboard).
pub const PROMETHEUS_VALUES: [&str; 6] = [
    "--set",
    "prometheus.serviceMonitor.enabled=true",
    "--set",
    "prometheus.rule.enabled=true",
    "--set",
    "grafanaDashboard.enabled=true",
];

/// The `--set` values that make the chart render `overlays/cluster-cidrs` (the base plus the
/// ClusterCIDR component: the CRD, `--cidr-allocator-type=MultiCIDRRangeAllocator`, its RBAC).
pub const CLUSTER_CIDRS_VALUES: [&str; 2] = [
    "--set",
    "controller.cidrAllocatorType=MultiCIDRRangeAllocator",
];

/// The documents the tests check for `dir` (`deploy` or `overlays/prometheus`): the kustomization
/// rendered ([`kustomized`]), or with `NODEIPAM_MANIFESTS=chart` the chart rendered in
/// `kube-system` with its default values (`deploy`) or [`PROMETHEUS_VALUES`]
/// (`overlays/prometheus`).
pub fn rendered(dir: &str) -> Vec<Value> {
    if std::env::var("NODEIPAM_MANIFESTS").as_deref() != Ok("chart") {
        return kustomized(dir);
    }
    let values: &[&str] = match dir {
        "deploy" => &[],
        "overlays/prometheus" => &PROMETHEUS_VALUES,
        "overlays/cluster-cidrs" => &CLUSTER_CIDRS_VALUES,
        other => panic!("NODEIPAM_MANIFESTS=chart: no chart values stand for {other}"),
    };
    match helm_template(values) {
        Some(Ok(docs)) => docs,
        Some(Err(e)) => panic!("helm template failed: {e}"),
        None => panic!("NODEIPAM_MANIFESTS=chart, but helm cannot run ({HELM_HINT})"),
    }
}

/// Where [`helm`] looks.
pub const HELM_HINT: &str = "set NODEIPAM_HELM, or NODEIPAM_UPSTREAM_BIN to tests/upstream/build.sh's folder, which holds helm";

/// The Helm CLI: `$NODEIPAM_HELM`, else `helm` in `$NODEIPAM_UPSTREAM_BIN` (tests/upstream/build.sh
/// builds the pinned one there), else `helm` on PATH; the first that answers `helm version`.
/// `None` if none does; a panic instead if `NODEIPAM_REQUIRE_HELM` is set (CI).
pub fn helm() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(path) = std::env::var_os("NODEIPAM_HELM") {
        candidates.push(PathBuf::from(path));
    }
    if let Some(dir) = std::env::var_os("NODEIPAM_UPSTREAM_BIN") {
        candidates.push(PathBuf::from(dir).join("helm"));
    }
    candidates.push(PathBuf::from("helm"));
    let found = candidates.into_iter().find(|helm| {
        Command::new(helm)
            .args(["version", "--short"])
            .output()
            .is_ok_and(|out| out.status.success())
    });
    assert!(
        found.is_some() || std::env::var_os("NODEIPAM_REQUIRE_HELM").is_none(),
        "NODEIPAM_REQUIRE_HELM is set but helm cannot run ({HELM_HINT})"
    );
    found
}

/// `helm template nodeipam charts/nodeipam --namespace kube-system ARGS…`: the documents, or
/// helm's error text. `None` when helm cannot run ([`helm`]).
pub fn helm_template(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    Some(helm_template_text(args)?.map(|text| documents(&text)))
}

/// [`helm_template`]'s output as helm printed it (not parsed), or helm's error text.
pub fn helm_template_text(args: &[&str]) -> Option<Result<String, String>> {
    let helm = helm()?;
    let out = Command::new(&helm)
        .args(["template", "nodeipam"])
        .arg(repo_root().join("charts/nodeipam"))
        .args(["--namespace", "kube-system"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", helm.display()));
    Some(if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm prints UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// The documents of the kustomization in `dir` (relative to the repository root).
pub fn kustomized(dir: &str) -> Vec<Value> {
    let path = repo_root().join(dir);
    match Command::new("kubectl").arg("kustomize").arg(&path).output() {
        Ok(out) if out.status.success() => {
            documents(&String::from_utf8(out.stdout).expect("kubectl prints UTF-8"))
        }
        Ok(out) => panic!(
            "kubectl kustomize {dir} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            assert!(
                std::env::var_os("NODEIPAM_REQUIRE_KUBECTL").is_none(),
                "NODEIPAM_REQUIRE_KUBECTL is set but kubectl cannot run: {e}"
            );
            eprintln!("kubectl cannot run ({e}): reading the listed files of {dir} unrendered");
            listed_files(&path)
        }
    }
}

/// Every document of a multi-document YAML text, as JSON values (empty documents skipped).
pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The resources (files, or directories with their own kustomization) and components a
/// kustomization lists, read without kustomize's transformations.
fn listed_files(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let kustomization = documents(&text).remove(0);
    let mut out = Vec::new();
    for key in ["resources", "components"] {
        for entry in kustomization[key].as_array().into_iter().flatten() {
            let path = dir.join(entry.as_str().unwrap());
            if path.is_dir() {
                out.extend(listed_files(&path));
            } else {
                out.extend(documents(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out
}

/// The documents of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The one document of `kind` named `name`.
pub fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    found[0]
}

/// Deserialises `doc` into `T` and back, and requires the same JSON: a misspelt or misplaced
/// field (which serde would silently drop) or a value of the wrong shape fails.
pub fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {}: does not deserialise: {e}",
            doc["kind"], doc["metadata"]["name"]
        )
    });
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, doc,
        "{} {}: fields lost or changed in the typed round trip",
        doc["kind"], doc["metadata"]["name"]
    );
    typed
}
