//! A clean hand-over with a write in doubt (issue 15, item 1). Two replicas with leader election;
//! the leader's PATCH of LATE is answered at once with a dropped connection and applied by the
//! API server 1.5 s later (within the request's own `timeout=` deadline, as kube-apiserver may);
//! every later PATCH of LATE is answered 503. The leader is then stopped cleanly. Before the fix
//! it released the Lease at once; the standby took it within one retry period, listed, saw LATE
//! without podCIDRs and gave LATE's block to FIRST (queued before LATE); the late write then
//! landed and both Nodes held 10.30.0.0/24. Now the stopping leader keeps the Lease (renewing it)
//! until the write in doubt can no longer be applied, and only then releases it.
//!
//! And a Lease *lost* with writes queued behind the token bucket (bug 12, chaos seed 35593): no
//! PATCH may reach the API server so late that it could land after a standby could have taken the
//! Lease over (liveness now: the write intents make such a PATCH harmless).
//!
//! And a PATCH delivered after the Lease passed on, whatever its deadline (issue 30): the
//! successor inherits its intent with the Lease and never gives its block to another Node.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, agent, fast_config, init_tracing, ipam, late_write_first_patch, masks, node_like,
    pod_cidrs, spawn_as, unserved,
};
use nodeipam::controller::ControllerConfig;
use nodeipam::leader::LeaseConfig;
use nodeipam_tests::monitor::OverlapMonitor;
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, LateAnswer, LateWriteOutcome, Resource, Sandbox, SandboxHandle, Verb,
    fixture,
};
use serde_json::{Value, json};

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
/// Its first PATCH is answered early and applied late.
const LATE: &str = "late";
/// Created after the stop; sorts before LATE, so a new leader that lists both serves it first.
const FIRST: &str = "a-first";
const LEASE_NAME: &str = "nodeipam-controller";

/// Lease 4 s / renew 3 s / retry 200 ms: the 2 s request timeout fits the Lease unshortened,
/// and a released Lease is taken within 200 ms.
fn config(ipam: &nodeipam_core::IpamConfig, identity: &str) -> ControllerConfig {
    let mut config = fast_config(ipam.clone());
    config.leader_election = Some(LeaseConfig {
        namespace: "kube-system".to_owned(),
        name: LEASE_NAME.to_owned(),
        identity: identity.to_owned(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(200),
    });
    config
}

fn late_write_outcomes(sb: &SandboxHandle) -> Vec<LateWriteOutcome> {
    sb.requests_of(Verb::Patch, Resource::Nodes)
        .into_iter()
        .filter_map(|r| r.late_write)
        .collect()
}

/// Starts replica A (it leads) and replica B (it stands by), then waits until A's PATCH of LATE
/// has met the late write armed for it: the opening of the hand-over tests with two replicas.
async fn a_leads_with_a_write_in_doubt_and_b_stands_by(
    sb: &SandboxHandle,
    ipam: &nodeipam_core::IpamConfig,
) -> (common::Running, common::Running) {
    let a = spawn_as(sb, config(ipam, "a"), "a");
    let ha = a.health.clone();
    assert!(sb.wait_until(WAIT, |_| ha.is_leading()).await, "A leads");
    let b = spawn_as(sb, config(ipam, "b"), "b");
    let hb = b.health.clone();
    assert!(sb.wait_until(WAIT, |_| hb.is_ready()).await, "B stands by");
    assert!(
        sb.wait_until(WAIT, |sb| late_write_outcomes(sb)
            == [LateWriteOutcome::Pending])
            .await,
        "A's PATCH of LATE never got the late write"
    );
    (a, b)
}
/// Position in the request log of the first Lease UPDATE that empties `holderIdentity`.
fn release_position(sb: &SandboxHandle) -> Option<usize> {
    sb.requests().into_iter().position(|r| {
        r.verb == Some(Verb::Update)
            && r.resource == Some(Resource::Leases)
            && r.body.as_ref().is_some_and(|b| {
                b["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(str::is_empty)
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_leader_keeps_the_lease_until_its_write_in_doubt_cannot_land() {
    init_tracing();
    let template = fixture(AWS)["items"][1].clone();
    let sb = Sandbox::start(
        json!({"kind": "NodeList", "apiVersion": "v1", "items": [node_like(&template, LATE)]}),
    )
    .await;
    let monitor = OverlapMonitor::attach(&sb);
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    late_write_first_patch(
        &sb,
        LATE,
        Duration::from_millis(1500),
        LateAnswer::DropConnection,
    );
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1000, FaultAction::Status(503)).named(LATE),
    );

    let (a, b) = a_leads_with_a_write_in_doubt_and_b_stands_by(&sb, &ipam).await;
    let hb = b.health.clone();

    // SIGTERM to A while its write is in doubt.
    let stop_signal_at = sb.requests().len();
    let summary = a.stop_outcome().await;
    assert!(summary.is_ok(), "A stopped cleanly: {summary:?}");
    let _ = sb.create_node(node_like(&template, FIRST));

    assert!(
        sb.wait_until(WAIT, |sb| hb.is_leading()
            && !pod_cidrs(sb, FIRST).is_empty()
            && late_write_outcomes(sb)
                .iter()
                .all(|o| !matches!(o, LateWriteOutcome::Pending)))
            .await,
        "B took over and served FIRST; late writes {:?}",
        late_write_outcomes(&sb)
    );
    monitor.assert_clean();
    assert_ne!(pod_cidrs(&sb, FIRST), pod_cidrs(&sb, LATE));

    // A renewed the Lease after the stop signal, before it released it.
    let requests = sb.requests();
    let released_at = release_position(&sb).expect("A released the Lease");
    let renewals_while_holding = requests[stop_signal_at..released_at]
        .iter()
        .filter(|r| {
            r.verb == Some(Verb::Update)
                && r.resource == Some(Resource::Leases)
                && r.user_agent == agent("a")
        })
        .count();
    assert!(
        renewals_while_holding >= 1,
        "A kept renewing the Lease while its write was in doubt"
    );
    assert!(
        matches!(
            late_write_outcomes(&sb).first(),
            Some(LateWriteOutcome::Committed { .. })
        ),
        "the late write landed on LATE: {:?}",
        late_write_outcomes(&sb)
    );
    assert_eq!(pod_cidrs(&sb, LATE), ["10.30.0.0/24"]);

    sb.clear_faults();
    let _ = b.stop_outcome().await;
    sb.shutdown().await;
}

/// Bug 12 (chaos seed 35593). A worker passed the Lease write gate, then waited for a token of
/// the token bucket (and a write-window slot), then sent its PATCH without looking at the Lease
/// again; under a rate limit that wait lasts seconds, so PATCHes let through while the Lease was
/// ours reached the API server after the leader had lost it — after the moment a standby may
/// take it over (the last successful renewal + the lease duration) less the request's own
/// deadline. In the seed the standby took over, listed, and gave three of those blocks to other
/// Nodes. Here one leader (2 writes/s, burst 1, 16 workers: each worker waits about 8 s for its
/// token) loses the Lease to failing Lease requests while 24 Nodes wait; every PATCH must have
/// arrived early enough for its server-side deadline (`timeout=` = the 500 ms request timeout)
/// to pass before that moment. Before the fix the last PATCHes arrived about 6 s too late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_behind_the_token_bucket_are_not_sent_after_the_lease_is_lost() {
    init_tracing();
    let template = fixture(AWS)["items"][1].clone();
    let items: Vec<Value> = (0..24)
        .map(|i| node_like(&template, &format!("queued-{i:02}")))
        .collect();
    let sb = Sandbox::start(json!({"kind": "NodeList", "apiVersion": "v1", "items": items})).await;
    let ipam = ipam("10.30.0.0/16", "", masks(None, None, None));
    let lease_duration = Duration::from_secs(3);
    let request_timeout = Duration::from_millis(500);
    let mut config = config(&ipam, "a");
    if let Some(lease) = config.leader_election.as_mut() {
        lease.lease_duration = lease_duration;
        lease.renew_deadline = Duration::from_secs(2);
    }
    config.kube_api_qps = 2.0;
    config.kube_api_burst = 1;
    config.workers = 16;
    config.request_timeout = request_timeout;

    let a = spawn_as(&sb, config, "a");
    let patched = |sb: &SandboxHandle| {
        sb.requests_of(Verb::Patch, Resource::Nodes)
            .iter()
            .any(|r| r.status == Some(200))
    };
    assert!(sb.wait_until(WAIT, patched).await, "A wrote a podCIDR");
    // From now on no Lease request succeeds: A loses the Lease at its renew deadline.
    for verb in [Verb::Get, Verb::Update, Verb::Create] {
        sb.inject(FaultRule::new(
            verb,
            Resource::Leases,
            1_000_000,
            FaultAction::Status(500),
        ));
    }
    let ended = a.ended().await;
    assert!(ended.is_err(), "A lost the Lease and stopped: {ended:?}");

    let requests = sb.requests();
    let last_renewal = requests
        .iter()
        .filter(|r| {
            r.resource == Some(Resource::Leases)
                && matches!(r.verb, Some(Verb::Update | Verb::Create))
                && matches!(r.status, Some(200 | 201))
        })
        .map(|r| r.received)
        .max()
        .expect("A took the Lease");
    // A standby may hold the Lease from (at the earliest) the last renewal's arrival + the lease
    // duration; 1 s of slack for a loaded machine (the bug overshot by seconds).
    let standby_may_lead = last_renewal + lease_duration + Duration::from_secs(1);
    let late: Vec<String> = requests
        .iter()
        .filter(|r| r.verb == Some(Verb::Patch) && r.resource == Some(Resource::Nodes))
        .filter(|r| r.received + request_timeout > standby_may_lead)
        .map(|r| {
            format!(
                "{} arrived {:?} after the last renewal",
                r.name.as_deref().unwrap_or("?"),
                r.received.duration_since(last_renewal)
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "PATCHes that could land after a standby took the Lease (lease {lease_duration:?}, \
         request timeout {request_timeout:?}): {late:?}"
    );
    assert!(
        !unserved(&sb).is_empty(),
        "Nodes were still waiting when the Lease was lost (else nothing was queued)"
    );
    sb.shutdown().await;
}

/// Issue 30 item 5: the fence's cost. A bring-up behind the token bucket (50 writes/s, burst 1)
/// with leader election (1 s retry period): before batching every PATCH's intent got a Lease
/// write of its own (a rate-limited worker records it just before its send); now the intents are
/// recorded when decided, ahead of the workers, and the renewals carry them, so the Lease writes
/// beyond one per retry period stay within one per `INTENT_BATCH` intents plus the credit
/// (`leader::early_write_due`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_bring_up_costs_about_one_lease_write_per_batch_of_nodes() {
    use nodeipam::leader::{INTENT_BATCH, INTENT_CREDIT_CAP};
    init_tracing();
    const NODES: u64 = 150;
    let template = fixture(AWS)["items"][1].clone();
    let items: Vec<Value> = (0..NODES)
        .map(|i| node_like(&template, &format!("node-{i:03}")))
        .collect();
    let sb = Sandbox::start(json!({"kind": "NodeList", "apiVersion": "v1", "items": items})).await;
    let ipam = ipam("10.30.0.0/16", "", masks(None, None, None));
    let retry_period = Duration::from_secs(1);
    let mut config = config(&ipam, "a");
    if let Some(lease) = config.leader_election.as_mut() {
        lease.retry_period = retry_period;
    }
    config.kube_api_qps = 50.0;
    config.kube_api_burst = 1;
    let a = spawn_as(&sb, config, "a");
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "every Node served"
    );
    let lease_writes: Vec<_> = sb
        .requests()
        .into_iter()
        .filter(|r| {
            r.resource == Some(Resource::Leases)
                && matches!(r.verb, Some(Verb::Update | Verb::Create))
        })
        .map(|r| r.received)
        .collect();
    let span = lease_writes.last().unwrap().duration_since(lease_writes[0]);
    // Writes on the renewal schedule: at most one per retry period (every write restarts it).
    let scheduled = span.as_millis() / retry_period.as_millis() + 1;
    let early = u128::from((NODES + INTENT_CREDIT_CAP) / INTENT_BATCH);
    assert!(
        lease_writes.len() as u128 <= scheduled + early,
        "{} Lease writes for {NODES} Nodes over {span:?}: more than {scheduled} on the renewal \
         schedule + {early} early ones",
        lease_writes.len()
    );
    a.stop().await;
    sb.shutdown().await;
}

/// Issue 30: safety without timing. A's PATCH of LATE reaches the API server and is committed
/// 10 s after it was sent — after its own `timeout=` (2 s), after A was killed (`kill -9`: no
/// release) and after the Lease (4 s) passed to B, as a TCP connection that stalled through a
/// partition delivers what it buffered when the partition heals. B serves FIRST (it sorts
/// before LATE) and every PATCH B sends to LATE is answered 503, so LATE is still without
/// podCIDRs when the late write lands. Before the fence B knew nothing of A's write: it gave
/// LATE's block (10.30.0.0/24, the first) to FIRST, and the late write then gave it to LATE too.
/// Now A's intent was in the Lease before its PATCH left, B takes the Lease with it, keeps that
/// block for LATE and gives FIRST another one; the intent leaves the Lease once LATE shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_delivered_after_the_lease_passed_on_cannot_give_its_block_to_a_second_node() {
    let (sb, monitor, template, ipam) = late_delivered_sandbox().await;
    // Every later PATCH of LATE (B's) fails without an outcome: LATE waits for the late write.
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1000, FaultAction::Status(503)).named(LATE),
    );

    let (a, b) = a_leads_with_a_write_in_doubt_and_b_stands_by(&sb, &ipam).await;
    let hb = b.health.clone();
    // The intent was in the Lease before the PATCH was sent.
    let intents = lease_intents(&sb);
    assert!(
        intents.contains("\"node\":\"late\"") && intents.contains("10.30.0.0/24"),
        "A's intent is in the Lease: {intents}"
    );
    a.abort().await;
    let _ = sb.create_node(node_like(&template, FIRST));

    assert!(
        sb.wait_until(Duration::from_secs(60), |sb| hb.is_leading()
            && !pod_cidrs(sb, FIRST).is_empty()
            && late_write_outcomes(sb)
                .iter()
                .all(|o| !matches!(o, LateWriteOutcome::Pending)))
            .await,
        "B took over and served FIRST, and the late write ran; late writes {:?}",
        late_write_outcomes(&sb)
    );
    assert!(
        matches!(
            late_write_outcomes(&sb).first(),
            Some(LateWriteOutcome::Committed { .. })
        ),
        "the late write landed on LATE: {:?}",
        late_write_outcomes(&sb)
    );
    assert_eq!(pod_cidrs(&sb, LATE), ["10.30.0.0/24"]);
    assert_ne!(pod_cidrs(&sb, FIRST), pod_cidrs(&sb, LATE));
    monitor.assert_clean();
    // LATE shows its podCIDRs: B drops the intent from the Lease with a later write.
    assert!(
        sb.wait_until(WAIT, |sb| !lease_intents(sb).contains("\"node\":\"late\""))
            .await,
        "the settled intent left the Lease: {}",
        lease_intents(&sb)
    );

    sb.clear_faults();
    let _ = b.stop_outcome().await;
    sb.shutdown().await;
}

/// A sandbox holding LATE (no podCIDRs) whose first PATCH is applied 10 s after it arrived,
/// whatever its `timeout=`, and answered with a dropped connection; an overlap monitor on it; the
/// Node template; a four-/24 cluster CIDR.
async fn late_delivered_sandbox() -> (
    SandboxHandle,
    OverlapMonitor,
    Value,
    nodeipam_core::IpamConfig,
) {
    init_tracing();
    let template = fixture(AWS)["items"][1].clone();
    let sb = Sandbox::start(
        json!({"kind": "NodeList", "apiVersion": "v1", "items": [node_like(&template, LATE)]}),
    )
    .await;
    let monitor = OverlapMonitor::attach(&sb);
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::DeliveredLate {
                after: Duration::from_secs(10),
                answer: LateAnswer::DropConnection,
            },
        )
        .named(LATE),
    );
    (sb, monitor, template, ipam)
}

/// The write intents annotation of the Lease, as stored (empty if none).
fn lease_intents(sb: &SandboxHandle) -> String {
    sb.lease("kube-system", LEASE_NAME)
        .and_then(|lease| {
            lease["metadata"]["annotations"][nodeipam::leader::WRITE_INTENTS_ANNOTATION]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// The same without leader election (issue 30): the write intents live in the same Lease, which a
/// replica started without leader election takes at once — no waiting for an earlier process's
/// lease, and no start-up write fence: the Lease's compare-and-swap is the fence. A, without
/// leader election, is killed with its PATCH of LATE still on the wire (applied 10 s later,
/// whatever its `timeout=`); B, its replacement, starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_leader_election_a_restarted_controller_inherits_the_writes_still_on_the_wire() {
    let (sb, monitor, template, ipam) = late_delivered_sandbox().await;
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1000, FaultAction::Status(503)).named(LATE),
    );
    let unelected = |identity: &str| {
        let mut config = config(&ipam, identity);
        config.fence_lease = config.leader_election.take();
        config
    };

    let a = spawn_as(&sb, unelected("a"), "a");
    assert!(
        sb.wait_until(WAIT, |sb| late_write_outcomes(sb)
            == [LateWriteOutcome::Pending])
            .await,
        "A's PATCH of LATE never got the late write"
    );
    a.abort().await;
    let _ = sb.create_node(node_like(&template, FIRST));
    let b = spawn_as(&sb, unelected("b"), "b");
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, FIRST).is_empty())
            .await,
        "B served FIRST"
    );
    assert!(
        sb.wait_until(Duration::from_secs(60), |sb| late_write_outcomes(sb)
            .iter()
            .all(|o| !matches!(o, LateWriteOutcome::Pending)))
            .await,
        "the late write ran"
    );
    assert_eq!(pod_cidrs(&sb, LATE), ["10.30.0.0/24"]);
    assert_ne!(pod_cidrs(&sb, FIRST), pod_cidrs(&sb, LATE));
    monitor.assert_clean();
    sb.clear_faults();
    let _ = b.stop_outcome().await;
    sb.shutdown().await;
}
