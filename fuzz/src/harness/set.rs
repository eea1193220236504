//! The `cidr_set_model` target.

use super::check::{
    check_all_bits, check_bits, check_counters, check_layout, check_sparse, mutate,
};
use super::decode::{
    build_set, decode_aligned_prefix, decode_cidr, decode_cluster, decode_index, family_bit,
};
use nodeipam_core::{BlockRequest, Placement};

use super::{
    Bytes, FULL_CHECK_BLOCKS, HUGE_MAX_OPS, HUGE_RANGE_BITS, MAX_OPS, MAX_SET_BLOCK_BITS, trace,
};

/// The differential `CidrSet` target.
///
/// Format: byte 0 — bit 0 family, bits 1–2 spare storage words (0–2); then the cluster (see
/// `decode_cluster`); then operations, one selector byte each (mod 9) followed by its operands:
/// 0–1 `allocate_next`; 2 `allocate_aligned(prefix)`; 3 `occupy(cidr)`; 4 `release(cidr)`;
/// 5 `is_allocated(index)` and `block_cidr(index)`; 6 `allocated_in(cidr)` and
/// `block_range(cidr)`; 7 `allocate_next` repeated 1–256 times; 8 release every block (whole
/// cluster) — all compared with `SetModel` after each step.
///
/// A block-bits byte ≥ `HUGE_SELECTOR` makes a set of 2^17 … 2^24 blocks: then at most
/// `HUGE_MAX_OPS` operations, `occupy` ranges over 2^`HUGE_RANGE_BITS` blocks become queries,
/// `allocate_aligned` prefixes are clamped to that size, and the end check is `check_sparse`.
pub fn run_cidr_set(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let header = bytes.u8();
    let family = family_bit(header & 1 != 0);
    let extra_words = usize::from((header >> 1) & 3) % 3;
    let (cluster_cidr, node_mask_size) =
        decode_cluster(&mut bytes, family, MAX_SET_BLOCK_BITS, true);
    let (mut set, mut model) = build_set(cluster_cidr, node_mask_size, extra_words);
    let full_checks = model.block_count <= FULL_CHECK_BLOCKS;
    let huge = model.block_count > 1 << MAX_SET_BLOCK_BITS;
    let max_ops = if huge { HUGE_MAX_OPS } else { MAX_OPS };

    let mut ops = 0usize;
    while !bytes.is_empty() && ops < max_ops {
        ops += 1;
        let raw = bytes.u8();
        // 9, 10, 11: the block operations (selector bytes ≥ 0xF0, so older seeds keep their meaning).
        let selector = if raw >= 0xF0 {
            9 + (raw - 0xF0) % 3
        } else {
            raw % 9
        };
        let step = format!("op {ops} (selector {selector}) on {cluster_cidr} /{node_mask_size}");
        let mut touched = vec![model.cursor];
        match selector {
            9 | 10 => {
                let mut prefix_len = decode_aligned_prefix(&mut bytes, &model);
                let min_huge_prefix = node_mask_size.saturating_sub(HUGE_RANGE_BITS);
                if huge && (cluster_cidr.prefix_len()..min_huge_prefix).contains(&prefix_len) {
                    prefix_len = min_huge_prefix;
                }
                let placement = if selector == 9 {
                    Placement::FirstFit
                } else {
                    Placement::NextFromCursor
                };
                let request = BlockRequest {
                    prefix_len,
                    placement,
                };
                let expected = model.allocate_block(request);
                if let Ok(block) = &expected {
                    let first = block.first_block_index;
                    touched.extend([
                        first.wrapping_sub(1),
                        first,
                        first + block.block_count - 1,
                        first + block.block_count,
                        model.cursor,
                    ]);
                }
                mutate(&mut set, &step, |s| s.allocate_block(request), expected);
            }
            11 => {
                let actual = set.largest_free_block();
                trace(&step, &actual);
                assert_eq!(actual, model.largest_free_block(), "{step}");
            }
            0 | 1 => {
                let expected = model.allocate_next();
                if let Ok(allocation) = &expected {
                    touched.push(allocation.block_index);
                }
                mutate(&mut set, &step, |s| s.allocate_next(), expected);
            }
            2 => {
                let mut prefix_len = decode_aligned_prefix(&mut bytes, &model);
                let min_huge_prefix = node_mask_size.saturating_sub(HUGE_RANGE_BITS);
                if huge && (cluster_cidr.prefix_len()..min_huge_prefix).contains(&prefix_len) {
                    prefix_len = min_huge_prefix;
                }
                let expected = model.allocate_aligned(prefix_len);
                if let Ok(aligned) = &expected {
                    let first = aligned.first_block_index;
                    touched.extend([
                        first.wrapping_sub(1),
                        first,
                        first + aligned.block_count - 1,
                    ]);
                    touched.push(first + aligned.block_count);
                }
                mutate(
                    &mut set,
                    &step,
                    |s| s.allocate_aligned(prefix_len),
                    expected,
                );
            }
            3 | 4 => {
                let cidr = decode_cidr(&mut bytes, &model);
                let mut too_wide = false;
                if let Ok((first, last)) = model.block_range(cidr) {
                    touched.extend([first.wrapping_sub(1), first, last, last.wrapping_add(1)]);
                    too_wide = huge && last - first >= 1 << HUGE_RANGE_BITS;
                }
                if selector == 3 && too_wide {
                    // Too many blocks for the model's BTreeSet: query the range instead.
                    assert_eq!(set.block_range(cidr), model.block_range(cidr), "{step}");
                    assert_eq!(set.allocated_in(cidr), model.allocated_in(cidr), "{step}");
                } else if selector == 3 {
                    let expected = model.occupy(cidr);
                    mutate(&mut set, &step, |s| s.occupy(cidr), expected);
                } else {
                    let expected = model.release(cidr);
                    mutate(&mut set, &step, |s| s.release(cidr), expected);
                }
            }
            5 => {
                let index = decode_index(&mut bytes, model.block_count);
                trace(
                    &step,
                    &(index, set.is_allocated(index), set.block_cidr(index)),
                );
                assert_eq!(set.is_allocated(index), model.is_allocated(index), "{step}");
                assert_eq!(
                    set.block_cidr(index),
                    model.checked_block_cidr(index),
                    "{step}"
                );
            }
            6 => {
                let cidr = decode_cidr(&mut bytes, &model);
                trace(
                    &step,
                    &(cidr, set.block_range(cidr), set.allocated_in(cidr)),
                );
                assert_eq!(set.block_range(cidr), model.block_range(cidr), "{step}");
                assert_eq!(set.allocated_in(cidr), model.allocated_in(cidr), "{step}");
            }
            7 => {
                let repeat = u32::from(bytes.u8()) + 1;
                for _ in 0..repeat {
                    let expected = model.allocate_next();
                    let stop = expected.is_err();
                    mutate(&mut set, &step, |s| s.allocate_next(), expected);
                    if stop {
                        break;
                    }
                }
            }
            _ => {
                let whole = model.cluster_cidr;
                let expected = model.release(whole);
                mutate(&mut set, &step, |s| s.release(whole), expected);
            }
        }
        check_counters(&set, &model, &step);
        check_bits(&set, &model, &touched, &step);
        if full_checks {
            check_all_bits(&set, &model, &step);
        }
    }
    if huge {
        check_sparse(&set, &model, "end");
    } else {
        check_all_bits(&set, &model, "end");
    }
    check_layout(&set.into_storage(), &model, extra_words);
}
