//! The build of the similarity join ([`Collections::build`]), once per query. Its parallel
//! steps are cut for `threads` threads (the session's `target_partitions`) and run by the
//! join's read tasks, on the threads they read on ([`Crew`]: the last reader leads, the others
//! take pieces), so `target_partitions = 1` builds on one core:
//! 1. every non-NULL, non-empty list becomes a set (sorted, deduplicated, NULL elements
//!    dropped), in pieces of [`PIECE_ROWS`] rows; empty sets are dropped (when an input is
//!    read by as many tasks as the build has threads, each task does this for its batches as
//!    they come: [`prepare`]);
//! 2. tokens are renamed to ranks by increasing global frequency (over both inputs; ties by
//!    value): one histogram per group of pieces, summed in slices of the value range (or one
//!    shared atomic histogram when per-group ones would outweigh the data; a hash map and a
//!    sort when the values are sparse), then a counting sort by frequency;
//! 3. all sets of both sides are put in one global order by `(size, side, row)` (a counting
//!    sort by size of sets listed in side and row order), each set's tokens renamed into its
//!    slot of one buffer, in pieces of about equal token counts;
//! 4. each side gets an inverted index over its sets' index prefixes (routed sets: their own
//!    bucket's tokens of it only), posting lists in
//!    global order: the sets are cut into contiguous ranges, one per thread; each range
//!    counts its tokens, the counts give every (range, token) pair its first slot, and each
//!    range then writes its postings there, so a list holds the ranges' postings in range
//!    order, i.e. in global order, with no sort.
//!
//! Every step's result is the same for any number of threads and helpers.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, GenericListArray, OffsetSizeTrait,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::memory_pool::MemoryReservation;

use super::crew::{Crew, lock};
use super::filter::{Collections, FastMap, Index, Posting, reserve};
use super::route::in_own_bucket;
use super::threshold::Threshold;
use crate::backend::cpu::SetElem;
use crate::intersect::lists::IntLists;
use crate::intersect::lists::dispatch_integer;
use crate::intersect::similarity::set_of;

/// Rows per piece of step 1 (the unit of parallel work).
const PIECE_ROWS: usize = 4096;

/// How step 2 orders the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenOrder {
    /// By increasing frequency over both inputs, ties by value.
    Frequency,
    /// By value: the sets of a prefix-partitioned partition, whose tokens (`UInt64`, written
    /// `rank * buckets + bucket` by the router) are already in the global order. The probe
    /// then starts candidates only at tokens of their copy's own bucket
    /// ([`Collections::filter`], `super::route`'s module docs).
    Routed { buckets: u32 },
}

/// The sets of some consecutive rows of one side before reordering: values of every set
/// back to back.
struct RawPiece<T> {
    values: Vec<T>,
    starts: Vec<usize>,
    rows: Vec<u32>,
}

impl<T> RawPiece<T> {
    fn set(&self, k: usize) -> &[T] {
        &self.values[self.starts[k]..self.starts[k + 1]]
    }
}

/// Step 1 for rows `from..to` of `list`: each non-NULL, non-empty list as a set, numbered
/// `base + i`.
fn piece<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
    list: &GenericListArray<O>,
    from: usize,
    to: usize,
    base: usize,
) -> Result<RawPiece<P::Native>>
where
    P::Native: SetElem,
{
    let view = IntLists::new::<P>(list);
    // Sized for the rows' values (an upper bound: NULL rows, NULL elements and duplicates
    // drop out), so the piece grows without copying.
    let offsets = list.value_offsets();
    let mut piece = RawPiece {
        values: Vec::with_capacity((offsets[to] - offsets[from]).as_usize()),
        starts: Vec::with_capacity(to - from + 1),
        rows: Vec::with_capacity(to - from),
    };
    piece.starts.push(0);
    let mut buf = Vec::new();
    for i in from..to {
        if view.is_null(i) {
            continue;
        }
        let set = set_of(&view, i, &mut buf);
        if set.is_empty() {
            continue;
        }
        piece.values.extend_from_slice(set);
        piece.starts.push(piece.values.len());
        piece
            .rows
            .push(u32::try_from(base + i).map_err(|_| too_many_rows())?);
    }
    Ok(piece)
}

fn too_many_rows() -> DataFusionError {
    DataFusionError::NotImplemented("SimilarityJoinExec: more than 2^32 rows on one side".into())
}

/// The bytes step 1 reserves for sets of `values` values in `rows` rows.
fn step1_bytes<T>(values: usize, rows: usize) -> usize {
    values * size_of::<T>() + rows * (size_of::<usize>() + size_of::<u32>())
}

/// Step 1 done on one batch of a token column ([`prepare`]), by the task that read it, so
/// that the build starts from sets: its pieces, rows numbered within the batch.
pub(crate) struct Prepared {
    rows: usize,
    /// `Vec<RawPiece<T>>` of the batch's element type.
    pieces: Box<dyn std::any::Any + Send + Sync>,
}

/// Step 1 on `tokens` (one batch of the join's token type: a list of integers), its memory
/// reserved in `reservation` (the build's, which counts it once, here instead of in step 1).
pub(crate) fn prepare(tokens: &ArrayRef, reservation: &MemoryReservation) -> Result<Prepared> {
    fn typed<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
        tokens: &ArrayRef,
        reservation: &MemoryReservation,
    ) -> Result<Prepared>
    where
        P::Native: SetElem,
    {
        let list = tokens.as_list::<O>();
        let n = list.len();
        let offsets = list.value_offsets();
        reserve(
            reservation,
            step1_bytes::<P::Native>((offsets[n] - offsets[0]).as_usize(), n),
            "the deduplicated sets",
        )?;
        let pieces = (0..n)
            .step_by(PIECE_ROWS)
            .map(|from| piece::<O, P>(list, from, (from + PIECE_ROWS).min(n), 0))
            .collect::<Result<Vec<_>>>()?;
        Ok(Prepared {
            rows: n,
            pieces: Box::new(pieces),
        })
    }
    let (large, element) = match tokens.data_type() {
        DataType::List(f) => (false, f.data_type()),
        DataType::LargeList(f) => (true, f.data_type()),
        other => return internal_err!("SimilarityJoinExec: token column is {other}, not a list"),
    };
    if element.is_null() {
        return Ok(Prepared {
            rows: tokens.len(),
            pieces: Box::new(()),
        });
    }
    dispatch_integer!(element, P => {
        if large {
            typed::<i64, P>(tokens, reservation)
        } else {
            typed::<i32, P>(tokens, reservation)
        }
    }, _ => internal_err!("SimilarityJoinExec: token elements are {element}, not integers"))
}

/// Ranks in the order (frequency, value), in place: `dense[k]` holds how often the `k`-th
/// value of the range occurs (0: it does not) and becomes its rank; returns how many values
/// occur. A counting sort by frequency that visits the values in increasing order, so equal
/// frequencies keep the values' order: the ranks a sort of the (frequency, value) pairs gives,
/// in time linear in the range and the largest frequency.
fn rank_by_frequency(dense: &mut [u32], reservation: &MemoryReservation) -> Result<usize> {
    let max = dense.iter().copied().max().unwrap_or(0) as usize;
    let bytes = (max + 1) * size_of::<u32>();
    reserve(reservation, bytes, "the token frequencies")?;
    // How many values occur `f` times, then the first rank of those values.
    let mut first = vec![0u32; max + 1];
    for &f in dense.iter() {
        first[f as usize] += 1;
    }
    let mut next = 0u32;
    for slot in first.iter_mut().skip(1) {
        let n = *slot;
        *slot = next;
        next += n;
    }
    for f in dense.iter_mut().filter(|f| **f > 0) {
        let slot = &mut first[*f as usize];
        *f = *slot;
        *slot += 1;
    }
    drop(first);
    reservation.shrink(bytes);
    Ok(next as usize)
}

/// A pointer that many threads write through, each to slots no other thread writes.
#[derive(Clone, Copy)]
struct Slots(*mut Posting);
// SAFETY: only used in step 4, where every slot is written by exactly one thread (the
// ranges' slot intervals are disjoint by construction) and read after all threads joined.
unsafe impl Send for Slots {}
// SAFETY: as for `Send`: the threads write disjoint slots and nobody reads before they join.
unsafe impl Sync for Slots {}

impl Slots {
    /// Slot `i` (a method, so closures capture the whole `Slots`, not its raw pointer).
    ///
    /// # Safety
    /// `i` lies within the allocation.
    unsafe fn at(&self, i: usize) -> *mut Posting {
        // SAFETY: the caller's promise.
        unsafe { self.0.add(i) }
    }
}

/// What every step of the build reads: the token order, the threshold, the reservation, the
/// threads and the crew that runs them.
type BuildArgs<'a> = (
    TokenOrder,
    &'a Threshold,
    &'a MemoryReservation,
    usize,
    &'a Crew,
);

impl Collections {
    /// Build from each side's token columns (batches of one list type of integers, after
    /// coercion) on up to `threads` cores. `self_join`: one side, one index. Rows are
    /// numbered across batches.
    ///
    /// `prepared[s]`: side `s`'s step 1 already done, batch by batch ([`prepare`], by the
    /// tasks that read them), or `None` (done here, in parallel).
    pub fn build(
        sides: &[Vec<ArrayRef>],
        prepared: Vec<Option<Vec<Prepared>>>,
        order: TokenOrder,
        threshold: &Threshold,
        reservation: &MemoryReservation,
        threads: usize,
        crew: &Crew,
    ) -> Result<Self> {
        let matches = prepared.len() == sides.len()
            && prepared.iter().zip(sides).all(|(p, b)| {
                p.as_ref().is_none_or(|p| {
                    p.len() == b.len() && p.iter().zip(b).all(|(p, a)| p.rows == a.len())
                })
            });
        if !matches {
            return internal_err!("SimilarityJoinExec: prepared batches differ from the batches");
        }
        Self::build_from(
            sides,
            prepared,
            order,
            threshold,
            reservation,
            threads,
            crew,
        )
    }

    fn build_from(
        sides: &[Vec<ArrayRef>],
        prepared: Vec<Option<Vec<Prepared>>>,
        order: TokenOrder,
        threshold: &Threshold,
        reservation: &MemoryReservation,
        threads: usize,
        crew: &Crew,
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
        if matches!(order, TokenOrder::Routed { .. }) && element != DataType::UInt64 {
            return internal_err!("SimilarityJoinExec: routed tokens are {element}, not UInt64");
        }
        let large = matches!(
            list_type,
            datafusion::arrow::datatypes::DataType::LargeList(_)
        );
        let threads = threads.max(1);
        let args = (order, threshold, reservation, threads, crew);
        dispatch_integer!(element, P => {
            if large {
                Self::build_typed::<i64, P>(sides, prepared, args)
            } else {
                Self::build_typed::<i32, P>(sides, prepared, args)
            }
        }, _ => internal_err!("SimilarityJoinExec: token elements are {element}, not integers"))
    }

    fn empty(sides: usize) -> Self {
        Self {
            tokens: Vec::new(),
            starts: vec![0],
            sizes: Vec::new(),
            sides: Vec::new(),
            rows: Vec::new(),
            home: Vec::new(),
            indexes: (0..sides)
                .map(|_| Index {
                    offsets: vec![0],
                    postings: Vec::new(),
                })
                .collect(),
            id_ranks: Vec::new(),
        }
    }

    /// The build, its parallel steps cut for `threads` threads and run by `crew`.
    fn build_typed<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
        sides: &[Vec<ArrayRef>],
        prepared: Vec<Option<Vec<Prepared>>>,
        (order, threshold, reservation, threads, crew): BuildArgs<'_>,
    ) -> Result<Self>
    where
        P::Native: SetElem,
    {
        // Each step's time, for the debug log (where a build's serial part is).
        let t0 = std::time::Instant::now();
        // 1. Sets, deduplicated, in pieces of consecutive rows: done by the read tasks
        // for a side `prepared` (its rows numbered across batches here), else here.
        let mut raw: Vec<Vec<RawPiece<P::Native>>> = Vec::with_capacity(sides.len());
        for (batches, prepared) in sides.iter().zip(prepared) {
            if let Some(side) = prepared {
                let mut pieces = Vec::new();
                let mut base = 0usize;
                for (array, batch) in batches.iter().zip(side) {
                    let Ok(mut batch_pieces) = batch.pieces.downcast::<Vec<RawPiece<P::Native>>>()
                    else {
                        return internal_err!(
                            "SimilarityJoinExec: a prepared batch of another element type"
                        );
                    };
                    if base > 0 {
                        u32::try_from(base + array.len()).map_err(|_| too_many_rows())?;
                        for p in batch_pieces.iter_mut() {
                            for r in p.rows.iter_mut() {
                                *r += base as u32;
                            }
                        }
                    }
                    pieces.append(&mut batch_pieces);
                    base += array.len();
                }
                raw.push(pieces);
                continue;
            }
            let total: usize = batches
                .iter()
                .map(|a| a.as_list::<O>().values().len())
                .sum();
            let rows: usize = batches.iter().map(|a| a.len()).sum();
            reserve(
                reservation,
                step1_bytes::<P::Native>(total, rows),
                "the deduplicated sets",
            )?;
            // (batch, first row, end row, the batch's first row number)
            let mut units = Vec::new();
            let mut base = 0usize;
            for (b, array) in batches.iter().enumerate() {
                let n = array.len();
                units.extend((0..n).step_by(PIECE_ROWS).map(|from| {
                    let to = (from + PIECE_ROWS).min(n);
                    (b, from, to, base)
                }));
                base += n;
            }
            let pieces = crew
                .map(units.len(), |u| {
                    let (b, from, to, base) = units[u];
                    piece::<O, P>(batches[b].as_list::<O>(), from, to, base)
                })?
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            raw.push(pieces);
        }

        // 2. Ranks by increasing frequency (ties by value), or by value for routed sets.
        let t1 = std::time::Instant::now();
        let mut rank = Ranks::new(&raw, order, reservation, threads, crew)?;
        let home = std::mem::take(&mut rank.home);
        reserve(reservation, home.len(), "the routed tokens' buckets")?;
        let t2 = std::time::Instant::now();
        let distinct = rank.distinct;

        // 3. Global order by (size, side, row).
        let sets: usize = raw.iter().flatten().map(|p| p.rows.len()).sum();
        let total: usize = raw.iter().flatten().map(|p| p.values.len()).sum();
        if u32::try_from(sets).is_err() {
            return datafusion::common::not_impl_err!("SimilarityJoinExec: more than 2^32 sets");
        }
        reserve(
            reservation,
            total * size_of::<u32>() + sets * (size_of::<usize>() * 2 + 24),
            "the reordered sets",
        )?;
        // The global order by (size, side, row): sizes listed in (side, row) order (sides in
        // order, each side's pieces and sets in row order), then a stable counting sort by size
        // gives each set its slot, linear (a comparison sort of the sets took 2.3 ms of a
        // 40 ms debian_deps query on one core).
        let mut listed: Vec<u32> = Vec::with_capacity(sets);
        for piece in raw.iter().flatten() {
            listed.extend(piece.starts.windows(2).map(|w| (w[1] - w[0]) as u32));
        }
        let slot_of = size_order(&listed);
        let t3a = std::time::Instant::now();
        drop(listed);
        let mut sizes = vec![0u32; sets];
        let mut side_of = vec![0u8; sets];
        let mut rows = vec![0u32; sets];
        // Where slot `j`'s set lies in `raw`: (piece, set within the piece).
        let mut source = vec![(0u32, 0u32); sets];
        let mut at = 0;
        for (s, pieces) in raw.iter().enumerate() {
            for (i, piece) in pieces.iter().enumerate() {
                for (k, &row) in piece.rows.iter().enumerate() {
                    let j = slot_of[at] as usize;
                    at += 1;
                    sizes[j] = (piece.starts[k + 1] - piece.starts[k]) as u32;
                    side_of[j] = s as u8;
                    rows[j] = row;
                    source[j] = (i as u32, k as u32);
                }
            }
        }
        drop(slot_of);
        let mut starts = Vec::with_capacity(sets + 1);
        starts.push(0);
        let mut end = 0usize;
        starts.extend(sizes.iter().map(|&n| {
            end += n as usize;
            end
        }));
        let mut tokens = vec![0u32; total];
        let t3b = std::time::Instant::now();
        // Each set's tokens renamed into its slot, in pieces of consecutive slots of about
        // equal token counts.
        let cuts = cut_by_weight(&starts, threads * 4);
        let mut outs = Vec::with_capacity(cuts.len());
        let mut rest = tokens.as_mut_slice();
        for w in cuts.windows(2) {
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(starts[w[1]] - starts[w[0]]);
            outs.push(Mutex::new(out));
            rest = tail;
        }
        crew.for_each(outs.len(), |c| {
            let mut out = lock(&outs[c]);
            let base = starts[cuts[c]];
            for j in cuts[c]..cuts[c + 1] {
                let (i, k) = source[j];
                let set = raw[side_of[j] as usize][i as usize].set(k as usize);
                let out = &mut out[starts[j] - base..starts[j + 1] - base];
                for (o, &v) in out.iter_mut().zip(set) {
                    *o = rank.get(v);
                }
                // Often already in order (data whose values are ranked alike): check first.
                if !out.is_sorted() {
                    out.sort_unstable();
                }
            }
        })?;
        drop(outs);
        drop(source);
        drop(raw);
        drop(rank);

        // 4. Index prefixes, one index per side.
        let t4 = std::time::Instant::now();
        // A set's prefix length depends on its size only, and the sets are in size order:
        // computed once per run of equal sizes.
        let prefix_len = |n: u32| {
            let n = u64::from(n);
            match threshold.min_overlap(n, n) {
                Some(a) => (n - a.max(1) + 1) as u32,
                None => 0,
            }
        };
        let mut last = None;
        let prefixes: Vec<u32> = sizes
            .iter()
            .map(|&n| match last {
                Some((size, len)) if size == n => len,
                _ => {
                    let len = prefix_len(n);
                    last = Some((n, len));
                    len
                }
            })
            .collect();
        // Routed sets are met only at their own bucket's tokens (`Collections::filter`):
        // only those are indexed.
        let routed = !home.is_empty();
        let indexed = |w: u32| !routed || home[w as usize];
        let tokens_of = |p: u32| {
            let from = starts[p as usize];
            &tokens[from..from + prefixes[p as usize] as usize]
        };
        let mut indexes = Vec::with_capacity(sides.len());
        for s in 0..sides.len() as u8 {
            let members: Vec<u32> = (0..sets as u32)
                .filter(|&p| side_of[p as usize] == s)
                .collect();
            let count: usize = match routed {
                false => members.iter().map(|&p| prefixes[p as usize] as usize).sum(),
                true => (members.iter())
                    .map(|&p| tokens_of(p).iter().filter(|&&w| indexed(w)).count())
                    .sum(),
            };
            reserve(
                reservation,
                count * size_of::<Posting>() + (distinct + 1) * size_of::<usize>(),
                "the prefix index",
            )?;
            if u32::try_from(count).is_err() {
                return datafusion::common::not_impl_err!(
                    "SimilarityJoinExec: more than 2^32 prefix tokens on one side"
                );
            }
            // One range of members per thread while their per-token counters (4 bytes per
            // distinct token each) stay small next to the postings.
            let ranges = threads
                .min((count * size_of::<Posting>()).div_ceil(4 * distinct.max(1)))
                .max(1);
            reserve(
                reservation,
                ranges * distinct * size_of::<u32>(),
                "the prefix index's counters",
            )?;
            // Ranges of about equal postings, not of equal sets: the sets are in size order and
            // a larger set has a longer prefix, so equal counts of sets left the last range
            // with most of the work (measured: this step took as long on 2 threads as on 1).
            let parts = split_by_weight(&members, ranges, |&p| prefixes[p as usize] as usize);
            // Per range: how many postings each token gets from it.
            let mut counters: Vec<Vec<u32>> = crew.map(parts.len(), |r| {
                let mut c = vec![0u32; distinct];
                for &p in parts[r].iter() {
                    for &w in tokens_of(p).iter().filter(|&&w| indexed(w)) {
                        c[w as usize] += 1;
                    }
                }
                c
            })?;
            // The lists' offsets, and the counters become each range's first slot per token
            // (`count` < 2^32, checked above). Over slices of the tokens in parallel: each
            // slice's postings first, then from the slices' starts (one walk of every
            // counter on one thread was the build's longest serial step, 3-4 ms at 200 k
            // tokens and 13 ranges).
            let offsets = first_slots(&mut counters, distinct, threads, crew)?;
            let mut postings: Vec<Posting> = Vec::with_capacity(count);
            let out = Slots(postings.as_mut_ptr());
            let nexts: Vec<Mutex<&mut Vec<u32>>> = counters.iter_mut().map(Mutex::new).collect();
            crew.for_each(parts.len(), |r| {
                let mut next = lock(&nexts[r]);
                for &p in parts[r].iter() {
                    let size = sizes[p as usize];
                    for (pos, &w) in tokens_of(p).iter().enumerate() {
                        if !indexed(w) {
                            continue;
                        }
                        let slot = &mut next[w as usize];
                        // SAFETY: `*slot` lies in token `w`'s list, in the part of it
                        // that belongs to this range (the counts above), and is below
                        // `count`, the capacity.
                        unsafe {
                            out.at(*slot as usize).write(Posting {
                                set: p,
                                pos: pos as u32,
                                size,
                            });
                        }
                        *slot += 1;
                    }
                }
            })?;
            drop(nexts);
            // SAFETY: the ranges wrote every slot below `count` exactly once (their counts sum
            // to `count` and each slot interval was filled to its end).
            unsafe { postings.set_len(count) };
            drop(counters);
            reservation.shrink(ranges * distinct * size_of::<u32>());
            indexes.push(Index { offsets, postings });
        }
        let ms = |a: std::time::Instant, b: std::time::Instant| (b - a).as_secs_f64() * 1e3;
        let t5 = std::time::Instant::now();
        log::debug!(
            "datafusion-sets: similarity_join build on {threads} threads, {sets} sets, {total} \
             tokens, {distinct} distinct: sets {:.2} ms, ranks {:.2} ms, size order {:.2} ms, \
             slots {:.2} ms, renaming {:.2} ms, prefix indexes {:.2} ms",
            ms(t0, t1),
            ms(t1, t2),
            ms(t2, t3a),
            ms(t3a, t3b),
            ms(t3b, t4),
            ms(t4, t5)
        );
        Ok(Self {
            tokens,
            starts,
            sizes,
            sides: side_of,
            rows,
            home,
            indexes,
            id_ranks: Vec::new(),
        })
    }
}

/// For per-range posting counts `counters[r][w]` (range `r`, token `w < distinct`): every
/// token list's first slot (`distinct + 1` offsets, the last one the total), and each counter
/// replaced by its range's first slot in that list (ranges in order). The tokens are cut into
/// about `4 * threads` slices run by `crew`.
fn first_slots(
    counters: &mut [Vec<u32>],
    distinct: usize,
    threads: usize,
    crew: &Crew,
) -> Result<Vec<usize>> {
    let slices = (threads * 4).clamp(1, distinct.max(1));
    let bounds: Vec<usize> = (0..=slices).map(|i| distinct * i / slices).collect();
    // Each slice's part of every counter, to hand each slice to one thread.
    let mut parts: Vec<Vec<&mut [u32]>> = (0..slices).map(|_| Vec::new()).collect();
    for c in counters.iter_mut() {
        let mut rest = &mut c[..distinct];
        for (i, part) in parts.iter_mut().enumerate() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(bounds[i + 1] - bounds[i]);
            part.push(head);
            rest = tail;
        }
    }
    let sums = {
        let parts = &parts;
        crew.map(slices, |i| {
            parts[i]
                .iter()
                .map(|c| c.iter().map(|&n| n as usize).sum::<usize>())
                .sum::<usize>()
        })?
    };
    let mut starts = Vec::with_capacity(slices);
    let mut total = 0usize;
    for s in sums {
        starts.push(total);
        total += s;
    }
    let mut offsets = vec![0usize; distinct + 1];
    offsets[distinct] = total;
    let mut heads: Vec<&mut [usize]> = Vec::with_capacity(slices);
    let mut rest = &mut offsets[..distinct];
    for i in 0..slices {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(bounds[i + 1] - bounds[i]);
        heads.push(head);
        rest = tail;
    }
    // Per slice: its offsets, and its part of every range's counter.
    type Slice<'a> = (&'a mut [usize], Vec<&'a mut [u32]>);
    let work: Vec<Mutex<Slice<'_>>> = heads.into_iter().zip(parts).map(Mutex::new).collect();
    crew.for_each(slices, |i| {
        let mut guard = lock(&work[i]);
        let (offs, counts) = &mut *guard;
        let mut next = starts[i];
        for (j, off) in offs.iter_mut().enumerate() {
            *off = next;
            for c in counts.iter_mut() {
                let n = c[j] as usize;
                c[j] = next as u32;
                next += n;
            }
        }
    })?;
    drop(work);
    Ok(offsets)
}

/// The slot of each set in the stable order by size, sets given by their sizes in input
/// order: a counting sort (the counters span the largest size, at most the number of values).
fn size_order(sizes: &[u32]) -> Vec<u32> {
    let max = sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut next = vec![0u32; max + 2];
    for &n in sizes {
        next[n as usize + 1] += 1;
    }
    for k in 1..next.len() {
        next[k] += next[k - 1];
    }
    sizes
        .iter()
        .map(|&n| {
            let slot = &mut next[n as usize];
            *slot += 1;
            *slot - 1
        })
        .collect()
}

/// Cuts of `0..n` (`n + 1 = starts.len()`, `starts` increasing from 0) into at most `parts`
/// pieces of about equal `starts[hi] - starts[lo]`: increasing set indexes from 0 to `n`.
fn cut_by_weight(starts: &[usize], parts: usize) -> Vec<usize> {
    let n = starts.len() - 1;
    let total = starts[n];
    let parts = parts.clamp(1, n.max(1));
    let mut cuts = Vec::with_capacity(parts + 1);
    cuts.push(0);
    for k in 1..parts {
        let at = starts.partition_point(|&s| s < total / parts * k + total % parts * k / parts);
        if at > *cuts.last().unwrap_or(&0) && at < n {
            cuts.push(at);
        }
    }
    cuts.push(n);
    cuts
}

/// `items` cut into at most `parts` consecutive non-empty slices of about equal total weight.
fn split_by_weight<T>(items: &[T], parts: usize, weight: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let total: usize = items.iter().map(&weight).sum();
    let parts = parts.max(1);
    let mut out = Vec::with_capacity(parts);
    let mut from = 0;
    let mut sum = 0usize;
    for (i, item) in items.iter().enumerate() {
        sum += weight(item);
        // Close a slice once it reaches its share of the total (the last takes the rest).
        if out.len() + 1 < parts && sum * parts >= total * (out.len() + 1) {
            out.push(&items[from..=i]);
            from = i + 1;
        }
    }
    if from < items.len() || out.is_empty() {
        out.push(&items[from..]);
    }
    out
}

/// Token ranks by increasing global frequency, ties by value: a dense table when the values
/// span a range not much larger than their count, else a hash map.
struct Ranks<T> {
    /// Dense: rank of value `v` at `v.order_bits() - base`.
    base: u64,
    dense: Vec<u32>,
    map: FastMap<T, u32>,
    distinct: usize,
    /// [`TokenOrder::Routed`]: whether the value of each rank lies in its copy's own bucket
    /// (empty for [`TokenOrder::Frequency`]).
    home: Vec<bool>,
}

impl<T: SetElem> Ranks<T> {
    fn new(
        raw: &[Vec<RawPiece<T>>],
        order: TokenOrder,
        reservation: &MemoryReservation,
        threads: usize,
        crew: &Crew,
    ) -> Result<Self> {
        let pieces: Vec<&RawPiece<T>> = raw.iter().flatten().collect();
        let total: usize = pieces.iter().map(|p| p.values.len()).sum();
        let (lo, hi) = crew
            .map(pieces.len(), |i| {
                pieces[i]
                    .values
                    .iter()
                    .fold((u64::MAX, 0u64), |(lo, hi), v| {
                        (lo.min(v.order_bits()), hi.max(v.order_bits()))
                    })
            })?
            .into_iter()
            .fold((u64::MAX, 0), |(a, b), (c, d)| (a.min(c), b.max(d)));
        if total > 0 && hi - lo < (1 << 32) && (hi - lo) as usize <= 4 * total + 65_536 {
            let range = (hi - lo) as usize + 1;
            reserve(
                reservation,
                range * size_of::<u32>() * 2,
                "the token frequencies",
            )?;
            let slot = |v: T| (v.order_bits() - lo) as usize;
            let mut dense = if threads > 1 && threads * range <= total {
                // Per-thread histograms, summed.
                let chunk = pieces.len().div_ceil(threads).max(1);
                reserve(
                    reservation,
                    threads * range * size_of::<u32>(),
                    "the token frequencies",
                )?;
                let groups: Vec<&[&RawPiece<T>]> = pieces.chunks(chunk).collect();
                let mut histograms = crew.map(groups.len(), |g| {
                    let mut h = vec![0u32; range];
                    for p in groups[g] {
                        for &v in &p.values {
                            h[slot(v)] += 1;
                        }
                    }
                    h
                })?;
                // Summed into the first, in slices of the range, in parallel.
                let Some((dense, rest)) = histograms.split_first_mut() else {
                    return internal_err!("SimilarityJoinExec: no token histogram");
                };
                let slice = range.div_ceil(threads * 4).max(4096);
                let outs: Vec<Mutex<&mut [u32]>> =
                    dense.chunks_mut(slice).map(Mutex::new).collect();
                crew.for_each(outs.len(), |k| {
                    let mut out = lock(&outs[k]);
                    for h in rest.iter() {
                        for (o, &c) in out.iter_mut().zip(&h[k * slice..]) {
                            *o += c;
                        }
                    }
                })?;
                drop(outs);
                reservation.shrink(threads * range * size_of::<u32>());
                histograms.swap_remove(0)
            } else if threads > 1 {
                let h: Vec<AtomicU32> = (0..range).map(|_| AtomicU32::new(0)).collect();
                crew.for_each(pieces.len(), |i| {
                    for &v in &pieces[i].values {
                        h[slot(v)].fetch_add(1, Ordering::Relaxed);
                    }
                })?;
                h.into_iter().map(AtomicU32::into_inner).collect()
            } else {
                let mut h = vec![0u32; range];
                for p in &pieces {
                    for &v in &p.values {
                        h[slot(v)] += 1;
                    }
                }
                h
            };
            // Routed: every occurring value counted once, so the ranks follow the values.
            let home = match order {
                TokenOrder::Frequency => Vec::new(),
                TokenOrder::Routed { buckets } => (dense.iter_mut().enumerate())
                    .filter(|(_, f)| **f > 0)
                    .map(|(k, f)| {
                        *f = 1;
                        in_own_bucket(lo + k as u64, buckets)
                    })
                    .collect(),
            };
            let distinct = rank_by_frequency(&mut dense, reservation)?;
            return Ok(Self {
                base: lo,
                dense,
                map: FastMap::default(),
                distinct,
                home,
            });
        }
        let mut freq: FastMap<T, u32> = FastMap::default();
        for p in &pieces {
            for &v in &p.values {
                *freq.entry(v).or_insert(0) += 1;
            }
        }
        let distinct = freq.len();
        reserve(
            reservation,
            distinct * 3 * (size_of::<T>() + 8),
            "the token frequencies",
        )?;
        let routed = match order {
            TokenOrder::Frequency => None,
            TokenOrder::Routed { buckets } => Some(buckets),
        };
        // Routed: by value alone.
        let mut sorted: Vec<(u32, T)> = (freq.iter())
            .map(|(&v, &f)| (if routed.is_some() { 0 } else { f }, v))
            .collect();
        sorted.sort_unstable();
        for (rank, (_, v)) in sorted.iter().enumerate() {
            freq.insert(*v, rank as u32);
        }
        let home = match routed {
            None => Vec::new(),
            Some(buckets) => (sorted.iter())
                .map(|(_, v)| in_own_bucket(v.order_bits(), buckets))
                .collect(),
        };
        Ok(Self {
            base: 0,
            dense: Vec::new(),
            map: freq,
            distinct,
            home,
        })
    }

    #[inline]
    fn get(&self, v: T) -> u32 {
        if self.dense.is_empty() {
            self.map.get(&v).copied().unwrap_or(u32::MAX)
        } else {
            self.dense[(v.order_bits() - self.base) as usize]
        }
    }
}

/// [`Collections::build`] as the read tasks run it: the caller leads, `threads - 1` helpers
/// on threads of their own.
#[cfg(test)]
pub(crate) fn build_on_threads(
    sides: &[Vec<ArrayRef>],
    prepared: Vec<Option<Vec<Prepared>>>,
    order: TokenOrder,
    threshold: &Threshold,
    reservation: &MemoryReservation,
    threads: usize,
) -> Result<Collections> {
    Crew::led(threads, |crew| {
        Collections::build(
            sides,
            prepared,
            order,
            threshold,
            reservation,
            threads,
            crew,
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, ListArray};
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};

    use super::*;
    use crate::intersect::similarity::Measure;
    use crate::join::threshold::Comparison;

    /// Batches of random lists: `rows` rows in batches of up to 5,000 (so pieces and
    /// ranges cut sets of one batch), values `v * spread` for `v` below `distinct`, some
    /// NULL lists, NULL elements, duplicates and empty lists.
    fn batches(seed: u64, rows: usize, distinct: u64, spread: i64) -> Vec<ArrayRef> {
        let mut state = seed | 1;
        let mut next = move |k: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % k
        };
        let mut out = Vec::new();
        let mut left = rows;
        while left > 0 {
            let n = left.min(5_000);
            left -= n;
            let lists: Vec<Option<Vec<Option<i64>>>> = (0..n)
                .map(|_| {
                    (next(20) != 0).then(|| {
                        let len = next(12);
                        (0..len)
                            .map(|_| {
                                // Skewed: small values are frequent.
                                let v = next(distinct).min(next(distinct)) as i64;
                                (next(50) != 0).then_some(v * spread - 1000)
                            })
                            .collect()
                    })
                })
                .collect();
            out.push(
                Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(lists)) as ArrayRef,
            );
        }
        out
    }

    /// The build is the same on any number of threads, whichever frequency table it uses.
    #[test]
    fn same_on_any_number_of_threads() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let threshold =
            Threshold::try_new(Measure::Jaccard, 0.5, Comparison::GtEq, "test").unwrap();
        // (distinct values, spread): per-thread histograms, the shared atomic histogram (values
        // spread over a range larger than threads x values), the hash map (sparser still).
        for (case, (distinct, spread)) in [(300u64, 1i64), (40_000, 3), (5_000, 1 << 40)]
            .into_iter()
            .enumerate()
        {
            let r = batches(7 + case as u64, 23_000, distinct, spread);
            let s = batches(11 + case as u64, 9_000, distinct, spread);
            for sides in [vec![r.clone()], vec![r, s]] {
                // `prepared`: which sides had step 1 done batch by batch (as read tasks do).
                let build = |threads, prepared: &[bool]| {
                    let reservation = MemoryConsumer::new("test").register(&pool);
                    let prepared = (sides.iter().zip(prepared))
                        .map(|(batches, &p)| {
                            p.then(|| {
                                (batches.iter())
                                    .map(|b| prepare(b, &reservation).unwrap())
                                    .collect()
                            })
                        })
                        .collect();
                    build_on_threads(
                        &sides,
                        prepared,
                        TokenOrder::Frequency,
                        &threshold,
                        &reservation,
                        threads,
                    )
                    .unwrap()
                };
                let none = vec![false; sides.len()];
                let one = build(1, &none);
                assert!(one.len() > 15_000, "{}", one.len());
                assert!(one.indexes.iter().all(|i| !i.postings.is_empty()));
                for threads in [2, 3, 8] {
                    assert!(
                        build(threads, &none) == one,
                        "case {case}, {threads} threads"
                    );
                }
                let mut ways = vec![vec![true; sides.len()]];
                if sides.len() == 2 {
                    ways.extend([vec![true, false], vec![false, true]]);
                }
                for prepared in ways {
                    for threads in [1, 3] {
                        assert!(
                            build(threads, &prepared) == one,
                            "case {case}, {threads} threads, prepared {prepared:?}"
                        );
                    }
                }
            }
        }
    }

    /// The counting sort by frequency ranks as sorting the (frequency, value) pairs does,
    /// absent values aside, and gives its memory back.
    #[test]
    fn ranks_by_frequency_then_value() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let reservation = MemoryConsumer::new("test").register(&pool);
        for n in [0usize, 1, 2, 17, 5000] {
            for (absent, spread) in [(0.0, 1u32), (0.3, 3), (0.5, 40), (0.9, 100_000)] {
                let freq: Vec<u32> = (0..n)
                    .map(|_| match rng.random_bool(absent) {
                        true => 0,
                        false => rng.random_range(1..=spread),
                    })
                    .collect();
                let mut want: Vec<(u32, usize)> = freq
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| **f > 0)
                    .map(|(k, &f)| (f, k))
                    .collect();
                want.sort_unstable();
                let mut ranks = freq.clone();
                let distinct = rank_by_frequency(&mut ranks, &reservation).unwrap();
                assert_eq!(distinct, want.len(), "{n} values, frequencies <= {spread}");
                for (rank, &(_, k)) in want.iter().enumerate() {
                    assert_eq!(ranks[k] as usize, rank, "value {k} of {n}");
                }
                assert_eq!(reservation.size(), 0);
            }
        }
    }

    /// The counting sort gives the slots of a stable sort by size: equal sizes keep their
    /// (side, row) order.
    #[test]
    fn size_order_is_a_stable_sort() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for n in [0usize, 1, 2, 17, 1000] {
            for spread in [1u32, 3, 50, 100_000] {
                let items: Vec<(u32, u32)> = (0..n as u32)
                    .map(|row| (rng.random_range(0..spread), row))
                    .collect();
                let sizes: Vec<u32> = items.iter().map(|t| t.0).collect();
                let mut placed = vec![None; n];
                for (item, slot) in items.iter().zip(size_order(&sizes)) {
                    assert!(
                        placed[slot as usize].replace(*item).is_none(),
                        "slot taken twice"
                    );
                }
                let placed: Vec<(u32, u32)> = placed.into_iter().map(Option::unwrap).collect();
                let mut want = items.clone();
                want.sort_by_key(|t| t.0);
                assert_eq!(placed, want, "{n} items, sizes < {spread}");
            }
        }
    }

    /// The parallel offsets equal one walk of every counter, token by token, on any number
    /// of threads and slices (more slices than tokens included).
    #[test]
    fn first_slots_equal_the_serial_walk() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (distinct, ranges) in [(0usize, 1usize), (1, 3), (7, 1), (5, 13), (20_000, 13)] {
            let counters: Vec<Vec<u32>> = (0..ranges)
                .map(|_| (0..distinct).map(|_| rng.random_range(0..5)).collect())
                .collect();
            let mut want_counters = counters.clone();
            let mut want = vec![0usize; distinct + 1];
            for w in 0..distinct {
                let mut next = want[w];
                for c in want_counters.iter_mut() {
                    let n = c[w] as usize;
                    c[w] = next as u32;
                    next += n;
                }
                want[w + 1] = next;
            }
            for threads in [1, 2, 5] {
                let mut got_counters = counters.clone();
                let got = Crew::led(threads, |crew| {
                    first_slots(&mut got_counters, distinct, threads, crew)
                })
                .unwrap();
                assert_eq!(
                    got, want,
                    "{distinct} tokens, {ranges} ranges, {threads} threads"
                );
                assert_eq!(got_counters, want_counters);
            }
        }
    }

    #[test]
    fn cuts_by_weight_are_increasing_and_about_equal() {
        // Sets of sizes 1, 2, ..., 200 (a size-ordered build's shape), and of equal sizes.
        for sizes in [(1..=200).collect::<Vec<usize>>(), vec![3; 50], vec![7]] {
            let mut starts = vec![0];
            for n in &sizes {
                starts.push(starts.last().unwrap() + n);
            }
            let total = *starts.last().unwrap();
            let largest = *sizes.iter().max().unwrap();
            for parts in [1, 2, 8, 1000] {
                let cuts = cut_by_weight(&starts, parts);
                assert_eq!((cuts[0], *cuts.last().unwrap()), (0, sizes.len()));
                assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
                assert!(cuts.len() - 1 <= parts.min(sizes.len()));
                for w in cuts.windows(2) {
                    let weight = starts[w[1]] - starts[w[0]];
                    assert!(weight <= total / parts + largest, "{parts}: {weight}");
                }
            }
        }
    }

    #[test]
    fn slices_of_equal_weight_cover_every_item_once() {
        let items: Vec<usize> = (1..=100).collect();
        for parts in 1..9 {
            let slices = split_by_weight(&items, parts, |&w| w);
            assert!(!slices.is_empty() && slices.len() <= parts);
            assert!(slices.iter().all(|s| !s.is_empty()));
            let joined: Vec<usize> = slices.concat();
            assert_eq!(joined, items);
            // Weights 1..100 rise as the sets' prefixes do: each slice holds about its share.
            let share = items.iter().sum::<usize>() / parts;
            for s in &slices {
                let w: usize = s.iter().sum();
                assert!(
                    w <= share + 100,
                    "{parts} parts: {w} against a share of {share}"
                );
            }
        }
        assert_eq!(
            split_by_weight(&[] as &[usize], 4, |&w| w),
            vec![&[] as &[usize]]
        );
        assert_eq!(
            split_by_weight(&[0usize, 0, 0], 2, |&w| w).concat(),
            vec![0, 0, 0]
        );
    }
}
