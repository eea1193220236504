//! An integer CIDR type for IPv4 and IPv6, parsed and displayed without allocation.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Family {
    /// IPv4: 32-bit addresses.
    V4,
    /// IPv6: 128-bit addresses.
    V6,
}

impl Family {
    /// The address width in bits: 32 for IPv4, 128 for IPv6 (the largest valid prefix length).
    pub const fn max_prefix_len(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The family of an address.
    pub const fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// A network: an address family, a network address with no host bits set, and a prefix length.
///
/// The address is held as an integer (`u128`; IPv4 uses the low 32 bits) so that block
/// arithmetic is plain integer arithmetic. A `Cidr` is always canonical: the bits past
/// `prefix_len` are zero, and `prefix_len` ≤ 32 (IPv4) or ≤ 128 (IPv6).
///
/// Text form (`Display`/`FromStr`): `a.b.c.d/len` or RFC 5952 IPv6 text `x::y/len`, exactly as
/// Go's `net.IPNet.String()` prints it for the same network — except IPv4-mapped IPv6 ranges
/// (`::ffff:0:0/96`), which print as `::ffff:a.b.c.d/len` where Go prints the IPv4 form; such ranges
/// are refused as cluster CIDRs (see [`crate::config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Cidr {
    family: Family,
    network: u128,
    prefix_len: u8,
}

/// The host part of a `prefix_len`-bit network in a `width`-bit family: the low
/// `width − prefix_len` bits set (0 ..= 128 of them). `prefix_len` ≤ `width` (callers check).
///
/// One variable `u128` shift: on 32-bit targets each is a long instruction sequence, so the
/// network arithmetic below is written to need one per operation.
const fn host_bits(width: u8, prefix_len: u8) -> u128 {
    match u128::MAX.checked_shr(128 - (width - prefix_len) as u32) {
        Some(host) => host,
        None => 0,
    }
}

const fn addr_bits(addr: &IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => a.to_bits() as u128,
        IpAddr::V6(a) => a.to_bits(),
    }
}

impl Cidr {
    /// Builds a CIDR from a network address and a prefix length in bits.
    ///
    /// # Errors
    /// - [`CidrError::InvalidPrefixLen`] if `prefix_len` exceeds 32 (IPv4) or 128 (IPv6);
    /// - [`CidrError::HostBitsSet`] if `addr` has bits set past `prefix_len` (use
    ///   [`Cidr::new_masked`] to clear them instead).
    pub const fn new(addr: IpAddr, prefix_len: u8) -> Result<Cidr, CidrError> {
        match Cidr::new_masked(addr, prefix_len) {
            Ok(cidr) if cidr.network == addr_bits(&addr) => Ok(cidr),
            Ok(_) => Err(CidrError::HostBitsSet),
            Err(error) => Err(error),
        }
    }

    /// Builds a CIDR from any address in it and a prefix length, clearing the host bits — what Go's
    /// `net.ParseCIDR` returns as its network, and what Kubernetes does with `--cluster-cidr`
    /// values and Node `podCIDRs`.
    ///
    /// # Errors
    /// [`CidrError::InvalidPrefixLen`] if `prefix_len` exceeds 32 (IPv4) or 128 (IPv6).
    pub const fn new_masked(addr: IpAddr, prefix_len: u8) -> Result<Cidr, CidrError> {
        let family = Family::of(&addr);
        let width = family.max_prefix_len();
        if prefix_len > width {
            return Err(CidrError::InvalidPrefixLen {
                prefix_len,
                max: width,
            });
        }
        Ok(Cidr {
            family,
            network: addr_bits(&addr) & !host_bits(width, prefix_len),
            prefix_len,
        })
    }

    /// Builds a CIDR from an integer network address (`u128`; IPv4 in the low 32 bits).
    /// Crate-internal: callers guarantee the value is canonical for `family`.
    pub(crate) const fn from_parts(family: Family, network: u128, prefix_len: u8) -> Cidr {
        Cidr {
            family,
            network,
            prefix_len,
        }
    }

    /// Parses `address/prefix_len` strictly: host bits must be zero.
    ///
    /// # Errors
    /// [`CidrError::Syntax`] for anything that is not `address/decimal`, [`CidrError::InvalidPrefixLen`]
    /// for a prefix length past the family's width, [`CidrError::HostBitsSet`] when host bits are set.
    pub fn parse(text: &str) -> Result<Cidr, CidrError> {
        let (addr, prefix_len) = split_cidr_text(text)?;
        Cidr::new(addr, prefix_len)
    }

    /// Parses `address/prefix_len` the way Go's `net.ParseCIDR` does: host bits are cleared, and the
    /// second value says whether any were set (so a caller can warn). Kubernetes accepts
    /// `--cluster-cidr=10.0.0.1/8` as `10.0.0.0/8` this way.
    ///
    /// # Errors
    /// [`CidrError::Syntax`] or [`CidrError::InvalidPrefixLen`], as for [`Cidr::parse`].
    pub fn parse_masked(text: &str) -> Result<(Cidr, bool), CidrError> {
        let (addr, prefix_len) = split_cidr_text(text)?;
        let cidr = Cidr::new_masked(addr, prefix_len)?;
        Ok((cidr, cidr.network != addr_bits(&addr)))
    }

    /// Parses `address/prefix_len` as kube-controller-manager reads a Node's podCIDRs: with
    /// `netutils.ParseCIDRSloppy` (k8s.io/utils/net), which is Go 1.16's `net.ParseCIDR` kept for
    /// values stored before Go 1.17. Besides what [`Cidr::parse_masked`] takes, it accepts
    /// leading zeros, read as **decimal** (never octal): in IPv4 octets (`010.0.50.0/24` is
    /// 10.0.50.0/24), in the dotted IPv4 tail of an IPv6 address (`::ffff:010.1.2.3/128`), in
    /// IPv6 groups (`2001:00db8::/32`: more than four hex digits while the value fits 16 bits)
    /// and in the prefix length (`/0024`). Host bits are cleared; the second value says whether
    /// any were set. Compare the result's text with the input to know whether it was canonical.
    ///
    /// # Errors
    /// [`CidrError::Syntax`] or [`CidrError::InvalidPrefixLen`], as for [`Cidr::parse`]; an
    /// octet over 255 or a group over `ffff` is a [`CidrError::Syntax`].
    pub fn parse_sloppy(text: &str) -> Result<(Cidr, bool), CidrError> {
        let (addr_text, len_text) = text.split_once('/').ok_or(CidrError::Syntax)?;
        let prefix_len = sloppy_decimal(len_text).ok_or(CidrError::Syntax)?;
        let addr = if addr_text.contains(':') {
            IpAddr::V6(sloppy_ipv6(addr_text)?)
        } else {
            IpAddr::V4(sloppy_ipv4(addr_text).ok_or(CidrError::Syntax)?)
        };
        let max = Family::of(&addr).max_prefix_len();
        if prefix_len > u32::from(max) {
            return Err(CidrError::InvalidPrefixLen {
                prefix_len: prefix_len.min(255) as u8,
                max,
            });
        }
        let cidr = Cidr::new_masked(addr, prefix_len as u8)?;
        Ok((cidr, cidr.network != addr_bits(&addr)))
    }

    /// Parses a Node's `spec.podCIDR`/`spec.podCIDRs` entry as every Go reader of the Node
    /// reads it: [`Cidr::parse_sloppy`] (kube-controller-manager's `netutils.ParseCIDRSloppy`),
    /// then [`Cidr::unmapped`], so `::ffff:10.9.1.0/120` is the IPv4 range `10.9.1.0/24`. The
    /// second value says whether host bits were set. Compare the result's text with the input to
    /// know whether it was canonical.
    ///
    /// # Errors
    /// As [`Cidr::parse_sloppy`].
    pub fn parse_pod_cidr(text: &str) -> Result<(Cidr, bool), CidrError> {
        let (cidr, host_bits) = Cidr::parse_sloppy(text)?;
        Ok((cidr.unmapped(), host_bits))
    }

    /// The range as Go reads an IPv6 network in the IPv4-mapped range `::ffff:0:0/96`
    /// (RFC 4291 §2.5.5.2): the IPv4 network of its low 32 bits, with a prefix 96 bits shorter
    /// (`::ffff:10.9.1.0/120` → `10.9.1.0/24`, `::ffff:10.9.0.60/126` → `10.9.0.60/30`,
    /// `::ffff:0:0/96` → `0.0.0.0/0`). Any other CIDR is returned unchanged.
    ///
    /// The rule (Go's `net` package, and k8s.io/utils/net's fork of Go 1.16's `ParseCIDR` that
    /// `ParseCIDRSloppy` is): `ParseCIDR` masks the 16-byte address with a 16-byte mask; the
    /// result's `IP.To4()` is not nil when the masked network is in `::ffff:0:0/96`, and then
    /// `IPNet.String()` prints the IPv4 form with the mask's last 32 bits, and every consumer
    /// that asks `To4() != nil` (`netutils.IsIPv4CIDR`, the kubelet, kube-proxy, CNI plugins)
    /// takes it as IPv4. A mask shorter than /96 clears part of the `ffff` marker, so the
    /// network is an ordinary IPv6 one and stays so (`::ffff:10.9.0.0/95` → `::fffe:0:0/95`,
    /// `::ffff:10.9.0.0/80` → `::/80`); `new_masked` has already cleared those bits here, so
    /// such a network is never in the mapped range. Pure arithmetic on the fixed-width value.
    pub const fn unmapped(&self) -> Cidr {
        match self.family {
            Family::V6 if self.prefix_len >= 96 && self.network >> 32 == 0xffff => Cidr {
                family: Family::V4,
                network: self.network & 0xffff_ffff,
                prefix_len: self.prefix_len - 96,
            },
            _ => *self,
        }
    }

    /// The address family.
    pub const fn family(&self) -> Family {
        self.family
    }

    /// The prefix length in bits (0..=32 for IPv4, 0..=128 for IPv6).
    pub const fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// The network address (first address of the range).
    pub const fn network(&self) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::V4(Ipv4Addr::from_bits(self.network as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from_bits(self.network)),
        }
    }

    /// The network address as an integer (`u128`; IPv4 in the low 32 bits).
    pub const fn network_bits(&self) -> u128 {
        self.network
    }

    /// The last address of the range as an integer (`u128`; IPv4 in the low 32 bits).
    pub const fn last_bits(&self) -> u128 {
        self.network | host_bits(self.family.max_prefix_len(), self.prefix_len)
    }

    /// Whether `other` lies entirely inside `self` (same family, `self`'s prefix no longer than
    /// `other`'s, same leading bits). Every CIDR contains itself.
    pub const fn contains(&self, other: &Cidr) -> bool {
        if !matches!(
            (self.family, other.family),
            (Family::V4, Family::V4) | (Family::V6, Family::V6)
        ) {
            return false;
        }
        if self.prefix_len > other.prefix_len {
            return false;
        }
        // `self` has no host bits, so `other` is inside it iff the two differ only in them.
        other.network ^ self.network <= host_bits(self.family.max_prefix_len(), self.prefix_len)
    }

    /// Whether the two ranges share any address. For CIDRs this is two-way containment, the
    /// test kube-controller-manager's cidrset uses before occupying or releasing.
    pub const fn overlaps(&self, other: &Cidr) -> bool {
        if !matches!(
            (self.family, other.family),
            (Family::V4, Family::V4) | (Family::V6, Family::V6)
        ) {
            return false;
        }
        // Containment one way or the other: the shorter prefix's network holds the longer one,
        // i.e. the two differ only in the shorter one's host bits (one test, one shift).
        let shorter = if self.prefix_len < other.prefix_len {
            self.prefix_len
        } else {
            other.prefix_len
        };
        other.network ^ self.network <= host_bits(self.family.max_prefix_len(), shorter)
    }
}

/// Splits `addr/len` text into a parsed address and prefix length, without allocation.
fn split_cidr_text(text: &str) -> Result<(IpAddr, u8), CidrError> {
    let (addr_text, len_text) = text.split_once('/').ok_or(CidrError::Syntax)?;
    // Go's ParseCIDR takes 1–3 decimal digits, no sign, no leading '+'.
    if len_text.is_empty() || len_text.len() > 3 || !len_text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CidrError::Syntax);
    }
    let prefix_len: u16 = len_text.parse().map_err(|_| CidrError::Syntax)?;
    // Zone indices (`fe80::1%eth0`) are not part of a CIDR; core::net rejects them already.
    let addr = IpAddr::from_str(addr_text).map_err(|_| CidrError::Syntax)?;
    let max = Family::of(&addr).max_prefix_len();
    if prefix_len > u16::from(max) {
        return Err(CidrError::InvalidPrefixLen {
            prefix_len: prefix_len.min(255) as u8,
            max,
        });
    }
    Ok((addr, prefix_len as u8))
}

/// A run of decimal digits with any number of leading zeros, as Go's `dtoi`: `None` for an
/// empty run, any other character, or a value past 2^24 (Go's limit; every caller then rejects it
/// as too large anyway).
fn sloppy_decimal(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = text.trim_start_matches('0');
    if digits.len() > 8 {
        return None;
    }
    let value = digits
        .bytes()
        .fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    (value < 0x00FF_FFFF).then_some(value)
}

/// A dotted quad whose octets may carry leading zeros (decimal), as Go 1.16's `parseIPv4`.
fn sloppy_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        *octet = u8::try_from(sloppy_decimal(parts.next()?)?).ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// IPv6 text whose groups may carry leading zeros past four digits and whose dotted tail may
/// carry leading zeros, as Go 1.16's `parseIPv6`: each part is rewritten without them (into a
/// fixed buffer, no allocation) and the result parsed strictly.
fn sloppy_ipv6(text: &str) -> Result<Ipv6Addr, CidrError> {
    use fmt::Write as _;
    let mut canonical: heapless::String<64> = heapless::String::new();
    for (index, group) in text.split(':').enumerate() {
        if index > 0 {
            canonical.push(':').map_err(|_| CidrError::Syntax)?;
        }
        if group.contains('.') {
            let tail = sloppy_ipv4(group).ok_or(CidrError::Syntax)?;
            write!(canonical, "{tail}").map_err(|_| CidrError::Syntax)?;
        } else if !group.is_empty() {
            let trimmed = group.trim_start_matches('0');
            let digits = if trimmed.is_empty() { "0" } else { trimmed };
            canonical.push_str(digits).map_err(|_| CidrError::Syntax)?;
        }
    }
    Ipv6Addr::from_str(&canonical).map_err(|_| CidrError::Syntax)
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// Strict parse; see [`Cidr::parse`].
    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        Cidr::parse(text)
    }
}

impl fmt::Display for Cidr {
    /// Canonical text: `10.42.0.0/16`, `2001:db8::/32` (RFC 5952, as Go prints it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.network() {
            IpAddr::V4(a) => write!(f, "{}/{}", a, self.prefix_len),
            // IPv4-mapped addresses print as `::ffff:1.2.3.4` (RFC 5952 §5); Go would print the
            // IPv4 form. They never reach a set: config refuses them as cluster CIDRs.
            IpAddr::V6(a) => write!(f, "{}/{}", a, self.prefix_len),
        }
    }
}

#[cfg(feature = "ipnet")]
mod ipnet_conv {
    use super::Cidr;
    use super::CidrError;

    impl From<Cidr> for ipnet::IpNet {
        fn from(cidr: Cidr) -> ipnet::IpNet {
            match cidr.network() {
                core::net::IpAddr::V4(a) => ipnet::IpNet::V4(
                    // prefix_len ≤ 32 is a Cidr invariant, so this cannot fail; fall back to /32
                    // rather than panic.
                    ipnet::Ipv4Net::new(a, cidr.prefix_len())
                        .unwrap_or_else(|_| ipnet::Ipv4Net::from(a)),
                ),
                core::net::IpAddr::V6(a) => ipnet::IpNet::V6(
                    ipnet::Ipv6Net::new(a, cidr.prefix_len())
                        .unwrap_or_else(|_| ipnet::Ipv6Net::from(a)),
                ),
            }
        }
    }

    impl TryFrom<ipnet::IpNet> for Cidr {
        type Error = CidrError;

        /// Strict: an `IpNet` with host bits set (`10.0.0.1/8`) is rejected with
        /// [`CidrError::HostBitsSet`]; use `Cidr::from(net.trunc())` to accept it.
        fn try_from(net: ipnet::IpNet) -> Result<Cidr, CidrError> {
            Cidr::new(net.addr(), net.prefix_len())
        }
    }

    #[cfg(test)]
    mod tests {
        #![allow(clippy::unwrap_used)]
        use super::*;

        /// Both directions, both families, the edges of the prefix range; a host bit refused.
        #[test]
        fn ipnet_round_trips_and_refuses_host_bits() {
            for text in [
                "10.244.0.0/16",
                "0.0.0.0/0",
                "10.1.2.3/32",
                "fd00::/48",
                "::/0",
            ] {
                let cidr = Cidr::parse(text).unwrap();
                let net = ipnet::IpNet::from(cidr);
                assert_eq!(net, text.parse::<ipnet::IpNet>().unwrap(), "{text}");
                assert_eq!(Cidr::try_from(net), Ok(cidr), "{text}");
            }
            let host_bits: ipnet::IpNet = "10.0.0.1/8".parse().unwrap();
            assert_eq!(Cidr::try_from(host_bits), Err(CidrError::HostBitsSet));
            assert_eq!(
                Cidr::try_from(host_bits.trunc()),
                Ok(Cidr::parse("10.0.0.0/8").unwrap())
            );
        }
    }
}

/// Why CIDR text or parts were rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum CidrError {
    /// The text is not `address/prefix-length` (an IPv4 dotted quad or IPv6 text, a `/`, and 1–3
    /// decimal digits).
    Syntax,
    /// The prefix length (bits) is larger than the family allows: `max` is 32 for IPv4, 128 for
    /// IPv6. Values over 255 are reported as 255.
    InvalidPrefixLen {
        /// The prefix length given, in bits.
        prefix_len: u8,
        /// The largest valid prefix length for the family, in bits.
        max: u8,
    },
    /// The address has bits set past the prefix length (e.g. `10.0.0.1/8`), in a strict parse.
    HostBitsSet,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrError::Syntax => f.write_str(
                "not a CIDR: expected address/prefix-length, e.g. 10.244.0.0/16 or fd00:10:244::/56",
            ),
            CidrError::InvalidPrefixLen { prefix_len, max } => write!(
                f,
                "prefix length /{prefix_len} is longer than the address (at most /{max})"
            ),
            CidrError::HostBitsSet => {
                f.write_str("address has bits set past the prefix length (not a network address)")
            }
        }
    }
}

impl core::error::Error for CidrError {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    fn show(c: &Cidr) -> heapless::String<64> {
        let mut text = heapless::String::new();
        write!(text, "{c}").unwrap();
        text
    }

    #[test]
    fn parse_and_display_round_trip() {
        let cases = [
            ("10.42.0.0/16", "10.42.0.0/16"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("10.42.5.7/32", "10.42.5.7/32"),
            ("2001:db8:1234:ff00::/56", "2001:db8:1234:ff00::/56"),
            ("2001:DB8::/32", "2001:db8::/32"),
            ("fd00:10:244::/64", "fd00:10:244::/64"),
            ("::/0", "::/0"),
            ("fd00::/110", "fd00::/110"),
        ];
        for (input, canonical) in cases {
            let c = Cidr::parse(input).unwrap();
            assert_eq!(show(&c).as_str(), canonical, "{input}");
            assert_eq!(Cidr::parse(canonical).unwrap(), c);
        }
    }

    #[test]
    fn parse_rejects_garbage_and_host_bits() {
        let bad = [
            ("", CidrError::Syntax),
            ("10.0.0.0", CidrError::Syntax),
            ("10.0.0.0/", CidrError::Syntax),
            ("10.0.0.0/+8", CidrError::Syntax),
            ("10.0.0.0/-1", CidrError::Syntax),
            ("10.0.0.0/0008", CidrError::Syntax),
            ("***HIDDEN***/25", CidrError::Syntax),
            ("10.0.0.0/8/8", CidrError::Syntax),
            (" 10.0.0.0/8", CidrError::Syntax),
            (
                "10.0.0.0/33",
                CidrError::InvalidPrefixLen {
                    prefix_len: 33,
                    max: 32,
                },
            ),
            (
                "fd00::/129",
                CidrError::InvalidPrefixLen {
                    prefix_len: 129,
                    max: 128,
                },
            ),
            (
                "fd00::/999",
                CidrError::InvalidPrefixLen {
                    prefix_len: 255,
                    max: 128,
                },
            ),
            ("10.0.0.1/8", CidrError::HostBitsSet),
            ("fd00::1/64", CidrError::HostBitsSet),
        ];
        for (input, err) in bad {
            assert_eq!(Cidr::parse(input), Err(err), "{input:?}");
        }
    }

    #[test]
    fn parse_masked_clears_and_reports_host_bits() {
        let (c, had) = Cidr::parse_masked("10.42.7.9/16").unwrap();
        assert_eq!(c, Cidr::parse("10.42.0.0/16").unwrap());
        assert!(had);
        let (c, had) = Cidr::parse_masked("fd00::/48").unwrap();
        assert_eq!(c.prefix_len(), 48);
        assert!(!had);
    }

    /// k8s.io/utils/net's ParseCIDRSloppy cases (its forked `ip_test.go`: `127.001.002.003`,
    /// `127.010.020.030`, `::ffff:127.001.002.003`) and their CIDR forms; leading zeros are
    /// decimal, never octal (`010` is ten, `008` is eight).
    #[test]
    fn parse_sloppy_reads_leading_zeros_as_decimal() {
        let cases = [
            ("010.0.50.0/24", "10.0.50.0/24", false),
            ("127.001.002.003/32", "127.1.2.3/32", false),
            ("127.010.020.030/8", "127.0.0.0/8", true),
            ("10.008.011.012/32", "10.8.11.12/32", false),
            ("0000010.0.0.0/0024", "10.0.0.0/24", false),
            ("10.1.9.9/24", "10.1.9.0/24", true),
            ("10.0.50.0/24", "10.0.50.0/24", false),
            ("::ffff:127.001.002.003/128", "::ffff:127.1.2.3/128", false),
            ("2001:00db8::/32", "2001:db8::/32", false),
            (
                "2001:0db8:0000:0000:0000:0000:0000:0000/032",
                "2001:db8::/32",
                false,
            ),
            ("fd00:10:244::1/64", "fd00:10:244::/64", true),
        ];
        for (input, canonical, host_bits) in cases {
            let (c, had) = Cidr::parse_sloppy(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(show(&c).as_str(), canonical, "{input}");
            assert_eq!(had, host_bits, "{input}");
        }
        // Still refused, as by ParseCIDRSloppy: octets past 255, groups past ffff, signs, empty
        // parts, missing or extra parts, zones, prefix lengths past the width.
        let bad = [
            ("256.0.0.0/8", CidrError::Syntax),
            ("0256.0.0.0/8", CidrError::Syntax),
            ("10.0.0/24", CidrError::Syntax),
            ("10.0.0.0.0/24", CidrError::Syntax),
            ("10..0.0/24", CidrError::Syntax),
            ("+10.0.0.0/24", CidrError::Syntax),
            ("10.0.0.0/+8", CidrError::Syntax),
            ("10.0.0.0", CidrError::Syntax),
            ("10.0.0.0/", CidrError::Syntax),
            (" 10.0.0.0/8", CidrError::Syntax),
            ("2001:10000::/32", CidrError::Syntax),
            ("fe80::1%eth0/64", CidrError::Syntax),
            ("::ffff:256.0.0.1/128", CidrError::Syntax),
            ("0x0a.0.0.0/8", CidrError::Syntax),
            (
                "010.0.0.0/033",
                CidrError::InvalidPrefixLen {
                    prefix_len: 33,
                    max: 32,
                },
            ),
        ];
        for (input, err) in bad {
            assert_eq!(Cidr::parse_sloppy(input), Err(err), "{input:?}");
        }
        // What the strict parsers refuse, the sloppy one reads: the reason it exists.
        assert_eq!(Cidr::parse_masked("010.0.50.0/24"), Err(CidrError::Syntax));
    }

    /// Go's `net.ParseCIDR` and k8s.io/utils/net's `ParseCIDRSloppy` (checked with Go 1.26 and
    /// k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2: `IPNet.String()` and `IP.To4() != nil`)
    /// on IPv4-mapped IPv6 text: a masked network inside `::ffff:0:0/96` is IPv4 with the prefix
    /// 96 bits shorter; a prefix under /96 masks the `ffff` marker and leaves ordinary IPv6.
    #[test]
    fn parse_pod_cidr_reads_ipv4_mapped_networks_as_go_does() {
        let cases = [
            ("::ffff:10.9.1.0/120", "10.9.1.0/24", false),
            ("::ffff:10.9.1.7/120", "10.9.1.0/24", true),
            ("::ffff:10.9.0.60/126", "10.9.0.60/30", false),
            ("::FFFF:10.9.1.0/120", "10.9.1.0/24", false),
            ("0:0:0:0:0:ffff:10.9.1.0/120", "10.9.1.0/24", false),
            ("::ffff:a09:100/120", "10.9.1.0/24", false),
            ("::ffff:010.9.1.0/120", "10.9.1.0/24", false),
            ("::ffff:10.9.1.0/128", "10.9.1.0/32", false),
            ("::ffff:10.9.0.0/96", "0.0.0.0/0", true),
            ("::ffff:0:0/96", "0.0.0.0/0", false),
            ("::ffff:10.9.0.0/95", "::fffe:0:0/95", true),
            ("::ffff:10.9.0.0/88", "::ff00:0:0/88", true),
            ("::ffff:10.9.0.0/80", "::/80", true),
            // Not mapped: unchanged.
            ("::fffe:10.9.1.0/120", "::fffe:a09:100/120", false),
            ("fd00::/64", "fd00::/64", false),
            ("010.9.1.0/24", "10.9.1.0/24", false),
        ];
        for (input, go, host_bits) in cases {
            let (c, had) = Cidr::parse_pod_cidr(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(show(&c).as_str(), go, "{input}");
            assert_eq!(had, host_bits, "{input}");
            assert_eq!(c.unmapped(), c, "{input}: unmapped twice");
        }
        assert_eq!(
            Cidr::parse_pod_cidr("::ffff:10.9.1.0/120")
                .unwrap()
                .0
                .family(),
            Family::V4
        );
        assert_eq!(
            Cidr::parse_pod_cidr("::ffff:10.9.1.0/129"),
            Err(CidrError::InvalidPrefixLen {
                prefix_len: 129,
                max: 128
            })
        );
    }

    #[test]
    fn contains_and_overlaps() {
        let p = |s| Cidr::parse(s).unwrap();
        assert!(p("10.0.0.0/8").contains(&p("10.42.0.0/16")));
        assert!(!p("10.42.0.0/16").contains(&p("10.0.0.0/8")));
        assert!(p("10.42.0.0/16").overlaps(&p("10.0.0.0/8")));
        assert!(!p("10.42.0.0/16").overlaps(&p("10.43.0.0/16")));
        assert!(!p("10.0.0.0/8").overlaps(&p("fd00::/8")));
        assert!(p("::/0").contains(&p("fd00::/128")));
        assert!(p("0.0.0.0/0").contains(&p("255.255.255.255/32")));
        assert!(p("10.42.0.0/16").contains(&p("10.42.0.0/16")));
        assert!(!p("::/0").contains(&p("10.0.0.0/8")));
        assert!(!p("10.42.0.0/16").contains(&p("10.43.0.0/24")));
        assert_eq!(p("10.42.8.0/22").last_bits(), 0x0A2A_0BFF);
        assert_eq!(p("::/0").last_bits(), u128::MAX);
        assert_eq!(p("0.0.0.0/0").last_bits(), u32::MAX as u128);
    }
}
