//! The controller's tasks: [`OwnedTask`] (every task [`super::run`] spawns, aborted when its
//! handle is dropped), [`stopped`] (the stop signal as a future), and the process-wide panic
//! record ([`install_panic_hook`], [`panic_watch`], [`panic_text`]) that makes a panic anywhere
//! fail a running [`super::run`].

use std::future::Future;
use std::sync::OnceLock;

use tokio::sync::watch;

/// The process-wide record of a panic, set by the hook [`install_panic_hook`] installs.
fn panic_channel() -> &'static watch::Sender<Option<String>> {
    static PANICKED: OnceLock<watch::Sender<Option<String>>> = OnceLock::new();
    PANICKED.get_or_init(|| watch::Sender::new(None))
}

pub(crate) fn panic_watch() -> watch::Receiver<Option<String>> {
    panic_channel().subscribe()
}

/// The text of a panic payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Installs a panic hook that logs a panic as one error line (message and location) and makes
/// a running [`super::run`] fail, whichever task panicked — including tasks inside the client stack that
/// the controller does not own (a panicking request-buffer worker otherwise leaves a process that
/// retries forever and answers `/healthz` with 200).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = panic_text(info.payload());
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        tracing::error!(
            panic = %message,
            %location,
            thread = thread.name().unwrap_or("?"),
            "a task panicked; exiting"
        );
        panic_channel().send_replace(Some(format!("{message} at {location}")));
    }));
}

/// A task `run` spawned, aborted when this handle is dropped. `run` owns every task it spawns, so
/// dropping its future stops them all at once, as `kill -9` stops a process: no write is sent
/// afterwards and the Lease is not released (a release would let a standby in at once while a
/// write of ours may still land). Found by the chaos suite: with plain `JoinHandle`s an aborted
/// `run` left its workers writing and its elector releasing the Lease.
pub(crate) struct OwnedTask<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> OwnedTask<T> {
    /// Spawns `task` on the current runtime.
    pub(crate) fn spawn(task: impl Future<Output = T> + Send + 'static) -> OwnedTask<T> {
        OwnedTask(tokio::spawn(task))
    }
}

impl<T> OwnedTask<T> {
    /// Asks the task to stop (it is dropped at its next await).
    pub(crate) fn abort(&self) {
        self.0.abort();
    }

    /// Whether the task has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> Future for OwnedTask<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for OwnedTask<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once `stop` is true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dropping the handle aborts the task: nothing it would do afterwards happens.
    #[tokio::test(start_paused = true)]
    async fn dropping_an_owned_task_aborts_it() {
        let (done_tx, mut done_rx) = watch::channel(false);
        let task = OwnedTask::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let _ = done_tx.send(true);
        });
        assert!(!task.is_finished());
        drop(task);
        // The sender went with the aborted task: the channel closes without ever saying true.
        assert!(done_rx.wait_for(|done| *done).await.is_err());

        let finished = OwnedTask::spawn(async { 7 });
        assert_eq!(finished.await.ok(), Some(7));
    }

    /// `stopped` resolves on `true` and when the sender is gone, not before.
    #[tokio::test(start_paused = true)]
    async fn stopped_resolves_on_true_or_a_dropped_sender() {
        let (stop_tx, mut stop) = watch::channel(false);
        let waiting = tokio::spawn(async move { stopped(&mut stop).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        stop_tx.send_replace(true);
        assert!(waiting.await.is_ok());
        let (stop_tx, mut stop) = watch::channel(false);
        drop(stop_tx);
        stopped(&mut stop).await;
    }

    #[test]
    fn panic_text_reads_str_and_string_payloads() {
        let text: Box<dyn std::any::Any + Send> = Box::new("static");
        assert_eq!(panic_text(text.as_ref()), "static");
        let text: Box<dyn std::any::Any + Send> = Box::new(String::from("formatted 7"));
        assert_eq!(panic_text(text.as_ref()), "formatted 7");
        let other: Box<dyn std::any::Any + Send> = Box::new(7_u8);
        assert_eq!(panic_text(other.as_ref()), "(no message)");
    }
}
