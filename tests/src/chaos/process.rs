//! A tokio runtime of its own for each simulated process of a seed — each controller replica and
//! the sandbox API server — as each is its own process in a cluster (seed 10207,
//! RELIABILITY.md).
//!
//! On one shared runtime, a synchronous section anywhere (another seed's final checks, a
//! sandbox's store lock, building a kube client) holds a worker thread that every replica's
//! Lease timer also needs; with two workers and a dozen seeds, a leader's renewals could wait
//! past the renew deadline although nothing of its own plan was failing. With a runtime per
//! process, a replica's timers and requests wait only for the machine's CPU and for its own
//! work, as in production (where a replica is also a `new_multi_thread` runtime with one worker
//! per core, `shell/src/main.rs`).

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// A multi-thread runtime (one worker per core, like the controller's binary) owned by one
/// simulated process. Dropping it shuts it down at once without waiting for its tasks — like a
/// process exiting — which is allowed inside another runtime's task.
#[derive(Debug)]
pub struct ProcessRuntime {
    handle: Handle,
    /// `None` only while being dropped.
    runtime: Option<Runtime>,
}

impl ProcessRuntime {
    /// A runtime whose threads are named `name`.
    ///
    /// # Errors
    /// The operating system's error creating its threads or its I/O driver.
    pub fn new(name: &str) -> io::Result<ProcessRuntime> {
        let runtime = Builder::new_multi_thread()
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(ProcessRuntime {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// The runtime's handle: `spawn` runs a task on it, `enter` makes it the runtime that
    /// `tokio::spawn` uses (a kube client spawns its request buffer's task when built).
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks run on the process's own threads; dropping the runtime inside another runtime's
    /// task does not panic and ends the tasks left on it, as a process's exit would.
    #[test]
    fn a_process_runtime_runs_its_tasks_and_ends_them_when_dropped() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        outer.block_on(async {
            let process = ProcessRuntime::new("chaos-test-process")
                .unwrap_or_else(|e| panic!("process runtime: {e}"));
            let thread = process
                .handle()
                .spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .unwrap_or_else(|e| panic!("task: {e}"));
            assert_eq!(thread.as_deref(), Some("chaos-test-process"));
            let forever = process.handle().spawn(std::future::pending::<()>());
            drop(process);
            // Bounded, so a runtime left running fails the test instead of hanging it.
            let ended = tokio::time::timeout(std::time::Duration::from_secs(60), forever)
                .await
                .unwrap_or_else(|_| panic!("the task outlived its process runtime"));
            assert!(
                ended
                    .as_ref()
                    .is_err_and(tokio::task::JoinError::is_cancelled),
                "{ended:?}"
            );
        });
    }
}
