//! Request deadlines, as kube-apiserver sets them (`WithRequestDeadline`,
//! `apiserver/pkg/endpoints/filters/request_deadline.go`): every request that is not long-running
//! (here: every verb but WATCH) must finish by *arrival + timeout*, where the timeout is the
//! request's `timeout` query parameter when it is positive and below the server's maximum, else
//! the maximum (`--request-timeout`, default 1 minute). A `timeout` that is not a Go duration is
//! refused with **400 BadRequest** `invalid timeout specified in the request URL - <Go's error>`.
//!
//! The sandbox enforces the deadline where a request would otherwise change state after it: a
//! request held by a delay is not run once its deadline has passed (it is answered with the
//! timeout filter's 504), and a late write whose commit time is past its deadline is never
//! committed. So a write can commit only before its own deadline — what a client that sends
//! `timeout=` relies on.

use std::time::Duration;

/// kube-apiserver's default `--request-timeout` (`requestTimeoutMaximum`).
pub const DEFAULT_REQUEST_TIMEOUT_MAXIMUM: Duration = Duration::from_secs(60);

/// The timeout of a request whose `timeout` query parameter is `value` (`None`: not given), as
/// `withRequestDeadline` picks it: the given value if `0 < value < maximum`, else `maximum`.
///
/// # Errors
/// The message kube-apiserver answers with (400) when `value` is not a Go duration.
pub fn request_timeout(value: Option<&str>, maximum: Duration) -> Result<Duration, String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(maximum);
    };
    let parsed = parse_go_duration(value)
        .map_err(|e| format!("invalid timeout specified in the request URL - {e}"))?;
    Ok(match parsed {
        Some(d) if !d.is_zero() && d < maximum => d,
        _ => maximum,
    })
}

/// Parses a duration as Go's `time.ParseDuration` does: an optional sign, then one or more
/// decimal numbers (with an optional fraction) each followed by a unit `ns`, `us` (`µs`, `μs`),
/// `ms`, `s`, `m` or `h`, e.g. `300ms`, `1.5s`, `1h30m`; a bare `0` is zero. `Ok(None)` for a
/// negative duration (which the deadline filter treats as "not positive"). Precision: whole
/// nanoseconds (Go's); values beyond `u64` nanoseconds are an overflow error, as in Go (which
/// stops at `i64`).
///
/// # Errors
/// Go's error text: `time: invalid duration "x"`, `time: missing unit in duration "1"`,
/// `time: unknown unit "x" in duration "1x"`.
pub fn parse_go_duration(text: &str) -> Result<Option<Duration>, String> {
    let quoted = format!("{text:?}");
    let invalid = || format!("time: invalid duration {quoted}");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Some(Duration::ZERO));
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(invalid());
        }
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per_unit: u128 = match unit {
            "" => return Err(format!("time: missing unit in duration {quoted}")),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => {
                return Err(format!("time: unknown unit {other:?} in duration {quoted}"));
            }
        };
        let overflow = || format!("time: invalid duration {quoted}");
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| overflow())?
        };
        let mut nanos = whole.checked_mul(nanos_per_unit).ok_or_else(overflow)?;
        // The fraction, truncated to whole nanoseconds as Go does.
        let mut scale = nanos_per_unit;
        for digit in fraction.bytes() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        if total > u128::from(u64::MAX) {
            return Err(overflow());
        }
    }
    if negative && total > 0 {
        return Ok(None);
    }
    let nanos = u64::try_from(total).map_err(|_| invalid())?;
    Ok(Some(Duration::from_nanos(nanos)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_time_parse_duration() {
        let ok = |t: &str| parse_go_duration(t).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(ok("10s"), Some(Duration::from_secs(10)));
        assert_eq!(ok("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(ok("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(ok("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(ok(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(ok("2us"), Some(Duration::from_micros(2)));
        assert_eq!(ok("2µs"), Some(Duration::from_micros(2)));
        assert_eq!(ok("0"), Some(Duration::ZERO));
        assert_eq!(ok("+0"), Some(Duration::ZERO));
        assert_eq!(ok("-1s"), None);
        assert_eq!(
            parse_go_duration("1").unwrap_err(),
            "time: missing unit in duration \"1\""
        );
        assert_eq!(
            parse_go_duration("1x").unwrap_err(),
            "time: unknown unit \"x\" in duration \"1x\""
        );
        for bad in ["", "s", ".s", "1..2s", "-", "1.2.3s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_deadline_filter_picks_the_given_timeout_only_when_positive_and_below_the_maximum() {
        let max = DEFAULT_REQUEST_TIMEOUT_MAXIMUM;
        assert_eq!(request_timeout(None, max), Ok(max));
        assert_eq!(request_timeout(Some(""), max), Ok(max));
        assert_eq!(request_timeout(Some("2s"), max), Ok(Duration::from_secs(2)));
        assert_eq!(request_timeout(Some("0s"), max), Ok(max));
        assert_eq!(request_timeout(Some("-3s"), max), Ok(max));
        assert_eq!(request_timeout(Some("2m"), max), Ok(max));
        assert_eq!(
            request_timeout(Some("abc"), max).unwrap_err(),
            "invalid timeout specified in the request URL - time: invalid duration \"abc\""
        );
    }
}
