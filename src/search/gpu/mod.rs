//! `topk_bm25` on the GPU: the batch types the search engine hands the device, and the
//! driver (`bm25`, with the cargo feature `cuda`) behind [`bm25_topk`]. The driver uses the
//! GPU runtime of `crate::backend::gpu` (its context, kernel modules, memory pools and
//! kernel graphs) and the search engine's index, scores and queries.
//!
//! The entry points go through [`Bm25Device`], which the CUDA driver and the stub (every
//! call answers [`GpuError::NotCompiled`]) both implement.

#[cfg(feature = "cuda")]
mod bm25;

use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::backend::gpu::Cuda;
use crate::backend::gpu::{GpuError, NoCuda, Selected};
use crate::search::index::InvertedIndex;
use crate::search::scoring::Scored;

/// `topk_bm25`'s entry points on the device, as the CUDA driver and the stub both answer
/// them.
pub(crate) trait Bm25Device {
    /// See [`bm25_topk`].
    fn topk(
        index: &InvertedIndex,
        scored: &Arc<Scored>,
        batch: &Bm25Batch<'_>,
        k: usize,
        budget: Option<usize>,
        cpu: &Bm25Cpu<'_>,
        hold: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Bm25Output, GpuError>;

    /// See [`bm25_evict`].
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    fn evict();

    /// See [`bm25_trace_take`].
    #[cfg(feature = "tuning")]
    fn trace_take() -> Result<Vec<[u64; 3]>, GpuError>;
}

#[cfg(feature = "cuda")]
impl Bm25Device for Cuda {
    fn topk(
        index: &InvertedIndex,
        scored: &Arc<Scored>,
        batch: &Bm25Batch<'_>,
        k: usize,
        budget: Option<usize>,
        cpu: &Bm25Cpu<'_>,
        hold: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Bm25Output, GpuError> {
        bm25::topk(index, scored, batch, k, budget, cpu, hold)
    }

    fn evict() {
        bm25::evict()
    }

    #[cfg(feature = "tuning")]
    fn trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
        bm25::trace_take()
    }
}

/// Without the `cuda` feature: nothing is ranked on a device.
impl Bm25Device for NoCuda {
    fn topk(
        _index: &InvertedIndex,
        _scored: &Arc<Scored>,
        _batch: &Bm25Batch<'_>,
        _k: usize,
        _budget: Option<usize>,
        _cpu: &Bm25Cpu<'_>,
        _hold: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Bm25Output, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn evict() {}

    #[cfg(feature = "tuning")]
    fn trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
        Ok(Vec::new())
    }
}

/// Rank a batch of queries: the device ranks every query it takes (see `bm25.rs`), and
/// `cpu(i)` ranks the others, on rayon's pool while the device works. The results come in
/// batch order, in one flat layout. `budget` bounds the device memory the resident index may
/// take (bytes; `None`: `DFSETS_GPU_INDEX_BUDGET`, else half the device). `hold(bytes)` is
/// asked for the pinned host memory the batch stages through (refused: [`GpuError::MemoryLimit`]).
/// Without the `cuda` feature: [`GpuError::NotCompiled`].
pub fn bm25_topk(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    batch: &Bm25Batch<'_>,
    k: usize,
    budget: Option<usize>,
    cpu: &Bm25Cpu<'_>,
    hold: &mut dyn FnMut(usize) -> bool,
) -> Result<Bm25Output, GpuError> {
    <Selected as Bm25Device>::topk(index, scored, batch, k, budget, cpu, hold)
}

/// Drop the resident index (tests; frees its device memory). Nothing to drop without the
/// `cuda` feature.
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub fn bm25_evict() {
    <Selected as Bm25Device>::evict()
}

/// Diagnostics (feature `tuning`; kernels compiled with the knob `bm25_trace`, else empty):
/// for each place of the last ranking launches' `order`, the start and end (ns, the device's
/// global timer) of the block or short item's warp that ranked it, and the query, kind and
/// multiprocessor (`bm25_trace` in bm25.cu: query in the low 32 bits, kind in the next 8, SM
/// above). Places no block reached are all zero. The record is cleared for the next batch.
#[cfg(feature = "tuning")]
pub fn bm25_trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
    <Selected as Bm25Device>::trace_take()
}

static BM25_BATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Batches of `topk_bm25` queries ranked (at least partly) on the GPU in this process.
pub fn bm25_batches_run() -> u64 {
    BM25_BATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_bm25_batch() {
    BM25_BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Most query terms a query may have to be ranked on the GPU (more: the CPU ranks it).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub const BM25_MAX_TERMS: usize = 64;
/// Largest k the GPU ranks (larger: the CPU).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub const BM25_MAX_K: usize = 768;

/// A batch of BM25 queries for [`bm25_topk`], read where it lies (nothing is copied into a
/// batch layout first): query `i` is `queries.ids(i)`, its distinct term ids ascending (the
/// canonical order of `search::scoring`), all known to the index, ranked in `mode` with the
/// two rules of `search::topk::top` for unknown terms applied by [`Bm25Batch::terms`] and
/// [`Bm25Batch::mode`]. A query with no terms is left to the CPU.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub struct Bm25Batch<'a> {
    pub queries: &'a crate::search::queries::Queries,
    pub mode: crate::search::topk::Mode,
}

impl Bm25Batch<'_> {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }

    /// Whether every term id of the batch is one of `index`'s.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    pub fn known_to(&self, index: &crate::search::index::InvertedIndex) -> bool {
        self.queries
            .all_ids()
            .iter()
            .all(|&t| (t as usize) < index.terms())
    }

    /// Query `i`'s terms: none under AND when it had an unknown term (its answer is empty by
    /// rule, which the CPU returns at once).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    pub fn terms(&self, i: usize) -> &[u32] {
        if self.mode == crate::search::topk::Mode::And && self.queries.unknown(i) {
            &[]
        } else {
            self.queries.ids(i)
        }
    }

    /// Query `i`'s mode: AND-then-OR with an unknown term is OR (its AND is empty).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    pub fn mode(&self, i: usize) -> crate::search::topk::Mode {
        use crate::search::topk::Mode;
        match self.mode {
            Mode::AndOr if self.queries.unknown(i) => Mode::Or,
            m => m,
        }
    }
}

/// Where the time of one [`bm25_topk`] call went (milliseconds) and what it moved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bm25Timings {
    /// Host work before the copy (residency, staging the queries).
    pub stage_ms: f64,
    /// Part of `stage_ms`: residency check and counting the device's queries and lists.
    pub lookup_ms: f64,
    /// Part of `stage_ms`: writing the upload buffer (pinned): places, modes, lists.
    pub fill_ms: f64,
    /// Part of `fill_ms`, a device-planned batch: the term ids, offsets and flags written
    /// into it (and the queries counted, in the offsets' pass).
    pub copy_ms: f64,
    /// Part of `fill_ms`, a device-planned batch: the queries left to the CPU picked (each
    /// query's mode and place, host-planned).
    pub modes_ms: f64,
    /// Part of `stage_ms`: the blocks' items and their order (longest first).
    pub sort_ms: f64,
    /// A device-planned batch: host time from queueing its copy up to reading the device's
    /// counts of items (the copy, `bm25_plan`, `bm25_order` and one wait); part of
    /// `launch_ms`.
    pub plan_ms: f64,
    /// Part of `launch_ms`: queueing the copy up (and its timing event).
    pub queue_copy_ms: f64,
    /// Part of `launch_ms`: queueing the kernels (one graph launch, or one by one).
    pub submit_ms: f64,
    /// Part of `submit_ms` through a graph: its nodes' parameters set.
    pub graph_update_ms: f64,
    /// Part of `submit_ms` through a graph: `cuGraphLaunch`.
    pub graph_launch_ms: f64,
    /// The graph's nodes whose parameters changed.
    pub graph_nodes_updated: u32,
    /// Host time queueing the copies and launches.
    pub launch_ms: f64,
    /// Host time blocked on the device (the synchronize, after the CPU's share).
    pub wait_ms: f64,
    /// The CPU's share of the batch (queries the device does not take).
    pub cpu_ms: f64,
    /// Turning the device's results into the caller's layout.
    pub unpack_ms: f64,
    /// Bytes of answers (doc ids and scores) handed to the caller in the page-locked block
    /// the device wrote them into, uncopied (0: copied out; see `Ranked`).
    pub lent_bytes: u64,
    pub h2d_ms: f64,
    pub kernel_ms: f64,
    pub d2h_ms: f64,
    pub total_ms: f64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    /// Bytes of index uploaded by this call (0 when it was already resident).
    pub uploaded_bytes: u64,
    /// Bytes of index resident on the device.
    pub resident_bytes: u64,
    /// Queries the device ranked.
    pub on_device: usize,
    /// Pieces the device's long OR queries were split into (0: none split).
    pub pieces: usize,
    /// Of `on_device`, the short AND queries ranked a warp each (a device-planned batch).
    pub warp_queries: usize,
    /// Batches whose kernels went out in one submission (a kernel graph, re-launched with
    /// the batch's parameters; 0 or 1 for one call).
    pub graph_launches: u32,
}

/// A BM25 batch's results, in the caller's query order, in one flat layout (the device's
/// queries and those the CPU ranked, see [`bm25_topk`]).
#[derive(Clone, Debug, Default)]
pub struct Bm25Output {
    pub ranked: crate::search::rank::Ranked,
    pub timings: Bm25Timings,
}

/// Ranks one query of a BM25 batch on the CPU (by its index in the batch).
pub type Bm25Cpu<'a> = dyn Fn(usize) -> Vec<crate::search::topk::Hit> + Sync + 'a;

#[cfg(test)]
mod tests {
    use super::Bm25Batch;
    use crate::search::queries::{Queries, QueryTerms};
    use crate::search::topk::Mode;

    #[test]
    fn a_batch_applies_the_rules_for_unknown_terms() {
        let qs: Queries = [
            QueryTerms {
                ids: vec![1, 4],
                unknown: true,
            },
            QueryTerms {
                ids: vec![2],
                unknown: false,
            },
        ]
        .into_iter()
        .collect();
        let batch = |mode| Bm25Batch { queries: &qs, mode };
        // AND with an unknown term matches nothing: no terms, left to the CPU.
        assert!(batch(Mode::And).terms(0).is_empty());
        assert_eq!(batch(Mode::And).terms(1), &[2]);
        assert_eq!(batch(Mode::And).mode(0), Mode::And);
        // AND-then-OR with an unknown term: its AND is empty, so it is OR.
        assert_eq!(batch(Mode::AndOr).terms(0), &[1, 4]);
        assert_eq!(batch(Mode::AndOr).mode(0), Mode::Or);
        assert_eq!(batch(Mode::AndOr).mode(1), Mode::AndOr);
        assert_eq!(batch(Mode::Or).terms(0), &[1, 4]);
        assert_eq!(batch(Mode::Or).mode(0), Mode::Or);
        assert_eq!(batch(Mode::Or).len(), 2);
    }
}
