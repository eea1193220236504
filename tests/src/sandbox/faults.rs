//! Fault injection: make the next N matching requests fail, hang or slow down.

use std::time::Duration;

use super::resource::{Resource, Verb};

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this HTTP code and a `Status` body (e.g. 500, 503, 409), without running it.
    Status(u16),
    /// Answer 429 `TooManyRequests` with `Retry-After: retry_after_secs`, without running it.
    TooManyRequests {
        /// Seconds in the `Retry-After` header.
        retry_after_secs: u64,
    },
    /// Do not run the request; hold it this long (until the client gives up), then answer 504.
    Hang(Duration),
    /// For a WATCH: do not run it; answer 200 with one `ERROR` event carrying a `Status` of this
    /// code, then end the stream — as kube-apiserver without the watch cache ends a watch that
    /// starts exactly at etcd's compaction revision (`500 InternalError` "etcd event received
    /// with PrevKv=nil", tests/FIDELITY.md).
    WatchError(u16),
    /// Run the request normally after this delay.
    Delay(Duration),
    /// Run the request (the write is committed), then answer with this code instead of the result:
    /// the client sees a failure although the change happened.
    CommitThenStatus(u16),
    /// Run the request (the write is committed), then hold the answer this long and answer 504:
    /// a timeout whose write nevertheless happened.
    CommitThenHang(Duration),
    /// A write that is committed late while its client is answered early — what a client sees
    /// when kube-apiserver's request times out (or its connection breaks) but the write still
    /// reaches etcd.
    ///
    /// The request is run `commit_after` after it arrived, on its own task (so it happens even if
    /// the client has disconnected), against the store **as it is then** — as `GuaranteedUpdate`
    /// applies a patch to the current object: if the object was deleted, got another uid (and the
    /// write pins the uid) or got other podCIDRs meanwhile, the write fails, and the failure is
    /// only visible in the request log ([`super::RequestRecord::late_write`]); a success is a
    /// normal commit (watch event, commit observers). The client gets `answer` instead of the
    /// result. The response delay ([`super::SandboxHandle::set_delay`]) does not apply: both
    /// times count from the arrival. Meant for writes; another verb is run late too and its
    /// result dropped.
    LateWrite {
        /// Time from the request's arrival to the commit.
        commit_after: Duration,
        /// What the client gets.
        answer: LateAnswer,
    },
    /// A request **delivered late** (issue 30): its bytes were held on a slow or partitioned link
    /// (a TCP connection delivers what it buffered when the partition heals), so the API server
    /// runs it `after` it was sent, **whatever its `timeout=`** — kube-apiserver's deadline starts
    /// when a request arrives, and etcd re-arms gRPC's relative timeout where the transaction
    /// arrives. Run as [`FaultAction::LateWrite`] (its own task, against the store as it is then)
    /// but never refused for a passed deadline; the client gets `answer`.
    DeliveredLate {
        /// Time from the request's arrival at the sandbox to its commit.
        after: Duration,
        /// What the client gets.
        answer: LateAnswer,
    },
}

/// What the client of a [`FaultAction::LateWrite`] gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateAnswer {
    /// `after` the request arrived: **504** as kube-apiserver's timeout filter writes it
    /// (`WithTimeoutForNonLongRunningRequests`, `apiserver/pkg/server/filters/timeout.go`): a
    /// `Status` with reason `Timeout`, message `Timeout: request did not complete within the
    /// allotted timeout`, `details: {}`, and (the filter encodes the bare `metav1.Status`) no
    /// `kind`/`apiVersion`, sent as `text/plain; charset=utf-8` (Go's content sniffing; the filter
    /// sets no Content-Type).
    Timeout {
        /// Time from the request's arrival to the answer.
        after: Duration,
    },
    /// Once the request has been read, the connection is closed without an answer: the client
    /// sees a transport error (connection closed before the response), not an HTTP status. The
    /// request log keeps `status: None` for it.
    DropConnection,
}

/// A fault rule: requests matching `verb`/`resource`/`name` (each `None` = any) get `action`,
/// `times` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// Verb to match, `None` = any.
    pub verb: Option<Verb>,
    /// Resource to match, `None` = any.
    pub resource: Option<Resource>,
    /// Object name to match, `None` = any.
    pub name: Option<String>,
    /// How many more requests this rule fires for.
    pub times: usize,
    /// What happens.
    pub action: FaultAction,
}

impl FaultRule {
    /// Fail the next `times` requests of `verb` on `resource` with `action`.
    pub fn new(verb: Verb, resource: Resource, times: usize, action: FaultAction) -> Self {
        FaultRule {
            verb: Some(verb),
            resource: Some(resource),
            name: None,
            times,
            action,
        }
    }

    /// Restrict the rule to one object name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    fn matches(&self, verb: Verb, resource: Resource, name: Option<&str>) -> bool {
        self.times > 0
            && self.verb.is_none_or(|v| v == verb)
            && self.resource.is_none_or(|r| r == resource)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

/// Take the first matching rule's action, consuming one of its `times`.
pub fn take(
    rules: &mut Vec<FaultRule>,
    verb: Verb,
    resource: Resource,
    name: Option<&str>,
) -> Option<FaultAction> {
    let rule = rules.iter_mut().find(|r| r.matches(verb, resource, name))?;
    rule.times -= 1;
    let action = rule.action.clone();
    rules.retain(|r| r.times > 0);
    Some(action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fire_n_times_and_match() {
        let mut rules = vec![
            FaultRule::new(Verb::Patch, Resource::Nodes, 2, FaultAction::Status(500)).named("a"),
        ];
        assert_eq!(
            take(&mut rules, Verb::Patch, Resource::Nodes, Some("b")),
            None
        );
        assert_eq!(
            take(&mut rules, Verb::Get, Resource::Nodes, Some("a")),
            None
        );
        assert_eq!(
            take(&mut rules, Verb::Patch, Resource::Nodes, Some("a")),
            Some(FaultAction::Status(500))
        );
        assert_eq!(
            take(&mut rules, Verb::Patch, Resource::Nodes, Some("a")),
            Some(FaultAction::Status(500))
        );
        assert_eq!(
            take(&mut rules, Verb::Patch, Resource::Nodes, Some("a")),
            None
        );
        assert!(rules.is_empty());
    }
}
