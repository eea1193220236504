//! Tests of the elector: plain tests of the pure parts, and paused-time tests of whole electors
//! against an in-process Lease API ([`fake_api`]), where every instant is exact.

mod fake_api;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use self::fake_api::{FakeApi, Fault, NAME, NAMESPACE};
use super::*;

const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Longer than anything a test waits for (short enough that a wait that never ends fails fast:
/// one try per retry period is simulated).
const FOREVER: Duration = Duration::from_secs(6 * 3600);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

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

/// A running elector and its handles.
struct Elector {
    state: watch::Receiver<Leadership>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeaderError>>,
}

fn spawn(api: &FakeApi, config: LeaseConfig) -> Elector {
    let elector = LeaderElector::new(api.client(&config.identity), config).expect("valid config");
    run_elector(elector)
}

/// Runs `elector` until its shutdown future is resolved ([`Elector::stop`]).
fn run_elector(elector: LeaderElector) -> Elector {
    let (state_tx, state) = watch::channel(Leadership::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(state_tx, async move {
        let _ = stopped.await;
    }));
    Elector {
        state,
        stop: Some(stop),
        task,
    }
}

impl Elector {
    /// Waits until `holds` is true of the published state; the (paused) instant it became so.
    async fn until(&mut self, holds: impl FnMut(&Leadership) -> bool) -> Instant {
        tokio::time::timeout(FOREVER, self.state.wait_for(holds))
            .await
            .expect("state reached")
            .expect("state reached before the elector ended");
        Instant::now()
    }

    async fn leading(&mut self) -> Instant {
        self.until(Leadership::is_leading).await
    }

    /// Whether it leads at some point within `within`.
    async fn leads_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.state.wait_for(Leadership::is_leading))
            .await
            .is_ok()
    }

    fn current(&self) -> Leadership {
        self.state.borrow().clone()
    }

    /// Resolve its shutdown future and wait for `run` to return.
    async fn stop(mut self) -> Result<(), LeaderError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("elector task did not panic")
    }

    /// `kill -9`: the task vanishes without releasing.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn lease_object(spec: Option<Value>) -> Value {
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
    });
    if let Some(spec) = spec {
        lease["spec"] = spec;
    }
    lease
}

fn writes(api: &FakeApi, agent: &str) -> usize {
    api.requests(agent, Method::POST).len() + api.requests(agent, Method::PUT).len()
}

// ---------------------------------------------------------------- pure parts

type ConfigEdit = fn(&mut LeaseConfig);
type LeaseEdit = fn(&FakeApi);

#[tokio::test]
async fn config_rules_follow_client_go() {
    let ok = config("a");
    assert!(ok.validate().is_ok());
    let cases: [(&str, ConfigEdit); 9] = [
        ("empty name", |c| c.name = " ".into()),
        ("empty namespace", |c| c.namespace = String::new()),
        ("empty identity", |c| c.identity = String::new()),
        ("lease under 1 s", |c| c.lease_duration = secs(0.9)),
        ("lease beyond int32 seconds", |c| {
            c.lease_duration = Duration::from_secs(1 << 31)
        }),
        ("zero renew deadline", |c| c.renew_deadline = Duration::ZERO),
        ("zero retry period", |c| c.retry_period = Duration::ZERO),
        ("renew deadline = lease duration", |c| {
            c.renew_deadline = c.lease_duration
        }),
        ("renew deadline = 1.2 × retry period", |c| {
            c.renew_deadline = Duration::from_secs(12);
            c.retry_period = Duration::from_secs(10);
        }),
    ];
    for (what, break_it) in cases {
        let mut c = ok.clone();
        break_it(&mut c);
        assert!(
            matches!(c.validate(), Err(LeaderError::InvalidConfig(_))),
            "{what}: {:?}",
            c.validate()
        );
        assert!(LeaderElector::new(FakeApi::default().client("x"), c).is_err());
    }
    // Bounds that are allowed.
    let mut c = ok.clone();
    c.lease_duration = Duration::from_secs(i32::MAX as u64);
    assert!(c.validate().is_ok());
    assert_eq!(c.lease_duration_seconds(), i32::MAX);
    c.lease_duration = secs(15.9);
    assert_eq!(
        c.lease_duration_seconds(),
        15,
        "whole seconds, fraction dropped"
    );
}

#[test]
fn request_timeout_is_half_the_renew_deadline_at_least_one_second() {
    for (renew, expected) in [(10.0, 5.0), (1.5, 1.0), (3.0, 1.5), (0.5, 1.0)] {
        let mut c = config("a");
        c.renew_deadline = secs(renew);
        assert_eq!(
            c.request_timeout(),
            secs(expected),
            "renew deadline {renew}"
        );
    }
}

#[test]
fn record_duration_honours_valid_values_and_reads_the_rest_as_configured() {
    let spec = |d: Option<i32>| LeaseSpec {
        lease_duration_seconds: d,
        ..LeaseSpec::default()
    };
    let configured = Duration::from_secs(15);
    let cases = [
        (Some(spec(Some(3))), Duration::from_secs(3)),
        (Some(spec(Some(1))), Duration::from_secs(1)),
        (
            Some(spec(Some(i32::MAX))),
            Duration::from_secs(i32::MAX as u64),
        ),
        (Some(spec(Some(0))), configured),
        (Some(spec(Some(-5))), configured),
        (Some(spec(Some(i32::MIN))), configured),
        (Some(spec(None)), configured),
        (None, configured),
    ];
    for (spec, expected) in cases {
        assert_eq!(
            record_lease_duration(spec.as_ref(), configured),
            expected,
            "{spec:?}"
        );
    }
}

#[test]
fn claimed_spec_renews_ours_and_takes_over_others() {
    let t1: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let t2: Timestamp = "2026-01-01T00:00:02Z".parse().unwrap();
    let old = |holder: Option<&str>, transitions: Option<i32>| LeaseSpec {
        holder_identity: holder.map(str::to_owned),
        lease_duration_seconds: Some(30),
        acquire_time: Some(MicroTime(t1)),
        renew_time: Some(MicroTime(t1)),
        lease_transitions: transitions,
        strategy: Some("OldestEmulationVersion".into()),
        preferred_holder: Some("p".into()),
    };
    let expect = |acquire, transitions| LeaseSpec {
        holder_identity: Some("me".into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(MicroTime(acquire)),
        renew_time: Some(MicroTime(t2)),
        lease_transitions: Some(transitions),
        strategy: Some("OldestEmulationVersion".into()),
        preferred_holder: Some("p".into()),
    };
    let cases = [
        // (old holder, old transitions) → (acquire time, transitions)
        ((Some("me"), Some(4)), (t1, 4)),
        ((Some("other"), Some(4)), (t2, 5)),
        ((Some(""), Some(4)), (t2, 5)),
        ((None, None), (t2, 1)),
        ((Some("other"), Some(-3)), (t2, 1)),
        ((Some("other"), Some(i32::MAX)), (t2, i32::MAX)),
        ((Some("me"), Some(-3)), (t1, 0)),
    ];
    for ((holder, transitions), (acquire, expected)) in cases {
        assert_eq!(
            claimed_spec(&old(holder, transitions), "me", 15, t2),
            expect(acquire, expected),
            "{holder:?} {transitions:?}"
        );
    }
    // A Lease without spec, and a renewal of a spec without acquire time.
    let bare = claimed_spec(&LeaseSpec::default(), "me", 15, t2);
    assert_eq!(bare.lease_transitions, Some(1));
    let mut no_acquire = old(Some("me"), Some(2));
    no_acquire.acquire_time = None;
    assert_eq!(
        claimed_spec(&no_acquire, "me", 15, t2).acquire_time,
        Some(MicroTime(t2))
    );
    // CREATE starts the count at 0.
    let created = created_spec("me", 15, t2);
    assert_eq!(
        created,
        LeaseSpec {
            holder_identity: Some("me".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(t2)),
            renew_time: Some(MicroTime(t2)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }
    );
}

#[test]
fn released_spec_empties_the_holder_for_one_second() {
    let t1: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let t2: Timestamp = "2026-01-01T00:00:09Z".parse().unwrap();
    let held = claimed_spec(&LeaseSpec::default(), "me", 15, t1);
    assert_eq!(
        released_spec(&held, t2),
        LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(t2)),
            renew_time: Some(MicroTime(t2)),
            lease_transitions: Some(1),
            ..LeaseSpec::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn may_start_write_needs_the_whole_request_before_the_fence() {
    let now = Instant::now();
    let fence = now + Duration::from_secs(10);
    let leading = Leadership::Leading { write_fence: fence };
    let cases = [
        (secs(0.0), secs(9.999), true),
        (secs(0.0), secs(10.0), false),
        (secs(5.0), secs(4.0), true),
        (secs(5.0), secs(5.0), false),
        (secs(11.0), secs(0.0), false),
    ];
    for (after, timeout, expected) in cases {
        assert_eq!(
            leading.may_start_write(now + after, timeout),
            expected,
            "{after:?} + {timeout:?}"
        );
    }
    assert!(!leading.may_start_write(now, Duration::MAX), "overflow");
    for other in [
        Leadership::default(),
        Leadership::Lost,
        Leadership::Stopped,
        Leadership::Standby {
            holder: Some("x".into()),
        },
    ] {
        assert!(!other.may_start_write(now, Duration::ZERO), "{other:?}");
        assert_eq!(other.write_fence(), None);
    }
    assert_eq!(leading.write_fence(), Some(fence));
}

// ---------------------------------------------------------------- whole electors

#[tokio::test(start_paused = true)]
async fn creates_a_missing_lease_with_client_go_fields_and_leads() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut c = config("a");
    c.lease_duration = secs(15.7);
    let mut a = spawn(&api, c);
    assert_eq!(a.leading().await, t0, "first try, no waiting");
    assert_eq!(
        a.current().write_fence(),
        Some(t0 + Duration::from_secs(15)),
        "fence = start of the try + the whole seconds written"
    );
    let log = api.log();
    let methods: Vec<_> = log.iter().map(|r| (r.method.clone(), r.status)).collect();
    assert_eq!(
        methods,
        [(Method::GET, Some(404)), (Method::POST, Some(201))]
    );
    let spec = api.spec();
    assert_eq!(spec["holderIdentity"], "a");
    assert_eq!(spec["leaseDurationSeconds"], json!(15));
    assert_eq!(spec["leaseTransitions"], json!(0));
    assert_eq!(spec["acquireTime"], spec["renewTime"]);
    // The fake refuses (422) any time that is not a MicroTime, so acceptance proves the format;
    // check it here as well.
    let renew = spec["renewTime"].as_str().expect("renewTime");
    assert_eq!((renew.len(), &renew[19..20], &renew[26..]), (27, ".", "Z"));
    assert_eq!(a.stop().await.ok(), Some(()));
}

#[tokio::test(start_paused = true)]
async fn renews_every_retry_period_keeping_acquire_time_and_transitions() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    let acquired = api.spec()["acquireTime"].clone();
    tokio::time::sleep_until(t0 + secs(6.5)).await;
    let puts = api.requests("a", Method::PUT);
    let at: Vec<_> = puts.iter().map(|r| r.at - t0).collect();
    assert_eq!(
        at,
        [secs(2.0), secs(4.0), secs(6.0)],
        "one renewal per period"
    );
    assert_eq!(
        api.requests("a", Method::GET).len(),
        1,
        "fast path: no reads"
    );
    // Each UPDATE carries the resourceVersion of the previous write (optimistic concurrency).
    for (i, put) in puts.iter().enumerate() {
        let body = put.body.as_ref().expect("body");
        assert_eq!(
            body["metadata"]["resourceVersion"],
            json!((i + 1).to_string())
        );
        assert_eq!(body["spec"]["acquireTime"], acquired);
        assert_eq!(body["spec"]["leaseTransitions"], json!(0));
        assert_eq!(body["spec"]["holderIdentity"], "a");
        assert_eq!(put.status, Some(200));
    }
    assert_eq!(
        a.current(),
        Leadership::Leading {
            write_fence: t0 + secs(6.0) + LEASE_DURATION
        }
    );
    a.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn a_standby_tries_every_retry_period_and_never_leads_while_the_holder_renews() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    let mut b = spawn(&api, config("b"));
    assert!(!b.leads_within(Duration::from_secs(119)).await);
    assert_eq!(
        b.current(),
        Leadership::Standby {
            holder: Some("a".into())
        }
    );
    let gets: Vec<_> = api
        .requests("b", Method::GET)
        .iter()
        .map(|r| r.at - t0)
        .collect();
    let expected: Vec<_> = (0..=59).map(|i| RETRY_PERIOD * i).collect();
    assert_eq!(
        gets, expected,
        "exactly one try per retry period, no jitter"
    );
    assert_eq!(writes(&api, "b"), 0);
    assert!(a.current().is_leading());
    b.stop().await.expect("standby stops");
    assert_eq!(writes(&api, "b"), 0, "a standby releases nothing");
    a.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_within_one_retry_period() {
    // (standby start offset, release instant) after the leader acquired at t0.
    let cases = [(0.5, 5.1), (1.0, 6.0), (0.0, 6.0), (0.0, 5.999), (1.5, 9.5)];
    for (offset, release_at) in cases {
        let api = FakeApi::default();
        let t0 = Instant::now();
        let mut a = spawn(&api, config("a"));
        a.leading().await;
        tokio::time::sleep_until(t0 + secs(offset)).await;
        let mut b = spawn(&api, config("b"));
        tokio::time::sleep_until(t0 + secs(release_at)).await;
        assert!(!b.current().is_leading());
        a.stop().await.expect("released");
        let release = api.requests("a", Method::PUT).pop().expect("a release PUT");
        let body = release.body.expect("body");
        assert_eq!(body["spec"]["holderIdentity"], "");
        assert_eq!(body["spec"]["leaseDurationSeconds"], json!(1));
        assert!(body["metadata"]["resourceVersion"].is_string());
        assert_eq!(release.status, Some(200));
        let b_led = b.leading().await;
        assert!(
            b_led >= release.at && b_led - release.at <= RETRY_PERIOD,
            "offset {offset} release {release_at}: led {:?} after the release",
            b_led - release.at
        );
        let spec = api.spec();
        assert_eq!(spec["holderIdentity"], "b");
        assert_eq!(
            spec["leaseTransitions"],
            json!(1),
            "taking a released Lease counts a transition"
        );
        b.stop().await.expect("released");
    }
}

/// Arrival of `agent`'s last write the server accepted (with no latency: when it committed).
fn last_committed_write(api: &FakeApi, agent: &str) -> Instant {
    api.log()
        .iter()
        .rev()
        .find(|r| {
            r.agent == agent && r.method != Method::GET && matches!(r.status, Some(200 | 201))
        })
        .map(|r| r.at)
        .expect("a committed write")
}

#[tokio::test(start_paused = true)]
async fn after_kill_9_the_standby_leads_after_lease_duration_within_lease_duration_plus_retry_period()
 {
    // (standby start offset, kill instant) after the leader acquired at t0.
    let cases = [
        (0.5, 5.3),
        (0.0, 4.0),
        (1.999, 5.0),
        (1.0, 31.0),
        (0.25, 2.0),
    ];
    for (offset, kill_at) in cases {
        let api = FakeApi::default();
        let t0 = Instant::now();
        let mut a = spawn(&api, config("a"));
        a.leading().await;
        tokio::time::sleep_until(t0 + secs(offset)).await;
        let mut b = spawn(&api, config("b"));
        tokio::time::sleep_until(t0 + secs(kill_at)).await;
        let fence = a.current().write_fence().expect("a leads");
        a.kill().await;
        let killed = Instant::now();
        let last_renewal = last_committed_write(&api, "a");
        let b_led = b.leading().await;
        let case = format!("offset {offset} kill {kill_at}");
        assert!(
            b_led - last_renewal >= LEASE_DURATION,
            "{case}: not before the lease duration"
        );
        assert!(
            b_led - killed <= LEASE_DURATION + RETRY_PERIOD,
            "{case}: led {:?} after the kill",
            b_led - killed
        );
        assert!(
            b_led >= fence,
            "{case}: never before the leader's write fence"
        );
        let spec = api.spec();
        assert_eq!(spec["holderIdentity"], "b", "{case}");
        assert_eq!(spec["leaseTransitions"], json!(1), "{case}");
        assert_eq!(spec["leaseDurationSeconds"], json!(15), "{case}");
        assert_ne!(spec["acquireTime"], Value::Null);
        b.stop().await.expect("released");
    }
}

#[tokio::test(start_paused = true)]
async fn no_takeover_before_the_write_fence_with_slow_or_lost_answers() {
    // Round trips of A and B (asymmetric: a fence taken from when A's answer arrives would let
    // a fast B in early), kill instants, and whether A's renewals commit without an answer.
    let latencies = [
        (0.0, 0.0),
        (0.3, 0.3),
        (0.9, 0.1),
        (2.5, 0.0),
        (4.9, 0.0),
        (0.1, 2.5),
    ];
    let kills = [3.0, 5.1, 6.7, 7.999, 12.0];
    // B starts this long after A leads, so its tries fall at every phase of A's renewals.
    let offsets = [0.0, 0.3, 0.7, 1.1, 1.6];
    // 16 s is a multiple of the retry period: the standby's try then falls right at the end of
    // its wait, leaving the fence no slack.
    let durations = [15, 16];
    let mut cases = Vec::new();
    for lease in durations {
        for latency in latencies {
            for kill_at in kills {
                for offset in offsets {
                    for lose_answers in [false, true] {
                        cases.push((lease, latency, kill_at, offset, lose_answers));
                    }
                }
            }
        }
    }
    let mut tightest = Duration::MAX;
    for (lease, (latency_a, latency_b), kill_at, offset, lose_answers) in cases {
        let api = FakeApi::default();
        api.set_latency("a", secs(latency_a));
        api.set_latency("b", secs(latency_b));
        let with_lease = |identity| LeaseConfig {
            lease_duration: Duration::from_secs(lease),
            ..config(identity)
        };
        let t0 = Instant::now();
        let mut a = spawn(&api, with_lease("a"));
        a.leading().await;
        tokio::time::sleep(secs(offset)).await;
        let mut b = spawn(&api, with_lease("b"));
        if lose_answers {
            api.fault("a", Some(Method::PUT), usize::MAX, Fault::CommitThenHang);
        }
        tokio::time::sleep_until(t0 + secs(kill_at)).await;
        let fence = a.current().write_fence();
        a.kill().await;
        let b_led = b.leading().await;
        let takeover = api
            .requests("b", Method::PUT)
            .pop()
            .expect("takeover PUT")
            .at;
        let case = format!(
            "lease {lease} latency a {latency_a} b {latency_b} kill {kill_at} offset {offset} lose {lose_answers}"
        );
        // A may have lost already (no fence) when its answers were lost long enough.
        if let Some(fence) = fence {
            assert!(
                takeover >= fence,
                "{case}: takeover sent {:?} before the fence",
                fence - takeover
            );
            tightest = tightest.min(takeover - fence);
        }
        assert!(b_led >= takeover, "{case}");
        b.stop().await.expect("released");
    }
    // The bound is not vacuous: some takeover came (almost) right at the fence.
    assert!(tightest <= secs(0.05), "tightest margin {tightest:?}");
}

#[tokio::test(start_paused = true)]
async fn the_write_fence_counts_from_the_start_of_the_successful_try() {
    let api = FakeApi::default();
    api.set_latency("a", secs(0.8));
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    // GET 0.8 s, then CREATE sent at t0+0.8, committed at t0+1.2, answered at t0+1.6.
    assert_eq!(a.leading().await, t0 + secs(1.6));
    assert_eq!(a.current().write_fence(), Some(t0 + LEASE_DURATION));
    // Renewals: fast-path UPDATEs sent at t0+2, t0+4, …; each answered 0.8 s later.
    a.until(|s| s.write_fence() == Some(t0 + secs(2.0) + LEASE_DURATION))
        .await;
    assert_eq!(Instant::now(), t0 + secs(2.8));
    a.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_for_the_renew_deadline_lose_leadership() {
    for fault in [Fault::Status(500), Fault::Hang, Fault::CommitThenHang] {
        let api = FakeApi::default();
        let t0 = Instant::now();
        let mut a = spawn(&api, config("a"));
        a.leading().await;
        api.fault("a", None, usize::MAX, fault);
        let lost = a.until(|s| *s == Leadership::Lost).await;
        assert_eq!(lost, t0 + RENEW_DEADLINE, "{fault:?}: lost at the deadline");
        assert!(lost < t0 + LEASE_DURATION, "before the write fence");
        let requests = api.log().len();
        let result = a.task.await.expect("no panic");
        match (&result, fault) {
            (
                Err(LeaderError::RenewDeadlineExceeded {
                    last_error: Some(RequestError::Kube(_)),
                    ..
                }),
                Fault::Status(500),
            ) => {}
            (
                Err(LeaderError::RenewDeadlineExceeded { .. }),
                Fault::Hang | Fault::CommitThenHang,
            ) => {}
            other => panic!("{fault:?}: {other:?}"),
        }
        if let Err(e) = &result {
            assert_eq!(e.metric_label(), "leader_renew_deadline_exceeded");
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            api.log().len(),
            requests,
            "{fault:?}: nothing after the loss, no release"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_within_the_deadline_keeps_leading() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    // The try at t0+2 fails (fast path and re-read); the one at t0+4 renews.
    api.fault("a", None, 2, Fault::Status(503));
    tokio::time::sleep_until(t0 + secs(4.5)).await;
    assert_eq!(
        a.current(),
        Leadership::Leading {
            write_fence: t0 + secs(4.0) + LEASE_DURATION
        }
    );
    assert!(!a.task.is_finished());
    a.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn a_conflicting_takeover_does_not_lead() {
    let api = FakeApi::default();
    api.put_raw(
        Some(lease_object(Some(
            json!({"holderIdentity": "ghost", "leaseDurationSeconds": 1}),
        ))),
        false,
    );
    let t0 = Instant::now();
    api.fault("b", Some(Method::PUT), 1, Fault::Status(409));
    let mut b = spawn(&api, config("b"));
    // t0: valid (just observed); t0+2: expired, PUT → 409; t0+4: taken.
    tokio::time::sleep_until(t0 + secs(3.0)).await;
    assert_eq!(
        b.current(),
        Leadership::Standby {
            holder: Some("ghost".into())
        }
    );
    assert_eq!(b.leading().await, t0 + secs(4.0));
    b.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn two_standbys_racing_for_an_expired_lease_elect_exactly_one() {
    let api = FakeApi::default();
    api.put_raw(
        Some(lease_object(Some(
            json!({"holderIdentity": "ghost", "leaseDurationSeconds": 1}),
        ))),
        false,
    );
    // Some latency, so both read the expired Lease before either writes.
    api.set_latency("b", secs(0.2));
    api.set_latency("c", secs(0.2));
    let mut b = spawn(&api, config("b"));
    let mut c = spawn(&api, config("c"));
    let first = tokio::select! {
        _ = b.leading() => "b",
        _ = c.leading() => "c",
    };
    let (winner, mut loser) = if first == "b" { (b, c) } else { (c, b) };
    assert!(!loser.leads_within(Duration::from_secs(120)).await);
    assert!(winner.current().is_leading());
    assert_eq!(api.spec()["holderIdentity"], first);
    let loser_conflicts = api
        .log()
        .iter()
        .filter(|r| r.agent != first && r.method == Method::PUT && r.status == Some(409))
        .count();
    assert_eq!(loser_conflicts, 1, "the loser's UPDATE was refused once");
    loser.stop().await.expect("stops");
    winner.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_reads_someone_else_in_the_lease_loses_at_once() {
    let edits: [(&str, LeaseEdit, Option<&str>); 3] = [
        (
            "taken",
            |api| api.edit_spec(|s| s["holderIdentity"] = json!("intruder")),
            Some("intruder"),
        ),
        (
            "emptied",
            |api| api.edit_spec(|s| s["holderIdentity"] = json!("")),
            None,
        ),
        ("deleted", |api| api.put_raw(None, false), None),
    ];
    for (what, edit, holder) in edits {
        let api = FakeApi::default();
        let t0 = Instant::now();
        let mut a = spawn(&api, config("a"));
        a.leading().await;
        tokio::time::sleep_until(t0 + secs(3.0)).await;
        edit(&api);
        let lost = a.until(|s| *s == Leadership::Lost).await;
        assert_eq!(lost, t0 + secs(4.0), "{what}: at the next try");
        match a.task.await.expect("no panic") {
            Err(LeaderError::Superseded { holder: h, .. }) => {
                assert_eq!(h.as_deref(), holder, "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
        if what == "taken" {
            assert_eq!(api.spec()["holderIdentity"], "intruder", "left alone");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn any_write_to_the_lease_restarts_the_wait() {
    // A dead holder's Lease (3 s), touched by someone else at t0+2 without changing the spec
    // (e.g. a label): the standby counts the 3 s from its observation of that write.
    let api = FakeApi::default();
    api.put_raw(
        Some(lease_object(Some(
            json!({"holderIdentity": "x", "leaseDurationSeconds": 3}),
        ))),
        false,
    );
    let t0 = Instant::now();
    let mut b = spawn(&api, config("b"));
    tokio::time::sleep_until(t0 + secs(1.0)).await;
    let mut touched = api.lease().expect("lease");
    touched["metadata"]["labels"] = json!({"touched": "yes"});
    api.put_raw(Some(touched), false);
    // Tries at t0 (observed), t0+2 (changed: observed again), t0+4 (valid), t0+6 (taken).
    assert_eq!(b.leading().await, t0 + secs(6.0));
    assert_eq!(
        api.lease().expect("lease")["metadata"]["labels"]["touched"],
        "yes",
        "metadata kept"
    );
    b.stop().await.expect("released");
}

/// How a standby must treat a hostile Lease found at t0.
#[derive(Debug)]
enum Expect {
    /// Takes it at t0 + this, with this `leaseTransitions`.
    TakenAfter(f64, i64),
    /// Writes nothing for this long; publishes this standby state.
    Untouched(Duration, Option<&'static str>),
}

#[tokio::test(start_paused = true)]
async fn hostile_lease_contents_never_panic() {
    let hour = Duration::from_secs(3600);
    let minute = Duration::from_secs(60);
    let micro = "2020-01-01T00:00:00.000000Z";
    let cases: Vec<(&str, Value, bool, Expect)> = vec![
        (
            "no spec",
            lease_object(None),
            false,
            Expect::TakenAfter(0.0, 1),
        ),
        (
            "empty spec",
            lease_object(Some(json!({}))),
            false,
            Expect::TakenAfter(0.0, 1),
        ),
        (
            "null spec",
            lease_object(Some(Value::Null)),
            false,
            Expect::TakenAfter(0.0, 1),
        ),
        (
            "empty holder",
            lease_object(Some(
                json!({"holderIdentity": "", "leaseDurationSeconds": 15}),
            )),
            false,
            Expect::TakenAfter(0.0, 1),
        ),
        // Unusable durations read as the configured 15 s from our first observation: expired
        // from t0+15, taken at the try at t0+16.
        (
            "held, no duration",
            lease_object(Some(json!({"holderIdentity": "x"}))),
            false,
            Expect::TakenAfter(16.0, 1),
        ),
        (
            "held, negative duration",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": -5}),
            )),
            false,
            Expect::TakenAfter(16.0, 1),
        ),
        (
            "held, zero duration",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": 0}),
            )),
            false,
            Expect::TakenAfter(16.0, 1),
        ),
        (
            "held, int32 minimum duration",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": i32::MIN}),
            )),
            false,
            Expect::TakenAfter(16.0, 1),
        ),
        (
            "held, short duration honoured",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": 3}),
            )),
            false,
            Expect::TakenAfter(4.0, 1),
        ),
        (
            "held, int32 maximum duration honoured",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": i32::MAX}),
            )),
            false,
            Expect::Untouched(hour, Some("x")),
        ),
        (
            "negative transitions",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": 1, "leaseTransitions": -7}),
            )),
            false,
            Expect::TakenAfter(2.0, 1),
        ),
        (
            "transitions at int32 maximum",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": 1, "leaseTransitions": i32::MAX}),
            )),
            false,
            Expect::TakenAfter(2.0, i64::from(i32::MAX)),
        ),
        (
            "whitespace holder is a holder",
            lease_object(Some(
                json!({"holderIdentity": " ", "leaseDurationSeconds": 3}),
            )),
            false,
            Expect::TakenAfter(4.0, 1),
        ),
        (
            "holder of another format",
            lease_object(Some(json!({
                "holderIdentity": "system:serviceaccount:kube-system:x/ünïcödé\u{0}",
                "leaseDurationSeconds": 3,
                "renewTime": micro, "acquireTime": micro,
            }))),
            false,
            Expect::TakenAfter(4.0, 1),
        ),
        (
            "renewTime from the far future changes nothing",
            lease_object(Some(json!({
                "holderIdentity": "x", "leaseDurationSeconds": 3,
                "renewTime": "9000-12-31T23:59:59.999999Z",
            }))),
            false,
            Expect::TakenAfter(4.0, 1),
        ),
        (
            // Valid for Go, beyond jiff's range (which ends 9999-12-30T22:00Z): undecodable.
            "renewTime beyond the decoder's range",
            lease_object(Some(json!({
                "holderIdentity": "x", "leaseDurationSeconds": 3,
                "renewTime": "9999-12-31T23:59:59.999999Z",
            }))),
            false,
            Expect::Untouched(Duration::from_secs(60), None),
        ),
        (
            "renewTime that is not a time",
            lease_object(Some(
                json!({"holderIdentity": "", "renewTime": "yesterday"}),
            )),
            false,
            Expect::Untouched(minute, None),
        ),
        (
            "holder that is a number",
            lease_object(Some(json!({"holderIdentity": 42}))),
            false,
            Expect::Untouched(minute, None),
        ),
        (
            "duration that is a string",
            lease_object(Some(json!({"leaseDurationSeconds": "15"}))),
            false,
            Expect::Untouched(minute, None),
        ),
        (
            "duration beyond int32",
            lease_object(Some(
                json!({"holderIdentity": "x", "leaseDurationSeconds": 1_000_000_000_000_i64}),
            )),
            false,
            Expect::Untouched(minute, None),
        ),
        (
            "spec that is not an object",
            lease_object(Some(json!("nonsense"))),
            false,
            Expect::Untouched(minute, None),
        ),
        (
            "no resourceVersion",
            lease_object(Some(json!({"holderIdentity": ""}))),
            true,
            Expect::Untouched(minute, None),
        ),
        (
            "our own identity (an earlier write of ours)",
            lease_object(Some(json!({
                "holderIdentity": "b", "leaseDurationSeconds": 15, "leaseTransitions": 4,
                "acquireTime": micro, "renewTime": micro,
            }))),
            false,
            Expect::TakenAfter(0.0, 4),
        ),
    ];
    for (what, lease, keep_resource_version, expect) in cases {
        let api = FakeApi::default();
        api.put_raw(Some(lease), keep_resource_version);
        let t0 = Instant::now();
        let mut b = spawn(&api, config("b"));
        match expect {
            Expect::TakenAfter(after, transitions) => {
                assert!(
                    b.leads_within(secs(after + 60.0)).await,
                    "{what}: {:?}",
                    api.log().last()
                );
                assert_eq!(Instant::now() - t0, secs(after), "{what}");
                let spec = api.spec();
                assert_eq!(spec["holderIdentity"], "b", "{what}");
                assert_eq!(spec["leaseTransitions"], json!(transitions), "{what}");
                assert_eq!(spec["leaseDurationSeconds"], json!(15), "{what}");
                if what.starts_with("our own") {
                    assert_eq!(spec["acquireTime"], micro, "{what}: acquire time kept");
                }
            }
            Expect::Untouched(within, holder) => {
                assert!(!b.leads_within(within).await, "{what}");
                assert_eq!(writes(&api, "b"), 0, "{what}");
                assert_eq!(
                    b.current(),
                    Leadership::Standby {
                        holder: holder.map(str::to_owned)
                    },
                    "{what}"
                );
                assert!(
                    api.requests("b", Method::GET).len() >= 30,
                    "{what}: keeps trying"
                );
            }
        }
        b.stop().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lease_turns_undecodable_loses_at_the_deadline() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    tokio::time::sleep_until(t0 + secs(1.0)).await;
    api.edit_spec(|s| s["renewTime"] = json!("not a time"));
    assert_eq!(
        a.until(|s| *s == Leadership::Lost).await,
        t0 + RENEW_DEADLINE
    );
    assert!(matches!(
        a.task.await.expect("no panic"),
        Err(LeaderError::RenewDeadlineExceeded {
            last_error: Some(RequestError::Kube(kube::Error::SerdeError(_))),
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_before_the_first_try_and_while_standing_by_writes_nothing() {
    let api = FakeApi::default();
    let b = spawn(&api, config("b"));
    assert!(b.stop().await.is_ok());
    assert!(api.log().is_empty(), "no request at all");

    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    let b = spawn(&api, config("b"));
    tokio::time::sleep_until(t0 + secs(7.0)).await;
    let state = b.state.clone();
    assert!(b.stop().await.is_ok());
    assert_eq!(*state.borrow(), Leadership::Stopped);
    assert_eq!(writes(&api, "b"), 0);
    a.stop().await.expect("released");
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_takeover_whose_answer_is_lost_still_releases() {
    let api = FakeApi::default();
    api.put_raw(
        Some(lease_object(Some(json!({"holderIdentity": ""})))),
        false,
    );
    api.fault("b", Some(Method::PUT), 1, Fault::CommitThenHang);
    let t0 = Instant::now();
    let b = spawn(&api, config("b"));
    tokio::time::sleep_until(t0 + secs(1.0)).await;
    assert_eq!(
        api.spec()["holderIdentity"],
        "b",
        "the takeover committed unanswered"
    );
    assert!(b.stop().await.is_ok());
    assert_eq!(
        api.spec()["holderIdentity"],
        "",
        "released after re-reading"
    );
    assert_eq!(api.spec()["leaseDurationSeconds"], json!(1));
}

#[tokio::test(start_paused = true)]
async fn release_leaves_a_lease_someone_else_took_alone() {
    let api = FakeApi::default();
    let t0 = Instant::now();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    tokio::time::sleep_until(t0 + secs(1.0)).await;
    api.edit_spec(|s| s["holderIdentity"] = json!("c"));
    let before = api.lease();
    assert!(a.stop().await.is_ok());
    assert_eq!(api.lease(), before, "not ours any more: untouched");
    let last = api.requests("a", Method::PUT).pop().expect("release try");
    assert_eq!(last.status, Some(409), "the stale release was refused");
}

#[tokio::test(start_paused = true)]
async fn a_failed_release_is_reported() {
    let api = FakeApi::default();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    api.fault("a", Some(Method::PUT), usize::MAX, Fault::Status(500));
    match a.stop().await {
        Err(e @ LeaderError::Release { .. }) => assert_eq!(e.metric_label(), "leader_release"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        api.spec()["holderIdentity"],
        "a",
        "the Lease expires instead"
    );
}

#[tokio::test(start_paused = true)]
async fn release_of_a_hung_server_is_bounded_by_the_renew_deadline() {
    let api = FakeApi::default();
    let mut a = spawn(&api, config("a"));
    a.leading().await;
    api.fault("a", None, usize::MAX, Fault::Hang);
    let asked = Instant::now();
    assert!(matches!(
        a.stop().await,
        Err(LeaderError::Release {
            source: RequestError::TimedOut(_),
            ..
        })
    ));
    assert!(Instant::now() - asked <= RENEW_DEADLINE);
}

// ---------------------------------------------------------------- write intents (issue 30)

fn spawn_with_intents(api: &FakeApi, config: LeaseConfig) -> (Elector, Arc<WriteIntents>) {
    let intents = Arc::new(WriteIntents::new());
    let elector = LeaderElector::new(api.client(&config.identity), config)
        .expect("valid config")
        .with_write_intents(intents.clone());
    (run_elector(elector), intents)
}

fn write_intent(node: &str, cidr: &str) -> WriteIntent {
    WriteIntent {
        node: node.to_owned(),
        uid: Some(format!("uid-{node}")),
        pod_cidrs: vec![cidr.to_owned()],
    }
}

fn stored_intents(api: &FakeApi) -> String {
    api.lease()
        .and_then(|l| {
            l["metadata"]["annotations"][WRITE_INTENTS_ANNOTATION]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn an_added_intent_is_written_at_once_and_a_successor_takes_the_lease_with_it() {
    let api = FakeApi::default();
    let (mut a, a_intents) = spawn_with_intents(&api, config("a"));
    a.leading().await;
    let writes_before = writes(&api, "a");
    let recorded_at = Instant::now();
    let generation = a_intents
        .record(write_intent("z-3", "10.64.16.0/24"))
        .expect("room");
    assert!(
        a_intents
            .wait_committed(generation, std::future::pending())
            .await
    );
    assert!(
        Instant::now() - recorded_at < RETRY_PERIOD,
        "written at once, not at the next renewal"
    );
    assert_eq!(writes(&api, "a"), writes_before + 1, "one Lease write");
    assert!(stored_intents(&api).contains("10.64.16.0/24"));

    // A dies; B takes the Lease with A's intent and keeps it there.
    let (mut b, b_intents) = spawn_with_intents(&api, config("b"));
    a.kill().await;
    b.leading().await;
    assert_eq!(
        b_intents.inherited(),
        [write_intent("z-3", "10.64.16.0/24")]
    );
    assert!(stored_intents(&api).contains("10.64.16.0/24"));
    // Settled: gone from the Lease at B's next write (a renewal), with no write of its own.
    let writes_before = writes(&api, "b");
    b_intents.settle("z-3");
    tokio::time::sleep(RETRY_PERIOD + secs(0.1)).await;
    assert_eq!(writes(&api, "b"), writes_before + 1);
    assert_eq!(stored_intents(&api), "[]");
    let _ = b.stop().await;
}

/// Issue 30 item 5: a writer waiting for its intent gets a Lease write at once while credit
/// remains (two batches' worth after a quiet time); once it is spent, its intent rides on the
/// next renewal — no write of its own; a full batch is written at once with nobody waiting.
#[tokio::test(start_paused = true)]
async fn without_credit_an_intent_rides_on_the_next_renewal_and_a_full_batch_is_written_at_once() {
    use super::intents::{INTENT_BATCH, INTENT_CREDIT_CAP};
    let api = FakeApi::default();
    let (mut a, a_intents) = spawn_with_intents(&api, config("a"));
    a.leading().await;
    // Spend the credit: each of these is written at once.
    for n in 0..INTENT_CREDIT_CAP / INTENT_BATCH {
        let writes_before = writes(&api, "a");
        let recorded_at = Instant::now();
        let generation = a_intents
            .record(write_intent(&format!("n{n}"), "10.64.0.0/24"))
            .expect("room");
        assert!(
            a_intents
                .wait_committed(generation, std::future::pending())
                .await
        );
        assert!(Instant::now() - recorded_at < RETRY_PERIOD, "n{n} at once");
        assert_eq!(writes(&api, "a"), writes_before + 1);
    }
    // No credit left: the next one waits for the renewal, which it does not bring forward.
    let writes_before = writes(&api, "a");
    let generation = a_intents
        .record(write_intent("late", "10.64.9.0/24"))
        .expect("room");
    let last_write = Instant::now();
    assert!(
        a_intents
            .wait_committed(generation, std::future::pending())
            .await
    );
    assert!(
        Instant::now() - last_write >= RETRY_PERIOD - secs(0.1),
        "committed by the renewal, not at once"
    );
    assert_eq!(writes(&api, "a"), writes_before + 1, "the renewal alone");
    assert!(stored_intents(&api).contains("10.64.9.0/24"));
    // A full batch, nobody waiting: written at once.
    tokio::time::sleep(secs(0.1)).await;
    let writes_before = writes(&api, "a");
    for n in 0..INTENT_BATCH {
        a_intents.record(write_intent(&format!("b{n}"), "10.65.0.0/24"));
    }
    tokio::time::sleep(secs(0.1)).await;
    assert_eq!(writes(&api, "a"), writes_before + 1, "the batch's write");
    assert!(stored_intents(&api).contains(&format!("\"b{}\"", INTENT_BATCH - 1)));
    let _ = a.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deposed_holder_cannot_get_an_intent_committed() {
    let api = FakeApi::default();
    let (mut a, a_intents) = spawn_with_intents(&api, config("a"));
    a.leading().await;
    // Someone else holds the Lease now (as after a takeover A did not see).
    api.edit_spec(|spec| spec["holderIdentity"] = json!("b"));
    let generation = a_intents
        .record(write_intent("z-3", "10.64.16.0/24"))
        .expect("room");
    let mut lost = a.state.clone();
    let committed = a_intents
        .wait_committed(generation, async move {
            let _ = lost.wait_for(|l| !l.is_leading()).await;
        })
        .await;
    assert!(!committed, "no intent of a deposed holder is committed");
    assert!(!stored_intents(&api).contains("z-3"));
    assert!(matches!(
        a.stop().await,
        Err(LeaderError::Superseded { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_intents_cannot_be_read_is_not_taken() {
    let api = FakeApi::default();
    let mut lease = lease_object(Some(json!({"holderIdentity": ""})));
    lease["metadata"]["annotations"] = json!({ WRITE_INTENTS_ANNOTATION: "[{\"node\": 3}]" });
    api.put_raw(Some(lease), false);
    let (mut b, _) = spawn_with_intents(&api, config("b"));
    assert!(!b.leads_within(RETRY_PERIOD * 5).await);
    assert_eq!(
        writes(&api, "b"),
        0,
        "nothing written over the unreadable intents"
    );
    let _ = b.stop().await;
}
