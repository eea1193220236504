//! `nodeipam::leader` against the sandbox API server: real HTTP, real resourceVersion
//! conflicts. Time here is the wall clock of a shared machine, so nothing asserts how long
//! anything took: hand-over speed is checked by counting the standby's tries in the sandbox's
//! request log (tries are never closer than one retry period), and the lease-duration wait by the
//! Lease's own `renewTime`/`acquireTime`. The exact timing is tested with paused time in the
//! module's unit tests.

use std::time::Duration;

use axum::http::{HeaderValue, header::USER_AGENT};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use nodeipam::leader::{LeaderElector, LeaderError, Leadership, LeaseConfig};
use nodeipam_tests::sandbox::{FaultAction, RequestRecord, Resource, Sandbox, SandboxHandle, Verb};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const NAMESPACE: &str = "kube-system";
const NAME: &str = "nodeipam-controller";
/// Upper bound of every wait (generous: 2 shared cores, debug build).
const WAIT: Duration = Duration::from_secs(30);
const LEASE_DURATION: Duration = Duration::from_secs(5);
const RENEW_DEADLINE: Duration = Duration::from_millis(3500);
const RETRY_PERIOD: Duration = Duration::from_millis(500);

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: NAMESPACE.to_owned(),
        name: NAME.to_owned(),
        identity: identity.to_owned(),
        lease_duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY_PERIOD,
    }
}

/// A client whose requests the sandbox logs with `field_manager == agent` (from the user agent).
fn client_as(sb: &SandboxHandle, agent: &str) -> kube::Client {
    let mut config = sb.kube_config();
    config
        .headers
        .push((USER_AGENT, HeaderValue::from_str(agent).expect("header")));
    kube::Client::try_from(config).expect("client")
}

struct Elector {
    identity: String,
    state: watch::Receiver<Leadership>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeaderError>>,
}

fn spawn(sb: &SandboxHandle, identity: &'static str) -> Elector {
    spawn_with(sb, config(identity))
}

fn spawn_with(sb: &SandboxHandle, config: LeaseConfig) -> Elector {
    let identity = config.identity.clone();
    let elector = LeaderElector::new(client_as(sb, &identity), config).expect("config");
    let (state_tx, state) = watch::channel(Leadership::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(state_tx, async move {
        let _ = stopped.await;
    }));
    Elector {
        identity,
        state,
        stop: Some(stop),
        task,
    }
}

impl Elector {
    /// Whether the published state satisfies `holds` within `within`.
    async fn reaches(&mut self, within: Duration, holds: impl FnMut(&Leadership) -> bool) -> bool {
        tokio::time::timeout(within, self.state.wait_for(holds))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    async fn stop(mut self) -> Result<(), LeaderError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("elector task did not panic")
    }
}

/// The sandbox's log of Lease requests by `agent`.
fn lease_requests(sb: &SandboxHandle, agent: &str) -> Vec<(usize, RequestRecord)> {
    sb.requests()
        .into_iter()
        .enumerate()
        .filter(|(_, r)| r.resource == Some(Resource::Leases) && r.field_manager == agent)
        .collect()
}

fn spec(sb: &SandboxHandle) -> Value {
    sb.lease(NAMESPACE, NAME).expect("the Lease")["spec"].clone()
}

fn micro_time(v: &Value) -> Timestamp {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a string"));
    assert_eq!(
        (s.len(), &s[19..20], &s[26..]),
        (27, ".", "Z"),
        "{s} is a MicroTime"
    );
    s.parse()
        .unwrap_or_else(|e| panic!("{s} is not a timestamp: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_elect_one_and_the_standby_takes_a_released_lease_at_its_next_try() {
    let sb = Sandbox::start(Value::Null).await;
    let mut a = spawn(&sb, "elector-a");
    let mut b = spawn(&sb, "elector-b");
    let first = tokio::time::timeout(WAIT, async {
        tokio::select! {
            _ = a.state.wait_for(Leadership::is_leading) => "elector-a",
            _ = b.state.wait_for(Leadership::is_leading) => "elector-b",
        }
    })
    .await
    .expect("a leader");
    let (leader, mut standby) = if first == "elector-a" { (a, b) } else { (b, a) };
    // The standby does not lead while the leader renews, for longer than a lease duration.
    assert!(
        !standby
            .reaches(LEASE_DURATION * 2, Leadership::is_leading)
            .await
    );
    assert_eq!(
        *standby.state.borrow(),
        Leadership::Standby {
            holder: Some(leader.identity.clone())
        }
    );
    assert!(leader.state.borrow().is_leading());
    // The fields client-go writes, as the sandbox stored them.
    let held = spec(&sb);
    assert_eq!(held["holderIdentity"], leader.identity);
    assert_eq!(held["leaseDurationSeconds"], json!(5));
    assert_eq!(held["leaseTransitions"], json!(0), "created");
    assert!(micro_time(&held["renewTime"]) >= micro_time(&held["acquireTime"]));
    assert!(
        lease_requests(&sb, &standby.identity)
            .iter()
            .all(|(_, r)| r.verb == Some(Verb::Get)),
        "the standby only read"
    );

    let leader_name = leader.identity.clone();
    leader.stop().await.expect("released");
    assert!(
        standby.reaches(WAIT, Leadership::is_leading).await,
        "standby takes over"
    );
    let taken = spec(&sb);
    assert_eq!(taken["holderIdentity"], standby.identity);
    assert_eq!(taken["leaseTransitions"], json!(1));
    // The release: an UPDATE with the resourceVersion, no holder, 1 s. The sandbox logs a request
    // when its body has arrived, so a renewal the stop cancelled in flight can be logged after the
    // release; it must not have committed there.
    let leader_updates: Vec<_> = lease_requests(&sb, &leader_name)
        .into_iter()
        .filter(|(_, r)| r.verb == Some(Verb::Update))
        .collect();
    let is_release = |r: &RequestRecord| {
        r.body
            .as_ref()
            .is_some_and(|b| b["spec"]["holderIdentity"] == "")
    };
    let (release_at, release) = leader_updates
        .iter()
        .rfind(|(_, r)| is_release(r))
        .cloned()
        .unwrap_or_else(|| panic!("no release among the leader's UPDATEs: {leader_updates:?}"));
    let late_renewals: Vec<_> = leader_updates
        .iter()
        .filter(|(i, r)| *i > release_at && r.status == Some(200))
        .collect();
    assert!(
        late_renewals.is_empty(),
        "the leader's writes committed after its release: {late_renewals:?}"
    );
    let body = release.body.expect("body");
    assert_eq!(body["spec"]["leaseDurationSeconds"], json!(1));
    assert!(body["metadata"]["resourceVersion"].is_string());
    assert_eq!(release.status, Some(200));
    // Within one retry period: the standby's first read after the release (or, if it raced the
    // release, the one after) led to its takeover — not a wait for the lease duration (10 tries).
    let after: Vec<_> = lease_requests(&sb, &standby.identity)
        .into_iter()
        .filter(|(i, _)| *i > release_at)
        .collect();
    let takeover = after
        .iter()
        .position(|(_, r)| r.verb == Some(Verb::Update))
        .expect("takeover UPDATE");
    assert!(
        takeover <= 2,
        "reads before the takeover: {takeover} ({:?})",
        after.iter().map(|(_, r)| r.verb).collect::<Vec<_>>()
    );
    assert_eq!(after[takeover].1.status, Some(200));
    standby.stop().await.expect("released");
    assert_eq!(spec(&sb)["holderIdentity"], "");
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leader_vanishes_the_standby_waits_a_lease_duration_then_takes_over() {
    let sb = Sandbox::start(Value::Null).await;
    let mut a = spawn(&sb, "elector-a");
    assert!(a.reaches(WAIT, Leadership::is_leading).await);
    let mut b = spawn(&sb, "elector-b");
    // Let b observe a few renewals, then `kill -9` a: no release.
    assert!(
        sb.wait_until(WAIT, |s| lease_requests(s, "elector-b").len() >= 3)
            .await
    );
    a.task.abort();
    let _ = a.task.await;
    assert!(b.reaches(WAIT, Leadership::is_leading).await);
    let a_writes: Vec<_> = lease_requests(&sb, "elector-a")
        .into_iter()
        .filter(|(_, r)| r.verb != Some(Verb::Get) && matches!(r.status, Some(200 | 201)))
        .collect();
    let (last_at, last) = a_writes.last().expect("a renewed").clone();
    assert!(
        a_writes
            .iter()
            .all(|(_, r)| r.body.as_ref().expect("body")["spec"]["holderIdentity"] == "elector-a"),
        "a never released"
    );
    let taken = spec(&sb);
    assert_eq!(taken["holderIdentity"], "elector-b");
    assert_eq!(taken["leaseTransitions"], json!(1));
    // Not before the lease duration: b's acquireTime is at least D after a's last renewTime
    // (both written by this host's clock; b waited D on its monotonic clock after seeing it).
    let last_renew = micro_time(&last.body.expect("body")["spec"]["renewTime"]);
    let acquired = micro_time(&taken["acquireTime"]);
    let waited = acquired.duration_since(last_renew);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::try_from(LEASE_DURATION).expect("fits"),
        "took over {waited:?} after the last renewal"
    );
    // Within lease duration + retry period: b's tries are at least a retry period apart, so that
    // span holds at most (D + P) / P + 1 of them; count b's reads after a's last renewal.
    let reads = lease_requests(&sb, "elector-b")
        .into_iter()
        .filter(|(i, r)| *i > last_at && r.verb == Some(Verb::Get))
        .count();
    let most =
        ((LEASE_DURATION + RETRY_PERIOD).as_millis() / RETRY_PERIOD.as_millis()) as usize + 1;
    assert!(
        reads <= most,
        "{reads} reads before the takeover (at most {most})"
    );
    b.stop().await.expect("released");
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_failing_for_the_renew_deadline_lose_and_do_not_release() {
    let sb = Sandbox::start(Value::Null).await;
    let mut a = spawn(&sb, "elector-a");
    assert!(a.reaches(WAIT, Leadership::is_leading).await);
    sb.fail_next(
        Verb::Update,
        Resource::Leases,
        10_000,
        FaultAction::Status(500),
    );
    sb.fail_next(
        Verb::Get,
        Resource::Leases,
        10_000,
        FaultAction::Status(503),
    );
    assert!(a.reaches(WAIT, |s| *s == Leadership::Lost).await);
    match a.task.await.expect("no panic") {
        Err(LeaderError::RenewDeadlineExceeded {
            last_error: Some(_),
            renew_deadline,
            ..
        }) => assert_eq!(renew_deadline, RENEW_DEADLINE),
        other => panic!("{other:?}"),
    }
    assert!(
        lease_requests(&sb, "elector-a").iter().all(|(_, r)| r
            .body
            .as_ref()
            .is_none_or(|b| b["spec"]["holderIdentity"] == "elector-a")),
        "no release after a loss"
    );
    assert_eq!(spec(&sb)["holderIdentity"], "elector-a", "left to expire");
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_refused_with_409_does_not_lead() {
    let sb = Sandbox::start(Value::Null).await;
    let leases: Api<Lease> = Api::namespaced(sb.client(), NAMESPACE);
    let ghost = |holder: &str| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1},
        }))
        .expect("lease")
    };
    leases
        .create(&PostParams::default(), &ghost("ghost"))
        .await
        .expect("ghost lease");
    // b's first takeover UPDATE is held 3 s (within its request timeout: half the renew
    // deadline, 4 s); meanwhile another writer renews: a real conflict.
    sb.fail_next(
        Verb::Update,
        Resource::Leases,
        1,
        FaultAction::Delay(Duration::from_secs(3)),
    );
    let mut b = spawn_with(
        &sb,
        LeaseConfig {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(8),
            ..config("elector-b")
        },
    );
    assert!(
        sb.wait_until(WAIT, |s| lease_requests(s, "elector-b")
            .iter()
            .any(|(_, r)| r.verb == Some(Verb::Update)))
            .await
    );
    let mut current = leases.get(NAME).await.expect("get");
    current.spec = ghost("ghost-2").spec;
    leases
        .replace(NAME, &PostParams::default(), &current)
        .await
        .expect("the other writer renews first");
    assert!(
        sb.wait_until(WAIT, |s| lease_requests(s, "elector-b")
            .iter()
            .any(|(_, r)| r.verb == Some(Verb::Update) && r.status.is_some()))
            .await
    );
    // ghost-2's one second runs out unrenewed; b takes it then. Had b counted the refused
    // UPDATE as leadership, its next UPDATE would have been a renewal of a Lease naming
    // ghost-2: refused again, and b would have lost instead of leading.
    assert!(b.reaches(WAIT, Leadership::is_leading).await);
    let updates: Vec<_> = lease_requests(&sb, "elector-b")
        .into_iter()
        .filter(|(_, r)| r.verb == Some(Verb::Update))
        .map(|(_, r)| (r.status, r.body.expect("body")["spec"].clone()))
        .collect();
    assert_eq!(updates[0].0, Some(409), "stale resourceVersion");
    assert_eq!(updates[1].0, Some(200));
    assert_eq!(updates[1].1["holderIdentity"], "elector-b");
    assert_eq!(
        updates[1].1["leaseTransitions"],
        json!(1),
        "a takeover, not a renewal"
    );
    assert_eq!(spec(&sb)["holderIdentity"], "elector-b");
    b.stop().await.expect("released");
    sb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_leases_in_the_sandbox_never_panic() {
    let sb = Sandbox::start(Value::Null).await;
    let leases: Api<Lease> = Api::namespaced(sb.client(), NAMESPACE);
    let raw = |spec: Value| -> Lease {
        serde_json::from_value(
            json!({"metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": spec}),
        )
        .expect("lease")
    };
    // A holder of another format, no duration: waited for (a full configured lease duration,
    // not taken at once), then taken.
    let before = Timestamp::now();
    leases
        .create(
            &PostParams::default(),
            &raw(json!({"holderIdentity": "system:node:ip-10-0-0-1 / ünïcödé"})),
        )
        .await
        .expect("create");
    let mut b = spawn(&sb, "elector-b");
    assert!(b.reaches(WAIT, Leadership::is_leading).await);
    let taken = spec(&sb);
    let waited = micro_time(&taken["acquireTime"]).duration_since(before);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::try_from(LEASE_DURATION).expect("fits"),
        "taken {waited:?} after the Lease was written"
    );
    assert_eq!(taken["leaseTransitions"], json!(1));
    b.stop().await.expect("released");

    // A renewTime that is not a time (the sandbox, unlike kube-apiserver, stores it): the
    // standby cannot read the Lease, so it writes nothing, and keeps trying.
    sb.clear_requests();
    let mut garbage = sb.lease(NAMESPACE, NAME).expect("lease");
    garbage["spec"] = json!({"holderIdentity": "", "renewTime": "yesterday"});
    let client = sb.client();
    let url = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{NAME}");
    let request = axum::http::Request::put(&url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&garbage).expect("json"))
        .expect("request");
    client
        .request_text(request)
        .await
        .expect("the sandbox stores it");
    let c = spawn(&sb, "elector-c");
    assert!(
        sb.wait_until(WAIT, |s| lease_requests(s, "elector-c").len() >= 4)
            .await
    );
    assert!(
        lease_requests(&sb, "elector-c")
            .iter()
            .all(|(_, r)| r.verb == Some(Verb::Get)),
        "no write"
    );
    assert_eq!(*c.state.borrow(), Leadership::Standby { holder: None });
    assert!(!c.task.is_finished(), "still running");
    c.stop().await.expect("stops cleanly");
    sb.shutdown().await;
}
