//! The request log: a bounded ring of the last requests, in arrival order.
//!
//! A resource request is logged as soon as it has been received (its body read, its resource and
//! verb known; before any delay or fault), with `status: None`; the status is filled in when the
//! answer is produced. A request whose client gives up first stays with `status: None`, so the
//! log shows every request, answered or not (admin requests under `/sandbox/` are not logged).
//! The ring keeps the last
//! [`RequestLog::capacity`] records (older ones are dropped, oldest first) and a body only up to
//! [`RequestLog::body_limit`] bytes, so a long run cannot grow it without bound.

use std::collections::VecDeque;

use serde::Serialize;
use serde_json::Value;

use super::resource::{Resource, Verb};

/// Records kept by default.
pub const DEFAULT_REQUEST_LOG_CAPACITY: usize = 100_000;

/// Largest body (bytes) kept in a record by default; larger ones are logged as `body: None` with
/// their size.
pub const DEFAULT_REQUEST_BODY_LIMIT: usize = 16 * 1024;

/// What became of a late write ([`super::FaultAction::LateWrite`]), filled in when it has run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LateWriteOutcome {
    /// Not run yet.
    Pending,
    /// Committed at this resourceVersion (or a no-op: the object already was so).
    Committed {
        /// resourceVersion of the object after the write.
        resource_version: u64,
    },
    /// Refused against the object as it was at commit time.
    Failed {
        /// HTTP code the request would have got.
        code: u16,
        /// `Status.reason`.
        reason: String,
        /// `Status.message`.
        message: String,
    },
}

/// One logged request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Kubernetes verb (`None` for non-resource paths such as `/version`).
    #[serde(skip)]
    pub verb: Option<Verb>,
    /// Verb as text (`""` for non-resource paths).
    pub verb_name: &'static str,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Resource, if the path named one.
    #[serde(skip)]
    pub resource: Option<Resource>,
    /// Namespace from the path.
    pub namespace: Option<String>,
    /// Object name from the path.
    pub name: Option<String>,
    /// `Content-Type` header.
    pub content_type: Option<String>,
    /// `fieldManager` query parameter or the user-agent-derived manager.
    pub field_manager: String,
    /// Parsed JSON body (`None` without a body, for a body that is not JSON, or one larger than
    /// the log's body limit — see `body_size`).
    pub body: Option<Value>,
    /// Size of the request body in bytes.
    pub body_size: usize,
    /// `User-Agent` header (`""` without one).
    pub user_agent: String,
    /// HTTP status of the answer (200 for a watch that started); `None` while the request is
    /// still being handled and for a request that was never answered (its client gave up or
    /// disconnected first, or the connection was dropped by a fault; a committed write may have
    /// happened).
    pub status: Option<u16>,
    /// For a request held by a late-write fault: what its commit did (see
    /// [`super::FaultAction::LateWrite`]); `None` otherwise.
    pub late_write: Option<LateWriteOutcome>,
    /// When the sandbox had read the request (its body included): the instant kube-apiserver's
    /// request deadline counts from.
    #[serde(skip)]
    pub received: std::time::Instant,
}

/// The request log (see the module doc).
#[derive(Debug)]
pub struct RequestLog {
    /// Sequence number of `entries[0]`.
    first_seq: u64,
    entries: VecDeque<RequestRecord>,
    capacity: usize,
    body_limit: usize,
}

impl Default for RequestLog {
    fn default() -> Self {
        RequestLog::new(DEFAULT_REQUEST_LOG_CAPACITY, DEFAULT_REQUEST_BODY_LIMIT)
    }
}

impl RequestLog {
    /// A log keeping the last `capacity` records (at least 1) and bodies up to `body_limit` bytes.
    pub fn new(capacity: usize, body_limit: usize) -> Self {
        RequestLog {
            first_seq: 0,
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            body_limit,
        }
    }

    /// Records kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Largest body kept, in bytes.
    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// The parsed body to keep for a request body of these bytes (`None` beyond the limit).
    pub fn keep_body(&self, bytes: &[u8]) -> Option<Value> {
        if bytes.is_empty() || bytes.len() > self.body_limit {
            return None;
        }
        serde_json::from_slice(bytes).ok()
    }

    /// Log a request (normally with `status: None`); returns its sequence number for
    /// [`RequestLog::answered`]. The oldest record is dropped when the log is full.
    pub fn received(&mut self, rec: RequestRecord) -> u64 {
        let seq = self.first_seq + self.entries.len() as u64;
        self.entries.push_back(rec);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
            self.first_seq += 1;
        }
        seq
    }

    fn record_mut(&mut self, seq: u64) -> Option<&mut RequestRecord> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.entries.get_mut(index)
    }

    /// Record the status of the answer to request `seq` (a no-op if the record is gone: cleared
    /// or dropped from the ring).
    pub fn answered(&mut self, seq: u64, status: u16) {
        if let Some(rec) = self.record_mut(seq) {
            rec.status = Some(status);
        }
    }

    /// Record what the late write of request `seq` did (a no-op if the record is gone).
    pub fn late_write(&mut self, seq: u64, outcome: LateWriteOutcome) {
        if let Some(rec) = self.record_mut(seq) {
            rec.late_write = Some(outcome);
        }
    }

    /// Sequence number the next request gets (= requests logged since the start).
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    /// The records kept, in arrival order.
    pub fn records(&self) -> Vec<RequestRecord> {
        self.entries.iter().cloned().collect()
    }

    /// Forget every record (requests in flight are not re-added when they are answered).
    pub fn clear(&mut self) {
        self.first_seq += self.entries.len() as u64;
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(path: &str) -> RequestRecord {
        RequestRecord {
            verb: None,
            verb_name: "",
            method: "GET".into(),
            path: path.into(),
            query: String::new(),
            resource: None,
            namespace: None,
            name: None,
            content_type: None,
            field_manager: String::new(),
            body: None,
            body_size: 0,
            user_agent: String::new(),
            status: None,
            late_write: None,
            received: std::time::Instant::now(),
        }
    }

    #[test]
    fn ring_keeps_the_last_records_and_answers_find_theirs() {
        let mut log = RequestLog::new(3, 8);
        let seqs: Vec<u64> = (0..5)
            .map(|i| log.received(rec(&format!("/{i}"))))
            .collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4]);
        log.answered(0, 200); // dropped already: no effect
        log.answered(3, 201);
        let kept: Vec<(String, Option<u16>)> = log
            .records()
            .into_iter()
            .map(|r| (r.path, r.status))
            .collect();
        assert_eq!(
            kept,
            [
                ("/2".into(), None),
                ("/3".into(), Some(201)),
                ("/4".into(), None)
            ]
        );
        log.clear();
        log.answered(4, 200);
        assert!(log.records().is_empty());
        assert_eq!(log.received(rec("/5")), 5);
        assert_eq!(
            log.keep_body(b"{\"a\":1}"),
            Some(serde_json::json!({"a": 1}))
        );
        assert_eq!(
            log.keep_body(b"{\"a\":12345}"),
            None,
            "over the 8-byte limit"
        );
    }
}
