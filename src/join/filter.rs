//! The filter phase of the similarity join (AllPairs + PPJoin) and its verification.
//!
//! Build ([`Collections::build`]), once per query:
//! 1. every non-NULL, non-empty list becomes a set (sorted, deduplicated, NULL elements
//!    dropped); empty sets are dropped, as they are similar to nothing;
//! 2. tokens are renamed to ranks by increasing global frequency (over both inputs; ties by
//!    value), so every set starts with its rarest tokens;
//! 3. all sets of both sides are put in one global order by `(size, side, row)`;
//! 4. each side gets an inverted index over its sets' *index prefixes* (the first
//!    `n - min_overlap(n, n) + 1` tokens, enough against partners at least as large), with
//!    posting lists in global order, hence sorted by size.
//!
//! Probe ([`Collections::filter`]): set `x` (size `n`) at global position `p` looks up its
//! *probe prefix* (`n - min_overlap(n, lo) + 1` tokens, `lo` the smallest admissible
//! partner size) in the other side's index (its own for a self-join) and meets only sets
//! before `p`, so each pair is seen once, by its later member. Posting entries of sets
//! smaller than `lo` are skipped with a binary search (length filter); each match updates
//! the candidate's prefix overlap or kills it with the positional filter
//! (`overlap so far + 1 + min(tokens left in x, tokens left in y) < min_overlap(n, m)`).
//! Survivors are verified by a merge that stops as soon as the required overlap can no
//! longer be reached ([`verify`]).

use std::collections::HashMap;

use datafusion::arrow::array::{Array, ArrayRef, ArrowPrimitiveType, AsArray, OffsetSizeTrait};
use datafusion::common::{Result, internal_err};
use datafusion::execution::memory_pool::MemoryReservation;

use super::threshold::Threshold;
use crate::backend::cpu::SetElem;
use crate::dispatch_integer;
use crate::functions::common::IntLists;
use crate::functions::set_similarity::set_of;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Grow `reservation` by `bytes` or fail with an error naming the operator and the purpose.
pub(crate) fn reserve(reservation: &MemoryReservation, bytes: usize, what: &str) -> Result<()> {
    reservation.try_grow(bytes).map_err(|e| {
        e.context(format!(
            "SimilarityJoinExec: the memory pool refused {bytes} bytes for {what}"
        ))
    })
}

/// One posting: a set (global position) and the position of the token in it.
#[derive(Clone, Copy, Debug)]
struct Posting {
    set: u32,
    pos: u32,
}

/// An inverted index over index prefixes, in CSR form: token `w`'s postings are
/// `postings[offsets[w]..offsets[w + 1]]`, in global order.
#[derive(Debug, Default)]
struct Index {
    offsets: Vec<usize>,
    postings: Vec<Posting>,
}

impl Index {
    #[inline]
    fn list(&self, w: u32) -> &[Posting] {
        let w = w as usize;
        &self.postings[self.offsets[w]..self.offsets[w + 1]]
    }
}

/// Both inputs after token reordering, in the global order, with their prefix indexes.
#[derive(Debug)]
pub(crate) struct Collections {
    /// Token ranks of every set (ascending within a set), sets in global order.
    tokens: Vec<u32>,
    /// `tokens[starts[p]..starts[p + 1]]` is set `p`.
    starts: Vec<usize>,
    /// Side of set `p`: 0 = left, 1 = right.
    sides: Vec<u8>,
    /// Row of set `p` in its side's input (batches concatenated).
    rows: Vec<u32>,
    /// One index per side (one in all for a self-join).
    indexes: Vec<Index>,
}

/// The sets of one side before reordering: values of every set back to back.
struct RawSide<T> {
    values: Vec<T>,
    starts: Vec<usize>,
    rows: Vec<u32>,
}

/// Per-stream buffers for [`Collections::filter`], sized to the number of sets.
#[derive(Debug, Default)]
pub struct Scratch {
    /// 0: not met yet; > 0: prefix overlap so far; < 0: pruned.
    state: Vec<i32>,
    /// `min_overlap(n, m)` of each met set.
    alpha: Vec<u32>,
    touched: Vec<u32>,
    /// The candidates of the last probe (global positions).
    pub candidates: Vec<u32>,
}

impl Scratch {
    /// Buffers for `sets` sets; bytes they take.
    pub fn new(sets: usize) -> Self {
        Self {
            state: vec![0; sets],
            alpha: vec![0; sets],
            touched: Vec::new(),
            candidates: Vec::new(),
        }
    }

    /// Bytes the per-set buffers take for `sets` sets.
    pub fn bytes_for(sets: usize) -> usize {
        sets * (size_of::<i32>() + size_of::<u32>())
    }

    /// `min_overlap` of candidate `q` (valid for the last probe's candidates).
    #[inline]
    pub fn alpha(&self, q: u32) -> u64 {
        u64::from(self.alpha[q as usize])
    }
}

impl Collections {
    /// Build from each side's token columns (batches of one list type of integers, after
    /// coercion). `self_join`: one side, one index. Rows are numbered across batches.
    pub fn build(
        sides: &[Vec<ArrayRef>],
        threshold: &Threshold,
        reservation: &MemoryReservation,
    ) -> Result<Self> {
        let Some(first) = sides.iter().flatten().next() else {
            return Ok(Self::empty(sides.len()));
        };
        let (list_type, element) = match first.data_type() {
            dt @ (datafusion::arrow::datatypes::DataType::List(f)
            | datafusion::arrow::datatypes::DataType::LargeList(f)) => {
                (dt.clone(), f.data_type().clone())
            }
            other => {
                return internal_err!("SimilarityJoinExec: token column is {other}, not a list");
            }
        };
        if let Some(bad) = sides.iter().flatten().find(|a| *a.data_type() != list_type) {
            return internal_err!(
                "SimilarityJoinExec: token columns differ in type: {list_type} and {}",
                bad.data_type()
            );
        }
        if element.is_null() {
            // Lists of NULL elements only: every set is empty.
            return Ok(Self::empty(sides.len()));
        }
        let large = matches!(
            list_type,
            datafusion::arrow::datatypes::DataType::LargeList(_)
        );
        dispatch_integer!(&element, P => {
            if large {
                Self::build_typed::<i64, P>(sides, threshold, reservation)
            } else {
                Self::build_typed::<i32, P>(sides, threshold, reservation)
            }
        }, _ => internal_err!("SimilarityJoinExec: token elements are {element}, not integers"))
    }

    fn empty(sides: usize) -> Self {
        Self {
            tokens: Vec::new(),
            starts: vec![0],
            sides: Vec::new(),
            rows: Vec::new(),
            indexes: (0..sides)
                .map(|_| Index {
                    offsets: vec![0],
                    postings: Vec::new(),
                })
                .collect(),
        }
    }

    fn build_typed<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
        sides: &[Vec<ArrayRef>],
        threshold: &Threshold,
        reservation: &MemoryReservation,
    ) -> Result<Self>
    where
        P::Native: SetElem,
    {
        // 1. Sets, deduplicated.
        let mut raw: Vec<RawSide<P::Native>> = Vec::with_capacity(sides.len());
        for batches in sides {
            let total: usize = batches
                .iter()
                .map(|a| a.as_list::<O>().values().len())
                .sum();
            let rows: usize = batches.iter().map(|a| a.len()).sum();
            reserve(
                reservation,
                total * size_of::<P::Native>() + rows * (size_of::<usize>() + size_of::<u32>()),
                "the deduplicated sets",
            )?;
            let mut side = RawSide {
                values: Vec::with_capacity(total),
                starts: vec![0],
                rows: Vec::new(),
            };
            let mut base = 0usize;
            let mut buf = Vec::new();
            for array in batches {
                let list = array.as_list::<O>();
                let view = IntLists::new::<P>(list);
                for i in 0..view.len() {
                    if view.is_null(i) {
                        continue;
                    }
                    let set = set_of(&view, i, &mut buf);
                    if set.is_empty() {
                        continue;
                    }
                    side.values.extend_from_slice(set);
                    side.starts.push(side.values.len());
                    side.rows.push(u32::try_from(base + i).map_err(|_| {
                        datafusion::common::DataFusionError::NotImplemented(
                            "SimilarityJoinExec: more than 2^32 rows on one side".into(),
                        )
                    })?);
                }
                base += view.len();
            }
            raw.push(side);
        }

        // 2. Ranks by increasing frequency.
        let mut freq: FastMap<P::Native, u32> = FastMap::default();
        for side in &raw {
            for &v in &side.values {
                *freq.entry(v).or_insert(0) += 1;
            }
        }
        let distinct = freq.len();
        reserve(
            reservation,
            distinct * 3 * (size_of::<P::Native>() + 8),
            "the token frequencies",
        )?;
        let mut order: Vec<(u32, P::Native)> = freq.iter().map(|(&v, &f)| (f, v)).collect();
        order.sort_unstable();
        for (rank, (_, v)) in order.iter().enumerate() {
            freq.insert(*v, rank as u32);
        }
        drop(order);
        let rank = freq;

        // 3. Global order by (size, side, row).
        let sets: usize = raw.iter().map(|s| s.rows.len()).sum();
        let total: usize = raw.iter().map(|s| s.values.len()).sum();
        if u32::try_from(sets).is_err() {
            return datafusion::common::not_impl_err!("SimilarityJoinExec: more than 2^32 sets");
        }
        reserve(
            reservation,
            total * size_of::<u32>() + sets * (size_of::<usize>() * 2 + 16),
            "the reordered sets",
        )?;
        let mut items: Vec<(u32, u8, u32, usize)> = Vec::with_capacity(sets);
        for (s, side) in raw.iter().enumerate() {
            for (k, &row) in side.rows.iter().enumerate() {
                let len = side.starts[k + 1] - side.starts[k];
                items.push((len as u32, s as u8, row, k));
            }
        }
        items.sort_unstable();
        let mut tokens = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(sets + 1);
        starts.push(0);
        let mut side_of = Vec::with_capacity(sets);
        let mut rows = Vec::with_capacity(sets);
        for &(_, s, row, k) in &items {
            let side = &raw[s as usize];
            let from = tokens.len();
            for v in &side.values[side.starts[k]..side.starts[k + 1]] {
                tokens.push(rank.get(v).copied().unwrap_or(u32::MAX));
            }
            tokens[from..].sort_unstable();
            starts.push(tokens.len());
            side_of.push(s);
            rows.push(row);
        }
        drop(items);
        drop(raw);
        drop(rank);

        // 4. Index prefixes, one index per side.
        let mut indexes = Vec::with_capacity(sides.len());
        for s in 0..sides.len() as u8 {
            let prefix = |p: usize| -> usize {
                let n = (starts[p + 1] - starts[p]) as u64;
                match threshold.min_overlap(n, n) {
                    Some(a) => (n - a.max(1) + 1) as usize,
                    None => 0,
                }
            };
            let mut offsets = vec![0usize; distinct + 1];
            let mut count = 0usize;
            for p in (0..sets).filter(|&p| side_of[p] == s) {
                for &w in &tokens[starts[p]..starts[p] + prefix(p)] {
                    offsets[w as usize + 1] += 1;
                }
                count += prefix(p);
            }
            reserve(
                reservation,
                count * size_of::<Posting>() + offsets.len() * size_of::<usize>(),
                "the prefix index",
            )?;
            for w in 0..distinct {
                offsets[w + 1] += offsets[w];
            }
            let mut fill = offsets.clone();
            let mut postings = vec![Posting { set: 0, pos: 0 }; count];
            for p in (0..sets).filter(|&p| side_of[p] == s) {
                for (pos, &w) in tokens[starts[p]..starts[p] + prefix(p)].iter().enumerate() {
                    let slot = &mut fill[w as usize];
                    postings[*slot] = Posting {
                        set: p as u32,
                        pos: pos as u32,
                    };
                    *slot += 1;
                }
            }
            indexes.push(Index { offsets, postings });
        }
        Ok(Self {
            tokens,
            starts,
            sides: side_of,
            rows,
            indexes,
        })
    }

    /// Number of sets (both sides).
    pub fn len(&self) -> usize {
        self.sides.len()
    }

    /// Set `p` (token ranks, ascending).
    #[inline]
    pub fn set(&self, p: usize) -> &[u32] {
        &self.tokens[self.starts[p]..self.starts[p + 1]]
    }

    #[inline]
    fn size(&self, p: usize) -> u64 {
        (self.starts[p + 1] - self.starts[p]) as u64
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

    /// Filter phase for set `p`: fill `scratch.candidates` with the sets before `p` (of the
    /// other side; of any side in a self-join) that pass the prefix, length and positional
    /// filters, and their `min_overlap` in `scratch`. Returns the number of distinct sets
    /// met in the index after the length filter (pre-candidates).
    pub fn filter(&self, p: usize, threshold: &Threshold, scratch: &mut Scratch) -> usize {
        scratch.candidates.clear();
        let x = self.set(p);
        let n = x.len() as u64;
        let Some(lo) = threshold.min_partner_size(n) else {
            return 0;
        };
        let Some(alpha) = threshold.min_overlap(n, lo) else {
            return 0;
        };
        let probe_len = (n - alpha.max(1) + 1) as usize;
        let index = if self.indexes.len() == 1 {
            &self.indexes[0]
        } else {
            &self.indexes[1 - self.side(p) as usize]
        };
        let Scratch {
            state,
            alpha: alphas,
            touched,
            candidates,
        } = scratch;
        for (i, &w) in x[..probe_len].iter().enumerate() {
            let Some(list) = index.offsets.get(w as usize + 1).map(|_| index.list(w)) else {
                continue;
            };
            let start = list.partition_point(|e| self.size(e.set as usize) < lo);
            for e in &list[start..] {
                let q = e.set as usize;
                if q >= p {
                    break;
                }
                let st = state[q];
                if st < 0 {
                    continue;
                }
                let m = self.size(q);
                if st == 0 {
                    touched.push(q as u32);
                    match threshold.min_overlap(n, m) {
                        Some(a) => alphas[q] = a as u32,
                        None => {
                            state[q] = -1;
                            continue;
                        }
                    }
                }
                let left_x = n - i as u64 - 1;
                let left_y = m - u64::from(e.pos) - 1;
                if st as u64 + 1 + left_x.min(left_y) >= u64::from(alphas[q]) {
                    state[q] = st + 1;
                } else {
                    state[q] = -1;
                }
            }
        }
        let met = touched.len();
        for &q in touched.iter() {
            if state[q as usize] > 0 {
                candidates.push(q);
            }
            state[q as usize] = 0;
        }
        touched.clear();
        met
    }
}

/// `|x ∩ y|` of two ascending token lists if it reaches `alpha`, else `None`. Stops as soon
/// as `alpha` can no longer be reached; with `exact = false` also as soon as it is reached
/// (the returned count is then a lower bound, enough for counting pairs).
#[inline]
pub fn verify(x: &[u32], y: &[u32], alpha: u64, exact: bool) -> Option<u64> {
    let (mut i, mut j, mut o) = (0usize, 0usize, 0u64);
    while i < x.len() && j < y.len() {
        if o + ((x.len() - i).min(y.len() - j) as u64) < alpha {
            return None;
        }
        if !exact && o >= alpha {
            return Some(o);
        }
        let (a, b) = (x[i], y[j]);
        o += u64::from(a == b);
        i += usize::from(a <= b);
        j += usize::from(b <= a);
    }
    (o >= alpha).then_some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_counts_and_stops() {
        assert_eq!(verify(&[1, 2, 3, 4], &[2, 4, 6], 2, true), Some(2));
        assert_eq!(verify(&[1, 2, 3, 4], &[2, 4, 6], 3, true), None);
        assert_eq!(verify(&[1, 2, 3], &[1, 2, 3], 1, false), Some(1));
        assert_eq!(verify(&[1, 2, 3], &[1, 2, 3], 1, true), Some(3));
        assert_eq!(verify(&[], &[1], 1, true), None);
        assert_eq!(verify(&[5], &[5], 1, true), Some(1));
    }
}
