//! Writes **delivered late** (issue 30) and schedules aimed at the edges of the write-intent
//! fence, drawn from a ChaCha8 stream of the seed of their own ([`EDGE_STREAM`]): every draw of
//! the plan before issue 30 stays what it was, so a seed's plan is its old plan with some of its
//! late writes turned into delivered-late ones and 0–2 edge events inserted (with their own steps
//! and gaps). The ClusterCIDR variant's steps come from stream 1 ([`super::pools`]).
//!
//! - **Delivered late** ([`FaultAction::DeliveredLate`]): the request is applied `after` it
//!   arrived, whatever its `timeout=` (a request held on a slow or partitioned link). A quarter
//!   of the plan's late-write rules (Node PATCHes and Lease UPDATEs, including those fired before
//!   a kill, a clean stop or a Lease loss) become delivered late, keeping their answer; the delay
//!   is drawn by [`delivery_delay`]: mostly around the request's own deadline and the Lease
//!   duration, rarely up to 60 s (each such seed waits for it in the end phase).
//! - **Edge events** ([`Edge`]): a leader killed, or deposed, with writes on the wire that land
//!   after its successor took over (the successor's own PATCHes of those Nodes answered 503 until
//!   then, so the Node stays unserved when the late write lands); renewals failing while writes
//!   start just before the write gate closes (the last the gate lets through), delivered just
//!   before or after their own deadline, or later; a takeover right after a Lease UPDATE — an
//!   intent write — whose answer was lost (committed then 504, or delivered late).

use std::time::Duration;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::plan::{Action, Model, Plan, Step};
use crate::sandbox::{FaultAction, FaultRule, LateAnswer, Resource, Verb};

/// The ChaCha8 stream of a seed the delivered-late faults and edge events are drawn from
/// (stream 0: the plan; stream 1: the ClusterCIDR variant).
pub const EDGE_STREAM: u64 = 2;

/// One edge event (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The leader `kill -9`ed with delivered-late PATCHes on the wire.
    KilledWithWritesOnTheWire,
    /// The leader loses the Lease (renewals hang, reads fail) with delivered-late PATCHes on the
    /// wire.
    DeposedWithWritesOnTheWire,
    /// Renewals fail; new Nodes arrive just before the write gate closes and their PATCHes are
    /// delivered around their deadline or later.
    WritesAtTheRenewDeadline,
    /// The leader is killed right after a Lease UPDATE (which carries the write intents) was
    /// committed without its answer reaching it.
    TakeoverAfterLostIntentAnswer,
}

/// The delay of a delivered-late write, for a plan whose effective request timeout is `t` and
/// lease duration `lease`: 45 % 0.8–1.3 *T* (just before or after its own deadline), 40 %
/// 0.5–2.5 lease durations (after a successor could take over), 12 % 4–10 s, 3 % 10–60 s.
pub fn delivery_delay(rng: &mut ChaCha8Rng, t: Duration, lease: Duration) -> Duration {
    match rng.random_range(0..100u32) {
        0..=44 => t.mul_f64(rng.random_range(0.8..1.3)),
        45..=84 => lease.mul_f64(rng.random_range(0.5..2.5)),
        85..=96 => Duration::from_millis(rng.random_range(4_000..=10_000)),
        _ => Duration::from_millis(rng.random_range(10_000..=60_000)),
    }
}

impl Plan {
    /// Draws the delivered-late faults and edge events of this plan (see the module doc) from
    /// stream [`EDGE_STREAM`]; `model` is the generator's view of the Nodes at the end of the
    /// schedule (new Nodes get fresh names).
    pub(super) fn draw_fence_edges(&mut self, model: &mut Model) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(EDGE_STREAM);
        let t = self.effective_request_timeout();
        let lease = self.lease.lease_duration;
        for step in &mut self.steps {
            let rule = match &mut step.action {
                Action::Fault(rule) => Some(rule),
                Action::Kill { late_write } | Action::Stop { late_write } => late_write.as_mut(),
                Action::LoseLease { late_write, .. } => late_write.as_mut(),
                _ => None,
            };
            let Some(rule) = rule else { continue };
            if let FaultAction::LateWrite { answer, .. } = rule.action
                && rng.random_bool(0.25)
            {
                rule.action = FaultAction::DeliveredLate {
                    after: delivery_delay(&mut rng, t, lease),
                    answer,
                };
            }
        }
        let edges = *[0usize, 1, 1, 2].choose(&mut rng).unwrap_or(&1);
        for _ in 0..edges {
            let edge = *[
                Edge::KilledWithWritesOnTheWire,
                Edge::DeposedWithWritesOnTheWire,
                Edge::WritesAtTheRenewDeadline,
                Edge::TakeoverAfterLostIntentAnswer,
            ]
            .choose(&mut rng)
            .unwrap_or(&Edge::KilledWithWritesOnTheWire);
            let steps = self.edge_steps(&mut rng, model, edge);
            let at = rng.random_range(self.steps.len() / 10..=self.steps.len());
            self.steps.splice(at..at, steps);
        }
    }

    /// The steps of one edge event, with their gaps.
    fn edge_steps(&self, rng: &mut ChaCha8Rng, model: &mut Model, edge: Edge) -> Vec<Step> {
        let t = self.effective_request_timeout();
        let lease = self.lease;
        let now = |action| Step {
            gap: Duration::ZERO,
            action,
        };
        let mut steps = Vec::new();
        let mut burst = |rng: &mut ChaCha8Rng, steps: &mut Vec<Step>| -> Vec<String> {
            (0..rng.random_range(3..=8))
                .map(|_| {
                    let spec = model.new_spec(rng, 0.0);
                    model.add(&spec);
                    let name = spec.name.clone();
                    steps.push(Step {
                        gap: Duration::from_micros(rng.random_range(0..=5_000)),
                        action: Action::Create(spec),
                    });
                    name
                })
                .collect()
        };
        match edge {
            Edge::KilledWithWritesOnTheWire | Edge::DeposedWithWritesOnTheWire => {
                // Every victim's delivered-late rule is in place before the burst; the kill (or
                // Lease loss) waits until the first one was taken. Answered after the client's
                // own timeout, so the old leader sends no re-send of it before the kill.
                let mut rules = Vec::new();
                let names = burst(rng, &mut steps);
                let count = rng.random_range(1..=2usize);
                let victims: Vec<String> = names.choose_multiple(rng, count).cloned().collect();
                let mut refused = Vec::new();
                for victim in &victims {
                    let after = if rng.random_bool(0.95) {
                        lease.lease_duration.mul_f64(rng.random_range(0.7..2.5))
                    } else {
                        Duration::from_millis(rng.random_range(10_000..=60_000))
                    };
                    rules.push(
                        FaultRule::new(
                            Verb::Patch,
                            Resource::Nodes,
                            1,
                            FaultAction::DeliveredLate {
                                after,
                                answer: LateAnswer::Timeout { after: t },
                            },
                        )
                        .named(victim.clone()),
                    );
                    // Until the late write has landed, the Node's other PATCHes (the old
                    // leader's re-sends, the successor's) are answered 503 — about ten a second
                    // at the plans' retry cap of 100 ms.
                    let times = usize::try_from(after.as_millis() / 80).unwrap_or(750) + 5;
                    refused.push(
                        FaultRule::new(
                            Verb::Patch,
                            Resource::Nodes,
                            times,
                            FaultAction::Status(503),
                        )
                        .named(victim.clone()),
                    );
                }
                let first = rules[0].clone();
                steps.splice(0..0, rules.into_iter().map(|r| now(Action::Fault(r))));
                steps.push(now(Action::AwaitFault(first)));
                if edge == Edge::KilledWithWritesOnTheWire {
                    steps.push(now(Action::Kill { late_write: None }));
                    steps.extend(refused.into_iter().map(|r| now(Action::Fault(r))));
                    steps.push(Step {
                        gap: Duration::from_millis(rng.random_range(20..=600)),
                        action: Action::Start,
                    });
                } else {
                    let rules = self.lease_loss_rules(rng);
                    steps.push(now(Action::LoseLease {
                        rules,
                        late_write: None,
                    }));
                    steps.extend(refused.into_iter().map(|r| now(Action::Fault(r))));
                }
            }
            Edge::WritesAtTheRenewDeadline => {
                // The gate closes at the last renewal + lease duration − T; renewals happen every
                // retry period until the Lease faults begin.
                let rules = self.lease_loss_rules(rng);
                steps.push(now(Action::LoseLease {
                    rules,
                    late_write: None,
                }));
                let closes = lease.lease_duration.saturating_sub(t);
                let gap = closes
                    .saturating_sub(lease.retry_period.mul_f64(rng.random_range(0.0..1.5)))
                    .saturating_sub(Duration::from_millis(rng.random_range(0..=100)));
                let after = if rng.random_bool(0.7) {
                    t.mul_f64(rng.random_range(0.8..1.3))
                } else {
                    delivery_delay(rng, t, lease.lease_duration)
                };
                let late = FaultRule::new(
                    Verb::Patch,
                    Resource::Nodes,
                    rng.random_range(3..=10),
                    FaultAction::DeliveredLate {
                        after,
                        answer: if rng.random_bool(0.5) {
                            LateAnswer::DropConnection
                        } else {
                            LateAnswer::Timeout { after: t }
                        },
                    },
                );
                steps.push(Step {
                    gap,
                    action: Action::Fault(late),
                });
                burst(rng, &mut steps);
            }
            Edge::TakeoverAfterLostIntentAnswer => {
                burst(rng, &mut steps);
                let action = match rng.random_range(0..3u32) {
                    0 => FaultAction::CommitThenStatus(504),
                    1 => FaultAction::DeliveredLate {
                        after: delivery_delay(rng, t, lease.lease_duration),
                        answer: LateAnswer::DropConnection,
                    },
                    _ => FaultAction::DeliveredLate {
                        after: t.mul_f64(rng.random_range(0.1..0.9)),
                        answer: LateAnswer::Timeout {
                            after: t.mul_f64(rng.random_range(0.0..0.1)),
                        },
                    },
                };
                let lost = FaultRule::new(Verb::Update, Resource::Leases, 1, action);
                steps.push(now(Action::Kill {
                    late_write: Some(lost),
                }));
                steps.push(Step {
                    gap: Duration::from_millis(rng.random_range(20..=600)),
                    action: Action::Start,
                });
            }
        }
        steps
    }

    /// Lease faults that make the holder lose the Lease: UPDATEs hang past the renew deadline,
    /// GETs fail (every replica sees them; the standby takes over once they are spent).
    fn lease_loss_rules(&self, rng: &mut ChaCha8Rng) -> Vec<FaultRule> {
        let deadline = self.lease.renew_deadline;
        vec![
            FaultRule::new(
                Verb::Update,
                Resource::Leases,
                rng.random_range(3..=8),
                FaultAction::Hang(deadline.mul_f64(rng.random_range(0.6..1.2))),
            ),
            FaultRule::new(
                Verb::Get,
                Resource::Leases,
                rng.random_range(3..=12),
                FaultAction::Status(500),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds 0–199 draw delivered-late writes (at most 60 s, some over 10 s), every edge event's
    /// shape, and the same plan every time.
    #[test]
    fn seeds_draw_delivered_late_writes_and_every_edge() {
        let (mut delivered, mut long, mut awaited, mut lost_answers, mut at_deadline) =
            (0, 0, 0, 0, 0);
        for seed in 0..200 {
            let plan = Plan::generate(seed);
            assert_eq!(plan, Plan::generate(seed));
            for (i, step) in plan.steps.iter().enumerate() {
                let rule = match &step.action {
                    Action::Fault(rule) | Action::AwaitFault(rule) => Some(rule),
                    Action::Kill { late_write }
                    | Action::Stop { late_write }
                    | Action::LoseLease { late_write, .. } => late_write.as_ref(),
                    _ => None,
                };
                if let Some(FaultAction::DeliveredLate { after, .. }) = rule.map(|r| &r.action) {
                    assert!(*after <= Duration::from_secs(60), "seed {seed}: {after:?}");
                    delivered += 1;
                    long += usize::from(*after >= Duration::from_secs(10));
                }
                match &step.action {
                    Action::AwaitFault(_) => awaited += 1,
                    Action::Kill {
                        late_write: Some(rule),
                    } if rule.resource == Some(Resource::Leases) => lost_answers += 1,
                    Action::Fault(rule)
                        if matches!(rule.action, FaultAction::DeliveredLate { .. })
                            && i > 0
                            && matches!(
                                plan.steps[i - 1].action,
                                Action::LoseLease {
                                    late_write: None,
                                    ..
                                }
                            ) =>
                    {
                        at_deadline += 1;
                    }
                    _ => {}
                }
            }
        }
        assert!(delivered > 200, "{delivered} delivered-late rules");
        // Most delays are short (seeds stay fast), a few reach 10–60 s.
        assert!(
            long > 0 && long * 10 < delivered,
            "{long} of {delivered} delivered 10 s late or later"
        );
        assert!(
            awaited >= 10,
            "{awaited} kills or Lease losses with writes on the wire"
        );
        assert!(
            lost_answers >= 10,
            "{lost_answers} takeovers after a lost intent answer"
        );
        assert!(
            at_deadline >= 10,
            "{at_deadline} writes at the renew deadline"
        );
    }
}
