//! A monitor of every state the sandbox API server passes through: attached as a commit observer
//! ([`SandboxHandle::on_commit`]), it keeps each Node's podCIDRs and checks, at **every** committed
//! Node write (not only at the end of a test), that no two Nodes' podCIDRs overlap. A violation
//! names both Nodes and the resourceVersion of the write that made it, so a failing schedule
//! points at the exact moment.
//!
//! Independent of the controller's code: CIDRs are parsed with `ipnet`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use ipnet::IpNet;
use serde_json::Value;

use crate::invariants::{name_of, pod_cidrs_of};
use crate::sandbox::{ChangeType, Commit, Resource, SandboxHandle};

/// What the monitor has seen.
#[derive(Debug, Default)]
struct State {
    /// Node name → its podCIDRs (those that parse).
    nodes: BTreeMap<String, Vec<IpNet>>,
    /// Every violation, in commit order.
    violations: Vec<String>,
    /// Node writes checked.
    commits: u64,
}

/// Checks "no two Nodes' podCIDRs overlap" at every committed write. Cheap enough for thousands
/// of Nodes: a write is checked against the other Nodes' CIDRs only when its podCIDRs change.
#[derive(Debug, Clone)]
pub struct OverlapMonitor {
    state: Arc<Mutex<State>>,
    observer: u64,
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    let same_family = matches!(
        (a, b),
        (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
    );
    same_family && (a.contains(b) || b.contains(a))
}

fn parsed(node: &Value) -> Vec<IpNet> {
    pod_cidrs_of(node)
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .map(|n| n.trunc())
        .collect()
}

impl State {
    fn set(&mut self, name: String, cidrs: Vec<IpNet>, resource_version: u64) {
        for cidr in &cidrs {
            for (other, theirs) in &self.nodes {
                if *other == name {
                    continue;
                }
                if let Some(their) = theirs.iter().find(|t| overlaps(t, cidr)) {
                    self.violations.push(format!(
                        "resourceVersion {resource_version}: Node {name} got podCIDR {cidr}, which overlaps {their} held by Node {other}"
                    ));
                }
            }
        }
        self.nodes.insert(name, cidrs);
    }
}

impl OverlapMonitor {
    /// Attaches to `sandbox`: takes its current Nodes as the starting state (they are checked
    /// too), then observes every commit.
    pub fn attach(sandbox: &SandboxHandle) -> OverlapMonitor {
        let state = Arc::new(Mutex::new(State::default()));
        {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            for node in sandbox.nodes() {
                let cidrs = parsed(&node);
                s.set(name_of(&node), cidrs, 0);
            }
        }
        let seen = state.clone();
        let observer = sandbox.on_commit(Arc::new(move |commit: &Commit<'_>| {
            if commit.resource != Resource::Nodes {
                return;
            }
            let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
            s.commits += 1;
            let name = commit.key.name.clone();
            match commit.change {
                ChangeType::Deleted => {
                    s.nodes.remove(&name);
                }
                ChangeType::Added | ChangeType::Modified => {
                    let cidrs = parsed(commit.after);
                    if s.nodes.get(&name) != Some(&cidrs) {
                        s.set(name, cidrs, commit.resource_version);
                    }
                }
            }
        }));
        OverlapMonitor { state, observer }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every overlap seen so far, in commit order (empty: none).
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// Node writes observed so far.
    pub fn commits(&self) -> u64 {
        self.state().commits
    }

    /// Stops observing `sandbox`.
    pub fn detach(&self, sandbox: &SandboxHandle) {
        sandbox.remove_commit_observer(self.observer);
    }

    /// Panics listing every violation, if there is any.
    ///
    /// # Panics
    /// When two Nodes' podCIDRs overlapped at any commit.
    pub fn assert_clean(&self) {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "{} overlapping podCIDR state(s) seen:\n{}",
            violations.len(),
            violations.join("\n")
        );
    }
}
