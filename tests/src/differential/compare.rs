//! Comparing our answers with upstream's, request by request, and shrinking a sequence that
//! diverges.

use std::fmt;

use nodeipam_core::Cidr;

use super::core_driver::CoreDriver;
use super::divergence::{Context, matching};
use super::protocol::Op;
use super::upstream::{UpstreamDriver, UpstreamError};

/// The result of comparing one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every answer is the same, or differs only as rows of [`super::INTENDED`] allow: the rows
    /// that did, with the request index where each matched. If the last row ends the comparison,
    /// the requests after it were not compared.
    Same {
        /// `(request index, row name)` for each intended divergence met.
        rows: Vec<(usize, &'static str)>,
        /// Requests compared (all of them unless a row ended the comparison).
        compared: usize,
    },
    /// The first difference no row explains.
    Diverged {
        /// Its request index.
        index: usize,
    },
}

/// Compares the answers to `ops`.
pub fn compare(ops: &[Op], ours: &[String], upstream: &[String]) -> Outcome {
    let mut cluster: Option<Cidr> = None;
    let mut node_mask = 0;
    let mut rows = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        if let Op::New {
            cluster: text,
            node_mask: mask,
        } = op
        {
            cluster = Cidr::parse_masked(text).ok().map(|(c, _)| c);
            node_mask = *mask;
        }
        let (Some(ours), Some(upstream)) = (ours.get(index), upstream.get(index)) else {
            return Outcome::Diverged { index };
        };
        if ours == upstream {
            continue;
        }
        let context = Context {
            cluster,
            node_mask,
            op,
            ours,
            upstream,
        };
        match matching(&context).as_slice() {
            [row] => {
                rows.push((index, row.name));
                if row.ends_comparison {
                    return Outcome::Same {
                        rows,
                        compared: index + 1,
                    };
                }
            }
            _ => return Outcome::Diverged { index },
        }
    }
    Outcome::Same {
        rows,
        compared: ops.len(),
    }
}

/// Runs `batch` through upstream's driver (one process) and ours, and compares each sequence.
///
/// # Errors
/// Whatever [`UpstreamDriver::run_batch`] returns.
pub fn run_and_compare(
    upstream: &UpstreamDriver,
    batch: &[Vec<Op>],
) -> Result<Vec<Outcome>, UpstreamError> {
    let theirs = upstream.run_batch(batch)?;
    let mut driver = CoreDriver::new();
    Ok(batch
        .iter()
        .zip(&theirs)
        .map(|(ops, theirs)| compare(ops, &driver.answer_all(ops), theirs))
        .collect())
}

/// Shrinks a diverging sequence: cuts it after its first unexplained difference, then drops
/// chunks of requests (halves, quarters, … single requests) while it still diverges. `run`
/// answers a batch of candidate sequences on upstream's side (e.g. [`UpstreamDriver::run_batch`]),
/// so each round costs one process.
///
/// # Errors
/// Whatever `run` returns.
pub fn shrink<E>(
    ops: &[Op],
    mut run: impl FnMut(&[Vec<Op>]) -> Result<Vec<Vec<String>>, E>,
) -> Result<Vec<Op>, E> {
    let diverges = |ops: &[Op], theirs: &[String]| {
        let ours = CoreDriver::new().answer_all(ops);
        match compare(ops, &ours, theirs) {
            Outcome::Diverged { index } => Some(index),
            Outcome::Same { .. } => None,
        }
    };
    let mut current = ops.to_vec();
    let first = run(std::slice::from_ref(&current))?;
    match first.first().and_then(|theirs| diverges(&current, theirs)) {
        Some(index) => current.truncate(index + 1),
        None => return Ok(current),
    }
    let mut chunk = current.len().div_ceil(2);
    while chunk >= 1 {
        let candidates: Vec<Vec<Op>> = (0..current.len())
            .step_by(chunk)
            .map(|start| {
                let mut candidate = current[..start].to_vec();
                candidate.extend_from_slice(&current[(start + chunk).min(current.len())..]);
                candidate
            })
            .filter(|candidate| !candidate.is_empty())
            .collect();
        let answers = run(&candidates)?;
        let smaller = candidates
            .into_iter()
            .zip(answers)
            .find_map(|(candidate, theirs)| {
                diverges(&candidate, &theirs).map(|index| {
                    let mut candidate = candidate;
                    candidate.truncate(index + 1);
                    candidate
                })
            });
        match smaller {
            Some(candidate) => {
                current = candidate;
                chunk = chunk.min(current.len().div_ceil(2));
            }
            None if chunk == 1 => break,
            None => chunk = chunk.div_ceil(2).min(chunk - 1).max(1),
        }
    }
    Ok(current)
}

/// A diverging sequence printed for a human: each request with both answers, the first
/// unexplained difference marked.
pub struct Transcript<'a> {
    /// The requests.
    pub ops: &'a [Op],
    /// Upstream's answers.
    pub upstream: &'a [String],
}

impl fmt::Display for Transcript<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ours = CoreDriver::new().answer_all(self.ops);
        let first = match compare(self.ops, &ours, self.upstream) {
            Outcome::Diverged { index } => Some(index),
            Outcome::Same { .. } => None,
        };
        for (index, op) in self.ops.iter().enumerate() {
            let theirs = self.upstream.get(index).map_or("<none>", String::as_str);
            let mark = if Some(index) == first { "!!" } else { "  " };
            let ours = ours.get(index).map_or("<none>", String::as_str);
            if ours == theirs {
                writeln!(f, "{mark} {index:>4} {op:<40} {ours}")?;
            } else {
                writeln!(
                    f,
                    "{mark} {index:>4} {op:<40} ours: {ours} | upstream: {theirs}"
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for upstream: our own driver with one answer altered — the allocation after
    /// the cursor wrapped reports one more try — so the harness can be shown to fail and shrink.
    fn altered_upstream(batch: &[Vec<Op>]) -> Result<Vec<Vec<String>>, ()> {
        Ok(batch
            .iter()
            .map(|ops| {
                let mut driver = CoreDriver::new();
                ops.iter()
                    .map(|op| {
                        let before = driver.set().map(|s| s.next_candidate());
                        let answer = driver.answer(op);
                        let after = driver.set().map(|s| s.next_candidate());
                        match (op, before, after) {
                            (Op::Alloc, Some(b), Some(a)) if a != 0 && a <= b => {
                                answer.replace(" tries=", " tries=1")
                            }
                            _ => answer,
                        }
                    })
                    .collect()
            })
            .collect())
    }

    fn ops(script: &str) -> Vec<Op> {
        script.lines().filter_map(Op::parse).collect()
    }

    #[test]
    fn same_answers_compare_equal_and_a_real_difference_is_found() {
        let ops = ops("new 10.0.0.0/30 32\nalloc\nalloc\noccupy fd00::/64\nalloc");
        let ours = CoreDriver::new().answer_all(&ops);
        assert_eq!(
            compare(&ops, &ours, &ours),
            Outcome::Same {
                rows: vec![],
                compared: 5
            }
        );
        let mut theirs = ours.clone();
        theirs[3] = "err out-of-range allocated=2".into();
        assert_eq!(
            compare(&ops, &ours, &theirs),
            Outcome::Same {
                rows: vec![(3, "other-family-error")],
                compared: 5
            }
        );
        theirs[4] = "ok 10.0.0.3/32 allocated=3 tries=1".into();
        assert_eq!(
            compare(&ops, &ours, &theirs),
            Outcome::Diverged { index: 4 }
        );
    }

    #[test]
    fn shrinking_keeps_a_divergence_and_drops_the_rest() {
        // 4 blocks; 30 requests, of which an allocation after a wrap diverges.
        let mut script = String::from("new 10.0.0.0/30 32\n");
        for _ in 0..6 {
            script.push_str("occupy 10.0.0.1/32\nrelease 10.0.0.2/32\nalloc\n");
        }
        script.push_str(
            "alloc\nalloc\nalloc\nrelease 10.0.0.0/30\nalloc\nalloc\nalloc\nalloc\nalloc\n",
        );
        let ops = ops(&script);
        let theirs = altered_upstream(std::slice::from_ref(&ops)).unwrap_or_default();
        let ours = CoreDriver::new().answer_all(&ops);
        assert!(matches!(
            compare(&ops, &ours, &theirs[0]),
            Outcome::Diverged { .. }
        ));
        let small = shrink(&ops, altered_upstream).unwrap_or_default();
        assert!(small.len() < ops.len() / 2, "{} requests left", small.len());
        let theirs = altered_upstream(std::slice::from_ref(&small)).unwrap_or_default();
        let ours = CoreDriver::new().answer_all(&small);
        assert_eq!(
            compare(&small, &ours, &theirs[0]),
            Outcome::Diverged {
                index: small.len() - 1
            }
        );
        // One request fewer anywhere no longer diverges (a 1-minimal sequence).
        for skip in 0..small.len() {
            let mut fewer = small.clone();
            fewer.remove(skip);
            let theirs = altered_upstream(std::slice::from_ref(&fewer)).unwrap_or_default();
            let ours = CoreDriver::new().answer_all(&fewer);
            assert!(
                !matches!(compare(&fewer, &ours, &theirs[0]), Outcome::Diverged { .. }),
                "dropping request {skip} of\n{}",
                super::super::protocol::to_text(&small)
            );
        }
    }
}
