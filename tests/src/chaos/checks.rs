//! The chaos suite's checks besides [`crate::monitor::OverlapMonitor`] and
//! [`crate::invariants::check`]:
//!
//! - [`AllocationMonitor`], at **every** committed Node write: a podCIDR set by an update (only
//!   the controller sets podCIDRs by an update; the actor sets them only when it creates a Node)
//!   is one block per cluster CIDR, in flag order, each of exactly the node mask size inside its
//!   cluster CIDR, overlapping no service CIDR, with `spec.podCIDR = spec.podCIDRs[0]`; and podCIDRs,
//!   once set, never change;
//! - [`check_patches`], over the request log: every Node PATCH names the Node's uid, carries
//!   `timeout=<the controller's request timeout>` and its field manager, and once a controller
//!   process (one `User-Agent`) has sent a Node object (one uid) a PATCH without a definite
//!   answer (no answer, 408, 5xx), it sends that object no other podCIDRs until an answer is
//!   definite (2xx, 404, 422) — a write whose outcome is unknown is re-sent unchanged, never
//!   replaced by another block (409/429 and other 4xx leave the doubt as it was);
//! - [`pool_usage`]: the oracle's count of blocks in use per cluster CIDR (Nodes' podCIDRs and
//!   service CIDRs), to decide whether an unserved Node is waiting for a block legitimately.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ipnet::IpNet;
use serde_json::Value;

use super::plan::{block_count, family_bits};
use super::pools::PoolWatch;
use crate::invariants::{ClusterSpec, pod_cidrs_of};
use crate::sandbox::{ChangeType, Commit, RequestRecord, Resource, SandboxHandle, Verb};

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    family_bits(a) == family_bits(b) && (a.contains(b) || b.contains(a))
}

/// Why the podCIDRs an update set are not a controller allocation for `spec` (`None`: they are).
pub fn allocation_problem(spec: &ClusterSpec, node: &Value) -> Option<String> {
    let texts = pod_cidrs_of(node);
    if texts.len() != spec.cluster_cidrs.len() {
        return Some(format!(
            "{texts:?}: {} podCIDR(s) for {} cluster CIDR(s)",
            texts.len(),
            spec.cluster_cidrs.len()
        ));
    }
    if node["spec"]["podCIDR"].as_str() != texts.first().map(String::as_str) {
        return Some(format!(
            "spec.podCIDR {} is not spec.podCIDRs[0] {:?}",
            node["spec"]["podCIDR"], texts[0]
        ));
    }
    for (text, (cluster, mask)) in texts.iter().zip(&spec.cluster_cidrs) {
        let Ok(net) = text.parse::<IpNet>() else {
            return Some(format!("{text:?} is not a CIDR"));
        };
        if net.trunc() != net {
            return Some(format!("{net} has host bits set"));
        }
        if net.prefix_len() != *mask || !cluster.contains(&net) {
            return Some(format!(
                "{net} is not a /{mask} block of cluster CIDR {cluster}"
            ));
        }
        if let Some(service) = spec.service_cidrs.iter().find(|s| overlaps(s, &net)) {
            return Some(format!("{net} overlaps service CIDR {service}"));
        }
    }
    None
}

/// One podCIDR assignment the server committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// resourceVersion of the write.
    pub resource_version: u64,
    /// The Node.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// The podCIDRs it got.
    pub pod_cidrs: Vec<String>,
}

#[derive(Debug, Default)]
struct AllocationState {
    violations: Vec<String>,
    assignments: Vec<Assignment>,
    /// The ClusterCIDR variant's view ([`super::pools`]), when attached for it.
    pools: Option<PoolWatch>,
}

impl AllocationState {
    fn observe(&mut self, spec: &ClusterSpec, commit: &Commit<'_>) {
        let name = &commit.key.name;
        let rv = commit.resource_version;
        let removed = commit.change == ChangeType::Deleted;
        if commit.resource == Resource::ClusterCidrs {
            if let Some(pools) = &mut self.pools
                && let Some(problem) = pools.pool_commit(name, commit.after, removed)
            {
                self.violations
                    .push(format!("resourceVersion {rv}: {problem}"));
            }
            return;
        }
        if commit.resource != Resource::Nodes {
            return;
        }
        if commit.change == ChangeType::Modified {
            self.node_modified(spec, commit);
        }
        if let Some(pools) = &mut self.pools {
            pools.node_commit(name, (!removed).then_some(commit.after));
        }
    }

    fn node_modified(&mut self, spec: &ClusterSpec, commit: &Commit<'_>) {
        let before = commit.before.map(pod_cidrs_of).unwrap_or_default();
        let after = pod_cidrs_of(commit.after);
        if before == after {
            return;
        }
        let name = &commit.key.name;
        let rv = commit.resource_version;
        if !before.is_empty() {
            self.violations.push(format!(
                "resourceVersion {rv}: Node {name}'s podCIDRs changed from {before:?} to {after:?}"
            ));
            return;
        }
        self.assignments.push(Assignment {
            resource_version: rv,
            name: name.clone(),
            uid: commit.after["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            pod_cidrs: after.clone(),
        });
        if let Some(problem) = allocation_problem(spec, commit.after) {
            if self
                .pools
                .as_ref()
                .is_some_and(|p| p.is_pool_allocation(spec, commit.after))
            {
                return;
            }
            let pools = if self.pools.is_some() {
                " nor of any ClusterCIDR that exists"
            } else {
                ""
            };
            self.violations.push(format!(
                "resourceVersion {rv}: Node {name} was given podCIDRs that are not an allocation{pools}: {problem}"
            ));
        }
    }
}

/// Checks every podCIDR assignment the API server commits (see the module doc). Attach before
/// the controllers start; read [`AllocationMonitor::violations`] at the end.
#[derive(Debug, Clone)]
pub struct AllocationMonitor {
    state: Arc<Mutex<AllocationState>>,
    observer: u64,
}

impl AllocationMonitor {
    /// Observes every commit of `sandbox` from now on.
    pub fn attach(sandbox: &SandboxHandle, spec: ClusterSpec) -> AllocationMonitor {
        AllocationMonitor::attach_with(sandbox, spec, None)
    }

    /// As [`AllocationMonitor::attach`], for the ClusterCIDR variant (`chaos::pools`): an
    /// assignment may also come from a ClusterCIDR that exists at its commit, and a ClusterCIDR
    /// may be removed only while no Node holds a podCIDR inside it.
    pub fn attach_with_pools(sandbox: &SandboxHandle, spec: ClusterSpec) -> AllocationMonitor {
        AllocationMonitor::attach_with(sandbox, spec, Some(PoolWatch::default()))
    }

    fn attach_with(
        sandbox: &SandboxHandle,
        spec: ClusterSpec,
        pools: Option<PoolWatch>,
    ) -> AllocationMonitor {
        let state = Arc::new(Mutex::new(AllocationState {
            pools,
            ..AllocationState::default()
        }));
        let seen = state.clone();
        let observer = sandbox.on_commit(Arc::new(move |commit: &Commit<'_>| {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .observe(&spec, commit);
        }));
        AllocationMonitor { state, observer }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AllocationState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every violation so far, in commit order.
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// podCIDR assignments (updates setting podCIDRs) seen so far.
    pub fn allocations(&self) -> u64 {
        self.state().assignments.len() as u64
    }

    /// Every podCIDR assignment seen so far, in commit order.
    pub fn assignments(&self) -> Vec<Assignment> {
        self.state().assignments.clone()
    }

    /// Stops observing `sandbox`.
    pub fn detach(&self, sandbox: &SandboxHandle) {
        sandbox.remove_commit_observer(self.observer);
    }
}

/// The `timeout` query parameter of a request, parsed as kube-apiserver does.
fn timeout_of(record: &RequestRecord) -> Option<Result<Option<Duration>, String>> {
    form_urlencoded::parse(record.query.as_bytes())
        .find(|(k, _)| k == "timeout")
        .map(|(_, v)| crate::sandbox::deadline::parse_go_duration(&v))
}

/// Checks every logged Node PATCH (see the module doc). `expected_timeout` is the controller's
/// request timeout. Returns the violations and the number of PATCHes checked. The log is in
/// arrival order, which for one Node is the order one process sent its PATCHes (a Node is
/// written by one worker at a time). A status the client never read (it gave up first) is
/// logged as `None`, so the check never assumes the client knew more than it did.
pub fn check_patches(
    records: &[RequestRecord],
    expected_timeout: Duration,
    field_manager: &str,
) -> (Vec<String>, usize) {
    let mut violations = Vec::new();
    // Timeouts other than the expected one: value → (count, an example Node).
    let mut wrong_timeouts: BTreeMap<String, (usize, String)> = BTreeMap::new();
    // (User-Agent, uid) → the last PATCH without a definite answer: (its position, its podCIDRs).
    let mut in_doubt: BTreeMap<(String, String), (usize, Value)> = BTreeMap::new();
    let mut checked = 0;
    for (seq, record) in records.iter().enumerate() {
        if record.verb != Some(Verb::Patch) || record.resource != Some(Resource::Nodes) {
            continue;
        }
        checked += 1;
        let name = record.name.clone().unwrap_or_default();
        let Some(body) = &record.body else {
            violations.push(format!("PATCH of Node {name}: no JSON body logged"));
            continue;
        };
        match timeout_of(record) {
            Some(Ok(Some(t))) if t == expected_timeout => {}
            other => {
                let found = match other {
                    Some(Ok(Some(t))) => format!("timeout={t:?}"),
                    Some(Ok(None)) => "a negative timeout".to_owned(),
                    Some(Err(e)) => format!("an invalid timeout ({e})"),
                    None => "no timeout".to_owned(),
                };
                wrong_timeouts
                    .entry(found)
                    .or_insert_with(|| (0, name.clone()))
                    .0 += 1;
            }
        }
        if record.field_manager != field_manager {
            violations.push(format!(
                "PATCH of Node {name} has field manager {:?}",
                record.field_manager
            ));
        }
        let Some(uid) = body.pointer("/metadata/uid").and_then(Value::as_str) else {
            violations.push(format!(
                "PATCH of Node {name} is not pinned to a uid: {body}"
            ));
            continue;
        };
        let cidrs = body
            .pointer("/spec/podCIDRs")
            .cloned()
            .unwrap_or(Value::Null);
        let key = (record.user_agent.clone(), uid.to_owned());
        if let Some((doubt_seq, doubted)) = in_doubt.get(&key)
            && *doubted != cidrs
        {
            violations.push(format!(
                "{} sent Node {name} (uid {uid}) podCIDRs {cidrs} while its PATCH #{doubt_seq} of \
                 {doubted} had no definite answer: a write in doubt must be re-sent unchanged",
                record.user_agent
            ));
        }
        match record.status {
            // Definite: applied, can never apply, or the object is gone.
            Some(200..=299 | 404 | 422) => {
                in_doubt.remove(&key);
            }
            // The server asked to retry: nothing was written, earlier doubts stand.
            Some(409 | 429) => {}
            Some(408 | 500..=599) | None => {
                in_doubt.insert(key, (seq, cidrs));
            }
            // Refused for now (other 4xx): nothing written, earlier doubts stand.
            Some(_) => {}
        }
    }
    for (found, (count, example)) in wrong_timeouts {
        violations.push(format!(
            "{count} Node PATCH(es) carry {found}, not the request timeout {expected_timeout:?} \
             (e.g. the PATCH of Node {example}): the server may then apply a write after the \
             client and its fences gave up on it"
        ));
    }
    (violations, checked)
}

/// Blocks in use per cluster CIDR (flag order) as the Nodes and service CIDRs cover them, with
/// the capacity: `(used, capacity)`. From [`crate::invariants::check`]'s block count.
pub fn pool_usage(nodes: &[Value], spec: &ClusterSpec) -> Vec<(u64, u128)> {
    let everyone: Vec<String> = nodes.iter().map(crate::invariants::name_of).collect();
    let all: Vec<&str> = everyone.iter().map(String::as_str).collect();
    // Every Node listed as unservable: only the block count is wanted here.
    let used = match crate::invariants::check(nodes, spec, &all, None) {
        Ok(report) => report.used_blocks,
        Err(_) => BTreeMap::new(),
    };
    spec.cluster_cidrs
        .iter()
        .map(|(cluster, mask)| {
            (
                used.get(&cluster.to_string()).copied().unwrap_or(0),
                block_count(cluster, *mask),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> ClusterSpec {
        ClusterSpec::new(
            &[("10.0.0.0/16", 24), ("fd00::/104", 112)],
            &["10.0.255.0/24"],
        )
    }

    #[test]
    fn an_allocation_is_one_block_per_cluster_cidr_in_order() {
        let node = |cidrs: &[&str]| json!({"spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}});
        assert_eq!(
            allocation_problem(&spec(), &node(&["10.0.3.0/24", "fd00::1:0/112"])),
            None
        );
        for bad in [
            node(&["10.0.3.0/24"]),
            node(&["fd00::1:0/112", "10.0.3.0/24"]),
            node(&["10.0.3.0/25", "fd00::1:0/112"]),
            node(&["10.1.3.0/24", "fd00::1:0/112"]),
            node(&["10.0.255.0/24", "fd00::1:0/112"]),
            node(&["10.0.3.1/24", "fd00::1:0/112"]),
        ] {
            assert!(allocation_problem(&spec(), &bad).is_some(), "{bad}");
        }
        let split = json!({"spec": {"podCIDR": "10.0.4.0/24", "podCIDRs": ["10.0.3.0/24", "fd00::1:0/112"]}});
        assert!(allocation_problem(&spec(), &split).is_some());
    }

    fn patch(agent: &str, uid: &str, cidr: &str, status: Option<u16>) -> RequestRecord {
        RequestRecord {
            verb: Some(Verb::Patch),
            verb_name: "patch",
            method: "PATCH".into(),
            path: "/api/v1/nodes/a".into(),
            query: "fieldManager=nodeipam-controller&timeout=500ms".into(),
            resource: Some(Resource::Nodes),
            namespace: None,
            name: Some("a".into()),
            content_type: None,
            field_manager: "nodeipam-controller".into(),
            body: Some(
                json!({"metadata": {"uid": uid}, "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}),
            ),
            body_size: 0,
            user_agent: agent.into(),
            status,
            late_write: None,
            received: std::time::Instant::now(),
        }
    }

    #[test]
    fn a_write_in_doubt_is_re_sent_unchanged_until_its_answer_is_definite() {
        let t = Duration::from_millis(500);
        let check = |records: &[RequestRecord]| check_patches(records, t, "nodeipam-controller");
        let ok = [
            patch("p1", "u1", "10.0.0.0/24", None),
            patch("p1", "u1", "10.0.0.0/24", Some(409)),
            patch("p1", "u1", "10.0.0.0/24", Some(503)),
            // Definite: it can never apply (e.g. the object was replaced); a new block may go.
            patch("p1", "u1", "10.0.0.0/24", Some(422)),
            patch("p1", "u1", "10.0.9.0/24", Some(200)),
            // Another object of the same name, and another process, are on their own.
            patch("p1", "u2", "10.0.1.0/24", None),
            patch("p2", "u2", "10.0.2.0/24", Some(200)),
        ];
        assert_eq!(check(&ok), (vec![], 7));
        for (first, second) in [(None, Some(200)), (Some(504), Some(200)), (Some(500), None)] {
            let changed = [
                patch("p1", "u1", "10.0.0.0/24", first),
                patch("p1", "u1", "10.0.0.0/24", Some(409)),
                patch("p1", "u1", "10.0.1.0/24", second),
            ];
            assert_eq!(check(&changed).0.len(), 1, "{first:?} then {second:?}");
        }
        let mut rounded = patch("p1", "u1", "10.0.0.0/24", Some(200));
        rounded.query = "timeout=1s".into();
        assert_eq!(
            check(&[rounded.clone(), rounded]).0.len(),
            1,
            "one line per timeout"
        );
        let mut unpinned = patch("p1", "u1", "10.0.0.0/24", Some(200));
        unpinned.body = Some(json!({"spec": {"podCIDRs": ["10.0.0.0/24"]}}));
        assert_eq!(check(&[unpinned]).0.len(), 1);
    }
}
