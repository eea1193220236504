//! Decoding of clusters, block indices, CIDRs and prefix lengths from fuzz bytes, shared by the
//! set and pool targets; and set construction with its error paths.

use nodeipam_core::{AllocError, Cidr, CidrSet, Family, storage_words, storage_words_for};

use super::check::{Storage, check_counters};
use super::model::SetModel;
use super::{
    Bytes, GARBAGE, HUGE_SELECTOR, MAX_SET_BLOCK_BITS, host_mask, masked_cidr, other_family, span,
    width,
};

/// Cluster CIDRs worth hitting often (network bits, prefix length).
const V4_CLUSTERS: [(u32, u8); 8] = [
    (0x0A00_0000, 8),  // 10.0.0.0/8
    (0x0A2A_0000, 16), // 10.42.0.0/16
    (0x7F7B_EA00, 24), // 127.123.234.0/24
    (0x0000_0000, 0),  // 0.0.0.0/0
    (0xFFFF_FF00, 24), // 255.255.255.0/24 (top of the space)
    (0x0AF4_0000, 14), // 10.244.0.0/14
    (0xFFFF_FFFF, 32), // 255.255.255.255/32
    (0xC0A8_0000, 20), // 192.168.0.0/20
];
const V6_CLUSTERS: [(u128, u8); 8] = [
    (0xfd00_0000_0000_0000_0000_0000_0000_0000, 48), // fd00::/48
    (0x2001_0db8_1234_ff00_0000_0000_0000_0000, 56), // 2001:db8:1234:ff00::/56
    (0, 0),                                          // ::/0
    (u128::MAX << 8, 120),                           // ffff:…:ff00/120 (top of the space)
    (0xfd00_0000_0000_0000_0000_0000_0000_0000, 112), // fd00::/112
    (0x0000_0000_0000_0000_0000_ffff_0000_0000, 96), // ::ffff:0.0.0.0/96
    (u128::MAX, 128),                                // the last address /128
    (0x2001_0db8_0000_0000_0000_0000_0000_0000, 64), // 2001:db8::/64
];

/// Decodes a cluster CIDR and a node mask size with at most `max_block_bits` block bits.
///
/// Byte `h`: bit 1 = raw (then: a prefix-length byte and 4 or 16 address bytes, big-endian), else
/// bits 2–4 index the table of `family` above. Then one byte: block bits (mod
/// `max_block_bits + 1`; with `huge`, bytes from `HUGE_SELECTOR` up give 17 … 24), clamped to the
/// family width.
pub(super) fn decode_cluster(
    bytes: &mut Bytes<'_>,
    family: Family,
    max_block_bits: u8,
    huge: bool,
) -> (Cidr, u8) {
    let h = bytes.u8();
    let w = width(family);
    let cluster_cidr = if h & 2 != 0 {
        let prefix_len = bytes.u8() % (w + 1);
        let address = bytes.uint(usize::from(w / 8));
        masked_cidr(family, address, prefix_len)
    } else {
        let pick = usize::from(h >> 2) % 8;
        match family {
            Family::V4 => {
                let (network, prefix_len) = V4_CLUSTERS[pick];
                masked_cidr(family, u128::from(network), prefix_len)
            }
            Family::V6 => {
                let (network, prefix_len) = V6_CLUSTERS[pick];
                masked_cidr(family, network, prefix_len)
            }
        }
    };
    let raw = bytes.u8();
    let block_bits = if huge && raw >= HUGE_SELECTOR {
        MAX_SET_BLOCK_BITS + 1 + (raw - HUGE_SELECTOR)
    } else {
        raw % (max_block_bits + 1)
    };
    let block_bits = block_bits.min(w - cluster_cidr.prefix_len());
    (cluster_cidr, cluster_cidr.prefix_len() + block_bits)
}

/// Family from a header bit.
pub(super) fn family_bit(bit: bool) -> Family {
    if bit { Family::V6 } else { Family::V4 }
}

/// A block index: four bytes, little-endian, modulo the block count — except `FFFFFFFD` …
/// `FFFFFFFF`, which give the out-of-range values `block_count + 1`, `u32::MAX` and
/// `block_count`.
pub(super) fn decode_index(bytes: &mut Bytes<'_>, block_count: u32) -> u32 {
    let raw = u32::from_le_bytes([bytes.u8(), bytes.u8(), bytes.u8(), bytes.u8()]);
    match raw {
        0xFFFF_FFFF => block_count,
        0xFFFF_FFFE => u32::MAX,
        0xFFFF_FFFD => block_count.saturating_add(1),
        _ => raw % block_count,
    }
}

/// A CIDR relative to `model`'s cluster: a block, a sub-range, a super-range, a neighbour outside,
/// the other family, or raw bits. First byte selects.
pub(super) fn decode_cidr(bytes: &mut Bytes<'_>, model: &SetModel) -> Cidr {
    let family = model.family();
    let w = width(family);
    let cluster_prefix = model.cluster_cidr.prefix_len();
    let (c_first, c_last) = span(&model.cluster_cidr);
    match bytes.u8() % 8 {
        0 | 1 => model.block_cidr(decode_index(bytes, model.block_count) % model.block_count),
        2 | 3 => {
            // Any prefix inside the cluster: block index plus low bits, prefix ≥ cluster's.
            let prefix_len = cluster_prefix + bytes.u8() % (w - cluster_prefix + 1);
            let block = u128::from(decode_index(bytes, model.block_count) % model.block_count);
            let low = bytes.uint(2) & host_mask(w, model.node_mask_size);
            let offset = block.checked_shl(model.shift()).unwrap_or(0) | low;
            masked_cidr(family, c_first + offset, prefix_len)
        }
        4 => masked_cidr(family, c_first, bytes.u8() % (cluster_prefix + 1)),
        5 => {
            // Just below or just above the cluster (when there is room), any prefix.
            let prefix_len = bytes.u8() % (w + 1);
            let address = if bytes.u8() & 1 == 0 {
                c_first.wrapping_sub(1)
            } else {
                c_last.wrapping_add(1)
            };
            masked_cidr(family, address, prefix_len)
        }
        6 => {
            let other = other_family(family);
            let ow = width(other);
            let prefix_len = bytes.u8() % (ow + 1);
            // Same numeric bits as the cluster, in the other family.
            masked_cidr(other, c_first, prefix_len)
        }
        _ => {
            let prefix_len = bytes.u8() % (w + 1);
            let address = bytes.uint(usize::from(w / 8));
            masked_cidr(family, address, prefix_len)
        }
    }
}

/// A prefix length for `allocate_aligned`: mostly valid, sometimes just outside the range.
pub(super) fn decode_aligned_prefix(bytes: &mut Bytes<'_>, model: &SetModel) -> u8 {
    let cluster_prefix = model.cluster_cidr.prefix_len();
    let block_bits = model.node_mask_size - cluster_prefix;
    match bytes.u8() {
        0xFF => model.node_mask_size.wrapping_add(1),
        0xFE => cluster_prefix.wrapping_sub(1),
        0xFD => u8::MAX,
        raw => cluster_prefix + raw % (block_bits + 1),
    }
}

/// The constructor's error paths for this cluster and mask, and its storage requirement.
pub(super) fn check_constructor(cluster_cidr: Cidr, node_mask_size: u8) {
    let w = width(cluster_cidr.family());
    let needed = storage_words(1u32 << (node_mask_size - cluster_cidr.prefix_len()));
    assert_eq!(
        storage_words_for(cluster_cidr.prefix_len(), node_mask_size),
        needed,
        "storage_words_for"
    );
    assert_eq!(
        CidrSet::new(cluster_cidr, node_mask_size, vec![0u64; needed - 1]).err(),
        Some(AllocError::StorageTooSmall {
            needed_words: needed,
            provided_words: needed - 1,
        }),
        "storage one word short"
    );
    let mut bad_masks = vec![w + 1, u8::MAX];
    if let Some(short) = cluster_cidr.prefix_len().checked_sub(1) {
        bad_masks.push(short);
    }
    for node_mask_size in bad_masks {
        assert_eq!(
            CidrSet::new(cluster_cidr, node_mask_size, vec![0u64; needed]).err(),
            Some(AllocError::InvalidNodeMaskSize {
                cluster_cidr,
                node_mask_size,
            }),
            "node mask /{node_mask_size}"
        );
    }
    let too_many = cluster_cidr.prefix_len() + 25;
    if too_many <= w {
        assert_eq!(
            CidrSet::new(cluster_cidr, too_many, vec![0u64; 1]).err(),
            Some(AllocError::TooManyBlocks {
                cluster_cidr,
                node_mask_size: too_many,
            }),
            "2^25 blocks"
        );
    }
}

/// Builds the set (garbage-filled storage plus 0–2 spare words) and its model.
pub(super) fn build_set(
    cluster_cidr: Cidr,
    node_mask_size: u8,
    extra_words: usize,
) -> (CidrSet<Storage>, SetModel) {
    check_constructor(cluster_cidr, node_mask_size);
    let model = SetModel::new(cluster_cidr, node_mask_size);
    let storage = vec![GARBAGE; storage_words(model.block_count) + extra_words];
    let set = match CidrSet::new(cluster_cidr, node_mask_size, storage) {
        Ok(set) => set,
        Err(error) => panic!("CidrSet::new({cluster_cidr}, {node_mask_size}) failed: {error}"),
    };
    check_counters(&set, &model, "new");
    (set, model)
}
