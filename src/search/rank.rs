//! Rank a batch of query texts against a loaded index: the shared core of the `topk_bm25`
//! scalar function (many queries per batch) and table function (one query).
//!
//! A batch runs on the CPU (queries in parallel on rayon's pool) or, with
//! `sets.backend = 'gpu'` (or `'auto'` with a usable GPU and at least [`AUTO_MIN_QUERIES`]
//! queries), on the GPU (`backend::gpu::bm25_topk`): the device ranks every query it can,
//! the CPU the rest (terms not resident on the device, more than 64 terms, k above 768, or
//! no GPU at all), with identical results either way.

use std::sync::Arc;

use datafusion::arrow::array::{Array, StringArray};
use rayon::prelude::*;

use super::index::InvertedIndex;
use super::loaded::LoadedIndex;
use super::scoring::Scored;
use super::tokenize::Tokenizer;
use super::topk::{Hit, Mode, query_terms, top};
use crate::backend::gpu;
use crate::config::BackendChoice;

/// Queries per rayon task.
const QUERIES_PER_TASK: usize = 64;

/// With `sets.backend = 'auto'`, the GPU ranks batches of at least this many queries.
pub const AUTO_MIN_QUERIES: usize = 2048;

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

/// One tokenized query: its distinct known term ids, ascending, and whether it had a term
/// the index does not hold (see [`query_terms`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryTerms {
    pub ids: Vec<u32>,
    pub unknown: bool,
}

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
    pub timings: Option<gpu::Bm25Timings>,
}

/// Whether `backend` puts a batch of `n` queries on the GPU.
fn wants_gpu(backend: BackendChoice, n: usize) -> bool {
    match backend {
        BackendChoice::Cpu => false,
        BackendChoice::Gpu => true,
        BackendChoice::Auto => n >= AUTO_MIN_QUERIES && gpu::is_available(),
    }
}

/// The top-k of every query, on the backend chosen (see the module doc). `budget` bounds the
/// GPU's resident index (bytes; `None`: the default).
pub fn rank_terms(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    queries: &[QueryTerms],
    k: usize,
    mode: Mode,
    backend: BackendChoice,
    budget: Option<usize>,
) -> (Vec<Vec<Hit>>, RankStats) {
    let mut stats = RankStats::default();
    let cpu = |q: &QueryTerms| top(index, scored, &q.ids, q.unknown, k, mode);
    if !wants_gpu(backend, queries.len()) || k == 0 {
        stats.on_cpu = queries.len();
        return (queries.par_iter().map(cpu).collect(), stats);
    }
    // The device's share: queries with known terms whose result is not empty by rule; an
    // unknown term empties AND and turns AND-then-OR into OR (as `top` does).
    let mut offsets = vec![0u32];
    let mut terms = Vec::new();
    let mut modes = Vec::new();
    let mut dev_of = vec![usize::MAX; queries.len()];
    for (i, q) in queries.iter().enumerate() {
        let m = match mode {
            Mode::And if q.unknown => continue,
            Mode::AndOr if q.unknown => Mode::Or,
            m => m,
        };
        if q.ids.is_empty() {
            continue;
        }
        dev_of[i] = modes.len();
        modes.push(m);
        terms.extend_from_slice(&q.ids);
        offsets.push(terms.len() as u32);
    }
    let batch = gpu::Bm25Batch {
        offsets: &offsets,
        terms: &terms,
        modes: &modes,
    };
    let mut dev = match gpu::bm25_topk(index, scored, &batch, k, budget) {
        Ok(out) => {
            if out.timings.on_device > 0 {
                gpu::count_bm25_batch();
            }
            stats.timings = Some(out.timings);
            out.hits
        }
        Err(e) => {
            log::debug!("datafusion-sets: topk_bm25 on the CPU: {e}");
            stats.gpu_error = Some(e.to_string());
            vec![None; modes.len()]
        }
    };
    let mut hits: Vec<Option<Vec<Hit>>> = dev_of
        .iter()
        .map(|&d| dev.get_mut(d).and_then(Option::take))
        .collect();
    stats.on_gpu = hits.iter().filter(|h| h.is_some()).count();
    stats.on_cpu = queries.len() - stats.on_gpu;
    hits.par_iter_mut()
        .zip(queries.par_iter())
        .with_min_len(QUERIES_PER_TASK)
        .for_each(|(h, q)| {
            if h.is_none() {
                *h = Some(cpu(q));
            }
        });
    let hits = hits.into_iter().map(Option::unwrap_or_default).collect();
    (hits, stats)
}

/// The top-k of every row of `texts` (`None` for NULL rows), on the backend chosen (see the
/// module doc; tokenization always on the CPU, in parallel).
pub fn rank_batch(
    loaded: &LoadedIndex,
    scored: &Arc<Scored>,
    texts: &StringArray,
    k: usize,
    mode: Mode,
    backend: BackendChoice,
) -> Vec<Option<Vec<Hit>>> {
    let options = loaded.index.tokenizer();
    let rows = texts.len() - texts.null_count();
    if !wants_gpu(backend, rows) {
        return (0..texts.len())
            .into_par_iter()
            .with_min_len(QUERIES_PER_TASK)
            .map_init(
                || Tokenizer::new(options),
                |tok, r| {
                    texts
                        .is_valid(r)
                        .then(|| rank_one(loaded, scored, tok, texts.value(r), k, mode))
                },
            )
            .collect();
    }
    let parsed: Vec<Option<QueryTerms>> = (0..texts.len())
        .into_par_iter()
        .with_min_len(QUERIES_PER_TASK)
        .map_init(
            || Tokenizer::new(options),
            |tok, r| {
                texts.is_valid(r).then(|| {
                    let terms = tok.terms(texts.value(r));
                    let (ids, unknown) =
                        query_terms(&loaded.index, terms.iter().map(String::as_str));
                    QueryTerms { ids, unknown }
                })
            },
        )
        .collect();
    let valid: Vec<QueryTerms> = parsed.iter().flatten().cloned().collect();
    let (hits, _) = rank_terms(&loaded.index, scored, &valid, k, mode, backend, None);
    let mut hits = hits.into_iter();
    parsed
        .into_iter()
        .map(|p| p.map(|_| hits.next().unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::index::IndexedDoc;
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
        let queries: Vec<QueryTerms> = texts
            .iter()
            .map(|t| {
                let (ids, unknown) = query_terms(&index, t.iter().copied());
                QueryTerms { ids, unknown }
            })
            .collect();
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            for k in [1, 5, 1000] {
                for backend in [BackendChoice::Cpu, BackendChoice::Gpu, BackendChoice::Auto] {
                    let (got, stats) =
                        rank_terms(&index, &scored, &queries, k, mode, backend, None);
                    assert_eq!(stats.on_gpu + stats.on_cpu, queries.len());
                    for (q, hits) in queries.iter().zip(&got) {
                        let want = exhaustive(&index, &scored, &q.ids, q.unknown, k, mode);
                        assert_eq!(hits, &want, "{mode:?} k {k} {backend:?} {q:?}");
                    }
                }
            }
        }
    }
}
