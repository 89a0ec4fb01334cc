//! BM25 with the parameters of one query: every posting's term score ("impact") computed
//! once, with per-term and per-block maxima for the pruning bounds.
//!
//! For a query q (its distinct terms) and a document d:
//!
//! ```text
//! BM25(d, q)  = Σ_{t ∈ q ∩ d} idf(t) · tf(t,d) · (k1 + 1) / (tf(t,d) + k1 · (1 − b + b · |d| / avgdl))
//! idf(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))
//! S(d, q)     = α · static(d) + (1 − α) · BM25(d, q)      (when the index has static scores)
//! ```
//!
//! N documents, n(t) of them holding t, avgdl = total terms / N: Lucene's and tantivy's
//! BM25 (tantivy quantizes |d|; this is exact). The sum runs over the query's distinct terms
//! in ascending term-id order, always, so every algorithm (pruned, exhaustive, CPU, GPU)
//! adds the same f64 values in the same order and gets the same bits.

use datafusion::common::Result;
use datafusion::config::ConfigOptions;
use datafusion::execution::memory_pool::MemoryReservation;

use super::index::InvertedIndex;
use crate::config::SetsConfig;

/// Postings per skipping block.
pub const BLOCK: usize = 64;

/// How many of a term's best posting scores [`Scored`] keeps (for lists of at least
/// [`FLOOR_MIN_DF`] postings): enough for the k of a top-k query up to this size.
pub const FLOOR_K: usize = 32;
/// Lists shorter than this keep no best scores (a short list gives no useful floor).
pub const FLOOR_MIN_DF: usize = FLOOR_K;

/// BM25 parameters from a session's `sets.bm25_*` options.
pub fn params_of(options: &ConfigOptions) -> Result<Bm25Params> {
    let c = SetsConfig::from_options(options)?;
    Ok(Bm25Params {
        k1: c.bm25_k1,
        b: c.bm25_b,
        alpha: c.bm25_alpha,
    })
}

/// BM25's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bm25Params {
    pub k1: f64,
    pub b: f64,
    /// Weight of the static score (ignored when the index has none).
    pub alpha: f64,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self {
            k1: 1.2,
            b: 0.75,
            alpha: 0.3,
        }
    }
}

/// An index with the impacts of one parameter set.
#[derive(Debug)]
pub struct Scored {
    pub params: Bm25Params,
    /// Impact of every posting (same positions as the index's postings).
    pub impacts: Vec<f64>,
    /// Largest impact of each block of `BLOCK` postings of each term: block `j` of term
    /// `t` is `block_start[t] + j`.
    pub block_max: Vec<f64>,
    pub block_start: Vec<usize>,
    /// Largest impact of each term.
    pub term_max: Vec<f64>,
    /// Largest static score over all documents (0 without static scores).
    pub static_max: f64,
    /// Weighted static score of every posting, `α · static`, or empty.
    pub weighted_static: Vec<f64>,
    /// The largest `impact + α·static` values of each term's postings, best first, at most
    /// `FLOOR_K` of them, for terms with at least `FLOOR_MIN_DF` postings: term `t`'s are
    /// `floor_values[floor_start[t]..floor_start[t + 1]]`. The k-th of them is a lower bound of
    /// the k-th best score of any query holding `t` (see [`Scored::theta_floor`]).
    pub floor_values: Vec<f64>,
    pub floor_start: Vec<usize>,
    /// The memory these impacts hold in a session's pool, released with them.
    memory: Option<MemoryReservation>,
}

/// The idf of a term held by `n` of `n_docs` documents.
pub fn idf(n_docs: u64, n: u64) -> f64 {
    let (big_n, n) = (n_docs as f64, n as f64);
    (1.0 + (big_n - n + 0.5) / (n + 0.5)).ln()
}

impl Scored {
    pub fn new(index: &InvertedIndex, params: Bm25Params) -> Self {
        let avgdl = if index.n_docs() == 0 {
            1.0
        } else {
            (index.total_len() as f64 / index.n_docs() as f64).max(f64::MIN_POSITIVE)
        };
        let bm25_weight = if index.statics().is_some() {
            1.0 - params.alpha
        } else {
            1.0
        };
        let (k1, b) = (params.k1, params.b);
        let mut impacts = vec![0.0; index.docs().len()];
        let mut block_max = Vec::new();
        let mut block_start = Vec::with_capacity(index.terms() + 1);
        let mut term_max = Vec::with_capacity(index.terms());
        for t in 0..index.terms() as u32 {
            let r = index.range(t);
            let w = bm25_weight * idf(index.n_docs(), index.df(t)) * (k1 + 1.0);
            for p in r.clone() {
                let tf = index.tfs()[p] as f64;
                let norm = k1 * (1.0 - b + b * index.lens()[p] as f64 / avgdl);
                impacts[p] = w * tf / (tf + norm);
            }
            block_start.push(block_max.len());
            let mut m = 0.0f64;
            for chunk in impacts[r].chunks(BLOCK) {
                let bm = chunk.iter().copied().fold(0.0, f64::max);
                block_max.push(bm);
                m = m.max(bm);
            }
            term_max.push(m);
        }
        block_start.push(block_max.len());
        let weighted_static: Vec<f64> = index
            .statics()
            .map(|s| s.iter().map(|&v| params.alpha * v).collect())
            .unwrap_or_default();
        let static_max = weighted_static.iter().copied().fold(0.0, f64::max);
        let mut floor_values = Vec::new();
        let mut floor_start = Vec::with_capacity(index.terms() + 1);
        let mut best = Vec::new();
        // The floor's argument needs every impact ≥ 0 (true unless α > 1 or k1, b are odd).
        let nonneg = impacts.iter().all(|&x| x >= 0.0);
        for t in 0..index.terms() as u32 {
            floor_start.push(floor_values.len());
            let r = index.range(t);
            if !nonneg || r.len() < FLOOR_MIN_DF {
                continue;
            }
            best.clear();
            best.extend(r.map(|p| impacts[p] + weighted_static.get(p).copied().unwrap_or(0.0)));
            let keep = FLOOR_K.min(best.len());
            best.select_nth_unstable_by(keep - 1, |a, b| b.total_cmp(a));
            best.truncate(keep);
            best.sort_unstable_by(|a, b| b.total_cmp(a));
            floor_values.extend_from_slice(&best);
        }
        floor_start.push(floor_values.len());
        Self {
            params,
            impacts,
            block_max,
            block_start,
            term_max,
            static_max,
            weighted_static,
            floor_values,
            floor_start,
            memory: None,
        }
    }

    /// An upper bound of the bytes [`Scored::new`] allocates for `index`.
    pub fn bytes_for(index: &InvertedIndex) -> usize {
        let (postings, terms) = (index.docs().len(), index.terms());
        let statics = index.statics().is_some() as usize;
        postings * 8 * (1 + statics)
            + (postings / BLOCK + terms + 1) * 8
            + (terms + 1) * 24
            + terms.min(postings / FLOOR_MIN_DF) * FLOOR_K * 8
    }

    /// The bytes these impacts hold.
    pub fn size_bytes(&self) -> usize {
        (self.impacts.capacity()
            + self.block_max.capacity()
            + self.term_max.capacity()
            + self.weighted_static.capacity()
            + self.floor_values.capacity())
            * 8
            + (self.block_start.capacity() + self.floor_start.capacity()) * 8
    }

    /// These impacts, accounted in `memory` (resized to what they hold) until dropped.
    pub fn holding(mut self, memory: MemoryReservation) -> Self {
        memory.resize(self.size_bytes());
        self.memory = Some(memory);
        self
    }

    /// A lower bound of the k-th best score of a query holding the terms `terms`, or -inf:
    /// the k-th largest `impact + α·static` among the postings of any one of its terms. Every
    /// one of those k documents scores at least that much (impacts are ≥ 0 and f64 addition
    /// of non-negative terms never decreases a sum), so the query's k-th best score does too.
    pub fn theta_floor(&self, terms: &[u32], k: usize) -> f64 {
        Self::floor_of_terms(terms.iter().map(|&t| self.term_floor(t, k)))
    }

    /// Term `t`'s own floor at `k`: the k-th largest `impact + α·static` among its postings,
    /// or -inf (fewer postings kept, or k out of 1..=`FLOOR_K`).
    pub fn term_floor(&self, t: u32, k: usize) -> f64 {
        if k == 0 || k > FLOOR_K {
            return f64::NEG_INFINITY;
        }
        let t = t as usize;
        self.floor_values[self.floor_start[t]..self.floor_start[t + 1]]
            .get(k - 1)
            .copied()
            .unwrap_or(f64::NEG_INFINITY)
    }

    /// A query's floor from its terms' own floors ([`Scored::term_floor`]): the largest, if
    /// positive (a floor of 0 could prune a document that ties at 0 and wins on its id).
    pub fn floor_of_terms(floors: impl Iterator<Item = f64>) -> f64 {
        let floor = floors.fold(f64::NEG_INFINITY, f64::max);
        if floor > 0.0 {
            floor
        } else {
            f64::NEG_INFINITY
        }
    }

    /// The static part of a document's score, read at posting `p` (0 without static scores).
    pub fn static_at(&self, p: usize) -> f64 {
        self.weighted_static.get(p).copied().unwrap_or(0.0)
    }
}
