//! The batch's answers in batch order, from the device's packed answers and the CPU's
//! share: lent as they lie when the packed layout is the answer's, else copied a run of
//! device queries at a time (or filled in parallel past many hits).

use std::sync::Arc;

use datafusion::arrow::buffer::ScalarBuffer;

use super::launch::packed_region;
use super::{ON_CPU, Staged};
use crate::backend::gpu::{GpuError, LentPinned, Workspace, view};
use crate::search::rank::Ranked;
use crate::search::topk::Hit;
use crate::tuning::knobs;

/// The batch's answers in batch order (the device's, once the stream is synchronized, and
/// the CPU's share). The device's come packed (`bm25_pack`): query slot `s`'s hits are
/// `docs[off[s]..off[s + 1]]`, slots in batch order, so a run of device queries between two
/// of the CPU's share is one copy. A lent block (`part.lent`) is the answer as it lies: its
/// doc ids and scores go to the result uncopied.
pub(super) fn unpack(
    ws: &mut Workspace,
    part: &Staged,
    k: usize,
    cpu_hits: &[Vec<Hit>],
) -> Result<Ranked, GpuError> {
    let lay = &part.layout;
    let gq = part.gq;
    let (d0, s0) = (lay.pk_doc - lay.pk_off, lay.pk_score - lay.pk_off);
    let pin = if gq == 0 {
        &[][..]
    } else {
        packed_region(ws, part)?
    };
    let (off, dev_doc, dev_score): (&[u32], &[u32], &[f64]) = if gq == 0 {
        (&[0], &[], &[])
    } else {
        (
            &view::<u32>(&pin[..d0])[..gq + 1],
            &view::<u32>(&pin[d0..s0])[..gq * k],
            &view::<f64>(&pin[s0..])[..gq * k],
        )
    };
    // The offsets as `bm25_pack` writes them: from 0, at most k a query.
    if !packed_offsets_ok(off, k) {
        return Err(GpuError::Kernel(format!(
            "packed answers' offsets out of order or above k = {k}"
        )));
    }
    let dev_hits = off[gq] as usize;
    if part.lent && gq > 0 {
        // The hits and their offsets stay where the device wrote them. (The offsets copied
        // into a fresh vector took a few µs of a 10,000-query call on the H200 hosts, its
        // pages faulted in.)
        let block = Arc::new(ws.pin_lent.take().expect("a lent batch holds its block"));
        // SAFETY: the block starts with the gq + 1 offsets (checked above), and `d0` and `s0`
        // are 256-byte aligned offsets into it, where the device wrote `dev_hits` doc ids and
        // scores (within gq * k each: checked above); the stream is synchronized and the
        // block left the workspace, so nothing writes it.
        let (offsets, docs, scores) = unsafe {
            (
                LentPinned::buffer(&block, 0, (gq + 1) * 4),
                LentPinned::buffer(&block, d0, dev_hits * 4),
                LentPinned::buffer(&block, s0, dev_hits * 8),
            )
        };
        return Ok(Ranked {
            offsets: ScalarBuffer::new(offsets, 0, gq + 1),
            docs: ScalarBuffer::new(docs, 0, dev_hits),
            scores: ScalarBuffer::new(scores, 0, dev_hits),
        });
    }
    let hits = dev_hits + cpu_hits.iter().map(Vec::len).sum::<usize>();
    // Both layouts below hold u32 offsets (`Ranked::build` panics past them).
    if u32::try_from(hits).is_err() {
        return Err(GpuError::Unsupported(format!(
            "{hits} topk_bm25 hits in one batch (fewer than 2^32)"
        )));
    }
    if hits > unpack_seq_max() {
        // Many hits: counts first, filled in parallel.
        let counts: Vec<usize> = part
            .slots()
            .map(|s| {
                if s & ON_CPU != 0 {
                    cpu_hits[(s & !ON_CPU) as usize].len()
                } else {
                    (off[s as usize + 1] - off[s as usize]) as usize
                }
            })
            .collect();
        return Ok(Ranked::build(&counts, |i, docs, scores| {
            let s = part.slot_at(i);
            if s & ON_CPU != 0 {
                for ((h, d), sc) in cpu_hits[(s & !ON_CPU) as usize]
                    .iter()
                    .zip(docs)
                    .zip(scores)
                {
                    *d = h.doc;
                    *sc = h.score;
                }
            } else {
                let at = off[s as usize] as usize;
                docs.copy_from_slice(&dev_doc[at..at + docs.len()]);
                scores.copy_from_slice(&dev_score[at..at + scores.len()]);
            }
        }));
    }
    if part.in_batch_order() {
        // The packed layout is the answer's. (Past `unpack_seq_max` hits, the parallel
        // fill above: one thread copying OR k 100's 835,000 hits took 4.9-5.4 ms on an H100
        // host, the fill 1.0-2.6.)
        return Ok(Ranked {
            offsets: off.to_vec().into(),
            docs: dev_doc[..dev_hits].to_vec().into(),
            scores: dev_score[..dev_hits].to_vec().into(),
        });
    }
    // One pass on this thread: the device's hits are copied a run of consecutive slots at a
    // time (the whole batch at once when the CPU's share has no hits).
    let mut offsets: Vec<u32> = Vec::with_capacity(part.queries() + 1);
    let mut docs = Vec::with_capacity(hits);
    let mut scores = Vec::with_capacity(hits);
    offsets.push(0);
    // The pending run: slots lo..next, not yet copied.
    let (mut lo, mut next) = (0usize, 0usize);
    let flush = |docs: &mut Vec<u32>, scores: &mut Vec<f64>, lo: usize, next: usize| {
        let r = off[lo] as usize..off[next] as usize;
        docs.extend_from_slice(&dev_doc[r.clone()]);
        scores.extend_from_slice(&dev_score[r]);
    };
    for s in part.slots() {
        if s & ON_CPU != 0 {
            let h = &cpu_hits[(s & !ON_CPU) as usize];
            if !h.is_empty() {
                flush(&mut docs, &mut scores, lo, next);
                lo = next;
                docs.extend(h.iter().map(|h| h.doc));
                scores.extend(h.iter().map(|h| h.score));
            }
        } else {
            let s = s as usize;
            if s != next {
                flush(&mut docs, &mut scores, lo, next);
                lo = s;
            }
            next = s + 1;
        }
        // (At most `hits`, below 2^32: checked above.)
        offsets.push((docs.len() + (off[next] - off[lo]) as usize) as u32);
    }
    flush(&mut docs, &mut scores, lo, next);
    Ok(Ranked {
        offsets: offsets.into(),
        docs: docs.into(),
        scores: scores.into(),
    })
}

/// Whether packed answers' offsets are as `bm25_pack` writes them: from 0, each query's
/// count (the next offset less its own) at most `k` (a decrease wraps above it). One pass
/// without data-dependent branches, which the compiler vectorizes (a pass that stopped at the
/// first bad pair was a branch per query).
fn packed_offsets_ok(off: &[u32], k: usize) -> bool {
    let Ok(k) = u32::try_from(k) else {
        return false;
    };
    let Some((&first, rest)) = off.split_first() else {
        return false;
    };
    let over = off
        .iter()
        .zip(rest)
        .fold(0u32, |acc, (&a, &b)| acc | u32::from(b.wrapping_sub(a) > k));
    first == 0 && over == 0
}

/// Most hits a batch's answers are unpacked on one thread (the knob `bm25_unpack_seq_max`;
/// default [`UNPACK_SEQ_MAX`]); more go through [`Ranked::build`]'s parallel fill.
fn unpack_seq_max() -> usize {
    knobs()
        .bm25_unpack_seq_max
        .map_or(UNPACK_SEQ_MAX, |m| m as usize)
}
const UNPACK_SEQ_MAX: usize = 262_144;

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The branch-free check says what a pair-by-pair reading of the rule says.
        #[test]
        fn packed_offsets_check_follows_the_rule(
            steps in proptest::collection::vec(0u32..14, 0..300),
            start in 0u32..3,
            k in 1usize..12,
            dip in proptest::option::of(0usize..300),
        ) {
            let mut off = vec![start];
            for s in &steps {
                off.push(off.last().unwrap() + s);
            }
            if let Some(d) = dip.filter(|&d| d + 1 < off.len()) {
                off[d + 1] = off[d].saturating_sub(1); // a decrease (or equal, at 0)
            }
            let want = off[0] == 0
                && off.windows(2).all(|w| w[1] >= w[0] && (w[1] - w[0]) as usize <= k);
            proptest::prop_assert_eq!(packed_offsets_ok(&off, k), want);
        }
    }

    #[test]
    fn packed_offsets_edges() {
        assert!(!packed_offsets_ok(&[], 10));
        assert!(packed_offsets_ok(&[0], 10));
        assert!(!packed_offsets_ok(&[1], 10));
        assert!(packed_offsets_ok(&[0, 10, 10, 20], 10));
        assert!(!packed_offsets_ok(&[0, 11], 10));
        assert!(!packed_offsets_ok(&[0, 5, 4], 10));
        assert!(!packed_offsets_ok(&[0, u32::MAX], 10));
    }
}
