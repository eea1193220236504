//! RBAC equals the code. The controller (configured from the `deploy/` Deployment's own
//! arguments) runs against the sandbox through every code path that talks to the API server —
//! the paged LIST fallback and WATCH of Nodes, their PATCH, the GET after a PATCH that cannot
//! apply, an Event created and then patched as a series, the Lease got, created, updated
//! (renewed) and released, and one authorized scrape of the secure port (TokenReview,
//! SubjectAccessReview). The requests the sandbox logged are the API calls the controller makes;
//! they are compared with what the ClusterRole/Role rules bound to the Deployment's
//! ServiceAccount grant, as RBAC evaluates them (namespace, API group, resource, verb, resource
//! name). The test fails on any request not granted and on any granted verb × resource (or
//! resource name) no request used.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::deploy;
use crate::secure;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clap::Parser as _;
use common::{WAIT, fast_config, init_tracing, ipam, spawn, unserved};
use deploy::{named, of_kind, rendered, round_trip};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use nodeipam::leader::LeaseConfig;
use nodeipam_tests::sandbox::{
    AccessTable, FaultAction, RequestRecord, Resource, Sandbox, SandboxOptions, Subject, Verb,
    fixture,
};
use serde_json::Value;

/// One API call as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    namespace: Option<String>,
    group: String,
    resource: String,
    verb: String,
    name: Option<String>,
}

/// The RBAC attributes of a logged request, as kube-apiserver's `RequestInfo` derives them
/// (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`): `/api/v1/…` is the core group,
/// `/apis/GROUP/VERSION/…` another; `namespaces/NS/` scopes it; GET is `get` with a name, `list`
/// without, `watch` with `watch=true`; POST `create`, PUT `update`, PATCH `patch`, DELETE
/// `delete`. Anything else (e.g. `/version`) is a non-resource request: `None`.
fn classify(record: &RequestRecord) -> Option<Call> {
    let parts: Vec<&str> = record.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        rest => (None, rest),
    };
    let (resource, name) = match rest {
        [resource] => ((*resource).to_owned(), None),
        [resource, name] => ((*resource).to_owned(), Some((*name).to_owned())),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some((*name).to_owned())),
        _ => return None,
    };
    let watch = form_urlencoded::parse(record.query.as_bytes())
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
    let verb = match (record.method.as_str(), name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (other, _) => panic!("unexpected method {other}: {record:?}"),
    };
    Some(Call {
        namespace,
        group,
        resource,
        verb: verb.to_owned(),
        name,
    })
}

/// One rule as granted: `namespace` is `None` for a ClusterRole bound cluster-wide.
#[derive(Debug, Clone)]
struct Grant {
    origin: String,
    namespace: Option<String>,
    rule: PolicyRule,
}

impl Grant {
    fn allows(&self, call: &Call) -> bool {
        let scope = self.namespace.is_none() || self.namespace == call.namespace;
        let groups = self
            .rule
            .api_groups
            .iter()
            .flatten()
            .any(|g| *g == call.group);
        let resources = self
            .rule
            .resources
            .iter()
            .flatten()
            .any(|r| *r == call.resource);
        let verbs = self.rule.verbs.contains(&call.verb);
        let names = match &self.rule.resource_names {
            None => true,
            Some(names) if names.is_empty() => true,
            Some(names) => call.name.as_ref().is_some_and(|n| names.contains(n)),
        };
        scope && groups && resources && verbs && names
    }

    /// Each (group, resource, verb, resource name) the rule grants, as a call that would use it.
    fn expanded(&self) -> Vec<(String, Call)> {
        let mut out = Vec::new();
        let names: Vec<Option<String>> = match &self.rule.resource_names {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for group in self.rule.api_groups.iter().flatten() {
            for resource in self.rule.resources.iter().flatten() {
                for verb in &self.rule.verbs {
                    for name in &names {
                        out.push((
                            self.origin.clone(),
                            Call {
                                namespace: self.namespace.clone(),
                                group: group.clone(),
                                resource: resource.clone(),
                                verb: verb.clone(),
                                name: name.clone(),
                            },
                        ));
                    }
                }
            }
        }
        out
    }
}

/// Every rule bound to ServiceAccount `namespace/name` in `docs`.
fn grants_for(docs: &[Value], namespace: &str, name: &str) -> Vec<Grant> {
    let is_ours = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == name
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    let cluster_roles: BTreeMap<String, ClusterRole> = of_kind(docs, "ClusterRole")
        .into_iter()
        .map(|d| {
            let role: ClusterRole = round_trip(d);
            (role.metadata.name.clone().unwrap(), role)
        })
        .collect();
    let roles: BTreeMap<(String, String), Role> = of_kind(docs, "Role")
        .into_iter()
        .map(|d| {
            let role: Role = round_trip(d);
            (
                (
                    role.metadata.namespace.clone().unwrap(),
                    role.metadata.name.clone().unwrap(),
                ),
                role,
            )
        })
        .collect();
    let mut grants = Vec::new();
    for doc in of_kind(docs, "ClusterRoleBinding") {
        let binding: ClusterRoleBinding = round_trip(doc);
        if !is_ours(&binding.subjects) {
            continue;
        }
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        let role = &cluster_roles[&binding.role_ref.name];
        for rule in role.rules.iter().flatten() {
            grants.push(Grant {
                origin: format!("ClusterRole {}", binding.role_ref.name),
                namespace: None,
                rule: rule.clone(),
            });
        }
    }
    for doc in of_kind(docs, "RoleBinding") {
        let binding: RoleBinding = round_trip(doc);
        if !is_ours(&binding.subjects) {
            continue;
        }
        let ns = binding.metadata.namespace.clone().unwrap();
        let rules = match binding.role_ref.kind.as_str() {
            "Role" => roles[&(ns.clone(), binding.role_ref.name.clone())]
                .rules
                .clone(),
            "ClusterRole" => cluster_roles[&binding.role_ref.name].rules.clone(),
            other => panic!("roleRef kind {other}"),
        };
        for rule in rules.into_iter().flatten() {
            grants.push(Grant {
                origin: format!("{} {}/{}", binding.role_ref.kind, ns, binding.role_ref.name),
                namespace: Some(ns.clone()),
                rule,
            });
        }
    }
    for grant in &grants {
        let rule = &grant.rule;
        let wildcard = |v: &Option<Vec<String>>| v.iter().flatten().any(|x| x.contains('*'));
        assert!(
            !wildcard(&rule.api_groups)
                && !wildcard(&rule.resources)
                && !rule.verbs.iter().any(|v| v == "*"),
            "{}: no wildcards",
            grant.origin
        );
        assert!(
            rule.non_resource_urls.is_none(),
            "{}: the controller requests no non-resource URL of the API server",
            grant.origin
        );
    }
    grants
}

#[tokio::test]
async fn rbac_rules_equal_the_api_calls_the_controller_makes() {
    rbac_rules_equal_the_api_calls_in("deploy").await;
}

/// With the ClusterCIDR component (`--cidr-allocator-type=MultiCIDRRangeAllocator`): the
/// ClusterCIDRs listed and watched, a finalizer and a status patched, on top of every call above.
#[tokio::test]
async fn with_cluster_cidrs_rbac_rules_equal_the_api_calls_the_controller_makes() {
    rbac_rules_equal_the_api_calls_in("overlays/cluster-cidrs").await;
}

/// The manifests of `dir` (rendered) grant exactly the calls the controller, configured from
/// their Deployment's arguments, makes.
async fn rbac_rules_equal_the_api_calls_in(dir: &str) {
    init_tracing();
    let docs = rendered(dir);
    let deployment: Deployment = round_trip(named(&docs, "Deployment", "nodeipam-controller"));
    let sa_namespace = deployment.metadata.namespace.clone().unwrap();
    let pod = deployment.spec.template.spec.clone().unwrap();
    let sa_name = pod.service_account_name.clone().unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let cli = nodeipam::flags::Cli::try_parse_from(
        std::iter::once("nodeipam-controller".to_owned()).chain(args),
    )
    .unwrap();

    // Every path: the sandbox refuses streaming lists (so the paged LIST fallback runs), the
    // first Node PATCH gets a 422 (it can never apply: the Node is read back), and a pool of two
    // blocks for four Nodes repeats CIDRNotAvailable (an Event, then a PATCH of its series).
    let sb = Sandbox::try_start(
        fixture("05-aws-4nodes-no-podcidr.json"),
        SandboxOptions {
            watch_list: false,
            ..SandboxOptions::default()
        },
    )
    .await
    .unwrap();
    sb.set_access_table(
        AccessTable::new()
            .token(
                "scraper",
                "system:serviceaccount:monitoring:prometheus-k8s",
                &[],
            )
            .allow(
                Subject::User("system:serviceaccount:monitoring:prometheus-k8s".to_owned()),
                "get",
                "/metrics",
            ),
    );
    sb.fail_next(Verb::Patch, Resource::Nodes, 1, FaultAction::Status(422));
    let _ = secure::metrics_handle();
    let mut config = fast_config(ipam(
        "10.244.0.0/23",
        "",
        common::masks(Some(24), None, None),
    ));
    config.leader_election = Some(LeaseConfig {
        namespace: cli.controller.leader_elect_resource_namespace.clone(),
        name: cli.controller.leader_elect_resource_name.clone(),
        identity: "rbac-test_1".to_owned(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(200),
    });
    config.watch_cluster_cidr_objects =
        cli.ipam.cidr_allocator_type == nodeipam::flags::MULTI_CIDR_ALLOCATOR;
    if config.watch_cluster_cidr_objects {
        // A pool for Nodes that do not exist (the four still share two blocks): it gets the
        // finalizer and a status. Created by the test, so its request is not the controller's.
        common::create_cluster_cidr(
            &sb,
            "rbac-pool",
            serde_json::json!({
                "ipv4": "10.250.0.0/24",
                "perNodeHostBits": 4,
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "example.com/no-such-label", "operator": "Exists"}
                ]}]},
            }),
        )
        .await;
        sb.clear_requests();
    }
    let controller = spawn(&sb, config.clone());
    let mut serving_args = vec!["--bind-address=127.0.0.1".to_owned()];
    serving_args.push(format!(
        "--authorization-always-allow-paths={}",
        nodeipam::serving::DEFAULT_ALWAYS_ALLOW_PATHS
    ));
    let serving_args: Vec<&str> = serving_args.iter().map(String::as_str).collect();
    let serving = secure::resolve(&serving_args, &sb.client()).await;
    let server = secure::start(serving, controller.health.clone(), None).await;

    let requests = |sb: &nodeipam_tests::sandbox::SandboxHandle| -> Vec<Call> {
        sb.requests().iter().filter_map(classify).collect()
    };
    let saw = |calls: &[Call], resource: &str, verb: &str| {
        calls
            .iter()
            .any(|c| c.resource == resource && c.verb == verb)
    };
    assert!(
        sb.wait_until(WAIT, |sb| {
            let calls = requests(sb);
            unserved(sb).len() == 2
                && saw(&calls, "events", "patch")
                && saw(&calls, "nodes", "get")
                && calls
                    .iter()
                    .filter(|c| c.resource == "leases" && c.verb == "update")
                    .count()
                    >= 2
                && (!config.watch_cluster_cidr_objects
                    || (saw(&calls, "clustercidrs", "patch")
                        && saw(&calls, "clustercidrs/status", "patch")
                        && saw(&calls, "clustercidrs", "watch")))
        })
        .await,
        "every code path ran: {:#?}",
        requests(&sb)
    );
    let scrape = secure::get(&server, "/metrics", Some("scraper")).await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    drop(server);
    let _ = controller.stop().await;

    let log = sb.requests();
    let calls: Vec<Call> = log.iter().filter_map(classify).collect();
    let non_resource: Vec<&RequestRecord> = log.iter().filter(|r| classify(r).is_none()).collect();
    assert!(
        non_resource.is_empty(),
        "non-resource requests: {non_resource:#?}"
    );
    let grants = grants_for(&docs, &sa_namespace, &sa_name);

    let mut table: BTreeMap<String, usize> = BTreeMap::new();
    for call in &calls {
        let key = format!(
            "{:<24} {:<22} {:<7} in {}",
            call.resource,
            if call.group.is_empty() {
                "\"\""
            } else {
                &call.group
            },
            call.verb,
            call.namespace.as_deref().unwrap_or("(cluster)")
        );
        *table.entry(key).or_default() += 1;
    }
    println!("API calls the controller made (resource, group, verb, namespace: count):");
    for (key, count) in &table {
        println!("  {key}: {count}");
    }

    let ungranted: BTreeSet<&Call> = calls
        .iter()
        .filter(|c| !grants.iter().any(|g| g.allows(c)))
        .collect();
    assert!(
        ungranted.is_empty(),
        "used but not granted (add to deploy/rbac.yaml): {ungranted:#?}"
    );
    let unused: Vec<(String, Call)> = grants
        .iter()
        .flat_map(Grant::expanded)
        .filter(|(_, granted)| {
            !calls.iter().any(|c| {
                (granted.namespace.is_none() || granted.namespace == c.namespace)
                    && granted.group == c.group
                    && granted.resource == c.resource
                    && granted.verb == c.verb
                    && (granted.name.is_none() || granted.name == c.name)
            })
        })
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used (remove from deploy/rbac.yaml, or the test misses a code path): {unused:#?}"
    );
    sb.shutdown().await;
}

#[test]
fn request_attributes_are_derived_as_kube_apiserver_does() {
    let record = |method: &str, path: &str, query: &str| RequestRecord {
        verb: None,
        verb_name: "",
        method: method.to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
        resource: None,
        namespace: None,
        name: None,
        content_type: None,
        field_manager: String::new(),
        body: None,
        body_size: 0,
        status: None,
        late_write: None,
        user_agent: String::new(),
        received: std::time::Instant::now(),
    };
    let call =
        |ns: Option<&str>, group: &str, resource: &str, verb: &str, name: Option<&str>| Call {
            namespace: ns.map(str::to_owned),
            group: group.to_owned(),
            resource: resource.to_owned(),
            verb: verb.to_owned(),
            name: name.map(str::to_owned),
        };
    for (r, want) in [
        (
            record("GET", "/api/v1/nodes", "limit=500"),
            Some(call(None, "", "nodes", "list", None)),
        ),
        (
            record("GET", "/api/v1/nodes", "watch=true&resourceVersion=5"),
            Some(call(None, "", "nodes", "watch", None)),
        ),
        (
            record("GET", "/api/v1/nodes/n1", ""),
            Some(call(None, "", "nodes", "get", Some("n1"))),
        ),
        (
            record("PATCH", "/api/v1/nodes/n1/status", ""),
            Some(call(None, "", "nodes/status", "patch", Some("n1"))),
        ),
        (
            record(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
                "",
            ),
            Some(call(
                Some("kube-system"),
                "coordination.k8s.io",
                "leases",
                "update",
                Some("l"),
            )),
        ),
        (
            record(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events",
                "",
            ),
            Some(call(
                Some("default"),
                "events.k8s.io",
                "events",
                "create",
                None,
            )),
        ),
        (
            record("GET", "/api/v1/namespaces", ""),
            Some(call(None, "", "namespaces", "list", None)),
        ),
        (record("GET", "/version", ""), None),
        (record("GET", "/healthz", ""), None),
    ] {
        assert_eq!(classify(&r), want, "{r:?}");
    }
}
