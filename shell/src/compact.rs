//! Compact per-Node values kept for the life of a Node (informer cache, allocator index): a Node's
//! uid and its podCIDR texts, stored without a heap allocation in the usual case and rendered
//! back to exactly the text the API server sent.
//!
//! Why: at 50,000 Nodes every `String`/`Box<str>` kept per Node is 50,000 small long-lived heap
//! blocks (a 36-byte uid is a 48-byte malloc chunk, a podCIDR text 32 bytes), kept twice (cache and
//! allocator), and interleaved with the short-lived buffers of JSON parsing — which is what kept
//! the controller's resident set at twice its live heap (see BENCHMARKS.md, "Controller at
//! scale"). The compact form is used only when rendering it gives back the very same text, so
//! nothing the decision logic sees changes.

use ipnet::IpNet;
use uuid::Uuid;

/// A Node's `metadata.uid`: a UUID in kube-apiserver's canonical form (lowercase, hyphenated, as
/// `k8s.io/apimachinery/pkg/util/uuid.NewUUID` renders it) is kept as its 16 bytes; any other
/// text as is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    /// A canonical UUID.
    Uuid([u8; 16]),
    /// Any other text.
    Text(Box<str>),
}

impl Uid {
    /// The compact form of `text`.
    pub fn new(text: &str) -> Uid {
        if let Ok(uuid) = Uuid::try_parse(text) {
            let mut buffer = Uuid::encode_buffer();
            if uuid.hyphenated().encode_lower(&mut buffer) == text {
                return Uid::Uuid(uuid.into_bytes());
            }
        }
        Uid::Text(text.into())
    }

    /// Whether this is the uid `text`.
    pub fn is(&self, text: &str) -> bool {
        match self {
            Uid::Uuid(bytes) => {
                let mut buffer = Uuid::encode_buffer();
                Uuid::from_bytes(*bytes)
                    .hyphenated()
                    .encode_lower(&mut buffer)
                    == text
            }
            Uid::Text(own) => **own == *text,
        }
    }

    /// Whether `uid` (as kept) and `text` (as seen) name the same object: both absent, or equal.
    pub fn same(uid: Option<&Uid>, text: Option<&str>) -> bool {
        match (uid, text) {
            (Some(uid), Some(text)) => uid.is(text),
            (None, None) => true,
            _ => false,
        }
    }
}

impl From<&str> for Uid {
    fn from(text: &str) -> Uid {
        Uid::new(text)
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Uuid(bytes) => {
                let mut buffer = Uuid::encode_buffer();
                f.write_str(
                    Uuid::from_bytes(*bytes)
                        .hyphenated()
                        .encode_lower(&mut buffer),
                )
            }
            Uid::Text(text) => f.write_str(text),
        }
    }
}

/// A Node's `spec.podCIDR` and `spec.podCIDRs` texts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum PodCidrTexts {
    /// Neither field set.
    #[default]
    Unset,
    /// `podCIDRs` is one or two CIDRs whose texts are exactly their canonical rendering, and
    /// `podCIDR` is the first: what every Node whose podCIDRs an allocator set looks like.
    Canonical {
        /// `podCIDRs[0]` (= `podCIDR`).
        first: IpNet,
        /// `podCIDRs[1]`, if any.
        second: Option<IpNet>,
    },
    /// Anything else, as the texts (kept so that the decision logic can name what is wrong).
    Raw(Box<RawPodCidrs>),
}

/// [`PodCidrTexts::Raw`]'s texts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawPodCidrs {
    /// `spec.podCIDR`, if set and not empty.
    pub pod_cidr: Option<Box<str>>,
    /// `spec.podCIDRs`.
    pub pod_cidrs: Box<[Box<str>]>,
}

/// `text` as a CIDR whose rendering is `text` itself (so keeping the parsed form loses nothing:
/// `010.0.1.0/24` or `fd00:0::/64` stay texts).
fn canonical(text: &str) -> Option<IpNet> {
    let net: IpNet = text.parse().ok()?;
    (net.to_string() == text).then_some(net)
}

impl PodCidrTexts {
    /// The compact form of `spec.podCIDR` (`None` when unset or empty) and `spec.podCIDRs`.
    pub fn new(pod_cidr: Option<&str>, pod_cidrs: &[String]) -> PodCidrTexts {
        match (pod_cidr, pod_cidrs) {
            (None, []) => return PodCidrTexts::Unset,
            (Some(first_text), [first, rest @ ..]) if first_text == first && rest.len() <= 1 => {
                let first = canonical(first);
                let second = rest.first().map(|t| canonical(t));
                match (first, second) {
                    (Some(first), None) => {
                        return PodCidrTexts::Canonical {
                            first,
                            second: None,
                        };
                    }
                    (Some(first), Some(Some(second))) => {
                        return PodCidrTexts::Canonical {
                            first,
                            second: Some(second),
                        };
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        PodCidrTexts::Raw(Box::new(RawPodCidrs {
            pod_cidr: pod_cidr.map(Into::into),
            pod_cidrs: pod_cidrs.iter().map(|t| t.as_str().into()).collect(),
        }))
    }

    /// `spec.podCIDR` as sent.
    pub fn pod_cidr(&self) -> Option<String> {
        match self {
            PodCidrTexts::Unset => None,
            PodCidrTexts::Canonical { first, .. } => Some(first.to_string()),
            PodCidrTexts::Raw(raw) => raw.pod_cidr.as_deref().map(str::to_owned),
        }
    }

    /// `spec.podCIDRs` as sent.
    pub fn pod_cidrs(&self) -> Vec<String> {
        match self {
            PodCidrTexts::Unset => Vec::new(),
            PodCidrTexts::Canonical { first, second } => std::iter::once(first)
                .chain(second.as_ref())
                .map(ToString::to_string)
                .collect(),
            PodCidrTexts::Raw(raw) => raw.pod_cidrs.iter().map(|t| t.to_string()).collect(),
        }
    }

    /// Whether neither field is set.
    pub fn is_unset(&self) -> bool {
        matches!(self, PodCidrTexts::Unset)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn canonical_uuids_are_kept_as_bytes_and_rendered_back() {
        let text = "4b1bd0a6-5bd4-4c67-9d3a-45f9b0a7e1c2";
        let uid = Uid::new(text);
        assert!(matches!(uid, Uid::Uuid(_)));
        assert_eq!(uid.to_string(), text);
        assert!(uid.is(text));
        assert!(!uid.is("4B1BD0A6-5BD4-4C67-9D3A-45F9B0A7E1C2"));
        for other in [
            "4B1BD0A6-5BD4-4C67-9D3A-45F9B0A7E1C2",
            "4b1bd0a65bd44c679d3a45f9b0a7e1c2",
            "{4b1bd0a6-5bd4-4c67-9d3a-45f9b0a7e1c2}",
            "urn:uuid:4b1bd0a6-5bd4-4c67-9d3a-45f9b0a7e1c2",
            "uid-1",
            "",
        ] {
            let uid = Uid::new(other);
            assert_eq!(uid, Uid::Text(other.into()), "{other:?} is kept as text");
            assert_eq!(uid.to_string(), other);
            assert!(uid.is(other));
            assert!(!uid.is(text));
        }
        assert!(Uid::same(None, None));
        assert!(!Uid::same(Some(&Uid::new(text)), None));
        assert!(!Uid::same(None, Some(text)));
    }

    #[test]
    fn pod_cidr_texts_render_back_exactly() {
        let s = |v: &[&str]| v.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>();
        let cases: &[(Option<&str>, Vec<String>, bool)] = &[
            (None, vec![], false),
            (Some("10.0.1.0/24"), s(&["10.0.1.0/24"]), true),
            (
                Some("10.0.1.0/24"),
                s(&["10.0.1.0/24", "fd00:0:0:1::/64"]),
                true,
            ),
            (Some("fd00:0:0:1::/64"), s(&["fd00:0:0:1::/64"]), true),
            // Not canonical: kept as texts.
            (Some("10.0.1.0/24"), s(&[]), false),
            (None, s(&["10.0.1.0/24"]), false),
            (Some("10.0.2.0/24"), s(&["10.0.1.0/24"]), false),
            (
                Some("fd00::0:1:0:0:0/64"),
                s(&["fd00::0:1:0:0:0/64"]),
                false,
            ),
            (Some("010.0.1.0/24"), s(&["010.0.1.0/24"]), false),
            (Some("10.0.1.0/24 "), s(&["10.0.1.0/24 "]), false),
            (Some("10.0.1.7/24"), s(&["10.0.1.7/24"]), true),
            (Some("garbage"), s(&["garbage", "more"]), false),
            (
                Some("10.0.1.0/24"),
                s(&["10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"]),
                false,
            ),
            (Some("10.0.1.0/24"), s(&["10.0.1.0/24", "nonsense"]), false),
        ];
        for (pod_cidr, pod_cidrs, compact) in cases {
            let texts = PodCidrTexts::new(*pod_cidr, pod_cidrs);
            assert_eq!(
                matches!(texts, PodCidrTexts::Canonical { .. }),
                *compact,
                "{pod_cidr:?} {pod_cidrs:?}: {texts:?}"
            );
            assert_eq!(texts.pod_cidr().as_deref(), *pod_cidr);
            assert_eq!(&texts.pod_cidrs(), pod_cidrs);
            assert_eq!(texts.is_unset(), pod_cidr.is_none() && pod_cidrs.is_empty());
        }
    }

    proptest! {
        /// Whatever the texts, the compact form gives them back unchanged.
        #[test]
        fn any_texts_round_trip(
            pod_cidr in proptest::option::of("[0-9a-f.:/]{0,20}"),
            pod_cidrs in proptest::collection::vec("[0-9a-f.:/]{0,20}", 0..4),
            uid in "[0-9a-f-]{0,40}",
        ) {
            let pod_cidr = pod_cidr.filter(|t| !t.is_empty());
            let texts = PodCidrTexts::new(pod_cidr.as_deref(), &pod_cidrs);
            prop_assert_eq!(texts.pod_cidr(), pod_cidr);
            prop_assert_eq!(texts.pod_cidrs(), pod_cidrs);
            let kept = Uid::new(&uid);
            prop_assert_eq!(kept.to_string(), uid.clone());
            prop_assert!(kept.is(&uid));
        }

        /// Real-looking podCIDRs (what the allocator writes) are always compact.
        #[test]
        fn allocated_pod_cidrs_are_compact(a in 0u8..=255, b in 0u8..=255, c in 0u16..=0xffff) {
            let v4 = format!("10.{a}.{b}.0/24");
            let v6 = format!("{}/64", std::net::Ipv6Addr::new(0xfd00, 0, 0, c, 0, 0, 0, 0));
            let texts = PodCidrTexts::new(Some(&v4), &[v4.clone(), v6.clone()]);
            prop_assert!(matches!(texts, PodCidrTexts::Canonical { second: Some(_), .. }), "{:?}", texts);
            prop_assert_eq!(texts.pod_cidrs(), vec![v4, v6]);
        }
    }
}
