//! Issue 16 (6): `deploy/`'s RBAC is enough on the real server (zero 403s), and each rule is
//! needed (each removed in turn: a 403).

use super::{
    apply_rbac, audited, client_as, common, create_fixture_nodes, deploy, request_token, secure,
    start_audited, wait_for,
};
use std::collections::BTreeSet;

use common::{election, fast_config, init_tracing, ipam, masks, spawn_with_client};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodeipam::reasons;
use serde_json::{Value, json};

/// Issue 16 (6), the first half: `deploy/`'s rendered RBAC (`kubectl kustomize deploy`: the
/// ServiceAccount, ClusterRole/Binding and Roles/Bindings) applied to the real server, the
/// controller run with its ServiceAccount's token from the real TokenRequest API through every
/// path that talks to the API server — streaming list and watch of Nodes, their PATCH, events
/// created and then patched as a series (a pool of two blocks for four Nodes repeats
/// CIDRNotAvailable), the Lease created, renewed and released, one scrape of the secure port
/// (TokenReview, SubjectAccessReview) — and kube-apiserver's audit log shows each of those calls
/// by the ServiceAccount and not one 403. The second half, each rule removed in turn:
/// [`rbac_rules_are_each_needed_on_the_real_server`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_rbac_is_enough_on_the_real_server() {
    const SA_USER: &str = "system:serviceaccount:kube-system:nodeipam-controller";
    init_tracing();
    let (cluster, audit_log, _audit_dir) = start_audited().await;
    let admin = cluster.admin_client().await.unwrap();

    // deploy/'s RBAC, as rendered for operators.
    let applied = apply_rbac(&admin, &deploy::rendered("deploy")).await;
    assert!(applied.contains(&"ClusterRole".to_owned()) && applied.contains(&"Role".to_owned()));

    // The ServiceAccount's token from the real TokenRequest API.
    let token = request_token(&admin, "kube-system", "nodeipam-controller").await;
    let client = client_as(&cluster, "nodeipam-sa", &token).await;

    let nodes: Api<Node> = Api::all(admin.clone());
    create_fixture_nodes(&nodes, "05-aws-4nodes-no-podcidr.json").await;
    let _ = secure::metrics_handle();
    let mut config = fast_config(ipam("10.244.0.0/23", "", masks(Some(24), None, None)));
    config.leader_election = Some(election("rbac-test_1"));
    let running = spawn_with_client(client.clone(), config);
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let repeated = wait_for(|| async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        let not_available: Vec<&Event> = list
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reasons::CIDR_NOT_AVAILABLE))
            .collect();
        // Two Nodes served, two without a block: their events repeat as a series.
        not_available.len() == 2 && not_available.iter().all(|e| e.series.is_some())
    })
    .await;
    assert!(repeated, "no repeated CIDRNotAvailable events");
    let serving = secure::resolve(&["--bind-address=127.0.0.1"], &client).await;
    let server = secure::start(serving, running.health.clone(), None).await;
    let scrape = secure::get(
        &server,
        "/metrics",
        Some(nodeipam_tests::real_apiserver::ADMIN_TOKEN),
    )
    .await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    drop(server);
    running.stop().await;

    let calls = audited(&audit_log, SA_USER);
    let forbidden: Vec<&(String, String, u16)> = calls.iter().filter(|c| c.2 == 403).collect();
    let kinds: BTreeSet<(&str, &str)> = calls
        .iter()
        .map(|(verb, target, _)| (verb.as_str(), target.as_str()))
        .collect();
    eprintln!(
        "audit: {} requests by {SA_USER}, {} answered 403; calls: {kinds:?}",
        calls.len(),
        forbidden.len()
    );
    assert!(forbidden.is_empty(), "403s: {forbidden:?}");
    for expected in [
        ("watch", "/nodes"),
        ("patch", "/nodes"),
        ("create", "events.k8s.io/events"),
        ("patch", "events.k8s.io/events"),
        ("create", "coordination.k8s.io/leases"),
        ("update", "coordination.k8s.io/leases"),
        ("create", "authentication.k8s.io/tokenreviews"),
        ("create", "authorization.k8s.io/subjectaccessreviews"),
    ] {
        assert!(kinds.contains(&expected), "no {expected:?} in {kinds:?}");
    }
}

/// The controller path that needs an RBAC rule: what one variant of
/// [`rbac_rules_are_each_needed_on_the_real_server`] drives, alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum RbacPath {
    /// The informer's streaming list and watch of Nodes (the default on 1.36).
    StreamingList,
    /// The informer's paged LIST (what it falls back to on servers without streaming lists;
    /// `InitialList::Paged` here).
    PagedList,
    /// A Node's uid-pinned PATCH of `spec.podCIDR(s)`.
    Assign,
    /// The GET of a Node after a PATCH that cannot apply (here refused with 422 by a
    /// ValidatingAdmissionPolicy on labelled Nodes, so the controller re-reads the Node).
    Reread,
    /// The events about a Node that gets no block (a pool of two blocks, three Nodes):
    /// `CIDRNotAvailable` created, then patched as a series when it repeats.
    Events,
    /// Leader election on the Lease (get, create when missing, update to renew).
    LeaderElection,
    /// The secure port's delegated TokenReview and SubjectAccessReview (one `/metrics` scrape).
    SecurePort,
}

/// Which path needs `verb` on `group/resource` (`None`: no path of the controller is known to).
fn rbac_path(group: &str, resource: &str, verb: &str) -> Option<RbacPath> {
    match (group, resource, verb) {
        ("", "nodes", "watch") => Some(RbacPath::StreamingList),
        ("", "nodes", "list") => Some(RbacPath::PagedList),
        ("", "nodes", "get") => Some(RbacPath::Reread),
        ("", "nodes", "patch") => Some(RbacPath::Assign),
        ("events.k8s.io", "events", "create" | "patch") => Some(RbacPath::Events),
        ("coordination.k8s.io", "leases", "get" | "create" | "update") => {
            Some(RbacPath::LeaderElection)
        }
        ("authentication.k8s.io", "tokenreviews", "create")
        | ("authorization.k8s.io", "subjectaccessreviews", "create") => Some(RbacPath::SecurePort),
        _ => None,
    }
}

/// deploy/'s RBAC with one rule removed (one verb of one rule) or narrowed (its `resourceNames`
/// replaced by another name), renamed so every variant has its own ServiceAccount and roles.
struct RbacVariant {
    /// The change, e.g. ``ClusterRole nodeipam-controller: `get` on ["nodes"] removed``.
    change: String,
    /// The requests that lost their permission: `(verb, "group/resource")`, as [`audited`]
    /// names them.
    denied: Vec<(String, String)>,
    /// The path that needs the rule.
    path: RbacPath,
    /// The variant's ClusterRole/Role/Bindings.
    docs: Vec<Value>,
    /// Its ServiceAccount (in `kube-system`).
    account: String,
}

/// The strings of a JSON array (empty if it is not one).
fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One variant per verb of every rule of every Role/ClusterRole in `rendered`, and one per rule
/// with `resourceNames`. Panics when a rule names a request no controller path is known to need
/// (an unused rule: say so and remove it from deploy/).
fn rbac_variants(rendered: &[Value]) -> Vec<RbacVariant> {
    const RBAC_KINDS: [&str; 4] = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let rbac: Vec<Value> = rendered
        .iter()
        .filter(|d| RBAC_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .cloned()
        .collect();
    // (the change, the requests it denies, the changed documents)
    type Change = (String, Vec<(String, String)>, Vec<Value>);
    let mut changes: Vec<Change> = Vec::new();
    for (d, doc) in rbac.iter().enumerate() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let role = format!("{kind} {}", doc["metadata"]["name"].as_str().unwrap());
        for (r, rule) in doc["rules"].as_array().unwrap().iter().enumerate() {
            let groups = strings(&rule["apiGroups"]);
            let resources = strings(&rule["resources"]);
            let verbs = strings(&rule["verbs"]);
            let targets = |verbs: &[String]| -> Vec<(String, String)> {
                let mut out = Vec::new();
                for verb in verbs {
                    for group in &groups {
                        for resource in &resources {
                            out.push((verb.clone(), format!("{group}/{resource}")));
                        }
                    }
                }
                out
            };
            for verb in &verbs {
                let mut docs = rbac.clone();
                let rules = docs[d]["rules"].as_array_mut().unwrap();
                let rest: Vec<&String> = verbs.iter().filter(|v| *v != verb).collect();
                if rest.is_empty() {
                    rules.remove(r);
                } else {
                    rules[r]["verbs"] = json!(rest);
                }
                changes.push((
                    format!("{role}: `{verb}` on {resources:?} removed"),
                    targets(std::slice::from_ref(verb)),
                    docs,
                ));
            }
            let names = strings(&rule["resourceNames"]);
            if !names.is_empty() {
                let mut docs = rbac.clone();
                let others: Vec<String> = names.iter().map(|n| format!("not-{n}")).collect();
                docs[d]["rules"][r]["resourceNames"] = json!(others);
                changes.push((
                    format!("{role}: {verbs:?} on {resources:?} narrowed to resourceNames {others:?} instead of {names:?}"),
                    targets(&verbs),
                    docs,
                ));
            }
        }
    }
    changes
        .into_iter()
        .enumerate()
        .map(|(i, (change, denied, mut docs))| {
            let account = format!("nodeipam-v{i}");
            for doc in &mut docs {
                let name = format!("{}-v{i}", doc["metadata"]["name"].as_str().unwrap());
                doc["metadata"]["name"] = json!(name);
                if doc["roleRef"].is_object() {
                    let role = format!("{}-v{i}", doc["roleRef"]["name"].as_str().unwrap());
                    doc["roleRef"]["name"] = json!(role);
                }
                if let Some(subjects) = doc["subjects"].as_array_mut() {
                    for subject in subjects {
                        subject["name"] = json!(account);
                    }
                }
            }
            let paths: BTreeSet<Option<RbacPath>> = denied
                .iter()
                .map(|(verb, target)| {
                    let (group, resource) = target.split_once('/').unwrap();
                    rbac_path(group, resource, verb)
                })
                .collect();
            let path = match paths.into_iter().collect::<Vec<_>>()[..] {
                [Some(path)] => path,
                _ => panic!(
                    "{change}: no single controller path is known to need {denied:?} — an unused \
                     rule? (check the controller's code; remove it from deploy/ if nothing sends it)"
                ),
            };
            RbacVariant {
                change,
                denied,
                path,
                docs,
                account,
            }
        })
        .collect()
}

/// The label of the Nodes whose updates the test's ValidatingAdmissionPolicy refuses.
const REFUSE_LABEL: &str = "nodeipam-test/refuse-updates";

/// A ValidatingAdmissionPolicy (and its binding) refusing every UPDATE (PATCH included) of a
/// Node labelled [`REFUSE_LABEL`] with `422 Invalid`; returns once the server enforces it (a
/// probe Node's label PATCH is refused).
async fn refuse_updates_of_labelled_nodes(admin: &Client, template: &Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "nodeipam-test-refuse-updates"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "objectSelector": {"matchLabels": {REFUSE_LABEL: "true"}},
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["nodes"]
                }]
            },
            "validations": [{
                "expression": "false",
                "message": "updates of this Node are refused by the test",
                "reason": "Invalid"
            }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "nodeipam-test-refuse-updates"},
        "spec": {"policyName": "nodeipam-test-refuse-updates", "validationActions": ["Deny"]}
    });
    for (path, body) in [
        (
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            policy,
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
            binding,
        ),
    ] {
        let request = http::Request::post(path)
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        admin.request::<Value>(request).await.unwrap();
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut probe = common::node_like(template, "refuse-probe");
    probe["metadata"]["labels"][REFUSE_LABEL] = json!("true");
    let probe: Node = serde_json::from_value(probe).unwrap();
    nodes.create(&PostParams::default(), &probe).await.unwrap();
    let mut n = 0;
    let enforced = wait_for(|| {
        n += 1;
        let patch = json!({"metadata": {"labels": {"probe": n.to_string()}}});
        let nodes = nodes.clone();
        async move {
            matches!(
                nodes.patch("refuse-probe", &PatchParams::default(), &Patch::Merge(&patch)).await,
                Err(kube::Error::Api(status)) if status.code == 422
            )
        }
    })
    .await;
    assert!(enforced, "the ValidatingAdmissionPolicy was not enforced");
    nodes
        .delete("refuse-probe", &DeleteParams::default())
        .await
        .unwrap();
}

/// Creates Nodes `names` from `template` (labelled [`REFUSE_LABEL`] if `refused`).
async fn create_nodes(nodes: &Api<Node>, template: &Value, names: &[String], refused: bool) {
    for name in names {
        let mut node = common::node_like(template, name);
        if refused {
            node["metadata"]["labels"][REFUSE_LABEL] = json!("true");
        }
        let node: Node = serde_json::from_value(node).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
}

/// Issue 16 (6), the second half: no rule of `deploy/`'s RBAC is unused. For every verb of every
/// rule (and every `resourceNames` restriction, narrowed to another name) a variant of the
/// rendered RBAC without it is applied to the real server under a ServiceAccount of its own, the
/// one controller path that needs the rule is driven with that account's token (from the real
/// TokenRequest API), and kube-apiserver's audit log must show that path's request answered 403
/// for that account. The rule → path → failure table is printed and kept in tests/FIDELITY.md.
/// With every rule present, `deploy_rbac_is_enough_on_the_real_server` shows zero 403s, so
/// together: each rule is needed and all of them are enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_rules_are_each_needed_on_the_real_server() {
    init_tracing();
    let (cluster, audit_log, _audit_dir) = start_audited().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    let variants = rbac_variants(&deploy::rendered("deploy"));
    let paths: BTreeSet<String> = variants.iter().map(|v| format!("{:?}", v.path)).collect();
    assert_eq!(paths.len(), 7, "every path driven at least once: {paths:?}");
    refuse_updates_of_labelled_nodes(&admin, &template).await;
    let _ = secure::metrics_handle();

    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        // A clean slate: no Node, no Lease.
        nodes
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
        let _ = leases
            .delete("nodeipam-controller", &DeleteParams::default())
            .await;
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": variant.account}})).unwrap();
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap();
        apply_rbac(&admin, &variant.docs).await;
        let token = request_token(&admin, "kube-system", &variant.account).await;
        let client = client_as(&cluster, &variant.account, &token).await;
        let names: Vec<String> = (0..3).map(|n| format!("v{i}-node-{n}")).collect();

        let mut config = fast_config(ipam("10.244.0.0/16", "", masks(None, None, None)));
        let mut running = None;
        let mut server = None;
        let mut scrape = None;
        match variant.path {
            RbacPath::StreamingList => {}
            RbacPath::PagedList => {
                config.initial_list = nodeipam::controller::InitialList::Paged;
            }
            RbacPath::Assign => create_nodes(&nodes, &template, &names[..1], false).await,
            RbacPath::Reread => create_nodes(&nodes, &template, &names[..1], true).await,
            RbacPath::Events => {
                config = fast_config(ipam("10.244.0.0/23", "", masks(Some(24), None, None)));
                create_nodes(&nodes, &template, &names, false).await;
            }
            RbacPath::LeaderElection => {
                config.leader_election = Some(election(&variant.account));
            }
            RbacPath::SecurePort => {
                let serving = secure::resolve(&["--bind-address=127.0.0.1"], &client).await;
                let started =
                    secure::start(serving, nodeipam::controller::Health::new(), None).await;
                let answer = secure::get(
                    &started,
                    "/metrics",
                    Some(nodeipam_tests::real_apiserver::ADMIN_TOKEN),
                )
                .await;
                scrape = Some(answer.status);
                server = Some(started);
            }
        }
        if variant.path != RbacPath::SecurePort {
            running = Some(spawn_with_client(client, config));
        }
        let user = format!("system:serviceaccount:kube-system:{}", variant.account);
        let mut seen = Vec::new();
        let failed = wait_for(|| {
            seen = audited(&audit_log, &user)
                .into_iter()
                .filter(|(verb, target, code)| {
                    *code == 403 && variant.denied.contains(&(verb.clone(), target.clone()))
                })
                .collect();
            let found = !seen.is_empty();
            async move { found }
        })
        .await;
        if let Some(running) = running {
            running.abort().await;
        }
        drop(server);
        let failure = seen
            .first()
            .map(|(verb, target, code)| format!("{code} on {verb} {target}"))
            .unwrap_or_else(|| "nothing failed".to_owned());
        let scrape = scrape
            .map(|s| format!("; the scrape got {s}"))
            .unwrap_or_default();
        rows.push(format!(
            "| {} | {:?} | {failure}{scrape} |",
            variant.change, variant.path
        ));
        if !failed {
            missing.push(variant.change.clone());
        }
    }
    eprintln!("| rule taken away | path driven | what failed (audit log) |\n|---|---|---|");
    for row in &rows {
        eprintln!("{row}");
    }
    eprintln!(
        "{} variants, {} without a failure",
        rows.len(),
        missing.len()
    );
    assert!(
        missing.is_empty(),
        "rules whose removal broke nothing (unused?): {missing:#?}"
    );
}
