//! The `cidr_parse` target: parsing, display round trip and flag validation.

use std::fmt::Write;
use std::net::IpAddr;

use nodeipam_core::config::validate;
use nodeipam_core::{
    Cidr, CidrError, CidrSet, ConfigError, Family, MAX_CLUSTER_CIDRS, NodeMaskFlags,
    storage_words_for,
};

use super::{
    MAX_SET_BLOCK_BITS, StackText, display_nonempty, ip_bits, masked_cidr, other_family, span,
    width,
};

/// An independent reading of the documented text rules: `address/1–3 decimal digits`, the
/// address as `std::net::IpAddr` parses it. Returns (address bits, family, prefix length).
fn oracle_split(text: &str) -> Result<(u128, Family, u8), CidrError> {
    let (address, digits) = text.split_once('/').ok_or(CidrError::Syntax)?;
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CidrError::Syntax);
    }
    let prefix_len: u32 = digits.bytes().fold(0, |n, b| n * 10 + u32::from(b - b'0'));
    let address: IpAddr = address.parse().map_err(|_| CidrError::Syntax)?;
    let family = match address {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    };
    let max = width(family);
    if prefix_len > u32::from(max) {
        return Err(CidrError::InvalidPrefixLen {
            prefix_len: prefix_len.min(255) as u8,
            max,
        });
    }
    Ok((ip_bits(address), family, prefix_len as u8))
}

/// Parses one piece of text every way and checks the results against each other, the oracle and
/// the display round trip.
fn check_parse(text: &str) {
    let strict = Cidr::parse(text);
    let masked = Cidr::parse_masked(text);
    assert_eq!(text.parse::<Cidr>(), strict, "FromStr = parse for {text:?}");
    match oracle_split(text) {
        Err(error) => {
            assert_eq!(strict, Err(error), "parse {text:?}");
            assert_eq!(masked, Err(error), "parse_masked {text:?}");
        }
        Ok((bits, family, prefix_len)) => {
            let expected = masked_cidr(family, bits, prefix_len);
            let had_host_bits = ip_bits(expected.network()) != bits;
            assert_eq!(
                masked,
                Ok((expected, had_host_bits)),
                "parse_masked {text:?}"
            );
            if had_host_bits {
                assert_eq!(strict, Err(CidrError::HostBitsSet), "parse {text:?}");
            } else {
                assert_eq!(strict, Ok(expected), "parse {text:?}");
            }
        }
    }
    if let Err(error) = strict {
        display_nonempty(&error);
    }
    if let Ok((cidr, _)) = masked {
        check_cidr(cidr, text);
    }
}

/// Canonical display round trip and the invariants of a parsed CIDR.
fn check_cidr(cidr: Cidr, text: &str) {
    let mut shown = StackText::new();
    assert!(
        write!(shown, "{cidr}").is_ok(),
        "Display of {cidr:?} overflowed 96 bytes"
    );
    let shown_text = shown.as_str();
    assert_eq!(
        Cidr::parse(shown_text),
        Ok(cidr),
        "re-parse {shown_text:?} (from {text:?})"
    );
    let mut again = StackText::new();
    assert!(write!(again, "{}", Cidr::parse(shown_text).unwrap_or(cidr)).is_ok());
    assert_eq!(again.as_str(), shown_text, "display is a fixed point");
    let (first, last) = span(&cidr);
    assert_eq!(cidr.network_bits(), first, "network_bits of {text:?}");
    assert_eq!(cidr.last_bits(), last, "last_bits of {text:?}");
    assert_eq!(Cidr::new(cidr.network(), cidr.prefix_len()), Ok(cidr));
    assert!(
        cidr.contains(&cidr) && cidr.overlaps(&cidr),
        "self-containment of {text:?}"
    );
    let other = masked_cidr(other_family(cidr.family()), first, 0);
    assert!(
        !cidr.overlaps(&other) && !other.contains(&cidr),
        "cross-family overlap"
    );
}

fn mask_flag(part: Option<&str>) -> Option<u8> {
    part.and_then(|p| p.trim().parse::<u8>().ok())
}

/// `config::validate` on three lines: cluster flag, service flag, `single,ipv4,ipv6` masks.
fn check_validate(text: &str) {
    let mut lines = text.split('\n');
    let cluster = lines.next().unwrap_or("");
    let service = lines.next().unwrap_or("");
    let mut masks = lines.next().unwrap_or("").split(',');
    let flags = NodeMaskFlags {
        node_cidr_mask_size: mask_flag(masks.next()),
        node_cidr_mask_size_ipv4: mask_flag(masks.next()),
        node_cidr_mask_size_ipv6: mask_flag(masks.next()),
    };
    match validate(cluster, service, flags) {
        Err(error) => display_config_error(&error),
        Ok(config) => {
            let count = config.cluster_cidrs.len();
            assert!(
                (1..=MAX_CLUSTER_CIDRS).contains(&count),
                "{count} cluster CIDRs accepted"
            );
            let families = config
                .cluster_cidrs
                .iter()
                .filter(|c| {
                    c.cluster_cidr.family() != config.cluster_cidrs[0].cluster_cidr.family()
                })
                .count();
            assert_eq!(config.is_dual_stack(), families > 0);
            // Several per family are accepted (issue 18), never two that overlap.
            for (i, a) in config.cluster_cidrs.iter().enumerate() {
                for b in &config.cluster_cidrs[..i] {
                    assert!(
                        !a.cluster_cidr.overlaps(&b.cluster_cidr),
                        "overlapping cluster CIDRs {} and {} accepted",
                        b.cluster_cidr,
                        a.cluster_cidr
                    );
                }
            }
            if let [a, b] = config.service_cidrs.as_slice() {
                assert_ne!(a.family(), b.family(), "two same-family service CIDRs");
            }
            for c in &config.cluster_cidrs {
                let prefix_len = c.cluster_cidr.prefix_len();
                assert!(c.node_mask_size >= prefix_len, "mask shorter than cluster");
                assert!(
                    c.node_mask_size <= width(c.cluster_cidr.family()),
                    "mask too long"
                );
                assert!(c.node_mask_size - prefix_len <= 24, "more than 2^24 blocks");
                assert_eq!(c.block_count(), 1u32 << (c.node_mask_size - prefix_len));
                check_cidr(c.cluster_cidr, cluster);
                if c.node_mask_size - prefix_len <= MAX_SET_BLOCK_BITS {
                    let words = storage_words_for(prefix_len, c.node_mask_size);
                    let set = CidrSet::new(c.cluster_cidr, c.node_mask_size, vec![0u64; words]);
                    assert!(
                        set.is_ok(),
                        "validated config rejected by CidrSet::new: {set:?}"
                    );
                }
            }
        }
    }
}

fn display_config_error(error: &ConfigError) {
    display_nonempty(error);
}

/// The parser target: if `data` is UTF-8, checks the whole text and each line with
/// [`Cidr::parse`]/[`Cidr::parse_masked`] (against an independent oracle, then display → parse
/// round trip through a stack buffer), each comma-separated entry trimmed, and `config::validate`
/// on the first three lines. Never a panic.
pub fn run_cidr_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check_parse(text);
    for line in text.split('\n').take(64) {
        check_parse(line);
        for entry in line.split(',').take(8) {
            check_parse(entry.trim());
        }
    }
    check_validate(text);
}
