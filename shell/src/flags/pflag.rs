//! Value syntax of Go's `pflag`, which kube-controller-manager (and cloud-controller-manager) parse
//! their command line with, so that a kcm command line means the same here:
//!
//! - booleans take `strconv.ParseBool`'s forms: `1 t T TRUE true True` and `0 f F FALSE false
//!   False`, only as `--flag=value` (`--flag` alone means true; `--flag false` is `--flag` and a
//!   stray argument, as in pflag);
//! - integers take `strconv.ParseInt(s, 0, …)`'s forms (pflag's `intValue.Set`): decimal, `0x`/`0X`
//!   hexadecimal, `0o`/`0O` or a leading `0` octal, `0b`/`0B` binary, an optional sign and `_`
//!   between digits — so `--node-cidr-mask-size=024` is 20, as in kcm;
//! - flag names are normalised as component-base's `cliflag.WordSepNormalizeFunc` does (every
//!   command built with `k8s.io/component-base/cli` sets it): `_` in a flag name means `-`, so
//!   `--concurrent_rc_syncs` is `--concurrent-rc-syncs`.

use std::borrow::Cow;

/// Parses a boolean as Go's `strconv.ParseBool`.
///
/// # Errors
/// A message listing the accepted forms.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(
            "expected true or false (also 1, t, T, TRUE, True, 0, f, F, FALSE, False)".to_owned(),
        ),
    }
}

/// Parses an integer as Go's `strconv.ParseInt(text, 0, 64)`: see the module documentation.
///
/// # Errors
/// A message saying what is expected (the caller checks the range).
pub fn parse_int(text: &str) -> Result<i64, String> {
    const EXPECTED: &str = "expected a whole number (decimal, or 0x/0o/0b prefixed)";
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    // Go's underscoreOK: `_` only between digits, or right after a base prefix.
    let bytes = digits.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'_' {
            let before_ok = i > 0 && bytes[i - 1] != b'_' || i == 0 && prefixed;
            let after_ok = i + 1 < bytes.len() && bytes[i + 1] != b'_';
            if !(before_ok && after_ok) {
                return Err(EXPECTED.to_owned());
            }
        }
    }
    let cleaned: String = digits.chars().filter(|c| *c != '_').collect();
    if cleaned.is_empty() {
        return Err(EXPECTED.to_owned());
    }
    let magnitude = u64::from_str_radix(&cleaned, radix).map_err(|_| EXPECTED.to_owned())?;
    if negative {
        0i64.checked_sub_unsigned(magnitude)
            .ok_or_else(|| EXPECTED.to_owned())
    } else {
        i64::try_from(magnitude).map_err(|_| EXPECTED.to_owned())
    }
}

/// A clap value parser for an integer flag of type `T` (pflag `int32Var`-style syntax, then the
/// range of `T`).
///
/// # Errors
/// As [`parse_int`], or a message giving the range.
pub fn parse_int_as<T>(text: &str) -> Result<T, String>
where
    T: TryFrom<i64> + num_bounds::Bounds,
{
    let value = parse_int(text)?;
    T::try_from(value).map_err(|_| {
        format!(
            "{value} is out of range ({} to {})",
            T::MIN_TEXT,
            T::MAX_TEXT
        )
    })
}

/// A clap value parser for the node CIDR mask size flags: pflag integer syntax (as
/// [`parse_int`]), then a prefix length in bits, 0 to 128. Which lengths fit a family (at most 32
/// for IPv4, and no shorter than the cluster CIDR's prefix) is checked with the cluster CIDRs, by
/// `nodeipam_core::validate`.
///
/// # Errors
/// As [`parse_int`], or a message saying what a mask size is (`-1` is not one).
pub fn parse_mask_size(text: &str) -> Result<u8, String> {
    let value = parse_int(text)?;
    u8::try_from(value)
        .ok()
        .filter(|bits| *bits <= 128)
        .ok_or_else(|| {
            format!(
                "{value} is not a mask size: a prefix length in bits, 0 to 32 for IPv4, 0 to 128 for IPv6"
            )
        })
}

/// The printable range of the integer types flags use.
pub mod num_bounds {
    /// The bounds of an integer type, as text for error messages.
    pub trait Bounds {
        /// The smallest value.
        const MIN_TEXT: &'static str;
        /// The largest value.
        const MAX_TEXT: &'static str;
    }
    impl Bounds for u8 {
        const MIN_TEXT: &'static str = "0";
        const MAX_TEXT: &'static str = "255";
    }
    impl Bounds for u16 {
        const MIN_TEXT: &'static str = "0";
        const MAX_TEXT: &'static str = "65535";
    }
    impl Bounds for u32 {
        const MIN_TEXT: &'static str = "0";
        const MAX_TEXT: &'static str = "4294967295";
    }
}

/// One command-line argument with its flag name normalised (`--a_b=c_d` → `--a-b=c_d`); values,
/// short flags and positional arguments are left alone.
pub fn normalize_arg(arg: &str) -> Cow<'_, str> {
    let Some(body) = arg.strip_prefix("--") else {
        return Cow::Borrowed(arg);
    };
    let name_end = body.find('=').unwrap_or(body.len());
    if !body[..name_end].contains('_') {
        return Cow::Borrowed(arg);
    }
    Cow::Owned(format!(
        "--{}{}",
        body[..name_end].replace('_', "-"),
        &body[name_end..]
    ))
}

/// Normalises every flag name of `argv` (the first item is the program name) up to a bare `--`,
/// after which everything is positional.
pub fn normalize_args<I, T>(argv: I) -> Vec<String>
where
    I: IntoIterator<Item = T>,
    T: Into<String>,
{
    let mut after_terminator = false;
    argv.into_iter()
        .map(Into::into)
        .enumerate()
        .map(|(index, arg)| {
            if index == 0 || after_terminator {
                return arg;
            }
            if arg == "--" {
                after_terminator = true;
                return arg;
            }
            normalize_arg(&arg).into_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_as_strconv_parse_bool() {
        for text in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(text), Ok(true), "{text}");
        }
        for text in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(text), Ok(false), "{text}");
        }
        for text in ["", "yes", "on", "tRUE", "2", " true"] {
            assert!(parse_bool(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn integers_as_strconv_parse_int_base_0() {
        let cases = [
            ("24", Some(24)),
            ("024", Some(20)),
            ("0x18", Some(24)),
            ("0X18", Some(24)),
            ("0o30", Some(24)),
            ("0b11000", Some(24)),
            ("+24", Some(24)),
            ("-1", Some(-1)),
            ("0", Some(0)),
            ("1_000", Some(1000)),
            ("0x_18", Some(24)),
            ("", None),
            ("_1", None),
            ("1_", None),
            ("1__0", None),
            ("08", None),
            ("0x", None),
            ("2.5", None),
            ("24 ", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_int(text).ok(), want, "{text:?}");
        }
        assert_eq!(parse_int_as::<u8>("0x18"), Ok(24));
        assert!(parse_int_as::<u8>("256").is_err());
        assert!(parse_int_as::<u8>("-1").is_err());
    }

    #[test]
    fn flag_names_are_normalised_like_word_sep_normalize_func() {
        let argv = normalize_args([
            "prog",
            "--concurrent_rc_syncs=5",
            "--cluster-cidr=10.0.0.0/8",
            "--node_cidr_mask_size",
            "24",
            "-v",
            "2",
            "plan",
            "a_file.json",
            "--",
            "--not_a_flag",
        ]);
        assert_eq!(
            argv,
            [
                "prog",
                "--concurrent-rc-syncs=5",
                "--cluster-cidr=10.0.0.0/8",
                "--node-cidr-mask-size",
                "24",
                "-v",
                "2",
                "plan",
                "a_file.json",
                "--",
                "--not_a_flag",
            ]
        );
        assert_eq!(normalize_arg("--log_dir=/a_b"), "--log-dir=/a_b");
    }
}
