//! WATCH: a chunked stream of JSON lines `{"type": …, "object": …}` read from the change history.
//!
//! Fan-out is cheap: each change's line is built once ([`super::store::Change::line`]) from the
//! stored JSON of its object and shared by every watcher; a watcher copies lines into chunks of up
//! to [`CHUNK_BYTES`] (initial events too), so a burst of changes is a few writes, not one per
//! event.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::object::StoredObject;
use super::resource::Resource;
use super::select::Selector;
use super::server::Shared;
use super::status::ApiError;
use super::store::{Change, ChangeType};

/// Bytes a watcher gathers before it sends a chunk.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Parameters of one watch.
#[derive(Debug, Clone)]
pub struct WatchParams {
    /// Resource.
    pub resource: Resource,
    /// Namespace (`None` = all / cluster-scoped).
    pub namespace: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents` (after `SetListOptionsDefaults`, see [`super::options`]).
    pub send_initial_events: Option<bool>,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Selectors.
    pub selector: Selector,
}

/// `{"type":"<ty>","object":<full object JSON>}\n` from the stored JSON (no serialization).
pub fn event_line(ty: &str, obj: &StoredObject) -> Bytes {
    let mut buf = Vec::with_capacity(obj.json_len() + 80);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(ty.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    obj.write_json(&mut buf);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
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
fn filtered(change: &Change, sel: &Selector) -> Option<ChangeType> {
    if sel.is_empty() {
        return Some(change.kind);
    }
    let now = sel.matches_object(&change.object);
    let before = change.prev.as_ref().is_some_and(|p| sel.matches_object(p));
    match change.kind {
        ChangeType::Added => now.then_some(ChangeType::Added),
        ChangeType::Modified => match (before, now) {
            (true, true) => Some(ChangeType::Modified),
            (false, true) => Some(ChangeType::Added),
            (true, false) => Some(ChangeType::Deleted),
            (false, false) => None,
        },
        ChangeType::Deleted => (before || now).then_some(ChangeType::Deleted),
    }
}

/// Lines gathered into chunks of about [`CHUNK_BYTES`].
struct Chunks {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Chunks {
    /// Add a line; `false` when the client has gone.
    async fn push(&mut self, line: &[u8]) -> bool {
        self.buf.extend_from_slice(line);
        if self.buf.len() >= CHUNK_BYTES {
            return self.flush().await;
        }
        true
    }

    /// Send what is gathered; `false` when the client has gone.
    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return true;
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.send(Ok(chunk)).await.is_ok()
    }
}

/// Where a watch starts (see [`start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Send the state at the start as ADDED events first.
    initial: bool,
    /// Then a BOOKMARK with `k8s.io/initial-events-end: "true"`.
    end_bookmark: bool,
    /// Start after this resourceVersion (`None` = the current one).
    from: Option<u64>,
}

/// The start of a watch, as kube-apiserver's watch cache plans it (`Cacher.Watch`,
/// `apiserver/pkg/storage/cacher/cacher.go`):
/// - `sendInitialEvents=true` (a *streaming list*; with WatchList on, also every watch with
///   resourceVersion `""`/`"0"`, see [`super::options`]): ADDED events for the current state —
///   for resourceVersion `N` it must be at least `N` (`NotOlderThan`), else 504 Too large
///   resource version (kube-apiserver waits up to 3 s first) — then, with
///   `allowWatchBookmarks`, a BOOKMARK at the state's resourceVersion annotated
///   `k8s.io/initial-events-end: "true"` (`isListWatchRequest`, `setInitialEventsEndBookmarkIfRequested`);
/// - `sendInitialEvents=false`: no initial events, changes after `N`, or after the current
///   resourceVersion for `""`/`"0"`;
/// - no `sendInitialEvents` (WatchList off): `""`/`"0"` ⇒ the legacy initial ADDED events without
///   the end bookmark; `N` ⇒ changes after `N` (410 in the stream when `N` is too old).
fn plan(p: &WatchParams, current: u64) -> Result<Plan, ApiError> {
    let rv: Option<u64> = match p.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    Ok(match p.send_initial_events {
        Some(true) => {
            if let Some(n) = rv
                && n > current
            {
                return Err(ApiError::too_large_resource_version(n, current));
            }
            Plan {
                initial: true,
                end_bookmark: p.bookmarks,
                from: None,
            }
        }
        Some(false) => Plan {
            initial: false,
            end_bookmark: false,
            from: rv,
        },
        None => Plan {
            initial: rv.is_none(),
            end_bookmark: false,
            from: rv,
        },
    })
}

/// Start a watch: returns the receiving end of the chunk stream (the task ends when the client goes
/// away, the timeout passes, watches are dropped, or the server shuts down). See `plan` for
/// where it starts.
///
/// # Errors
/// 400 for a malformed resourceVersion, 504 for a streaming list from a future resourceVersion.
pub fn start(
    shared: Arc<Shared>,
    p: WatchParams,
) -> Result<mpsc::Receiver<Result<Bytes, std::io::Error>>, ApiError> {
    let plan = plan(&p, shared.store().resource_version())?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let mut rv_rx = shared.rv_tx.subscribe();
    let mut drop_rx = shared.drop_tx.subscribe();
    let mut shutdown_rx = shared.shutdown_tx.subscribe();
    let interval = shared.bookmark_interval;
    tokio::spawn(async move {
        let ns = p.namespace.as_deref();
        let deadline = p.timeout.map(|t| tokio::time::Instant::now() + t);
        rv_rx.borrow_and_update();
        drop_rx.borrow_and_update();
        let mut out = Chunks {
            tx,
            buf: Vec::new(),
        };
        let (mut last, first): (u64, Vec<Arc<StoredObject>>) = {
            let store = shared.store();
            let current = store.resource_version();
            match (plan.initial, plan.from) {
                (true, _) => (current, store.stored(p.resource, ns).cloned().collect()),
                (false, Some(rv)) => (rv, Vec::new()),
                (false, None) => (current, Vec::new()),
            }
        };
        for o in first.iter().filter(|o| p.selector.matches_object(o)) {
            if !out.push(&event_line("ADDED", o)).await {
                return;
            }
        }
        drop(first);
        if plan.end_bookmark
            && !out
                .push(&line("BOOKMARK", &bookmark(p.resource, last, true)))
                .await
        {
            return;
        }
        loop {
            let batch = {
                let store = shared.store();
                store
                    .changes_since(p.resource, ns, last)
                    .map(|c| (c, store.resource_version()))
            };
            match batch {
                Err(e) => {
                    if p.resource == Resource::Nodes && e.code == 410 {
                        shared.stats.gone410.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = out.push(&line("ERROR", &e.to_status())).await;
                    let _ = out.flush().await;
                    return;
                }
                Ok((changes, current)) => {
                    for c in &changes {
                        if !shared.watch_event_delay.is_zero() {
                            // What is gathered goes out first: the pause is the stream's, not
                            // a buffer's.
                            if !out.flush().await {
                                return;
                            }
                            tokio::time::sleep(shared.watch_event_delay).await;
                        }
                        let sent = match filtered(c, &p.selector) {
                            Some(ty) if ty == c.kind => out.push(&c.line()).await,
                            Some(ty) => out.push(&event_line(ty.as_str(), &c.object)).await,
                            None => true,
                        };
                        if !sent {
                            return;
                        }
                    }
                    last = last.max(current);
                }
            }
            if !out.flush().await {
                return;
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
                    if !out.push(&line("BOOKMARK", &bookmark(p.resource, last, false))).await {
                        return;
                    }
                }
                _ = out.tx.closed() => return,
            }
        }
    });
    Ok(rx)
}
