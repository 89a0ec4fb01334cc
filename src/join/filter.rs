//! The filter phase of the similarity join (AllPairs + PPJoin) and its verification.
//!
//! [`Collections`] holds both inputs after the build (`build.rs`): sets deduplicated, tokens
//! renamed to ranks by increasing global frequency (every set starts with its rarest tokens),
//! all sets in one global order by `(size, side, row)`, and per side an inverted index over
//! the sets' *index prefixes* (the first `n - min_overlap(n, n) + 1` tokens, enough against
//! partners at least as large), posting lists in global order, hence sorted by size.
//!
//! Probe ([`Collections::filter`]): set `x` (size `n`) at global position `p` looks up its
//! *probe prefix* (`n - min_overlap(n, lo) + 1` tokens, `lo` the smallest admissible
//! partner size) in the other side's index (its own for a self-join) and meets only sets
//! before `p`, so each pair is seen once, by its later member. Posting entries of sets
//! smaller than `lo` are skipped with a binary search (length filter); each match updates
//! the candidate's prefix overlap or kills it with the positional filter
//! (`overlap so far + 1 + min(tokens left in x, tokens left in y) < min_overlap(n, m)`).
//! `min_overlap(n, m)` comes from a per-size table recomputed only when `n` changes (a
//! stream probes sets in increasing size). Survivors ([`Candidate`]s) are verified by a merge
//! that resumes after the last token the prefixes share (every common token before it has
//! been counted, see [`Candidate`]) and stops as soon as the required overlap can no longer
//! be reached ([`verify`]). Sets routed by prefix bucket (`super::route`) are probed from
//! their own bucket's tokens only, a candidate counted from the first token it is met at.

use std::collections::HashMap;

use datafusion::arrow::array::{Array, make_comparator};
use datafusion::arrow::compute::{SortOptions, concat, sort_to_indices};
use datafusion::common::Result;
use datafusion::execution::memory_pool::MemoryReservation;

use super::threshold::Threshold;
use crate::backend::cpu::{BoundedKernel, overlap_at_least, prefetch};

pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Grow `reservation` by `bytes` or fail with an error naming the operator and the purpose.
pub(crate) fn reserve(reservation: &MemoryReservation, bytes: usize, what: &str) -> Result<()> {
    reservation.try_grow(bytes).map_err(|e| {
        e.context(format!(
            "SimilarityJoinExec: the memory pool refused {bytes} bytes for {what}"
        ))
    })
}

/// One posting: a set (global position), the position of the token in it and the set's
/// size (read by the length and positional filters without another memory access). Three
/// `u32` in this order, as the device reads them (`probe_join` in kernels/simjoin.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Posting {
    pub(super) set: u32,
    pub(super) pos: u32,
    pub(super) size: u32,
}

/// An inverted index over index prefixes, in CSR form: token `w`'s postings are
/// `postings[offsets[w]..offsets[w + 1]]`, in global order.
#[derive(Debug, PartialEq, Default)]
pub(super) struct Index {
    pub(super) offsets: Vec<usize>,
    pub(super) postings: Vec<Posting>,
}

impl Index {
    #[inline]
    fn list(&self, w: u32) -> &[Posting] {
        let w = w as usize;
        &self.postings[self.offsets[w]..self.offsets[w + 1]]
    }

    /// The index as the device reads it: the offsets and the postings' words, three per
    /// posting.
    pub(crate) fn view(&self) -> crate::join::gpu::IndexView<'_> {
        // SAFETY: `Posting` is `repr(C)` with three `u32` fields: 12 bytes, no padding,
        // aligned as `u32`, so the postings are `3 * len` initialized `u32` in order.
        let words = unsafe {
            std::slice::from_raw_parts(
                self.postings.as_ptr().cast::<u32>(),
                self.postings.len() * 3,
            )
        };
        crate::join::gpu::IndexView {
            offsets: &self.offsets,
            postings: words,
        }
    }
}

/// Both inputs after token reordering, in the global order, with their prefix indexes.
#[derive(Debug, PartialEq)]
pub(crate) struct Collections {
    /// Token ranks of every set (ascending within a set), sets in global order.
    pub(super) tokens: Vec<u32>,
    /// `tokens[starts[p]..starts[p + 1]]` is set `p`.
    pub(super) starts: Vec<usize>,
    /// Size of set `p`.
    pub(super) sizes: Vec<u32>,
    /// Side of set `p`: 0 = left, 1 = right.
    pub(super) sides: Vec<u8>,
    /// Row of set `p` in its side's input (batches concatenated).
    pub(super) rows: Vec<u32>,
    /// Sets routed by prefix bucket (`super::build::TokenOrder::Routed`): whether each token
    /// is of its copy's own bucket. Empty otherwise.
    pub(super) home: Vec<bool>,
    /// One index per side (one in all for a self-join).
    pub(super) indexes: Vec<Index>,
    /// A replicated self-join (left: the whole input, right: this partition's part of it):
    /// each set's id ranked among the ids of both sides (equal ids, equal ranks; [`NULL_RANK`]
    /// for a null id). Only the right side's sets probe, and only the left side's index: a
    /// pair of rows is this partition's when its right set comes later in the global order
    /// (`(size, side, row)`), and of two sets of one size, when the right set's id ranks
    /// higher (the pair of two rows is then met in one partition only; `PairRule::Replicated`).
    /// Empty otherwise.
    pub(super) id_ranks: Vec<u32>,
}

/// The rank of a null id in [`Collections::id_ranks`]: no pair with it is kept.
pub(super) const NULL_RANK: u32 = u32::MAX;

/// A candidate of the last probe of set `x`: a set `y` met in the index that passed the
/// prefix, length and positional filters, with what the probe already knows of `|x ∩ y|`.
///
/// Every common token smaller than the last one the prefixes share has been counted in
/// `overlap`: it lies before that token in `x`'s probe prefix and in `y`'s index prefix,
/// so the probe met `y` in its posting list. Verification resumes at `from_x`, `from_y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Global position of `y`.
    pub set: u32,
    /// `min_overlap(|x|, |y|)`.
    pub alpha: u32,
    /// Common tokens counted by the probe.
    pub overlap: u32,
    /// Position in `x` after the last common token counted.
    pub from_x: u32,
    /// Position in `y` after the last common token counted.
    pub from_y: u32,
}

/// `min_overlap(n, m)` is `None` in an [`Scratch`] table.
const NO_OVERLAP: u32 = u32::MAX;

/// Per-stream buffers for [`Collections::filter`], sized to the number of sets. One
/// `Scratch` serves one [`Threshold`] (its table of `min_overlap` is keyed by size only).
#[derive(Debug, Default)]
pub struct Scratch {
    /// 0: not met yet; > 0: prefix overlap so far; < 0: pruned.
    state: Vec<i32>,
    /// Positions after the last common token met, in the probing set and in each met set.
    last: Vec<(u32, u32)>,
    touched: Vec<u32>,
    /// The probing size the table below is for (0: none yet).
    table_n: u64,
    /// `min_partner_size(table_n)`.
    table_lo: u64,
    /// `min_overlap(table_n, m)` at `m - table_lo`, for `m` in `table_lo..=table_n`.
    table: Vec<u32>,
    /// The candidates of the last probe.
    pub candidates: Vec<Candidate>,
}

impl Scratch {
    /// Buffers for `sets` sets.
    pub fn new(sets: usize) -> Self {
        Self {
            state: vec![0; sets],
            last: vec![(0, 0); sets],
            ..Self::default()
        }
    }

    /// Bytes the per-set buffers take for `sets` sets.
    pub fn bytes_for(sets: usize) -> usize {
        sets * (size_of::<i32>() + size_of::<(u32, u32)>())
    }

    /// Make the `min_overlap` table the one of size `n`; `false` when no set can pass
    /// with a set of size `n`.
    fn table_for(&mut self, n: u64, threshold: &Threshold) -> bool {
        if self.table_n != n {
            self.table_n = n;
            self.table.clear();
            match threshold.min_partner_size(n) {
                Some(lo) => {
                    self.table_lo = lo;
                    self.table.extend((lo..=n).map(|m| {
                        threshold
                            .min_overlap(n, m)
                            .map_or(NO_OVERLAP, |a| a.min(u64::from(NO_OVERLAP - 1)) as u32)
                    }));
                }
                None => self.table_lo = n + 1,
            }
        }
        !self.table.is_empty()
    }
}

impl Collections {
    /// Number of sets (both sides).
    pub fn len(&self) -> usize {
        self.sides.len()
    }

    /// Every set's token ranks back to back, and where each set starts (`len() + 1`
    /// entries): the layout the GPU verification uploads.
    pub fn raw(&self) -> (&[u32], &[usize]) {
        (&self.tokens, &self.starts)
    }

    /// Set `p` (token ranks, ascending).
    #[inline]
    pub fn set(&self, p: usize) -> &[u32] {
        &self.tokens[self.starts[p]..self.starts[p + 1]]
    }

    /// Side of set `p` (0 = left, 1 = right).
    #[inline]
    pub fn side(&self, p: usize) -> u8 {
        self.sides[p]
    }

    /// Input row of set `p` within its side.
    #[inline]
    pub fn row(&self, p: usize) -> u32 {
        self.rows[p]
    }

    /// The input row of every set, in set order.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    /// The side of every set (0 = left, 1 = right), in set order.
    pub fn sides(&self) -> &[u8] {
        &self.sides
    }

    /// Whether the sets are routed by prefix bucket (`super::build::TokenOrder::Routed`).
    pub fn routed(&self) -> bool {
        !self.home.is_empty()
    }

    /// Rank the sets' ids for a replicated self-join ([`Self::id_ranks`]): `ids[s]` is side
    /// `s`'s id column, rows as the build numbers them.
    pub(super) fn rank_ids(
        &mut self,
        ids: [&dyn Array; 2],
        reservation: &MemoryReservation,
    ) -> Result<()> {
        let n = ids[0].len() + ids[1].len();
        // The ids together, their order, the ranks by row and by set.
        reserve(
            reservation,
            ids[0].get_array_memory_size()
                + ids[1].get_array_memory_size()
                + 8 * n
                + 4 * self.sizes.len(),
            "the ranks of the ids",
        )?;
        let all = concat(&ids)?;
        let cmp = make_comparator(all.as_ref(), all.as_ref(), SortOptions::default())?;
        let order: Vec<u32> = match sort_to_indices(all.as_ref(), None, None) {
            Ok(order) => order.values().to_vec(),
            // A type the sort kernel lacks, but the comparator orders.
            Err(_) => {
                let mut order: Vec<u32> = (0..n as u32).collect();
                order.sort_by(|&a, &b| cmp(a as usize, b as usize));
                order
            }
        };
        let mut by_row = vec![NULL_RANK; n];
        let (mut rank, mut previous) = (0u32, None);
        for i in order.iter().map(|&i| i as usize) {
            if all.is_null(i) {
                continue;
            }
            if let Some(j) = previous
                && cmp(j, i).is_ne()
            {
                rank += 1;
            }
            by_row[i] = rank;
            previous = Some(i);
        }
        let first = [0, ids[0].len()];
        self.id_ranks = (self.sides.iter().zip(&self.rows))
            .map(|(&side, &row)| by_row[first[usize::from(side.min(1))] + row as usize])
            .collect();
        Ok(())
    }

    /// A replicated self-join's pair of left set `l` and right set `r` (see
    /// [`Self::id_ranks`]), if this partition emits it: `(l, r)` with the set of higher id
    /// first, else `(r, l)`.
    #[inline]
    pub(crate) fn replicated_pair(&self, l: usize, r: usize) -> Option<(usize, usize)> {
        let (a, b) = (*self.id_ranks.get(l)?, *self.id_ranks.get(r)?);
        let (m, n) = (self.sizes[l], self.sizes[r]);
        if a == NULL_RANK || b == NULL_RANK || a == b || m > n || (m == n && a > b) {
            return None;
        }
        Some(if a > b { (l, r) } else { (r, l) })
    }

    /// Whether this bucket owns the pair of routed sets `p` and `q` (`super::route::owns`);
    /// `false` for sets that are not routed.
    #[inline]
    pub fn owns(&self, p: usize, q: usize, threshold: &Threshold) -> bool {
        let home = |w: u32| self.home.get(w as usize).copied().unwrap_or(false);
        super::route::owns(self.set(p), self.set(q), threshold, home)
    }

    /// The prefix indexes as the device reads them: one for a self-join, else side 0's then
    /// side 1's.
    pub(crate) fn index_views(&self) -> Vec<crate::join::gpu::IndexView<'_>> {
        self.indexes.iter().map(Index::view).collect()
    }

    /// How many pairs of postings share a token in the prefix indexes: the order of the
    /// number of index entries the probes walk (each pair of sets sharing an indexed token is
    /// met once from the later set). Within a side for a self-join, across sides for an R-S
    /// join. What the backend policy weighs the join by.
    pub fn probe_work(&self) -> u64 {
        fn lens(i: &Index) -> impl Iterator<Item = u64> + '_ {
            i.offsets.windows(2).map(|w| (w[1] - w[0]) as u64)
        }
        match self.indexes.as_slice() {
            [one] => lens(one).map(|l| l * l.saturating_sub(1) / 2).sum(),
            [a, b] => lens(a).zip(lens(b)).map(|(x, y)| x * y).sum(),
            _ => 0,
        }
    }

    /// Hint the CPU to fetch the tokens of set `q` from position `from` on (the first two
    /// cache lines: a verification's merge starts there).
    #[inline]
    pub fn prefetch_set(&self, q: usize, from: usize) {
        if let Some(&start) = self.starts.get(q) {
            let p = self.tokens.as_ptr().wrapping_add(start + from);
            prefetch(p);
            prefetch(p.wrapping_add(16));
        }
    }

    /// Filter phase for set `p`: fill `scratch.candidates` with the sets before `p` (of the
    /// other side; of any side in a self-join) that pass the prefix, length and positional
    /// filters. Returns the number of distinct sets met in the index after the length
    /// filter (pre-candidates).
    pub fn filter(&self, p: usize, threshold: &Threshold, scratch: &mut Scratch) -> usize {
        scratch.candidates.clear();
        let x = self.set(p);
        let n = x.len() as u64;
        if !scratch.table_for(n, threshold) {
            return 0;
        }
        let lo = scratch.table_lo;
        // Partners of size `lo` need the fewest common tokens: the longest probe prefix.
        let alpha = u64::from(scratch.table[0]);
        if alpha == u64::from(NO_OVERLAP) {
            return 0;
        }
        let probe_len = (n - alpha.max(1) + 1) as usize;
        let index = if self.indexes.len() == 1 {
            &self.indexes[0]
        } else {
            &self.indexes[1 - self.side(p) as usize]
        };
        let sizes = &self.sizes;
        let Scratch {
            state,
            last,
            touched,
            table,
            candidates,
            ..
        } = scratch;
        // Routed sets: a pair is this partition's only if its smallest common token (the
        // first the probe meets it at) is of the copy's own bucket, and the index holds only
        // such tokens, so a candidate starts at the first of them. Nothing before it is
        // common when the pair is owned (one that shares an earlier token is not, and the
        // pair rule drops it after verification), so it counts one common token and later
        // tokens are left to the verification.
        let routed = self.routed();
        // Replicated: (the ranks, the probe's rank); only the right side probes.
        let id_rule = match self.id_ranks.get(p) {
            Some(_) if self.sides[p] == 0 => return 0,
            Some(&NULL_RANK) => return 0,
            Some(&rank) => Some((self.id_ranks.as_slice(), rank)),
            None => None,
        };
        for (i, &w) in x[..probe_len].iter().enumerate() {
            let Some(list) = index.offsets.get(w as usize + 1).map(|_| index.list(w)) else {
                continue;
            };
            let start = list.partition_point(|e| u64::from(e.size) < lo);
            let left_x = n - i as u64 - 1;
            for e in &list[start..] {
                let q = e.set as usize;
                if q >= p {
                    break;
                }
                if let Some((ranks, rank)) = id_rule {
                    let other = ranks[q];
                    if other == NULL_RANK
                        || other == rank
                        || (u64::from(e.size) == n && other > rank)
                    {
                        continue;
                    }
                }
                let st = state[q];
                if st < 0 || (routed && st > 0) {
                    continue;
                }
                let m = u64::from(e.size);
                let a = table[(m - lo) as usize];
                if st == 0 {
                    touched.push(q as u32);
                    if a == NO_OVERLAP {
                        state[q] = -1;
                        continue;
                    }
                }
                let left_y = m - u64::from(e.pos) - 1;
                if st as u64 + 1 + left_x.min(left_y) >= u64::from(a) {
                    state[q] = st + 1;
                    last[q] = (i as u32 + 1, e.pos + 1);
                } else {
                    state[q] = -1;
                }
            }
        }
        let met = touched.len();
        for &q in touched.iter() {
            let st = state[q as usize];
            if st > 0 {
                let (from_x, from_y) = last[q as usize];
                candidates.push(Candidate {
                    set: q,
                    alpha: table[(u64::from(sizes[q as usize]) - lo) as usize],
                    overlap: st as u32,
                    from_x,
                    from_y,
                });
            }
            state[q as usize] = 0;
        }
        touched.clear();
        met
    }
}

/// `|x ∩ y|` for candidate `c` of probing set `x` (`y` the candidate's set), if it reaches
/// `c.alpha`, else `None`: the merge (`kernel`) resumes after the tokens the probe counted.
/// With `EXACT = false` it also stops once `c.alpha` is reached (the count is then a lower
/// bound, enough for counting pairs).
#[inline]
pub fn verify_candidate<const EXACT: bool>(
    kernel: BoundedKernel,
    x: &[u32],
    y: &[u32],
    c: &Candidate,
) -> Option<u64> {
    let (fx, fy) = (c.from_x as usize, c.from_y as usize);
    if fx > x.len() || fy > y.len() {
        return None;
    }
    verify::<EXACT>(
        kernel,
        &x[fx..],
        &y[fy..],
        u64::from(c.alpha),
        u64::from(c.overlap),
    )
}

/// `counted + |x ∩ y|` of two ascending token lists if it reaches `alpha`, else `None`.
/// Stops as soon as `alpha` can no longer be reached; with `EXACT = false` also as soon as it
/// is reached (the returned count is then a lower bound, enough for counting pairs). The
/// merge is the bounded-overlap kernel of the CPU backend
/// ([`crate::backend::cpu::overlap_at_least`]: scalar, AVX2, AVX-512 or VP2INTERSECT).
#[inline]
pub fn verify<const EXACT: bool>(
    kernel: BoundedKernel,
    x: &[u32],
    y: &[u32],
    alpha: u64,
    counted: u64,
) -> Option<u64> {
    overlap_at_least::<EXACT>(kernel, x, y, alpha.saturating_sub(counted)).map(|o| counted + o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar merge and the kernel `auto` picks on this CPU.
    fn kernels() -> Vec<BoundedKernel> {
        use crate::backend::cpu::CpuKernelChoice;
        use crate::backend::cpu::Kernel;
        let mut k = vec![
            BoundedKernel::resolve(CpuKernelChoice::Fixed(Kernel::Scalar)),
            BoundedKernel::resolve(CpuKernelChoice::Auto),
        ];
        k.dedup();
        k
    }

    #[test]
    fn verify_counts_and_stops() {
        for k in kernels() {
            assert_eq!(verify::<true>(k, &[1, 2, 3, 4], &[2, 4, 6], 2, 0), Some(2));
            assert_eq!(verify::<true>(k, &[1, 2, 3, 4], &[2, 4, 6], 3, 0), None);
            // Early-stopping: at least alpha, at most the overlap (kernels stop per block).
            let some = verify::<false>(k, &[1, 2, 3], &[1, 2, 3], 1, 0);
            assert!(some.is_some_and(|c| (1..=3).contains(&c)), "{some:?}");
            assert_eq!(verify::<true>(k, &[1, 2, 3], &[1, 2, 3], 1, 0), Some(3));
            assert_eq!(verify::<true>(k, &[], &[1], 1, 0), None);
            assert_eq!(verify::<true>(k, &[5], &[5], 1, 0), Some(1));
            // Resumed after 2 counted tokens.
            assert_eq!(verify::<true>(k, &[7, 9], &[9], 3, 2), Some(3));
            assert_eq!(verify::<true>(k, &[7, 9], &[8], 3, 2), None);
            assert_eq!(verify::<false>(k, &[7, 9], &[8], 2, 2), Some(2));
            assert_eq!(verify::<true>(k, &[], &[], 2, 2), Some(2));
        }
    }

    fn naive_overlap(x: &[u32], y: &[u32]) -> u64 {
        x.iter().filter(|v| y.binary_search(v).is_ok()).count() as u64
    }

    /// `verify` against a naive count, for every `alpha` and split point.
    #[test]
    fn verify_equals_naive() {
        for k in kernels() {
            let mut state = 0x2545_F491_4F6C_DD1Du64;
            let mut next = move |k: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % k
            };
            for _ in 0..2000 {
                let set = |next: &mut dyn FnMut(u64) -> u64| {
                    let len = next(30);
                    let mut s: Vec<u32> = (0..len).map(|_| next(40) as u32).collect();
                    s.sort_unstable();
                    s.dedup();
                    s
                };
                let (x, y) = (set(&mut next), set(&mut next));
                let o = naive_overlap(&x, &y);
                for alpha in 0..=x.len().min(y.len()) as u64 + 1 {
                    let exact = verify::<true>(k, &x, &y, alpha, 0);
                    assert_eq!(exact, (o >= alpha).then_some(o), "{x:?} {y:?} {alpha}");
                    let some = verify::<false>(k, &x, &y, alpha, 0);
                    assert_eq!(some.is_some(), o >= alpha, "{x:?} {y:?} {alpha}");
                    assert!(some.is_none_or(|c| c >= alpha && c <= o));
                }
                // Resuming after a common prefix split: tokens below `v` counted already.
                let v = next(40) as u32;
                let (fx, fy) = (x.partition_point(|&t| t < v), y.partition_point(|&t| t < v));
                let counted = naive_overlap(&x[..fx], &y[..fy]);
                for alpha in 0..=o + 1 {
                    assert_eq!(
                        verify::<true>(k, &x[fx..], &y[fy..], alpha, counted),
                        (o >= alpha).then_some(o),
                        "{x:?} {y:?} {alpha} from {v}"
                    );
                }
            }
        }
    }
}
