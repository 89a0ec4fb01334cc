//! The GPU backend: batched k-way intersection of sorted integer list columns on NVIDIA GPUs.
//!
//! - The CUDA runtime (`cuda`, with the cargo feature `cuda`, on by default) loads the
//!   driver and NVRTC at run time through `cudarc`, so the crate builds, tests and runs with
//!   no CUDA installed: without a driver or a device every entry point returns a
//!   [`GpuError`] and the SQL layer stays on the CPU (the reason goes to the debug log).
//! - The kernels (`kernels/intersect.cu`) are embedded in the binary, compiled once per
//!   process with NVRTC for the device's own architecture, and cached with the context.
//! - [`intersect`] runs one batch: list offsets and values go to the device in one copy
//!   through a pooled pinned staging buffer (sliced arrays included, no per-row work), every
//!   step of the k-way intersection runs on the device, and the results come back compacted
//!   as Arrow-style values + offsets, in one copy, with a per-row flag for the rows the CPU
//!   must recompute (a list not strictly increasing). Device and pinned memory are pooled per
//!   process; a batch that does not fit is split into several launches.
//! - `rows` connects this to the SQL functions (`sets.backend = 'gpu'`).
//!
//! Without the `cuda` feature a stub with the same names answers [`GpuError::NotCompiled`].

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod columns;
mod error;
pub mod fault;
mod fold;
mod pair_buffer;

use datafusion::arrow::buffer::Buffer;

use crate::backend::cpu::SetElem;

pub use error::GpuError;
#[cfg(test)]
pub(crate) use fold::fold_groups_emulated;
pub use fold::{FoldOutput, fold_groups};
pub use pair_buffer::{PairBuffer, PassOrder, in_chunk_order};

#[cfg(feature = "cuda")]
mod bm25;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod graph;
#[cfg(feature = "cuda")]
mod pinned_read;
#[cfg(feature = "cuda")]
mod simjoin;
#[cfg(feature = "cuda")]
pub use bm25::{bm25_evict, bm25_topk, bm25_trace_take};
#[cfg(feature = "cuda")]
pub use cuda::{
    device, intersect, intersect_resident, kernel_graphs_off, launch_group_bytes, measure_ceilings,
    pinned_read_probe, set_next_epoch,
};
#[cfg(feature = "cuda")]
pub use simjoin::{DeviceSets, PendingVerify, submit_pairs, upload_sets, verify_pairs};

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub use stub::{
    DeviceSets, PendingVerify, bm25_evict, bm25_topk, bm25_trace_take, device, intersect,
    intersect_resident, kernel_graphs_off, launch_group_bytes, measure_ceilings, pinned_read_probe,
    set_next_epoch, submit_pairs, upload_sets, verify_pairs,
};

/// Whether a BM25 batch with the whole index resident is planned on the device (the host
/// writes only the term ids; see `bm25/planned.rs`) or staged and planned on the host: 0 unset
/// (`DFSETS_BM25_DEVICE_PLAN`, default on), 1 on, 2 off.
static BM25_DEVICE_PLAN: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Plan BM25 batches on the device (`true`, the default) or on the host (benchmarks compare
/// the two in one process).
pub fn set_bm25_device_plan(on: bool) {
    BM25_DEVICE_PLAN.store(if on { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
}

/// See [`set_bm25_device_plan`].
pub fn bm25_device_plan() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match BM25_DEVICE_PLAN.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("DFSETS_BM25_DEVICE_PLAN").map_or(true, |v| v.trim() != "0");
            BM25_DEVICE_PLAN.store(if on { 1 } else { 2 }, Relaxed);
            on
        }
    }
}

/// A process-wide size: set by a call, else read once from an environment variable (in
/// `unit`s), else a default.
struct SizeKnob {
    /// `usize::MAX`: not set or read yet.
    value: std::sync::atomic::AtomicUsize,
    var: &'static str,
    unit: usize,
    default: usize,
}

impl SizeKnob {
    const fn new(var: &'static str, unit: usize, default: usize) -> Self {
        SizeKnob {
            value: std::sync::atomic::AtomicUsize::new(usize::MAX),
            var,
            unit,
            default,
        }
    }

    /// `usize::MAX` goes back to the environment (or the default).
    fn set(&self, v: usize) {
        self.value.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    fn get(&self) -> usize {
        let v = self.value.load(std::sync::atomic::Ordering::Relaxed);
        if v != usize::MAX {
            return v;
        }
        let v = std::env::var(self.var)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .map_or(self.default, |n| n.saturating_mul(self.unit));
        self.value.store(v, std::sync::atomic::Ordering::Relaxed);
        v
    }
}

/// The default of [`lent_max`]: 4 GiB.
pub const LENT_MAX_DEFAULT: usize = 4 << 30;

/// See [`lent_max`].
static LENT_MAX: SizeKnob = SizeKnob::new("DFSETS_GPU_LENT_MAX_MB", 1 << 20, LENT_MAX_DEFAULT);

/// Sets [`lent_max`] for later batches of the process (tests, and embedders that keep many
/// results: page-locked memory is taken from what the operating system can page out);
/// `usize::MAX` goes back to the default.
pub fn set_lent_max(bytes: usize) {
    LENT_MAX.set(bytes);
}

/// The most bytes of page-locked host memory lent to results at once. A GPU batch's results
/// (`list_intersect`'s values, `topk_bm25`'s answers) are handed to Arrow in the page-locked
/// block the device wrote them into, with no copy; blocks idle in the process's pool count
/// too. A batch that would pass this copies its results into ordinary memory instead.
/// Unset: `DFSETS_GPU_LENT_MAX_MB` (MiB), else [`LENT_MAX_DEFAULT`].
pub fn lent_max() -> usize {
    LENT_MAX.get()
}

/// Bytes of page-locked host memory in lent blocks now: held by results or by a workspace,
/// or idle in the process's pool of them (0 without the `cuda` feature). A block is taken
/// only while this stays within [`lent_max`].
pub fn lent_bytes() -> usize {
    #[cfg(feature = "cuda")]
    return cuda::lent_bytes_now();
    #[cfg(not(feature = "cuda"))]
    0
}

/// Bytes of input staged (Arrow memory into pinned memory) per host-to-device copy: each
/// piece is copied while the host stages the next, so staging and the copy overlap. 0 stages
/// the whole launch group first and copies it at once (what "from pinned memory" benchmarks
/// measure). Unset: `DFSETS_GPU_STAGE_PIECE` (bytes), else 16 MiB.
static STAGE_PIECE: SizeKnob = SizeKnob::new("DFSETS_GPU_STAGE_PIECE", 1, 16 << 20);

/// Sets the bytes staged per host-to-device copy (see [`stage_piece`]); 0: stage everything,
/// then copy once. For benchmarks and tests; applies to later calls of the process.
pub fn set_stage_piece(bytes: usize) {
    STAGE_PIECE.set(bytes);
}

/// Bytes staged per host-to-device copy (0: one copy after staging everything).
pub fn stage_piece() -> usize {
    STAGE_PIECE.get()
}

/// How a step of the GPU intersection uses what it knows of a resident column's row order
/// (each resident list column's strictly increasing rows are found once, when it is copied to
/// the device): `u32::MAX` unset; 0 ignores it (every element is order-checked, as for staged
/// lists); otherwise rows known increasing skip the check, and a row whose B is known
/// increasing and at least this many times longer than A searches B in device memory instead
/// of reading it; `WARP`: a call whose lists are all known runs `wmerge` ([`KnownOrder::Warp`]).
/// Unset: `DFSETS_GPU_SEARCH_RATIO`, else `Warp` (kernels/NOTES.md, "Known order" and
/// "wmerge").
static SEARCH_RATIO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// What the GPU intersection does with known row order (see [`known_order`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownOrder {
    /// Check every element's order, as for staged lists.
    Ignore,
    /// Skip the order check of rows known increasing; never search.
    CheckOnly,
    /// Skip the check, and search B when `|B| >= ratio * |A|` (ratio >= 1).
    Search(u32),
    /// When every list of a call is known increasing, run the step as `wmerge` (a warp per
    /// piece of A, both lists streamed in windows of 32); otherwise as `Search(4)`.
    Warp,
}

/// [`KnownOrder::Warp`]'s encoding in `SEARCH_RATIO`.
const WARP: u32 = 1 << 31;
/// The largest search ratio kept (below `WARP`).
const MAX_RATIO: u32 = WARP - 1;

/// Whether list calls record events around each step's merge kernels (`Timings::merge_ms`).
/// Off unless a benchmark turns it on: each event is one more operation queued between the
/// kernels, and a call whose kernels are short waits for the host to queue them (kernels/NOTES.md,
/// "The device waits for the host").
static MERGE_MARKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the merge kernels' own timing (`Timings::merge_ms`) on or off for later calls of the
/// process (benchmarks).
pub fn set_merge_marks(on: bool) {
    MERGE_MARKS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`set_merge_marks`] is on.
pub fn merge_marks() -> bool {
    MERGE_MARKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets the use of known row order for later calls of the process (benchmarks and tests).
pub fn set_known_order(k: KnownOrder) {
    SEARCH_RATIO.store(encode_known_order(k), std::sync::atomic::Ordering::Relaxed);
}

/// The use of known row order (`DFSETS_GPU_SEARCH_RATIO`: 0 ignore, `off` check only, N search
/// at ratio N, `warp` the warp kernel; default: `warp`).
pub fn known_order() -> KnownOrder {
    let mut v = SEARCH_RATIO.load(std::sync::atomic::Ordering::Relaxed);
    if v == u32::MAX {
        let env = std::env::var("DFSETS_GPU_SEARCH_RATIO").ok();
        v = encode_known_order(parse_known_order(env.as_deref()));
        SEARCH_RATIO.store(v, std::sync::atomic::Ordering::Relaxed);
    }
    decode_known_order(v)
}

/// `DFSETS_GPU_SEARCH_RATIO`'s value as a mode (unset or unreadable: `Warp`).
fn parse_known_order(v: Option<&str>) -> KnownOrder {
    match v.map(str::trim) {
        Some("off") => KnownOrder::CheckOnly,
        Some("0") => KnownOrder::Ignore,
        Some(s) => s
            .parse::<u32>()
            .map_or(KnownOrder::Warp, KnownOrder::Search),
        None => KnownOrder::Warp,
    }
}

/// A mode as `SEARCH_RATIO` keeps it (a search ratio clamped to `1..=MAX_RATIO`).
fn encode_known_order(k: KnownOrder) -> u32 {
    match k {
        KnownOrder::Ignore => 0,
        KnownOrder::CheckOnly => u32::MAX - 1,
        KnownOrder::Search(r) => r.clamp(1, MAX_RATIO),
        KnownOrder::Warp => WARP,
    }
}

fn decode_known_order(v: u32) -> KnownOrder {
    match v {
        0 => KnownOrder::Ignore,
        v if v == u32::MAX - 1 => KnownOrder::CheckOnly,
        WARP => KnownOrder::Warp,
        r => KnownOrder::Search(r),
    }
}

/// The device the backend runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's name for the device.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

pub(crate) static BATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Batches the SQL functions ran on the GPU in this process (for tests and diagnostics).
pub fn batches_run() -> u64 {
    BATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

static BM25_BATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Batches of `topk_bm25` queries ranked (at least partly) on the GPU in this process.
pub fn bm25_batches_run() -> u64 {
    BM25_BATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_bm25_batch() {
    BM25_BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

static SIMJOIN_CHUNKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Chunks of similarity-join candidates verified on the GPU in this process.
pub fn simjoin_chunks_run() -> u64 {
    SIMJOIN_CHUNKS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_simjoin_chunk() {
    SIMJOIN_CHUNKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Most query terms a query may have to be ranked on the GPU (more: the CPU ranks it).
pub const BM25_MAX_TERMS: usize = 64;
/// Largest k the GPU ranks (larger: the CPU).
pub const BM25_MAX_K: usize = 768;

/// A batch of BM25 queries for [`bm25_topk`], read where it lies (nothing is copied into a
/// batch layout first): query `i` is `queries.ids(i)`, its distinct term ids ascending (the
/// canonical order of `search::scoring`), all known to the index, ranked in `mode` with the
/// two rules of `search::topk::top` for unknown terms applied by [`Bm25Batch::terms`] and
/// [`Bm25Batch::mode`]. A query with no terms is left to the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Bm25Batch<'a> {
    pub queries: &'a crate::search::queries::Queries,
    pub mode: crate::search::topk::Mode,
}

impl Bm25Batch<'_> {
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }

    /// Whether every term id of the batch is one of `index`'s.
    pub fn known_to(&self, index: &crate::search::index::InvertedIndex) -> bool {
        self.queries
            .all_ids()
            .iter()
            .all(|&t| (t as usize) < index.terms())
    }

    /// Query `i`'s terms: none under AND when it had an unknown term (its answer is empty by
    /// rule, which the CPU returns at once).
    pub fn terms(&self, i: usize) -> &[u32] {
        if self.mode == crate::search::topk::Mode::And && self.queries.unknown(i) {
            &[]
        } else {
            self.queries.ids(i)
        }
    }

    /// Query `i`'s mode: AND-then-OR with an unknown term is OR (its AND is empty).
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

/// A candidate pair of the similarity join for [`verify_pairs`] (the layout of `Pair` in
/// `kernels/simjoin.cu`): the candidate set `y` by position in [`upload_sets`]'s order and
/// the pair's minimum overlap `alpha`. The probe set is its group's ([`PairGroups`]): the
/// join writes a probe's candidates together, so 8 bytes a pair is all that crosses the
/// host's memory and the bus. The device merges each pair from the sets' first tokens (the
/// filter's count of the prefixes is not sent: it would triple the pair).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairToVerify {
    pub y: u32,
    pub alpha: u32,
}

/// How a chunk's pairs are grouped by probe set: group `g` holds the pairs from
/// `starts[g]` to the next group's start (or the chunk's end), all of probe set
/// `probes[g]`. `starts` is ascending from 0, each group non-empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairGroups<'a> {
    pub starts: &'a [u32],
    pub probes: &'a [u32],
}

impl PairGroups<'_> {
    /// The probe set of each pair of `passed` (ascending pair indices), with the pair:
    /// `f(probe, index, item)`.
    pub fn each_probe<T: Copy>(&self, passed: &[(u32, T)], mut f: impl FnMut(u32, u32, T)) {
        let mut g = 0usize;
        for &(i, item) in passed {
            while g + 1 < self.starts.len() && self.starts[g + 1] <= i {
                g += 1;
            }
            f(self.probes[g], i, item);
        }
    }
}

/// A queued chunk's answer ([`PendingVerify::finish`]): the chunk back (so a failed call
/// can be verified on the CPU) with the passing pairs or the failure.
pub type VerifyAnswer = (
    std::sync::Arc<PairBuffer>,
    Result<(Vec<(u32, u32)>, VerifyTimings), GpuError>,
);

/// What one [`verify_pairs`] call did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifyTimings {
    /// Both kernels (device time, from CUDA events).
    pub kernel_ms: f64,
    /// The host's time in the call: staging, queuing, the wait and taking the answer (for a
    /// queued chunk, not the time it spent at the device while its caller went on).
    pub total_ms: f64,
    /// Of `total_ms`, the wait for the device's work (copies up, kernels, the counters).
    pub wait_ms: f64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    /// Probe sets verified a block each (their short pairs).
    pub groups: u64,
    /// Pairs verified a block each (long remainders, merge-path partitioned).
    pub large_pairs: u64,
}

/// Whether a GPU is usable by this process (initializing the backend on first call).
pub fn is_available() -> bool {
    device().is_ok()
}

/// One list column's offsets as Arrow stores them (`n + 1` entries, sliced arrays
/// included: the first entry need not be 0).
#[derive(Clone, Copy, Debug)]
pub enum HostOffsets<'a> {
    /// `List` offsets.
    I32(&'a [i32]),
    /// `LargeList` offsets.
    I64(&'a [i64]),
}

impl HostOffsets<'_> {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        match self {
            HostOffsets::I32(o) => o.len().saturating_sub(1),
            HostOffsets::I64(o) => o.len().saturating_sub(1),
        }
    }

    /// Entry `i` as a `usize` (offsets are never negative in a valid array; a negative one
    /// reads as 0).
    pub fn at(&self, i: usize) -> usize {
        match self {
            HostOffsets::I32(o) => usize::try_from(o[i]).unwrap_or(0),
            HostOffsets::I64(o) => usize::try_from(o[i]).unwrap_or(0),
        }
    }
}

/// One argument of a batch: a list column seen through its buffers. Row `i` is
/// `values[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Copy, Debug)]
pub struct HostList<'a, T> {
    /// The list offsets.
    pub offsets: HostOffsets<'a>,
    /// The child values (only `values[offsets[0]..offsets[n]]` are read).
    pub values: &'a [T],
    /// The Arrow buffers holding `values` and `offsets` (`values` and `offsets` are slices of
    /// them), when the column may stay on the device for later calls; `None`: stage it.
    pub column: Option<(&'a Buffer, &'a Buffer)>,
}

/// The host memory a call of [`intersect`] stages through, to reserve in the query's memory
/// pool while it runs: the pinned input of its largest launch group (values, at most
/// `launch_bytes` of them, offsets and validity) and the pinned output (a flag and an offset
/// per row and, for [`Mode::Values`], at most the smallest list's values). An upper bound:
/// lists already resident on the device stage no values. `resident`: every list's values are
/// on the device already ([`intersect_resident`]), so none are counted.
pub fn staging_bytes<T>(
    lists: &[HostList<'_, T>],
    mode: Mode,
    launch_bytes: Option<usize>,
    resident: bool,
) -> usize {
    let esz = std::mem::size_of::<T>();
    let cap = |b: usize| launch_bytes.map_or(b, |l| b.min(l));
    let n = lists.first().map_or(0, |l| l.offsets.rows());
    let count = |l: &HostList<'_, T>| l.offsets.at(n).saturating_sub(l.offsets.at(0));
    let values: usize = if resident {
        0
    } else {
        lists.iter().map(|l| count(l) * esz).sum()
    };
    let offsets: usize = lists
        .iter()
        .map(|l| match l.offsets {
            HostOffsets::I32(o) => o.len() * 4,
            HostOffsets::I64(o) => o.len() * 8,
        })
        .sum();
    let results = match mode {
        Mode::Values => lists.iter().map(count).min().unwrap_or(0) * esz,
        Mode::Counts => 0,
    };
    cap(values) + offsets + n.div_ceil(8) + n + (n + 1) * 8 + cap(results)
}

/// Row validity shared by all arguments: bit `bit_offset + i` of `bits` (LSB first, Arrow's
/// layout) is set when row `i` is not NULL. NULL rows get an empty result.
#[derive(Clone, Copy, Debug)]
pub struct RowValidity<'a> {
    /// The bitmap bytes.
    pub bits: &'a [u8],
    /// Bit position of row 0.
    pub bit_offset: usize,
}

/// What a batch computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The common values of every row (`list_intersect`).
    Values,
    /// Only their number (`list_intersect_count`).
    Counts,
}

/// Where the time of one [`intersect`] call went (milliseconds; device times from CUDA
/// events, host times from the wall clock).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// Host copies of the inputs into pinned staging memory.
    pub stage_ms: f64,
    /// Host-to-device copies.
    pub h2d_ms: f64,
    /// All kernels: from an event queued after the inputs' copies (for a `wmerge` call: right
    /// before its launch, after the host prepared it) to one after the last kernel.
    pub kernel_ms: f64,
    /// Of `kernel_ms`, the kernels' own span on the device when they went out as one graph
    /// (`graph_launches`): from the graph's event before its first kernel to the one after
    /// its last, without the wait for the host's submission (0 otherwise).
    pub kernel_span_ms: f64,
    /// Of `kernel_ms`, the merge kernels alone (partition and merge, or `wmerge` and `wplace`);
    /// measured only while [`set_merge_marks`] is on (0 otherwise).
    pub merge_ms: f64,
    /// Device-to-host copies of the results.
    pub d2h_ms: f64,
    /// Host copies of the results out of pinned memory.
    pub unstage_ms: f64,
    /// The whole call.
    pub total_ms: f64,
    /// Bytes copied to the device (values, offsets, validity).
    pub h2d_bytes: u64,
    /// Bytes copied back.
    pub d2h_bytes: u64,
    /// Input values of the batch (all arguments).
    pub input_values: u64,
    /// Launch groups the batch was split into.
    pub chunks: u32,
    /// List arguments read from copies already on the device (no copy).
    pub columns_reused: u32,
    /// Launch groups whose kernels went out in one submission (a kernel graph, re-launched
    /// with the group's parameters; see `DFSETS_GPU_GRAPH`).
    pub graph_launches: u32,
    /// List arguments copied whole to the device and kept there for later calls (their
    /// bytes are in `h2d_bytes`).
    pub columns_uploaded: u32,
}

/// A batch's results.
#[derive(Clone, Debug, Default)]
pub struct GpuOutput<T> {
    /// Row `i`'s results are `values[offsets[i]..offsets[i + 1]]` (`n + 1` entries from 0).
    /// In [`Mode::Counts`] the offsets are there and `values` is empty.
    pub offsets: Vec<u64>,
    /// The common values, ascending within each row (empty when `shared_values` holds them).
    pub values: Vec<T>,
    /// The values as an Arrow buffer of `T`, when the call asked for it (`share_values`).
    pub shared_values: Option<Buffer>,
    /// `flagged[i]` is true where the device's result for row `i` must be discarded and the
    /// row recomputed on the CPU: some list of the row is not strictly increasing.
    pub flagged: Vec<bool>,
    /// Whether any row is flagged.
    pub any_flagged: bool,
    /// Where the time went.
    pub timings: Timings,
}

impl<T: SetElem> GpuOutput<T> {
    /// The common values, wherever they are (`shared_values` or `values`).
    pub fn values_slice(&self) -> &[T] {
        match &self.shared_values {
            // SAFETY: the buffer holds `len / size_of::<T>()` values of `T` (a primitive
            // integer: every bit pattern is valid) at an address aligned for `T` (a `Vec<T>`
            // or a 256-byte aligned section of page-locked memory), and lives as long as `self`.
            Some(b) => unsafe {
                std::slice::from_raw_parts(
                    b.as_ptr().cast::<T>(),
                    b.len() / std::mem::size_of::<T>(),
                )
            },
            None => &self.values,
        }
    }
}

/// Measured transfer ceilings of the device (GB/s).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ceilings {
    /// Device-to-device copy, bytes read plus bytes written.
    pub d2d_gbps: f64,
    /// Pinned host to device.
    pub h2d_gbps: f64,
    /// Device to pinned host.
    pub d2h_gbps: f64,
}

/// One host thread reading a buffer (GB/s, best of 5, `pinned_read_probe`): page-locked
/// memory the device has just written (a copy down), with plain and with streaming loads, and
/// ordinary memory the same two ways (streaming falls back to plain loads without SSE4.1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PinnedReads {
    pub pinned_plain_gbs: f64,
    pub pinned_stream_gbs: f64,
    pub ordinary_plain_gbs: f64,
    pub ordinary_stream_gbs: f64,
}

#[cfg(test)]
mod tests {
    use super::{Bm25Batch, SizeKnob};

    /// A knob: its default unset (no such variable), a set value, the default again.
    #[test]
    fn size_knob_set_else_default() {
        let knob = SizeKnob::new("DFSETS_TEST_NO_SUCH_VARIABLE", 1 << 20, 7);
        assert_eq!(knob.get(), 7);
        knob.set(0);
        assert_eq!(knob.get(), 0);
        knob.set(5 << 20);
        assert_eq!(knob.get(), 5 << 20);
        knob.set(usize::MAX);
        assert_eq!(knob.get(), 7);
    }

    /// `DFSETS_GPU_SEARCH_RATIO` and `set_known_order`: every mode survives its encoding
    /// (no search ratio read as the warp mode or a marker), and the environment's spellings
    /// mean what the docs say.
    #[test]
    fn known_order_modes_round_trip() {
        use super::{
            KnownOrder::*, MAX_RATIO, decode_known_order, encode_known_order, parse_known_order,
        };
        for k in [
            Ignore,
            CheckOnly,
            Search(1),
            Search(4),
            Search(MAX_RATIO),
            Warp,
        ] {
            assert_eq!(decode_known_order(encode_known_order(k)), k);
        }
        assert_eq!(decode_known_order(encode_known_order(Search(0))), Search(1));
        assert_eq!(
            decode_known_order(encode_known_order(Search(u32::MAX))),
            Search(MAX_RATIO)
        );
        for (env, k) in [
            (None, Warp),
            (Some("warp"), Warp),
            (Some(" 4 "), Search(4)),
            (Some("0"), Ignore),
            (Some("off"), CheckOnly),
            (Some("nonsense"), Warp),
        ] {
            assert_eq!(parse_known_order(env), k, "{env:?}");
        }
    }
    use crate::search::queries::{Queries, QueryTerms};
    use crate::search::topk::Mode;

    /// The staging estimate: input values capped by the launch group, offsets, validity,
    /// flags and result offsets, and the smallest list's values for `Values` only.
    #[test]
    fn staging_bytes_counts_what_a_call_stages() {
        use super::{HostList, HostOffsets, Mode, staging_bytes};
        let (a_off, b_off) = ([0i32, 3, 5], [0i64, 10, 100]);
        let a = [1u32, 2, 3, 4, 5, 6];
        let b = [0u64; 100];
        let lists = [
            HostList {
                offsets: HostOffsets::I32(&a_off),
                values: &a[..5],
                column: None,
            },
            HostList {
                offsets: HostOffsets::I32(&a_off),
                values: &a,
                column: None,
            },
        ];
        // 2 rows: values 2 x 5 x 4, offsets 2 x 3 x 4, validity 1, flags 2, result offsets
        // 3 x 8, results 5 x 4.
        assert_eq!(
            staging_bytes(&lists, Mode::Values, None, false),
            40 + 24 + 1 + 2 + 24 + 20
        );
        // Resident lists: no input values staged, the rest as before.
        assert_eq!(
            staging_bytes(&lists, Mode::Values, None, true),
            24 + 1 + 2 + 24 + 20
        );
        assert_eq!(
            staging_bytes(&lists, Mode::Counts, None, false),
            40 + 24 + 1 + 2 + 24
        );
        assert_eq!(
            staging_bytes(&lists, Mode::Values, Some(16), false),
            16 + 24 + 1 + 2 + 24 + 16
        );
        let wide = [
            HostList {
                offsets: HostOffsets::I64(&b_off),
                values: &b,
                column: None,
            },
            HostList {
                offsets: HostOffsets::I64(&[0, 0, 1]),
                values: &b,
                column: None,
            },
        ];
        // 100 + 1 values of 8 bytes, 64-bit offsets, one result value at most.
        assert_eq!(
            staging_bytes(&wide, Mode::Values, None, false),
            101 * 8 + 48 + 1 + 2 + 24 + 8
        );
        assert_eq!(staging_bytes::<u64>(&[], Mode::Values, None, false), 8);
    }

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
