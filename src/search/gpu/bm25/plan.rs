//! How a query is ranked on the device: in one block or in pieces over ranges of ordinals
//! ([`plan`], exact either way), the blocks a staged batch launches ([`Blocks`]) and the
//! launch order, longest first ([`work_bucket`]).

use std::sync::OnceLock;

use super::{AND_ONLY, CAP, MAX_PIECES, PIECE, WHOLE};
use crate::search::topk::Mode;
use crate::tuning::knobs;

/// The work (candidates times lists searched, see [`plan`]) a piece of a split query should
/// hold in a batch of `mode` (the knob `bm25_piece`, 0: never split; default
/// [`DEFAULT_PIECE`]; an AND batch: `bm25_piece_and`, default the smaller of that and
/// [`DEFAULT_PIECE_AND`]). AND's pieces are smaller: its time is its longest pieces' chains
/// of searches (pieces of 4,096 took AND's kernels from 0.15 to 0.13 ms on an H200),
/// whereas OR at 4,096 lost more to each piece's own top-k (0.59 -> 0.78 ms).
pub(super) fn piece_work(mode: Mode) -> u64 {
    static P: OnceLock<(u64, u64)> = OnceLock::new();
    let (any, and) = *P.get_or_init(|| {
        let any = knobs().bm25_piece.unwrap_or(DEFAULT_PIECE);
        let and = knobs().bm25_piece_and.unwrap_or(any.min(DEFAULT_PIECE_AND));
        (any, and)
    });
    if mode == Mode::And { and } else { any }
}

const DEFAULT_PIECE_AND: u64 = 4096;
const DEFAULT_PIECE: u64 = 16384;

/// How the device ranks one query: `pieces` blocks over ordinal ranges (1: the whole query
/// in one block), each holding about `work / pieces` of the work (candidates times lists
/// searched), cut at the ordinals of the list `lead` (its position among the query's terms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Plan {
    pub(super) pieces: u32,
    pub(super) work: u64,
    pub(super) lead: u32,
    /// OR's starting threshold (`Scored::theta_floor`; -inf for AND, which never reads it).
    pub(super) floor: f64,
    /// AND-then-OR (a split one also gets a block for its AND).
    pub(super) and_or: bool,
}

/// The device's plan for one query (see `or_pruned` in bm25.cu for the lists it visits): an
/// OR query visits the postings of its essential lists (those left once the lists whose
/// maxima, smallest first, sum with the static bound to no more than the floor are put
/// aside), or of all its lists (no floor, or none put aside); AND visits its shortest list.
/// Each candidate is then looked up by a binary search in every other list, one list after
/// the other: a block's time follows those chains of dependent loads (ncu on the H100: the
/// OR launch's busiest multiprocessor was active 1.9x as long as the average one, held by
/// queries of 8-12 terms whose pieces had as many postings as a two-term query's), so the
/// work is the candidates times the lists searched (at least one). A query with more work
/// than `piece` is split into pieces over ranges of ordinals, cut at equal shares of its
/// longest essential list (AND: of its shortest list). Only the count of pieces and where
/// they are cut depend on this estimate, never the answer (every split is exact). An OR query
/// is split only with a floor: a piece starts from its query's floor, whereas without one
/// each piece would collect and sort its own k candidates before it could prune (measured:
/// OR at k = 100, no floor, 2.85 ms of kernels unsplit, 4.97 ms split into 16,186 pieces of
/// 4,096 postings); the sweep's work is all its postings.
pub(super) fn plan(
    lens: &[u64],
    maxima: impl Fn(usize) -> f64,
    floor: f64,
    static_max: f64,
    mode: Mode,
    k: usize,
    piece: u64,
) -> Plan {
    let and_or = mode == Mode::AndOr;
    let whole = |work| Plan {
        pieces: 1,
        work,
        lead: 0,
        floor,
        and_or,
    };
    let most = (CAP / k.max(1)).min(MAX_PIECES) as u64;
    let split = |work: u64, lead: usize| Plan {
        pieces: if piece == 0 || most < 2 {
            1
        } else {
            work.div_ceil(piece).clamp(1, most) as u32
        },
        work,
        lead: lead as u32,
        floor,
        and_or,
    };
    // Lists each candidate is searched in.
    let searched = (lens.len() as u64).saturating_sub(1).max(1);
    if mode == Mode::And {
        let Some((lead, &short)) = lens.iter().enumerate().min_by_key(|&(_, &l)| l) else {
            return whole(0);
        };
        return split(short * searched, lead);
    }
    if floor == f64::NEG_INFINITY {
        // The sweep, never split.
        return whole(lens.iter().sum());
    }
    // Lists still essential, one bit each (at most BM25_MAX_TERMS = 64 lists).
    let mut essential: u64 = if lens.len() >= 64 {
        u64::MAX
    } else {
        (1 << lens.len()) - 1
    };
    let is_essential = |e: u64, j: usize| e >> j & 1 == 1;
    let cut = floor - 1e-12 * floor.abs();
    let mut sum = static_max;
    while let Some(j) = (0..lens.len())
        .filter(|&j| is_essential(essential, j))
        .min_by(|&a, &b| maxima(a).total_cmp(&maxima(b)))
    {
        if sum + maxima(j) > cut {
            break;
        }
        sum += maxima(j);
        essential &= !(1 << j);
    }
    if essential == 0 {
        // Nothing can reach the floor: the kernel visits nothing.
        return whole(0);
    }
    let ess = (0..lens.len()).filter(|&j| is_essential(essential, j));
    let work: u64 = ess.clone().map(|j| lens[j]).sum::<u64>() * searched;
    split(work, ess.max_by_key(|&j| lens[j]).unwrap_or(0))
}

/// Sort keys for the longest-first launch order: buckets of work (postings to visit), four
/// per power of two (exact order does not matter, only that long queries start first).
pub(super) fn work_bucket(work: u64) -> usize {
    if work < 4 {
        return work as usize;
    }
    let lz = 63 - work.leading_zeros() as usize; // floor(log2)
    let frac = ((work >> (lz - 2)) & 3) as usize; // the next two bits
    4 * (lz - 1) + frac
}

/// Buckets of [`work_bucket`] (work < 2^64).
pub(super) const WORK_BUCKETS: usize = 4 * 63 + 4;

/// A group's blocks, built by the writing pass: its items (`Item` in bm25.cu: device slot,
/// part, lead << 16 | parts, kind | piece slot counted within the group), their sort keys,
/// and its split queries (device slot, end of its pieces within the group).
#[derive(Default)]
pub(super) struct Blocks {
    pub(super) items: Vec<[u32; 4]>,
    pub(super) keys: Vec<u8>,
    pub(super) splits: Vec<[u32; 2]>,
    pub(super) pieces: u32,
}

impl Blocks {
    /// Query `q`'s blocks: one, or its pieces (and a block for the AND of an AND-then-OR).
    pub(super) fn push(&mut self, q: u32, p: &Plan) {
        if p.pieces == 1 {
            self.items.push([q, 0, 1, WHOLE]);
            self.keys.push(work_bucket(p.work) as u8);
            return;
        }
        let key = work_bucket(p.work / u64::from(p.pieces)) as u8;
        if p.and_or {
            self.items.push([q, 0, 1, AND_ONLY]);
            self.keys.push(key);
        }
        // Pieces of equal shares of the lead list, cut by the device.
        for j in 0..p.pieces {
            self.items
                .push([q, j, p.lead << 16 | p.pieces, PIECE | (self.pieces + j)]);
            self.keys.push(key);
        }
        self.pieces += p.pieces;
        self.splits.push([q, self.pieces]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    #[test]
    fn a_query_is_split_by_its_candidates_times_the_lists_searched() {
        let lens = [10_000, 300, 50_000];
        let maxima = [1.0, 2.0, 0.5];
        // No floor: all lists are swept, in one piece.
        let p = plan(&lens, |j| maxima[j], -INF, 0.0, Mode::Or, 10, 4096);
        assert_eq!((p.pieces, p.work), (1, 60_300));
        // A floor below every maximum: every posting is a candidate searched in two lists, in
        // pieces cut at the longest list.
        let p = plan(&lens, |j| maxima[j], 0.1, 0.0, Mode::Or, 10, 4096);
        assert_eq!((p.pieces, p.work, p.lead), (30, 120_600, 2));
        // A floor of 1.6: the two smallest maxima (0.5 + 1.0 = 1.5 <= 1.6) are put aside;
        // the candidates are the 300 postings of the list of maximum 2.0.
        let p = plan(&lens, |j| maxima[j], 1.6, 0.0, Mode::Or, 10, 128);
        assert_eq!((p.pieces, p.work, p.lead), (5, 600, 1));
        // The static bound counts against the floor: 0.2 + 0.5 <= 1.0 but + 1.0 is not.
        let p = plan(&lens, |j| maxima[j], 1.0, 0.2, Mode::AndOr, 10, 4096);
        assert_eq!((p.pieces, p.work, p.lead), (6, 20_600, 0));
        // Within one piece: not split.
        let p = plan(&[100, 50], |j| [1.0, 2.0][j], 1.6, 0.0, Mode::Or, 10, 200);
        assert_eq!((p.pieces, p.work), (1, 50));
        // One list: each candidate counts once.
        let p = plan(&[1000], |_| 1.0, 0.5, 0.0, Mode::Or, 10, 100);
        assert_eq!((p.pieces, p.work), (10, 1000));
        // Every list below the floor: nothing to visit.
        let p = plan(&lens, |j| maxima[j], 4.0, 0.0, Mode::Or, 10, 16);
        assert_eq!((p.pieces, p.work), (1, 0));
        // AND: the shortest list's postings, each searched in the others, cut at that list.
        let p = plan(&lens, |j| maxima[j], -INF, 0.0, Mode::And, 10, 100);
        assert_eq!((p.pieces, p.work, p.lead), (6, 600, 1));
    }

    #[test]
    fn pieces_are_bounded_by_the_merge_buffer() {
        let lens = [1_000_000];
        let maxima = [1.0];
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 10, 16);
        assert_eq!(p.pieces as usize, MAX_PIECES);
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 100, 16);
        assert_eq!(p.pieces as usize, CAP / 100);
        let p = plan(&[5, 1_000_000], |_| 1.0, -INF, 0.0, Mode::And, 100, 1);
        assert_eq!((p.pieces as usize, p.work), (5, 5));
        // k above half the buffer: two pieces' answers would not fit, no split.
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 600, 16);
        assert_eq!(p.pieces, 1);
        let p = plan(&lens, |_| 1.0, -INF, 0.0, Mode::And, 600, 16);
        assert_eq!(p.pieces, 1);
        // Splitting off.
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 10, 0);
        assert_eq!(p.pieces, 1);
        let p = plan(&[5, 1_000_000], |_| 1.0, -INF, 0.0, Mode::And, 10, 0);
        assert_eq!((p.pieces, p.work), (1, 5));
    }
}
