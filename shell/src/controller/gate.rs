//! When a Node PATCH may be sent: the write intent committed in the Lease (safety), then the
//! write gate (liveness).

use std::sync::Arc;
use std::time::Duration;

use nodeipam_core::Cidr;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::leader::{Leadership, WriteIntent, WriteIntents};

/// When a new PATCH may start.
///
/// - **Safety: the write intent.** With leader election, a PATCH is sent only once its intent
///   (Node, uid, podCIDRs) is in a Lease write that committed while this replica held the Lease
///   (recorded when decided, `WriteGate::record_ahead`; waited for before the send,
///   `WriteGate::record_intent`; `leader::intents`): a successor takes the Lease with every such
///   intent and holds those blocks for those Nodes, so a PATCH that reaches the API server at any
///   later time cannot give a block to a second Node. No timing is assumed.
/// - Liveness: not before `not_before`. Without leader election, after a restart a write the
///   previous process sent just before it died may still be applied until that write's own
///   deadline (`timeout=` = the request timeout); the first list, and with it every allocation,
///   waits for this instant (`pipeline::run`). This is a timing assumption: see README's
///   "Never one CIDR for two Nodes" for what it does not cover.
/// - Liveness: with leader election, only while the Lease is surely ours for longer than a whole
///   write ([`Leadership::may_start_write`]): a leader that cannot renew stops sending before a
///   standby may take over, so its writes are not refused after the fact (the intent already
///   makes them harmless).
///
/// `WriteGate::wait` must be the last wait before the request is sent (after the write window,
/// the token bucket and the intent): it says the Lease is ours *now*, not when the request leaves
/// later.
#[derive(Debug, Clone)]
pub struct WriteGate {
    /// No write starts before this instant.
    pub not_before: Instant,
    /// With leader election: the elector's state.
    pub lease: Option<watch::Receiver<Leadership>>,
    /// The longest one write may take: the request timeout.
    pub write_duration: Duration,
    /// With leader election: the write intents kept in the Lease (`None`: no intent is recorded).
    pub intents: Option<Arc<WriteIntents>>,
}

impl WriteGate {
    /// Waits until a write may start. `false`: it never may (leadership is gone).
    pub(super) async fn wait(&self) -> bool {
        tokio::time::sleep_until(self.not_before).await;
        let Some(lease) = &self.lease else {
            return true;
        };
        let mut lease = lease.clone();
        loop {
            {
                let state = lease.borrow_and_update();
                if state.may_start_write(Instant::now(), self.write_duration) {
                    return true;
                }
                if matches!(*state, Leadership::Lost | Leadership::Stopped) {
                    return false;
                }
            }
            // The fence moves with every renewal; a renewal that comes too late means Lost.
            let next_renewal = tokio::time::sleep(self.write_duration.min(Duration::from_secs(1)));
            tokio::select! {
                changed = lease.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
                () = next_renewal => {}
            }
        }
    }

    /// Records the intent to PATCH Node `node` (object `uid`) with `pod_cidrs` as soon as it is
    /// decided, ahead of the worker that sends it: the Lease write that commits it then carries the
    /// intents of every Node decided meanwhile (see `leader::intents` on the cost). Never waits; a
    /// full log records nothing here ([`WriteGate::record_intent`] waits for room later).
    pub(super) fn record_ahead(&self, node: &str, uid: Option<&str>, pod_cidrs: &[Cidr]) {
        if let Some(intents) = &self.intents {
            let _ = intents.record(intent(node, uid, pod_cidrs));
        }
    }

    /// How many Nodes the dispatcher decides ahead of its workers: none without intents; with
    /// them two batches ([`crate::leader::INTENT_BATCH`]), so that the Lease write committing one
    /// batch is under way while the workers send the other.
    pub(super) fn decide_ahead(&self) -> usize {
        match &self.intents {
            Some(_) => usize::try_from(2 * crate::leader::INTENT_BATCH).unwrap_or(usize::MAX),
            None => 0,
        }
    }

    /// Records the intent to PATCH Node `node` (object `uid`) with `pod_cidrs` and waits until a
    /// committed Lease write holds it. `true`: the PATCH may be sent (or no intents are kept);
    /// `false`: leadership ended first, the PATCH must not be sent. Waits for room while the log
    /// is full ([`crate::leader::MAX_WRITE_INTENTS`]).
    pub(super) async fn record_intent(
        &self,
        node: &str,
        uid: Option<&str>,
        pod_cidrs: &[Cidr],
    ) -> bool {
        let Some(intents) = &self.intents else {
            return true;
        };
        let intent = intent(node, uid, pod_cidrs);
        loop {
            if let Some(generation) = intents.record(intent.clone()) {
                return intents
                    .wait_committed(generation, self.leadership_ended())
                    .await;
            }
            if !intents.wait_for_room(self.leadership_ended()).await {
                return false;
            }
        }
    }

    /// Resolves when this replica no longer leads (never without leader election).
    fn leadership_ended(&self) -> impl std::future::Future<Output = ()> + use<> {
        let lease = self.lease.clone();
        async move {
            match lease {
                Some(mut lease) => {
                    let _ = lease.wait_for(|l| !l.is_leading()).await;
                }
                None => std::future::pending().await,
            }
        }
    }
}

/// The intent of a PATCH of `pod_cidrs` to Node `node`, object `uid`.
fn intent(node: &str, uid: Option<&str>, pod_cidrs: &[Cidr]) -> WriteIntent {
    WriteIntent {
        node: node.to_owned(),
        uid: uid.map(str::to_owned),
        pod_cidrs: pod_cidrs.iter().map(ToString::to_string).collect(),
    }
}
