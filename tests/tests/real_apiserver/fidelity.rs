//! One request sequence replayed against the real kube-apiserver and against the sandbox, each
//! answer reduced to what the controller reads — status code, `reason`, and named fields of the
//! body — and compared (issue 16's sandbox fidelity; the table is in tests/FIDELITY.md).
//!
//! A step's path and body may name values captured from earlier answers on the same server as
//! `$(name)` (a resourceVersion, a continue token, a uid): each server replays with its own.

use std::collections::BTreeMap;

use kube::Client;
use serde_json::Value;

/// How long one request may take (watches end after their `timeoutSeconds`; a server that has
/// not answered by then is recorded as code 0).
pub const STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One request of a replayed sequence.
#[derive(Debug, Clone)]
pub struct Step {
    /// What the request is, for the table.
    pub what: String,
    /// HTTP method.
    pub method: &'static str,
    /// Path and query (with `$(name)` captures).
    pub uri: String,
    /// `Content-Type` of the body.
    pub content_type: &'static str,
    /// The body (with `$(name)` captures), if any.
    pub body: Option<String>,
    /// The fields compared: JSON pointers into a successful answer, or, with a suffix,
    /// `pointer#names` (the `metadata.name`s of an array), `pointer#present` (set and not empty).
    /// A watch's answer is compared as its list of events instead (see [`reduce_watch`]).
    pub compare: Vec<&'static str>,
    /// Values to capture from a successful answer: `(name, JSON pointer)`.
    pub capture: Vec<(String, &'static str)>,
    /// Why a difference on this step is kept rather than fixed (tests/FIDELITY.md), if it is.
    pub kept: Option<&'static str>,
}

impl Step {
    /// A request without a body, comparing code and reason only.
    pub fn new(what: impl Into<String>, method: &'static str, uri: impl Into<String>) -> Step {
        Step {
            what: what.into(),
            method,
            uri: uri.into(),
            content_type: "application/json",
            body: None,
            compare: Vec::new(),
            capture: Vec::new(),
            kept: None,
        }
    }

    /// A difference on this step is known and kept, for `why`.
    pub fn kept(mut self, why: &'static str) -> Step {
        self.kept = Some(why);
        self
    }

    /// With a body of `content_type`.
    pub fn body(mut self, content_type: &'static str, body: impl Into<String>) -> Step {
        self.content_type = content_type;
        self.body = Some(body.into());
        self
    }

    /// Also compares these fields (see [`Step::compare`]).
    pub fn compare(mut self, fields: &[&'static str]) -> Step {
        self.compare.extend_from_slice(fields);
        self
    }

    /// Captures `pointer` of the answer as `$(name)`.
    pub fn capture(mut self, name: impl Into<String>, pointer: &'static str) -> Step {
        self.capture.push((name.into(), pointer));
        self
    }
}

/// One answer, reduced.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` of a refused request (`""` on success).
    pub reason: String,
    /// The compared fields, `(field, value)`; for a watch, `("events", [...])`.
    pub fields: Vec<(String, Value)>,
    /// `Status.message` of a refused request (printed, not compared: it quotes server-specific
    /// resourceVersions and uids).
    pub message: String,
}

/// The running count of a comparison: requests compared, differences kept with a reason, and
/// the unexplained ones (which fail the test).
#[derive(Debug, Default)]
pub struct Tally {
    /// Requests compared.
    pub compared: usize,
    /// Differences the step marks as kept (`Step::kept`), with the reason printed.
    pub kept: usize,
    /// Unexplained differences, one line each.
    pub differences: Vec<String>,
}

impl Tally {
    /// Compares each step's real answer with the sandbox's (code, `reason`, fields; messages are
    /// printed only) and prints one table row per request.
    pub fn compare<'a>(
        &mut self,
        set: &str,
        steps: impl Iterator<Item = &'a Step>,
        real: &[Reduced],
        sandbox: &[Reduced],
    ) {
        for ((step, real), sandbox) in steps.zip(real).zip(sandbox) {
            self.compared += 1;
            let same = real.code == sandbox.code
                && real.reason == sandbox.reason
                && real.fields == sandbox.fields;
            eprintln!(
                "| {set} | {} | {} {} {:?} | {} | {:?} / {:?} |",
                step.what,
                real.code,
                real.reason,
                real.fields,
                if same {
                    "same".to_owned()
                } else {
                    format!("{} {} {:?}", sandbox.code, sandbox.reason, sandbox.fields)
                },
                real.message,
                sandbox.message
            );
            if let (false, Some(why)) = (same, step.kept) {
                eprintln!("  kept: {why}");
                self.kept += 1;
            } else if !same {
                self.differences.push(format!(
                    "{set}: {}: real {real:?}, sandbox {sandbox:?}",
                    step.what
                ));
            }
        }
    }
}

fn substitute(text: &str, captured: &BTreeMap<String, String>) -> String {
    let mut out = text.to_owned();
    for (name, value) in captured {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

fn field(body: &Value, spec: &str) -> Value {
    if let Some(pointer) = spec.strip_suffix("#names") {
        let names: Vec<Value> = body
            .pointer(pointer)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|i| i["metadata"]["name"].clone())
                    .collect()
            })
            .unwrap_or_default();
        return Value::Array(names);
    }
    if let Some(pointer) = spec.strip_suffix("#present") {
        let present = match body.pointer(pointer) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        };
        return Value::Bool(present);
    }
    body.pointer(spec).cloned().unwrap_or(Value::Null)
}

/// A watch's answer (JSON lines) as its events: `"ADDED <name>"`, `"MODIFIED <name>"`,
/// `"DELETED <name>"`, `"BOOKMARK initial-events-end"` for the end of a streaming list's initial
/// events, `"ERROR <code> <reason>"`. Other BOOKMARKs are left out: the server sends them on its
/// own clock, not at a point of the sequence.
pub fn reduce_watch(text: &str) -> Vec<Value> {
    let mut events = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            events.push(Value::String(format!("not JSON: {line}")));
            continue;
        };
        let kind = event["type"].as_str().unwrap_or_default();
        let object = &event["object"];
        let reduced = match kind {
            "BOOKMARK" => {
                if object["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true" {
                    "BOOKMARK initial-events-end".to_owned()
                } else {
                    continue;
                }
            }
            "ERROR" => format!(
                "ERROR {} {}",
                object["code"],
                object["reason"].as_str().unwrap_or_default()
            ),
            _ => format!(
                "{kind} {}",
                object["metadata"]["name"].as_str().unwrap_or_default()
            ),
        };
        events.push(Value::String(reduced));
    }
    events
}

/// Sends every step in order to `client`'s server and reduces each answer; `captured` holds the
/// values captured so far on that server (empty for a fresh sequence) and gains this one's.
///
/// # Panics
/// On a transport error (no answer at all), or a step naming a capture no earlier step made.
pub async fn replay(
    client: &Client,
    steps: &[Step],
    captured: &mut BTreeMap<String, String>,
) -> Vec<Reduced> {
    let mut answers = Vec::new();
    for step in steps {
        let uri = substitute(&step.uri, captured);
        let body = step
            .body
            .as_deref()
            .map(|b| substitute(b, captured))
            .unwrap_or_default();
        assert!(
            !uri.contains("$(") && !body.contains("$("),
            "{}: a capture is missing in {uri} {body}",
            step.what
        );
        let mut request = http::Request::builder().method(step.method).uri(&uri);
        if step.body.is_some() {
            request = request.header("Content-Type", step.content_type);
        }
        let request = request.body(body.into_bytes()).unwrap();
        let watch = uri.contains("watch=true");
        let sent = tokio::time::timeout(
            STEP_TIMEOUT,
            client.send(request.map(kube::client::Body::from)),
        )
        .await;
        let Ok(sent) = sent else {
            answers.push(Reduced {
                code: 0,
                reason: format!("no answer within {STEP_TIMEOUT:?}"),
                fields: Vec::new(),
                message: String::new(),
            });
            continue;
        };
        let response = sent.unwrap_or_else(|e| panic!("{}: {} {uri}: {e}", step.what, step.method));
        let code = response.status().as_u16();
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap_or_else(|e| panic!("{}: reading the answer: {e}", step.what))
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let answer = if code >= 300 {
            Reduced {
                code,
                reason: value["reason"].as_str().unwrap_or_default().to_owned(),
                fields: Vec::new(),
                message: value["message"].as_str().unwrap_or_default().to_owned(),
            }
        } else if watch {
            // The messages of ERROR events, for the table.
            let message = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|e| e["type"] == "ERROR")
                .filter_map(|e| e["object"]["message"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
                .join("; ");
            Reduced {
                code,
                reason: String::new(),
                fields: vec![("events".to_owned(), Value::Array(reduce_watch(&text)))],
                message,
            }
        } else {
            for (name, pointer) in &step.capture {
                if let Some(v) = value.pointer(pointer) {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    captured.insert(name.clone(), v);
                }
            }
            Reduced {
                code,
                reason: String::new(),
                fields: step
                    .compare
                    .iter()
                    .map(|spec| ((*spec).to_owned(), field(&value, spec)))
                    .collect(),
                message: String::new(),
            }
        };
        answers.push(answer);
    }
    answers
}
