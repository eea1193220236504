//! The value parsers of the flags clap does not type itself: the allocator type, klog's `-v`,
//! the client's qps/burst, the workers, listen addresses, and Go's duration text.

use std::net::SocketAddr;
use std::time::Duration;

use super::{CLOUD_ALLOCATOR, MULTI_CIDR_ALLOCATOR, RANGE_ALLOCATOR, pflag};

pub(super) fn parse_allocator_type(text: &str) -> Result<String, String> {
    if [RANGE_ALLOCATOR, CLOUD_ALLOCATOR, MULTI_CIDR_ALLOCATOR].contains(&text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{RANGE_ALLOCATOR}, {CLOUD_ALLOCATOR} and {MULTI_CIDR_ALLOCATOR} are supported"
        ))
    }
}

/// klog's `-v`: `strconv.ParseUint(text, 10, 32)` (component-base `VerbosityLevelPflag`).
pub(super) fn parse_verbosity(text: &str) -> Result<u32, String> {
    if text.starts_with('+') {
        return Err("expected a whole number ≥ 0".to_owned());
    }
    text.parse::<u32>()
        .map_err(|_| "expected a whole number ≥ 0".to_owned())
}

/// `--kube-api-burst`: an int32 in pflag's syntax, at least 1.
pub(super) fn parse_burst(text: &str) -> Result<u32, String> {
    match pflag::parse_int(text)? {
        n @ 1..=0x7fff_ffff => Ok(n as u32),
        _ => Err("must be a whole number from 1 to 2147483647".to_owned()),
    }
}

pub(super) fn parse_workers(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err("must be a whole number from 1 to 1000".to_owned()),
    }
}

pub(super) fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps > 0.0 => Ok(qps),
        _ => Err("must be a number greater than 0".to_owned()),
    }
}

/// A listen address, or `None` when disabled with `0` (controller-runtime's convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

/// Parses a listen address (`HOST:PORT`, Go's `:PORT`); `0` disables the server.
pub(super) fn parse_bind_address(text: &str) -> Result<BindAddress, String> {
    if text == "0" {
        return Ok(BindAddress(None));
    }
    // Go's `:8080` form means every address.
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse::<SocketAddr>()
        .map(|a| BindAddress(Some(a)))
        .map_err(|_| "expected HOST:PORT (e.g. 0.0.0.0:8080, :8080) or 0 to disable".to_owned())
}

/// Parses Go's `time.ParseDuration` text, restricted to non-negative values: a sequence of
/// decimal numbers each with a unit `h`, `m`, `s`, `ms`, `us`/`µs`, `ns` (`1m30s`, `1.5s`), or `0`.
///
/// # Errors
/// A message saying what is expected.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected a duration such as 15s, 1m30s or 500ms";
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(EXPECTED.to_owned());
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| EXPECTED.to_owned())?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| EXPECTED.to_owned())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(EXPECTED.to_owned()),
        };
        total += value * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| EXPECTED.to_owned())
}
