//! Rank a batch of query texts against a loaded index: the shared core of the `topk_bm25`
//! scalar function (many queries per batch) and table function (one query).
//!
//! A batch runs on the CPU (queries in parallel on rayon's pool) or, with
//! `sets.backend = 'gpu'` (or `'auto'` with a usable GPU, an OR or AND-then-OR batch of at
//! least `placement::AUTO_MIN_QUERIES` queries, an AND batch of at least
//! `placement::AUTO_MIN_AND_QUERIES`; see [`wants_gpu`]), on the GPU
//! (`search::gpu::bm25_topk`): the device ranks every query it can, the CPU the rest (terms
//! not resident on the device, more than 64 terms, k above 768, or no GPU at all), while the
//! device works, with identical results either way. Results come in one flat layout
//! ([`Ranked`]), which is the Arrow list's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, ListArray, StringArray, StructArray, UInt32Array,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{Result, exec_err};
use rayon::prelude::*;

use super::index::InvertedIndex;
use super::loaded::LoadedIndex;
use super::queries::Queries;
use super::scoring::Scored;
use super::tokenize::Tokenizer;
use super::topk::{Hit, Mode, query_terms, top};
use crate::config::BackendChoice;

/// Queries per rayon task.
const QUERIES_PER_TASK: usize = 64;

/// Whether `backend` puts a batch of `n` queries in `mode` on the GPU (the placement
/// policy's [`crate::placement::topk_batch_on_gpu`]).
pub fn wants_gpu(backend: BackendChoice, mode: Mode, n: usize) -> bool {
    crate::placement::topk_batch_on_gpu(backend, mode == Mode::And, n)
}

/// The element type of `topk_bm25`'s result list: `{doc_id, score}`.
pub fn hit_fields() -> Fields {
    Fields::from(vec![
        Field::new("doc_id", DataType::UInt32, false),
        Field::new("score", DataType::Float64, false),
    ])
}

/// The top-k of one query text.
pub fn rank_one(
    loaded: &LoadedIndex,
    scored: &Scored,
    tokenizer: &mut Tokenizer,
    text: &str,
    k: usize,
    mode: Mode,
) -> Vec<Hit> {
    let terms = tokenizer.terms(text);
    let (ids, unknown) = query_terms(&loaded.index, terms.iter().map(String::as_str));
    top(&loaded.index, scored, &ids, unknown, k, mode)
}

/// A batch's results in one flat (columnar) layout: query `i`'s hits, best first, are
/// `docs[offsets[i]..offsets[i + 1]]` with `scores[..]` alike (the Arrow list's layout). The
/// offsets, doc ids and scores are Arrow buffers: the GPU's may lie where the device wrote
/// them (a page-locked block the buffers hold), and they become the result's list uncopied
/// (the offsets as the list's i32 offsets, below 2^31). A batch holds fewer than 2^32 hits.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    pub offsets: ScalarBuffer<u32>,
    pub docs: ScalarBuffer<u32>,
    pub scores: ScalarBuffer<f64>,
}

impl Default for Ranked {
    fn default() -> Self {
        Self {
            offsets: Vec::new().into(),
            docs: Vec::new().into(),
            scores: Vec::new().into(),
        }
    }
}

impl Ranked {
    /// Queries held.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Query `i`'s hits.
    pub fn hits(&self, i: usize) -> Vec<Hit> {
        let r = self.offsets[i] as usize..self.offsets[i + 1] as usize;
        self.docs[r.clone()]
            .iter()
            .zip(&self.scores[r])
            .map(|(&doc, &score)| Hit { doc, score })
            .collect()
    }

    /// Every query's hits.
    pub fn to_lists(&self) -> Vec<Vec<Hit>> {
        (0..self.len()).map(|i| self.hits(i)).collect()
    }

    /// The hits as `topk_bm25`'s result column, `List<Struct<doc_id, score>>` (`nulls`: the
    /// rows without a query): the offsets, doc ids and scores become the list's buffers
    /// uncopied. An error past 2^31 hits (the list's offsets are i32).
    pub fn into_list(self, nulls: Option<NullBuffer>) -> Result<ListArray> {
        // The offsets rise from 0, so below 2^31 they are the list's i32 offsets as they lie.
        if self
            .offsets
            .last()
            .is_some_and(|&o| i32::try_from(o).is_err())
        {
            return exec_err!("topk_bm25: more than 2^31 results in one batch");
        }
        let n_offsets = self.offsets.len();
        let offsets = ScalarBuffer::<i32>::new(self.offsets.into_inner(), 0, n_offsets);
        let values = StructArray::try_new(
            hit_fields(),
            vec![
                Arc::new(UInt32Array::new(self.docs, None)) as ArrayRef,
                Arc::new(Float64Array::new(self.scores, None)) as ArrayRef,
            ],
            None,
        )?;
        Ok(ListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Struct(hit_fields()), true)),
            OffsetBuffer::new(offsets),
            Arc::new(values),
            nulls,
        )?)
    }

    /// The layout for `counts` (hits per query), filled in parallel: `fill(i, docs, scores)`
    /// writes query `i`'s hits into slices of exactly its count.
    ///
    /// # Panics
    /// When the counts add up to 2^32 or more (the offsets are u32; such a batch would hold
    /// 48 GiB of doc ids and scores). Callers check the total first.
    pub fn build<F>(counts: &[usize], fill: F) -> Self
    where
        F: Fn(usize, &mut [u32], &mut [f64]) + Sync,
    {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        let mut total = 0usize;
        offsets.push(0u32);
        for &c in counts {
            total += c;
            offsets.push(u32::try_from(total).expect("a batch of fewer than 2^32 hits"));
        }
        let mut docs = vec![0u32; total];
        let mut scores = vec![0f64; total];
        // Groups of queries, each with its own part of the output.
        let mut parts = Vec::with_capacity(counts.len().div_ceil(FILL_GROUP));
        let (mut d, mut s) = (docs.as_mut_slice(), scores.as_mut_slice());
        for q0 in (0..counts.len()).step_by(FILL_GROUP) {
            let q1 = (q0 + FILL_GROUP).min(counts.len());
            let len = (offsets[q1] - offsets[q0]) as usize;
            let (dh, dt) = std::mem::take(&mut d).split_at_mut(len);
            let (sh, st) = std::mem::take(&mut s).split_at_mut(len);
            (d, s) = (dt, st);
            parts.push((q0..q1, dh, sh));
        }
        let fill_part = |(qs, mut d, mut s): (std::ops::Range<usize>, &mut [u32], &mut [f64])| {
            for i in qs {
                let c = counts[i];
                let (dh, dt) = std::mem::take(&mut d).split_at_mut(c);
                let (sh, st) = std::mem::take(&mut s).split_at_mut(c);
                (d, s) = (dt, st);
                fill(i, dh, sh);
            }
        };
        if total < PAR_FILL_MIN {
            parts.into_iter().for_each(fill_part);
        } else {
            parts.into_par_iter().for_each(fill_part);
        }
        Self {
            offsets: offsets.into(),
            docs: docs.into(),
            scores: scores.into(),
        }
    }

    /// The layout of per-query lists (panics as [`Ranked::build`] does).
    pub fn from_lists(lists: &[Vec<Hit>]) -> Self {
        let counts: Vec<usize> = lists.iter().map(Vec::len).collect();
        Self::build(&counts, |i, d, s| {
            for ((h, d), s) in lists[i].iter().zip(d).zip(s) {
                *d = h.doc;
                *s = h.score;
            }
        })
    }
}

/// Queries per parallel task of [`Ranked::build`].
const FILL_GROUP: usize = 256;
/// Fewer hits than this: [`Ranked::build`] fills on the calling thread.
const PAR_FILL_MIN: usize = 16_384;

/// How a batch was ranked.
#[derive(Clone, Debug, Default)]
pub struct RankStats {
    /// Queries ranked on the GPU.
    pub on_gpu: usize,
    /// Queries ranked on the CPU.
    pub on_cpu: usize,
    /// Why the GPU was not used, when it was asked for and failed.
    pub gpu_error: Option<String>,
    /// The GPU call's timings, when it ran.
    pub timings: Option<super::gpu::Bm25Timings>,
}

/// The top-k of every query, on the backend chosen (see the module doc). `budget` bounds the
/// GPU's resident index (bytes; `None`: the default); `hold(bytes)` is asked for the GPU's host
/// staging (the bytes held in all; `false`: refused, and the batch is ranked on the CPU).
#[allow(clippy::too_many_arguments)]
pub fn rank_terms(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    queries: &Queries,
    k: usize,
    mode: Mode,
    backend: BackendChoice,
    budget: Option<usize>,
    hold: &mut dyn FnMut(usize) -> bool,
) -> (Ranked, RankStats) {
    let mut stats = RankStats::default();
    let cpu = |i: usize| top(index, scored, queries.ids(i), queries.unknown(i), k, mode);
    let all_cpu = |stats: &mut RankStats| {
        stats.on_cpu = queries.len();
        let lists: Vec<Vec<Hit>> = (0..queries.len())
            .into_par_iter()
            .with_min_len(QUERIES_PER_TASK / 8)
            .map(cpu)
            .collect();
        Ranked::from_lists(&lists)
    };
    if !wants_gpu(backend, mode, queries.len()) || k == 0 {
        let r = all_cpu(&mut stats);
        return (r, stats);
    }
    // The device reads the queries where they lie (see `Bm25Batch` for the rules on
    // unknown terms); a query it does not take comes back to `cpu`.
    let batch = super::gpu::Bm25Batch { queries, mode };
    let on_cpu = cpu;
    match super::gpu::bm25_topk(index, scored, &batch, k, budget, &on_cpu, hold) {
        Ok(out) => {
            if out.timings.on_device > 0 {
                super::gpu::count_bm25_batch();
            }
            stats.on_gpu = out.timings.on_device;
            stats.on_cpu = queries.len() - stats.on_gpu;
            stats.timings = Some(out.timings);
            (out.ranked, stats)
        }
        Err(e) => {
            log::debug!("datafusion-sets: topk_bm25 on the CPU: {e}");
            stats.gpu_error = Some(e.to_string());
            let r = all_cpu(&mut stats);
            (r, stats)
        }
    }
}

/// The top-k of every row of `texts`, on the backend chosen (see the module doc;
/// tokenization always on the CPU, in parallel). A NULL row gets an empty entry (the
/// caller takes the nulls from `texts`). `hold` as for [`rank_terms`]. Once `abandoned` is
/// set, the CPU skips the rows it has not ranked yet (the caller drops the result).
#[allow(clippy::too_many_arguments)]
pub fn rank_batch(
    loaded: &LoadedIndex,
    scored: &Arc<Scored>,
    texts: &StringArray,
    k: usize,
    mode: Mode,
    backend: BackendChoice,
    gpu_budget: Option<usize>,
    hold: &mut dyn FnMut(usize) -> bool,
    abandoned: &AtomicBool,
) -> (Ranked, RankStats) {
    let options = loaded.index.tokenizer();
    let rows = texts.len() - texts.null_count();
    if !wants_gpu(backend, mode, rows) {
        let lists: Vec<Vec<Hit>> = (0..texts.len())
            .into_par_iter()
            .with_min_len(QUERIES_PER_TASK)
            .map_init(
                || Tokenizer::new(options),
                |tok, r| {
                    // Nobody waits for an abandoned batch: its remaining rows are skipped.
                    if texts.is_valid(r) && !abandoned.load(Ordering::Relaxed) {
                        rank_one(loaded, scored, tok, texts.value(r), k, mode)
                    } else {
                        Vec::new()
                    }
                },
            )
            .collect();
        let stats = RankStats {
            on_cpu: texts.len(),
            ..Default::default()
        };
        return (Ranked::from_lists(&lists), stats);
    }
    // NULL rows become queries with no terms (empty results, as wanted). Groups of rows
    // tokenized in parallel, each into a flat batch of its own, then joined.
    let parts: Vec<Queries> = (0..texts.len().div_ceil(QUERIES_PER_TASK))
        .into_par_iter()
        .map_init(
            || Tokenizer::new(options),
            |tok, g| {
                let mut part = Queries::new();
                for r in g * QUERIES_PER_TASK..((g + 1) * QUERIES_PER_TASK).min(texts.len()) {
                    if texts.is_valid(r) {
                        let terms = tok.terms(texts.value(r));
                        let (ids, unknown) =
                            query_terms(&loaded.index, terms.iter().map(String::as_str));
                        part.push(&ids, unknown);
                    } else {
                        part.push(&[], false);
                    }
                }
                part
            },
        )
        .collect();
    let parsed = Queries::concat(&parts);
    rank_terms(
        &loaded.index,
        scored,
        &parsed,
        k,
        mode,
        backend,
        gpu_budget,
        hold,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::index::IndexedDoc;
    use crate::search::queries::QueryTerms;
    use crate::search::scoring::Bm25Params;
    use crate::search::tokenize::TokenizerOptions;
    use crate::search::topk::exhaustive;

    /// Without a GPU (or with one), every backend gives the CPU's results, and the split of
    /// the batch (empty queries, unknown terms) is right.
    #[test]
    fn every_backend_ranks_like_the_cpu() {
        let words = ["a", "b", "c", "d", "e", "f"];
        let docs: Vec<IndexedDoc> = (0..300u32)
            .map(|i| IndexedDoc {
                id: 1000 - i * 3,
                terms: (0..(i % 7 + 1))
                    .map(|j| words[((i * 7 + j * j) % 6) as usize])
                    .collect(),
                static_score: None,
            })
            .collect();
        let index = InvertedIndex::build(&docs, TokenizerOptions::default(), false);
        let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
        let texts: [&[&str]; 6] = [&["a", "b"], &[], &["zz"], &["c", "zz"], &["f"], &["a"; 3]];
        let queries: Queries = texts
            .iter()
            .map(|t| QueryTerms::of(&index, t.iter().copied()))
            .collect();
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            for k in [1, 5, 1000] {
                for backend in [BackendChoice::Cpu, BackendChoice::Gpu, BackendChoice::Auto] {
                    let (got, stats) = rank_terms(
                        &index,
                        &scored,
                        &queries,
                        k,
                        mode,
                        backend,
                        None,
                        &mut |_| true,
                    );
                    assert_eq!(stats.on_gpu + stats.on_cpu, queries.len());
                    assert_eq!(got.len(), queries.len());
                    for i in 0..queries.len() {
                        let q = queries.get(i);
                        let want = exhaustive(&index, &scored, &q.ids, q.unknown, k, mode);
                        assert_eq!(got.hits(i), want, "{mode:?} k {k} {backend:?} {q:?}");
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// The flat layout holds exactly the lists it was built from, in order, on both
        /// sides of the parallel-fill cut.
        #[test]
        fn ranked_layout_round_trips(
            lens in proptest::collection::vec(0usize..200, 0..600),
            seed in 0u64..1000,
        ) {
            let lists: Vec<Vec<Hit>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    (0..n)
                        .map(|j| Hit {
                            doc: (i * 7919 + j) as u32 ^ seed as u32,
                            score: (i as f64) * 0.5 - j as f64 + seed as f64,
                        })
                        .collect()
                })
                .collect();
            let r = Ranked::from_lists(&lists);
            proptest::prop_assert_eq!(r.len(), lists.len());
            proptest::prop_assert_eq!(r.to_lists(), lists.clone());
            proptest::prop_assert_eq!(r.offsets.last().copied().unwrap_or(0) as usize, r.docs.len());
            proptest::prop_assert_eq!(r.docs.len(), r.scores.len());
        }
    }
}
