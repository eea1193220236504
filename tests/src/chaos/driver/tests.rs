//! The driver's own behaviour, on a real seed's plan without its schedule.

use super::*;

/// Seed 10207's failure, made to happen: the leader loses the Lease between the settled check
/// and its stop (here every Lease request fails until it gives up; there, its timers ran late).
/// The end phase starts new replicas and settles again, so the end-state comparison still runs
/// on a leader's summary. (Without the re-settle: "no leader's summary at the end".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_after_the_settled_check_is_settled_again() {
    let mut plan = Plan::of_seed(10207, false);
    assert_eq!(
        plan.replicas, 2,
        "seed 10207 runs two replicas with leader election"
    );
    plan.steps.clear();
    let hooks = Hooks {
        lease_fails_after_settled: true,
    };
    let report = match run_plan_with(&plan, hooks).await {
        Ok(report) => report,
        Err(failure) => panic!("{failure}"),
    };
    assert_eq!(report.resettles, 1, "{:#?}", report.log);
    let lost = report
        .log
        .iter()
        .any(|line| line.contains("lost the Lease") && line.contains("500"));
    assert!(
        lost,
        "the leader's loss is logged with its cause: {:#?}",
        report.log
    );
}
