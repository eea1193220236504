//! Log set-up: kube-controller-manager's `-v` and `--logging-format` onto `tracing`.
//!
//! Verbosity (klog's levels, Kubernetes' logging conventions: V(2) steady-state information,
//! V(4) debug, V(5) trace, V(6) requested resources, V(7+) HTTP traffic) maps onto tracing filters:
//!
//! | `-v` | filter |
//! |---|---|
//! | 0–3 (default 0) | `info`: start-up, every Node assigned, skips, exhaustion (rate-limited), leadership |
//! | 4 | this controller at `debug` (per-Node decisions, retries) |
//! | 5 | this controller at `trace` |
//! | 6 | plus kube-rs at `debug` (requests) |
//! | 7 and more | everything at `trace` (hyper, rustls, …) |
//!
//! Below `-v=6`, kube-rs's HTTP trace layer (`kube_client::client::builder`) is off: it logs an
//! ERROR line for every 5xx or failed request (`failed with status 503 Service Unavailable`)
//! before the controller handles the failure and logs it once itself (a WARN naming the Node or
//! Lease and what happens next), so each handled failure was logged twice.
//!
//! `RUST_LOG`, when set to a valid filter, replaces the mapping (it names targets and levels
//! exactly; the start-up line says so). Warnings and errors show at every verbosity.
//!
//! `--logging-format=json` writes one JSON object per line with klog's JSON field names
//! (component-base `logs/json`): `ts` (seconds since the epoch, float), `caller` (`file:line`),
//! `msg`, `v` (the klog level the line would need: 0 for info and warnings, 4 debug, 5 trace),
//! `err` for an error value, then the event's structured fields (`node`, `cluster_cidr`, …).
//! Warnings and errors add `"level":"warning"`/`"error"` (klog's JSON has no such field; errors
//! carry no `v`, as klog's error lines).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::flags::{LogFormat, LoggingFlags};

/// The tracing filter for klog verbosity `v` (see the module table).
pub fn filter_for_verbosity(v: u32) -> &'static str {
    match v {
        0..=3 => "info,kube_client::client::builder=off",
        4 => "info,nodeipam=debug,nodeipam_controller=debug,kube_client::client::builder=off",
        5 => "info,nodeipam=trace,nodeipam_controller=trace,kube_client::client::builder=off",
        6 => {
            "info,nodeipam=trace,nodeipam_controller=trace,kube=debug,kube_client=debug,kube_runtime=debug"
        }
        _ => "trace",
    }
}

/// Which filter is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterSource {
    /// From `-v` (the filter text).
    Verbosity(&'static str),
    /// `RUST_LOG` (its text).
    RustLog(String),
    /// `RUST_LOG` was set but is not a valid filter; `-v`'s filter is used.
    InvalidRustLog {
        /// The text of `RUST_LOG`.
        text: String,
        /// The filter used instead.
        used: &'static str,
    },
}

/// Chooses the filter: a valid `RUST_LOG` (given as `rust_log`) wins over `-v`.
pub fn choose_filter(verbosity: u32, rust_log: Option<&str>) -> (EnvFilter, FilterSource) {
    let mapped = filter_for_verbosity(verbosity);
    match rust_log {
        Some(text) if !text.trim().is_empty() => match EnvFilter::try_new(text) {
            Ok(filter) => (filter, FilterSource::RustLog(text.to_owned())),
            Err(_) => (
                EnvFilter::new(mapped),
                FilterSource::InvalidRustLog {
                    text: text.to_owned(),
                    used: mapped,
                },
            ),
        },
        _ => (EnvFilter::new(mapped), FilterSource::Verbosity(mapped)),
    }
}

/// Installs the global subscriber (stderr) for `flags`; a second call changes nothing.
pub fn init(flags: &LoggingFlags) -> FilterSource {
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, source) = choose_filter(flags.verbosity, rust_log.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match flags.logging_format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder.event_format(KlogJson).try_init(),
    };
    source
}

/// The `--logging-format=json` event format (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct KlogJson;

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        writer.write_str(&json_line(ts, event))?;
        writer.write_char('\n')
    }
}

/// One JSON log line (without the newline) for `event` at time `ts` (seconds since the epoch).
pub fn json_line(ts: f64, event: &Event<'_>) -> String {
    let meta = event.metadata();
    let mut fields = JsonFields::default();
    event.record(&mut fields);
    let mut line = String::with_capacity(128);
    let _ = write!(line, "{{\"ts\":{ts:.6}");
    if let (Some(file), Some(number)) = (meta.file(), meta.line()) {
        let _ = write!(
            line,
            ",\"caller\":{}",
            json_string(&format!("{file}:{number}"))
        );
    }
    let _ = write!(line, ",\"msg\":{}", json_string(&fields.message));
    match *meta.level() {
        Level::ERROR => line.push_str(",\"level\":\"error\""),
        Level::WARN => line.push_str(",\"v\":0,\"level\":\"warning\""),
        Level::INFO => line.push_str(",\"v\":0"),
        Level::DEBUG => line.push_str(",\"v\":4"),
        Level::TRACE => line.push_str(",\"v\":5"),
    }
    for (name, value) in &fields.values {
        let _ = write!(line, ",{}:{value}", json_string(name));
    }
    line.push('}');
    line
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

/// The fields of one event: the message, and each other field as JSON text.
#[derive(Default)]
struct JsonFields {
    message: String,
    values: Vec<(&'static str, String)>,
}

impl JsonFields {
    fn push(&mut self, field: &Field, json: String) {
        // klog's key for an error value.
        let name = match field.name() {
            "error" => "err",
            other => other,
        };
        self.values.push((name, json));
    }
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.push(field, json_string(value));
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        let text = if value.is_finite() {
            value.to_string()
        } else {
            json_string(&value.to_string())
        };
        self.push(field, text);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.push(field, json_string(&text));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::LogBuffer as Buffer;

    fn capture(filter: &str, emit: impl FnOnce()) -> Vec<serde_json::Value> {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .event_format(KlogJson)
            .finish();
        crate::test_support::with_test_subscriber(subscriber, emit);
        let text = buffer.text();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
            .collect()
    }

    #[test]
    fn json_lines_use_klog_field_names() {
        let lines = capture("trace", || {
            tracing::info!(node = "worker-1", pod_cidrs = %"10.244.1.0/24", "assigned pod CIDRs");
            tracing::warn!(cluster_cidr = "10.244.0.0/16", used = 256u32, "exhausted");
            tracing::error!(error = %"boom", "controller stopped");
            tracing::debug!(tries = 3i64, ok = true, "retrying");
        });
        assert_eq!(lines.len(), 4);
        let info = &lines[0];
        assert_eq!(info["msg"], "assigned pod CIDRs");
        assert_eq!(info["v"], 0);
        assert_eq!(info["node"], "worker-1");
        assert_eq!(info["pod_cidrs"], "10.244.1.0/24");
        assert!(info["ts"].as_f64().is_some_and(|t| t > 1.6e9), "{info}");
        assert!(
            info["caller"]
                .as_str()
                .is_some_and(|c| c.contains("logging.rs:")),
            "{info}"
        );
        assert!(info.get("level").is_none());
        assert_eq!(lines[1]["level"], "warning");
        assert_eq!(lines[1]["used"], 256);
        assert_eq!(lines[2]["level"], "error");
        assert_eq!(lines[2]["err"], "boom");
        assert!(lines[2].get("v").is_none(), "klog error lines carry no v");
        assert_eq!(lines[3]["v"], 4);
        assert_eq!(lines[3]["tries"], 3);
        assert_eq!(lines[3]["ok"], true);
    }

    /// A failed request is logged once, by the controller: kube-rs's trace layer's own ERROR
    /// line (target `kube_client::client::builder`, "failed with status 503") is filtered out at
    /// every verbosity below 6; at 6 and up (HTTP debugging) it shows.
    #[test]
    fn kube_clients_own_error_lines_are_filtered_below_v6() {
        let emit = || {
            tracing::error!(target: "kube_client::client::builder", "failed with status 503 Service Unavailable");
            tracing::warn!(target: "nodeipam::controller::worker", node = "a", "writing spec.podCIDRs did not succeed");
        };
        for v in [0, 2, 4, 5] {
            let lines = capture(filter_for_verbosity(v), emit);
            let messages: Vec<&str> = lines.iter().filter_map(|l| l["msg"].as_str()).collect();
            assert_eq!(messages, ["writing spec.podCIDRs did not succeed"], "v={v}");
        }
        assert_eq!(capture(filter_for_verbosity(6), emit).len(), 2);
    }

    #[test]
    fn verbosity_maps_onto_filters_and_rust_log_wins() {
        let lines = capture(filter_for_verbosity(2), || {
            tracing::debug!("hidden at v=2");
            tracing::info!("shown at v=2");
        });
        assert_eq!(lines.len(), 1);
        let lines = capture(filter_for_verbosity(4), || {
            tracing::debug!("shown at v=4 for this crate");
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(
            filter_for_verbosity(0),
            "info,kube_client::client::builder=off"
        );
        assert_eq!(filter_for_verbosity(9), "trace");
        assert_eq!(
            choose_filter(4, Some("warn")).1,
            FilterSource::RustLog("warn".to_owned())
        );
        assert_eq!(
            choose_filter(4, None).1,
            FilterSource::Verbosity(filter_for_verbosity(4))
        );
        assert!(matches!(
            choose_filter(0, Some("nodeipam=[")).1,
            FilterSource::InvalidRustLog { .. }
        ));
    }
}
