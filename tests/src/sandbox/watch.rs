//! WATCH: a chunked stream of JSON lines `{"type": …, "object": …}` read from the change history.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::resource::Resource;
use super::select::Selector;
use super::server::Shared;
use super::status::ApiError;
use super::store::{Change, ChangeType};

/// Parameters of one watch.
#[derive(Debug, Clone)]
pub struct WatchParams {
    /// Resource.
    pub resource: Resource,
    /// Namespace (`None` = all / cluster-scoped).
    pub namespace: Option<String>,
    /// `resourceVersion` (`None`/`""`/`"0"` = start with the current state as ADDED events).
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Selectors.
    pub selector: Selector,
}

fn line(ty: &str, object: &Value) -> Bytes {
    let mut buf = serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
    buf.push(b'\n');
    Bytes::from(buf)
}

fn bookmark(res: Resource, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": res.kind(), "apiVersion": res.api_version(), "metadata": meta})
}

/// What a change looks like to a watcher with a selector (objects entering or leaving the
/// selection become ADDED/DELETED, as the watch cache does).
fn filtered(change: &Change, sel: &Selector) -> Option<&'static str> {
    let now = sel.matches(&change.object);
    let before = change.prev.as_ref().is_some_and(|p| sel.matches(p));
    match change.kind {
        ChangeType::Added => now.then_some("ADDED"),
        ChangeType::Modified => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
        ChangeType::Deleted => (before || now).then_some("DELETED"),
    }
}

/// Start a watch: returns the receiving end of the chunk stream (the task ends when the client goes
/// away, the timeout passes, watches are dropped, or the server shuts down).
///
/// # Errors
/// 400 for a malformed resourceVersion.
pub fn start(
    shared: Arc<Shared>,
    p: WatchParams,
) -> Result<mpsc::Receiver<Result<Bytes, std::io::Error>>, ApiError> {
    let from: Option<u64> = match p.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let mut rv_rx = shared.rv_tx.subscribe();
    let mut drop_rx = shared.drop_tx.subscribe();
    let mut shutdown_rx = shared.shutdown_tx.subscribe();
    let interval = shared.bookmark_interval;
    tokio::spawn(async move {
        let ns = p.namespace.as_deref();
        let deadline = p.timeout.map(|t| tokio::time::Instant::now() + t);
        rv_rx.borrow_and_update();
        drop_rx.borrow_and_update();
        let initial = from.is_none() || p.send_initial_events;
        let (mut last, first): (u64, Vec<Value>) = {
            let store = shared
                .store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match from {
                Some(rv) if !p.send_initial_events => (rv, Vec::new()),
                _ => {
                    let objs: Vec<Value> = store
                        .objects(p.resource, ns)
                        .into_iter()
                        .filter(|o| p.selector.matches(o))
                        .collect();
                    (store.resource_version(), objs)
                }
            }
        };
        if initial {
            for o in &first {
                if tx.send(Ok(line("ADDED", o))).await.is_err() {
                    return;
                }
            }
            if p.send_initial_events
                && p.bookmarks
                && tx
                    .send(Ok(line("BOOKMARK", &bookmark(p.resource, last, true))))
                    .await
                    .is_err()
            {
                return;
            }
        }
        loop {
            let batch = {
                let store = shared
                    .store
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                store
                    .changes_since(p.resource, ns, last)
                    .map(|c| (c, store.resource_version()))
            };
            match batch {
                Err(e) => {
                    let _ = tx.send(Ok(line("ERROR", &e.to_status()))).await;
                    return;
                }
                Ok((changes, current)) => {
                    for c in &changes {
                        if let Some(ty) = filtered(c, &p.selector)
                            && tx.send(Ok(line(ty, &c.object))).await.is_err()
                        {
                            return;
                        }
                    }
                    last = last.max(current);
                }
            }
            let sleep_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = drop_rx.changed() => return,
                _ = shutdown_rx.changed() => return,
                r = rv_rx.changed() => if r.is_err() { return },
                _ = sleep_deadline => return,
                _ = tokio::time::sleep(interval), if p.bookmarks => {
                    if tx.send(Ok(line("BOOKMARK", &bookmark(p.resource, last, false)))).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    Ok(rx)
}
