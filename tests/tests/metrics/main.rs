//! End-to-end tests that read the process-wide metrics recorder (`metrics::set_global_recorder`
//! is once per process, and every controller running in the process writes the same series): in a
//! test binary of their own, apart from the `e2e` suite whose controllers run side by side. The
//! tests here share one recorder ([`recorder`]) and run one at a time (its guard).

#[path = "../common/mod.rs"]
mod common;

mod node_selector;
mod standby;

use std::sync::OnceLock;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{Mutex, MutexGuard};

/// The process's recorder (`nodeipam::metrics::install_recorder`, installed at the first call)
/// and a guard: hold it for the whole test, so that no other test's controller writes the series
/// it reads.
async fn recorder() -> (PrometheusHandle, MutexGuard<'static, ()>) {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    static ALONE: Mutex<()> = Mutex::const_new(());
    let alone = ALONE.lock().await;
    let handle = HANDLE
        .get_or_init(|| nodeipam::metrics::install_recorder().expect("the first recorder"))
        .clone();
    (handle, alone)
}
