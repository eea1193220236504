//! Write intents: the fence the API server enforces for Node writes (issue 30).
//!
//! Every PATCH of a Node's `spec.podCIDRs` that a replica sends has its **intent** — the Node's
//! name, its `metadata.uid` and the podCIDRs — committed in the Lease object first, by a
//! `metadata.resourceVersion`-preconditioned UPDATE that the replica makes as the Lease's holder.
//! A successor can take the Lease only by an UPDATE preconditioned on the version it read (the
//! compare-and-swap the election already rests on), and that UPDATE carries the intents it read
//! along. So:
//!
//! - every PATCH a deposed holder could ever land, however late the network delivers it, is named
//!   in the Lease its successor took: the successor reserves those blocks for those Nodes (as
//!   writes in doubt) before it allocates anything, and sends the same podCIDRs itself;
//! - a deposed holder cannot record a new intent (its UPDATE carries an old resourceVersion: 409),
//!   so it can never send a PATCH its successor does not know about.
//!
//! No step of this depends on time: a request, or kube-apiserver's transaction to etcd, may be
//! delivered at any later moment. Leases, deadlines and write gates now only decide *when* a
//! standby takes over (liveness). An intent leaves the Lease (lazily, with a later write) once its
//! write can no longer change anything: the PATCH was applied or refused for good, the Node showed
//! podCIDRs (immutable once set: a late write can only repeat them or be refused), or the Node
//! object is gone (PATCHes pin `metadata.uid`: a late write can never land on a re-created Node).
//!
//! **Cost** (issue 30 item 5). A Lease write carries every intent recorded before it, so the
//! controller records intents as early as it can (when it decides, ahead of its workers) and the
//! elector writes early — before its next renewal, which carries the intents anyway — only by the
//! rule of [`early_write_due`]: a full batch ([`INTENT_BATCH`] intents not yet committed), or a
//! writer waiting for its intent while credit remains (one [`INTENT_BATCH`] of credit is earned per
//! [`INTENT_BATCH`] intents recorded, at most [`INTENT_CREDIT_CAP`] is kept). So over any stretch
//! of time the early writes are at most `(intents recorded + INTENT_CREDIT_CAP) / INTENT_BATCH`
//! — at most one extra Lease write per [`INTENT_BATCH`] Node writes, plus two — whatever the
//! order and pace of the Nodes; a writer that finds no credit waits for the next renewal (at most
//! one retry period: liveness only). None of this is about safety: a PATCH still waits for a
//! committed Lease write holding its intent.
//!
//! The intents live in the Lease annotation [`WRITE_INTENTS_ANNOTATION`] as a JSON array of
//! `{"node", "uid", "podCIDRs"}` objects, sorted by node name, at most [`MAX_WRITE_INTENTS`] of
//! them (about 120 bytes each: well inside the API server's 256 KiB limit on annotations).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::coordination::v1::Lease;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The Lease annotation holding the write intents.
pub const WRITE_INTENTS_ANNOTATION: &str = "nodeipam.io/write-intents";

/// At most this many intents are held at once (writes in flight plus writes in doubt). A writer
/// that finds the log full waits until one leaves (liveness only). 1,024 intents of a 63-character
/// name, a uid and two CIDRs take ~150 KiB, inside the API server's 256 KiB for all annotations.
pub const MAX_WRITE_INTENTS: usize = 1024;

/// Intents per early Lease write: the elector writes before its next renewal once this many
/// intents are recorded that no committed write holds ([`early_write_due`]). Issue 30's goal is at
/// most one extra Lease write per 30 Nodes; 50 leaves room for writes a Node needs twice (a
/// refusal and a new allocation). The controller decides up to twice this many Nodes ahead of its
/// workers (`controller::worker`), so a batch's write is committed before a worker needs it.
pub const INTENT_BATCH: u64 = 50;

/// The most credit kept for early writes ([`early_write_due`]), in intents: two early writes'
/// worth, so a lone Node (or the last few of a burst) gets its write at once after a quiet time.
pub const INTENT_CREDIT_CAP: u64 = 2 * INTENT_BATCH;

/// What the elector knows, between two Lease writes, about the intents it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingIntents {
    /// Intents recorded (new or changed) since the generation the last committed write carried.
    pub uncommitted: u64,
    /// Whether a writer waits for a generation no committed write carried yet.
    pub demanded: bool,
    /// Credit for early writes, in intents: +1 per intent recorded, −[`INTENT_BATCH`] per early
    /// write, at most [`INTENT_CREDIT_CAP`].
    pub credit: u64,
}

/// Whether the elector writes the Lease now rather than with its next renewal (which carries the
/// intents too): a full batch of uncommitted intents, or a waiting writer while a whole batch of
/// credit remains. Pure; the rule behind the bound in the module doc. Safety does not depend on
/// it: a PATCH waits for its intent's commit whenever that comes.
pub fn early_write_due(pending: PendingIntents) -> bool {
    pending.uncommitted >= INTENT_BATCH || (pending.demanded && pending.credit >= INTENT_BATCH)
}

/// One Node write that may be in flight: PATCH `spec.podCIDRs` = `pod_cidrs` on Node `node`,
/// object `uid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteIntent {
    /// `metadata.name` of the Node.
    pub node: String,
    /// `metadata.uid` the PATCH is pinned to (`None`: the Node had none, e.g. a test double).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The podCIDRs written, canonical CIDR text, first family first.
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
}

/// The Lease's intents could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the Lease annotation {WRITE_INTENTS_ANNOTATION} does not hold write intents ({reason}); a \
     replica cannot know which Node writes may still land, so it does not take this Lease — \
     remove the annotation only once no earlier replica's write can still reach the API server"
)]
pub struct IntentsUnreadable {
    /// What is wrong with it.
    pub reason: String,
}

/// The intents a Lease holds (none without the annotation).
///
/// # Errors
/// [`IntentsUnreadable`] when the annotation is not a JSON array of intents, holds a Node twice or
/// more than [`MAX_WRITE_INTENTS`].
pub fn intents_of(lease: &Lease) -> Result<BTreeMap<String, WriteIntent>, IntentsUnreadable> {
    let Some(text) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WRITE_INTENTS_ANNOTATION))
    else {
        return Ok(BTreeMap::new());
    };
    let list: Vec<WriteIntent> = serde_json::from_str(text).map_err(|e| IntentsUnreadable {
        reason: e.to_string(),
    })?;
    if list.len() > MAX_WRITE_INTENTS {
        return Err(IntentsUnreadable {
            reason: format!("{} intents, at most {MAX_WRITE_INTENTS}", list.len()),
        });
    }
    let mut intents = BTreeMap::new();
    for intent in list {
        let node = intent.node.clone();
        if intents.insert(node.clone(), intent).is_some() {
            return Err(IntentsUnreadable {
                reason: format!("Node {node:?} is named twice"),
            });
        }
    }
    Ok(intents)
}

/// The intents this replica wants the Lease to hold, and which of them a committed Lease write
/// holds. Shared by the controller ([`WriteIntents::record`] when it decides,
/// [`WriteIntents::wait_committed`] before a PATCH, [`WriteIntents::settle`]) and the elector
/// (which writes them with every Lease UPDATE: [`WriteIntents::snapshot`],
/// [`WriteIntents::committed`]; early ones when [`WriteIntents::due`]).
#[derive(Debug)]
pub struct WriteIntents {
    state: Mutex<State>,
    /// Bumped by every change that may make an early write due ([`WriteIntents::due`]).
    signal: watch::Sender<()>,
    /// The generation of the wanted set that the last committed Lease write carried.
    committed: watch::Sender<u64>,
}

#[derive(Debug)]
struct State {
    /// Each intent with the generation that added it (the one a committed write must reach).
    wanted: BTreeMap<String, (WriteIntent, u64)>,
    generation: u64,
    /// The highest generation a writer waits for ([`WriteIntents::wait_committed`]).
    demanded: u64,
    /// Credit for early writes, in intents ([`PendingIntents::credit`]).
    credit: u64,
    /// What a predecessor left in the Lease when we took it.
    inherited: BTreeMap<String, WriteIntent>,
    /// The Lease's `leaseTransitions` our acquisition wrote (see [`WriteIntents::epoch`]).
    epoch: Option<u64>,
}

impl Default for State {
    fn default() -> Self {
        State {
            wanted: BTreeMap::new(),
            generation: 0,
            demanded: 0,
            // A first Node gets its write at once.
            credit: INTENT_CREDIT_CAP,
            inherited: BTreeMap::new(),
            epoch: None,
        }
    }
}

impl Default for WriteIntents {
    fn default() -> Self {
        WriteIntents::new()
    }
}

impl WriteIntents {
    /// An empty log.
    pub fn new() -> WriteIntents {
        WriteIntents {
            state: Mutex::new(State::default()),
            signal: watch::Sender::new(()),
            committed: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds (or replaces) the intent for `intent.node` and returns the generation a committed Lease
    /// write must reach before the PATCH may be sent ([`WriteIntents::wait_committed`]): the
    /// generation that added this very intent, so recording it again costs nothing. `None` when the
    /// log is full ([`MAX_WRITE_INTENTS`]) and this Node has no intent yet. Never waits and never
    /// asks for a write by itself (only a full batch does, [`early_write_due`]).
    pub fn record(&self, intent: WriteIntent) -> Option<u64> {
        let mut state = self.lock();
        if let Some((held, generation)) = state.wanted.get(&intent.node)
            && *held == intent
        {
            return Some(*generation);
        }
        if !state.wanted.contains_key(&intent.node) && state.wanted.len() >= MAX_WRITE_INTENTS {
            return None;
        }
        state.generation += 1;
        state.credit = (state.credit + 1).min(INTENT_CREDIT_CAP);
        let generation = state.generation;
        state
            .wanted
            .insert(intent.node.clone(), (intent, generation));
        drop(state);
        self.signal.send_replace(());
        Some(generation)
    }

    /// Drops Node `node`'s intent: its write can no longer change anything. Written with the next
    /// Lease UPDATE (no write of its own). Wakes writers waiting for room.
    pub fn settle(&self, node: &str) {
        let mut state = self.lock();
        if state.wanted.remove(node).is_some() {
            // Nothing is written for a removal alone.
            drop(state);
            self.committed.send_modify(|_| {});
        }
    }

    /// Whether Node `node` has an intent.
    pub fn contains(&self, node: &str) -> bool {
        self.lock().wanted.contains_key(node)
    }

    /// Number of intents held.
    pub fn len(&self) -> usize {
        self.lock().wanted.len()
    }

    /// Whether no intent is held.
    pub fn is_empty(&self) -> bool {
        self.lock().wanted.is_empty()
    }

    /// Takes over a Lease's intents when taking the Lease (a standby, which has none of its own):
    /// they become ours to keep in the Lease (and to resolve) and are remembered as
    /// [`WriteIntents::inherited`].
    pub fn inherit(&self, intents: BTreeMap<String, WriteIntent>) {
        let mut state = self.lock();
        state.generation += 1;
        let generation = state.generation;
        state.wanted = intents
            .iter()
            .map(|(node, intent)| (node.clone(), (intent.clone(), generation)))
            .collect();
        state.inherited = intents;
    }

    /// Notes the `leaseTransitions` our successful acquisition wrote: it grows with every change
    /// of holder, and each value is committed by the Lease's resourceVersion-preconditioned update,
    /// so no two holders ever share one and a later holder's is larger.
    pub fn set_epoch(&self, epoch: u64) {
        self.lock().epoch = Some(epoch);
    }

    /// The epoch of our holding of the Lease ([`WriteIntents::set_epoch`]); `None` before we hold
    /// it. Orders the terms of successive holders (the ClusterCIDR writer's stamps use it).
    pub fn epoch(&self) -> Option<u64> {
        self.lock().epoch
    }

    /// The Nodes whose intent is held: a write to each may still land, whenever (sorted).
    pub fn nodes(&self) -> Vec<String> {
        self.lock().wanted.keys().cloned().collect()
    }

    /// The intents inherited at acquisition (sorted by Node name).
    pub fn inherited(&self) -> Vec<WriteIntent> {
        self.lock().inherited.values().cloned().collect()
    }

    /// What a Lease write must carry now: the wanted generation and the annotation value.
    pub fn snapshot(&self) -> (u64, String) {
        let state = self.lock();
        let list: Vec<&WriteIntent> = state.wanted.values().map(|(intent, _)| intent).collect();
        // Serializing plain strings cannot fail.
        let text = serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_owned());
        (state.generation, text)
    }

    /// The pending intents as [`early_write_due`] reads them.
    pub fn pending(&self) -> PendingIntents {
        // The watch before the mutex, never both at once (`wait_for_room` holds them the other way).
        let committed = *self.committed.borrow();
        let state = self.lock();
        PendingIntents {
            uncommitted: state.generation.saturating_sub(committed),
            demanded: state.demanded > committed,
            credit: state.credit,
        }
    }

    /// Resolves when an early Lease write is due ([`early_write_due`]). The elector then writes
    /// and calls [`WriteIntents::early_write`].
    pub async fn due(&self) {
        let mut signal = self.signal.subscribe();
        let _ = signal.wait_for(|()| early_write_due(self.pending())).await;
    }

    /// The elector starts an early write: it spends one batch of credit.
    pub fn early_write(&self) {
        let mut state = self.lock();
        state.credit = state.credit.saturating_sub(INTENT_BATCH);
    }

    /// A Lease write carrying generation `generation` committed.
    pub fn committed(&self, generation: u64) {
        let newer = self.committed.send_if_modified(|c| {
            let newer = generation > *c;
            if newer {
                *c = generation;
            }
            newer
        });
        if newer {
            self.signal.send_replace(());
        }
    }

    /// Waits until a committed Lease write carried generation `generation` (`true`), or until
    /// `give_up` resolves (`false`). Asks for the write: it is made at once while credit remains
    /// ([`early_write_due`]), else with the next renewal.
    pub async fn wait_committed(
        &self,
        generation: u64,
        give_up: impl std::future::Future<Output = ()>,
    ) -> bool {
        let mut committed = self.committed.subscribe();
        let reached = *committed.borrow_and_update() >= generation;
        if !reached {
            let mut state = self.lock();
            if state.demanded < generation {
                state.demanded = generation;
                drop(state);
                self.signal.send_replace(());
            }
        }
        tokio::select! {
            biased;
            done = committed.wait_for(|c| *c >= generation) => done.is_ok(),
            () = give_up => false,
        }
    }

    /// Waits until the log has room or `give_up` resolves; `false` if it gave up.
    pub async fn wait_for_room(&self, give_up: impl std::future::Future<Output = ()>) -> bool {
        let mut committed = self.committed.subscribe();
        tokio::select! {
            biased;
            room = committed.wait_for(|_| self.len() < MAX_WRITE_INTENTS) => room.is_ok(),
            () = give_up => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn intent(node: &str, cidr: &str) -> WriteIntent {
        WriteIntent {
            node: node.to_owned(),
            uid: Some(format!("uid-{node}")),
            pod_cidrs: vec![cidr.to_owned()],
        }
    }

    fn lease_with(annotation: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: annotation.map(|a| {
                    [(WRITE_INTENTS_ANNOTATION.to_owned(), a.to_owned())]
                        .into_iter()
                        .collect()
                }),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    #[test]
    fn intents_round_trip_through_the_annotation_sorted_by_node() {
        let log = WriteIntents::new();
        log.record(intent("b", "10.0.1.0/24"));
        log.record(intent("a", "10.0.0.0/24"));
        let (generation, text) = log.snapshot();
        assert_eq!(generation, 2);
        assert_eq!(
            text,
            r#"[{"node":"a","uid":"uid-a","podCIDRs":["10.0.0.0/24"]},{"node":"b","uid":"uid-b","podCIDRs":["10.0.1.0/24"]}]"#
        );
        let read = intents_of(&lease_with(Some(&text))).unwrap();
        assert_eq!(
            read.values().cloned().collect::<Vec<_>>(),
            vec![intent("a", "10.0.0.0/24"), intent("b", "10.0.1.0/24")]
        );
    }

    #[test]
    fn a_lease_without_the_annotation_holds_no_intent() {
        assert!(intents_of(&lease_with(None)).unwrap().is_empty());
    }

    #[test]
    fn an_unreadable_annotation_is_an_error_naming_it() {
        for bad in [
            "not json",
            "{}",
            r#"[{"node":"a"}]"#,
            r#"[{"node":"a","podCIDRs":["x"]},{"node":"a","podCIDRs":["y"]}]"#,
        ] {
            let error = intents_of(&lease_with(Some(bad))).unwrap_err();
            assert!(
                error.to_string().contains(WRITE_INTENTS_ANNOTATION),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn recording_the_same_intent_again_needs_no_new_write() {
        let log = WriteIntents::new();
        let first = log.record(intent("a", "10.0.0.0/24")).unwrap();
        log.committed(first);
        assert_eq!(log.pending().uncommitted, 0);
        assert_eq!(log.record(intent("a", "10.0.0.0/24")), Some(first));
        assert_eq!(log.pending().uncommitted, 0);
        let changed = log.record(intent("a", "10.0.9.0/24")).unwrap();
        assert!(changed > first && log.pending().uncommitted == 1);
    }

    #[test]
    fn an_intent_recorded_again_waits_for_its_own_generation_not_a_later_one() {
        // The controller records an intent when it decides and again before the PATCH; a write
        // committed in between holds it, so the PATCH must not wait for another one.
        let log = WriteIntents::new();
        let a = log.record(intent("a", "10.0.0.0/24")).unwrap();
        log.committed(a);
        log.record(intent("b", "10.0.1.0/24")).unwrap();
        assert_eq!(log.record(intent("a", "10.0.0.0/24")), Some(a));
    }

    #[test]
    fn settling_removes_the_intent_without_asking_for_a_write() {
        let log = WriteIntents::new();
        let generation = log.record(intent("a", "10.0.0.0/24")).unwrap();
        log.committed(generation);
        log.settle("a");
        assert!(log.is_empty());
        assert!(!early_write_due(log.pending()));
        assert_eq!(log.snapshot().1, "[]");
    }

    #[test]
    fn an_early_write_is_due_for_a_full_batch_or_a_waiting_writer_with_credit() {
        let pending = |uncommitted, demanded, credit| PendingIntents {
            uncommitted,
            demanded,
            credit,
        };
        let b = INTENT_BATCH;
        for (case, due) in [
            (pending(0, false, INTENT_CREDIT_CAP), false),
            (pending(b - 1, false, INTENT_CREDIT_CAP), false),
            (pending(b, false, 0), true),
            (pending(1, true, b), true),
            (pending(1, true, b - 1), false),
            (pending(b, true, 0), true),
        ] {
            assert_eq!(early_write_due(case), due, "{case:?}");
        }
    }

    /// Nodes one at a time, each writer waiting for its own intent, the elector writing early
    /// whenever [`early_write_due`] says so and otherwise at its renewals (every `renewal_every`
    /// Nodes; `None`: never): the early writes stay within `(Nodes + cap) / batch`.
    fn early_writes_for(nodes: u64, renewal_every: Option<u64>) -> u64 {
        let log = WriteIntents::new();
        let mut early = 0;
        for n in 0..nodes {
            let generation = log.record(intent(&format!("n{n}"), "10.0.0.0/24")).unwrap();
            // The writer asks (as `wait_committed` does).
            log.lock().demanded = generation;
            if early_write_due(log.pending()) {
                log.early_write();
                early += 1;
                log.committed(log.snapshot().0);
            } else if renewal_every.is_some_and(|every| n % every == every - 1) {
                log.committed(log.snapshot().0);
            }
            log.settle(&format!("n{n}"));
        }
        early
    }

    #[test]
    fn early_writes_are_at_most_one_per_batch_of_intents_plus_the_credit_cap() {
        for (nodes, renewal_every) in [
            (10, None),
            (1_000, None),
            (1_000, Some(7)),
            (10_000, Some(60)),
        ] {
            let early = early_writes_for(nodes, renewal_every);
            let bound = (nodes + INTENT_CREDIT_CAP) / INTENT_BATCH;
            assert!(
                early <= bound,
                "{nodes} Nodes: {early} early writes > {bound}"
            );
        }
        // A lone Node after a quiet time is written at once.
        assert_eq!(early_writes_for(1, None), 1);
        // Without the rule (a write whenever a writer waits) it would be one per Node.
        assert!(early_writes_for(1_000, None) < 1_000 / 10);
    }

    #[test]
    fn a_full_batch_is_due_without_any_writer_waiting() {
        let log = WriteIntents::new();
        for n in 0..INTENT_BATCH {
            assert!(!early_write_due(log.pending()), "{n} intents");
            log.record(intent(&format!("n{n}"), "10.0.0.0/24"));
        }
        assert!(early_write_due(log.pending()));
        let (generation, _) = log.snapshot();
        log.committed(generation);
        assert!(!early_write_due(log.pending()));
    }

    #[test]
    fn a_full_log_refuses_a_new_node_but_not_a_known_one() {
        let log = WriteIntents::new();
        for n in 0..MAX_WRITE_INTENTS {
            assert!(
                log.record(intent(&format!("n{n}"), "10.0.0.0/24"))
                    .is_some()
            );
        }
        assert_eq!(log.record(intent("new", "10.0.0.0/24")), None);
        assert!(log.record(intent("n0", "10.0.1.0/24")).is_some());
        log.settle("n1");
        assert!(log.record(intent("new", "10.0.0.0/24")).is_some());
    }

    #[test]
    fn inherited_intents_are_kept_and_remembered() {
        let log = WriteIntents::new();
        let old: BTreeMap<_, _> = [("z-3".to_owned(), intent("z-3", "10.64.16.0/24"))]
            .into_iter()
            .collect();
        log.inherit(old);
        assert_eq!(log.inherited(), vec![intent("z-3", "10.64.16.0/24")]);
        assert!(log.contains("z-3"));
        assert!(log.snapshot().1.contains("10.64.16.0/24"));
    }

    #[tokio::test]
    async fn a_writer_waits_for_the_commit_of_its_generation() {
        let log = std::sync::Arc::new(WriteIntents::new());
        let generation = log.record(intent("a", "10.0.0.0/24")).unwrap();
        let waiting = {
            let log = log.clone();
            tokio::spawn(
                async move { log.wait_committed(generation, std::future::pending()).await },
            )
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        log.committed(generation);
        assert!(waiting.await.unwrap());
        assert!(
            !log.wait_committed(generation + 1, std::future::ready(()))
                .await
        );
    }
}
