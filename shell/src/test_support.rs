//! Helpers shared by the crate's unit tests (compiled only for `cargo test`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::reconcile::NodeView;

/// A log sink a test's `tracing` subscriber writes into; read it back through `.text()`.
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far, as UTF-8.
    pub(crate) fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8(bytes).expect("utf-8")
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with a plain-text tracing subscriber writing into a buffer; returns what `f` logged.
pub(crate) fn logged(f: impl FnOnce()) -> String {
    let buffer = LogBuffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    buffer.text()
}

/// The view of a Node `name` holding `pod_cidrs` (uid `uid-<name>`, no labels, not deleting).
pub(crate) fn node_view(name: &str, pod_cidrs: &[&str]) -> NodeView {
    NodeView {
        name: name.into(),
        pod_cidr: pod_cidrs.first().map(|s| (*s).to_owned()),
        pod_cidrs: pod_cidrs.iter().map(|s| (*s).to_owned()).collect(),
        deleting: false,
        uid: Some(format!("uid-{name}")),
        labels: BTreeMap::new(),
    }
}
