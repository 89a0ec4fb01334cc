//! Every `DFSETS_*` environment variable the library reads, in one place.
//!
//! - [`Env`]: the four settings of the product, read in every build, once per process (on
//!   first use): `DFSETS_DISABLE_GPU`, `DFSETS_GPU_LENT_MAX_MB`, `DFSETS_GPU_INDEX_BUDGET`,
//!   `DFSETS_GPU_COLUMN_BUDGET`.
//! - [`Knobs`]: the measurement knobs (piece sizes, kernel shapes, one path against another),
//!   for benchmarks and device probes. With the cargo feature `tuning` they are read from the
//!   environment once per process, on first use, each from the variable `DFSETS_` followed by
//!   its field's name in capitals (`gpu_graph` from `DFSETS_` + `GPU_GRAPH`); without the
//!   feature [`knobs`] is [`Knobs::DEFAULT`] and no variable is read. Three kinds of knob
//!   exist only with the feature (the code that reads and obeys them is compiled out without
//!   it): the one that changes answers on purpose (`sj_filter_only`: a similarity join
//!   returns its candidates), the kernel sources compiled from a file at run time
//!   (`gpu_intersect_source`, `bm25_source`) and fault injection (`gpu_fault`,
//!   `backend::gpu::fault`).
//! - The run-time overrides: with the feature, a benchmark that compares two settings in one
//!   process sets them with `set_known_order`, `set_stage_piece`, `set_merge_marks`,
//!   `set_bm25_device_plan`, `set_lent_max`, `set_sj_filter_only` and `set_sj_device_filter`;
//!   the getters ([`known_order`], [`stage_piece`], [`merge_marks`], [`bm25_device_plan`],
//!   [`lent_max`], [`sj_device_filter`])
//!   answer the override, else the environment, else the default, in every build.
//!
//! A knob that is `None` leaves the code that reads it to its own default, documented there;
//! a value out of a knob's range is ignored by that code, as if unset.
//!
//! This module imports nothing from the crate: the backend, the search and the join all read
//! it.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};

/// The settings of the product: how the GPU backend may use the machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub struct Env {
    /// `DFSETS_DISABLE_GPU`: set to anything but empty or `0`, the GPU backend never starts
    /// (every GPU entry point answers `GpuError::Disabled`; the SQL functions run on the CPU).
    pub disable_gpu: bool,
    /// `DFSETS_GPU_LENT_MAX_MB`: the most page-locked host memory (MiB) lent to results at
    /// once (`backend::gpu::lent_max`); `None`: 4 GiB.
    pub gpu_lent_max_mb: Option<usize>,
    /// `DFSETS_GPU_INDEX_BUDGET`: device memory (bytes) the resident `topk_bm25` index may
    /// take when `sets.gpu_index_budget` is 0; `None`: half the device's memory.
    pub gpu_index_budget: Option<usize>,
    /// `DFSETS_GPU_COLUMN_BUDGET`: device memory (bytes) the resident list columns may take
    /// when `sets.gpu_column_budget` is 0; `None`: a quarter of the device's memory.
    pub gpu_column_budget: Option<usize>,
    /// `DFSETS_KERNEL_CACHE`: the directory compiled GPU kernels are kept in across processes
    /// (`off`, `0` or empty: none); unset, `$XDG_CACHE_HOME/datafusion-sets/kernels`, else
    /// `$HOME/.cache/datafusion-sets/kernels`.
    pub kernel_cache: Option<std::path::PathBuf>,
}

impl Env {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    fn read() -> Self {
        let bytes = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        Env {
            disable_gpu: std::env::var_os("DFSETS_DISABLE_GPU")
                .is_some_and(|v| !v.is_empty() && v != "0"),
            gpu_lent_max_mb: std::env::var("DFSETS_GPU_LENT_MAX_MB")
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok()),
            gpu_index_budget: bytes("DFSETS_GPU_INDEX_BUDGET"),
            gpu_column_budget: bytes("DFSETS_GPU_COLUMN_BUDGET"),
            kernel_cache: kernel_cache_dir(
                std::env::var_os("DFSETS_KERNEL_CACHE").as_deref(),
                std::env::var_os("XDG_CACHE_HOME").as_deref(),
                std::env::var_os("HOME").as_deref(),
            ),
        }
    }
}

/// [`Env::kernel_cache`] from the values of `DFSETS_KERNEL_CACHE`, `XDG_CACHE_HOME` and
/// `HOME`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
fn kernel_cache_dir(
    kernel_cache: Option<&std::ffi::OsStr>,
    xdg_cache_home: Option<&std::ffi::OsStr>,
    home: Option<&std::ffi::OsStr>,
) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let set = |v: Option<&std::ffi::OsStr>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    match kernel_cache {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => set(xdg_cache_home)
            .or_else(|| set(home).map(|h| h.join(".cache")))
            .map(|c| c.join("datafusion-sets").join("kernels")),
    }
}

/// The product's settings, read from the environment on first use.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn env() -> &'static Env {
    static ENV: LazyLock<Env> = LazyLock::new(Env::read);
    &ENV
}

/// What the GPU intersection does with known row order (each resident list column's strictly
/// increasing rows are found once, when it is copied to the device; kernels/DESIGN.md, "Known
/// order" and "wmerge").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownOrder {
    /// Check every element's order, as for staged lists.
    Ignore,
    /// Skip the order check of rows known increasing; never search.
    CheckOnly,
    /// Skip the check, and search B when `|B| >= ratio * |A|` (ratio >= 1).
    Search(u32),
    /// When every list of a call is known increasing, run the step as `wmerge` (a warp per
    /// piece of A, both lists streamed in windows of 32); otherwise as `Search(4)`. The
    /// default.
    Warp,
}

/// `DFSETS_SJ_FILTER_ONLY` (benchmarks only): a similarity join that skips verification.
/// Logged as a warning; never for real answers.
#[cfg(feature = "tuning")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SjFilterOnly {
    /// A real join.
    #[default]
    Off,
    /// `1`: candidates are counted as pairs without verification (the filter alone).
    Count,
    /// `serialize`: the same, but with a GPU verifier the candidates are also written into
    /// its chunks as for the device (a full chunk is emptied, not sent): the filter with the
    /// serialization.
    Serialize,
}

/// Every measurement knob (see the module docs); each field's doc names its variable without
/// the `DFSETS_` prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub struct Knobs {
    // The list intersection on the GPU (`backend::gpu::intersect`).
    /// `GPU_SEARCH_RATIO`: `0` [`KnownOrder::Ignore`], `off` `CheckOnly`, N
    /// `Search(N)`, anything else (`warp`) or unset `Warp`.
    pub gpu_search_ratio: KnownOrder,
    /// `GPU_STAGE_PIECE`: bytes of input staged per host-to-device copy, 0: stage the
    /// whole launch group, then copy it at once; `None`: 16 MiB.
    pub gpu_stage_piece: Option<usize>,
    /// `GPU_LAUNCH_BYTES`: input bytes per launch group (clamped to 16 MiB ..= 4 GiB);
    /// `None`: an eighth of the device's memory.
    pub gpu_launch_bytes: Option<usize>,
    /// `GPU_MERGE_THREADS` (64, 128 or 256) and `GPU_MERGE_ITEMS` (4, 8, 12 or
    /// 16; tiles of at most 2,048 positions): the merge block's shape.
    pub gpu_merge_threads: Option<u32>,
    pub gpu_merge_items: Option<u32>,
    /// `GPU_MERGE_MINB` (1..=32): the blocks per multiprocessor the 32-bit merge
    /// kernels are compiled for.
    pub gpu_merge_minb: Option<u32>,
    /// `GPU_WPIECE` (32..=65,536) fixes `wmerge`'s piece size; `GPU_WPIECE_MIN`
    /// / `_MAX` (32..=65,536) and `_PER_SM` (1..=65,536) set the terms of its rule.
    pub gpu_wpiece: Option<u32>,
    pub gpu_wpiece_min: Option<u32>,
    pub gpu_wpiece_max: Option<u32>,
    pub gpu_wpiece_per_sm: Option<u32>,
    /// `GPU_WMINB` (1..=8): the blocks per multiprocessor `wmerge` is compiled for.
    pub gpu_wminb: Option<u32>,
    /// `GPU_WPLACE_PER_SM`: `wplace` blocks per multiprocessor at most (0: one warp per
    /// piece the step can have).
    pub gpu_wplace_per_sm: Option<u32>,
    /// `GPU_LINEINFO=1`: kernels compiled with line info (for the profiler).
    pub gpu_lineinfo: bool,
    /// `GPU_GRAPH=0`: every launch queued on its own, never through a kernel graph.
    pub gpu_graph: bool,
    /// `GPU_INTERSECT_SOURCE`: a file compiled instead of the embedded
    /// kernels/intersect.cu (same kernel signatures), so that kernel variants are measured
    /// side by side by one binary.
    #[cfg(feature = "tuning")]
    pub gpu_intersect_source: Option<std::ffi::OsString>,
    /// `GPU_FAULT`: the faults armed at start (a comma-separated list of names,
    /// `backend::gpu::fault`).
    #[cfg(feature = "tuning")]
    pub gpu_fault: Option<String>,

    // `topk_bm25` on the GPU (`search::gpu`).
    /// `BM25_DEVICE_PLAN=0`: batches with the whole index resident are planned on the
    /// host, not on the device.
    pub bm25_device_plan: bool,
    /// `BM25_PIECE` and `BM25_PIECE_AND`: the work a piece of a split query
    /// holds (0: never split), in any batch and in an AND batch.
    pub bm25_piece: Option<u64>,
    pub bm25_piece_and: Option<u64>,
    /// `BM25_ZERO_COPY=0`: answers copied down rather than written into the host's
    /// buffer by the device.
    pub bm25_zero_copy: bool,
    /// `BM25_LEND=0`: answers copied out of the workspace's buffer rather than lent.
    pub bm25_lend: bool,
    /// `BM25_AND_KERNEL=0`: AND batches on the general kernel, not `bm25_topk_and`.
    pub bm25_and_kernel: bool,
    /// `BM25_MAPPED_IN=0`: a device-planned batch is copied up, not read where the
    /// host wrote it.
    pub bm25_mapped_in: bool,
    /// `BM25_UNPACK_SEQ_MAX`: most hits unpacked on one thread.
    pub bm25_unpack_seq_max: Option<u64>,
    /// kernels/bm25.cu's compile-time shapes, each `-D<NAME>=<value>` when in its range:
    /// `BM25_TILE` (a power of two in 256..=4096), `BM25_SHORT_LEAD` (at most
    /// 64), `BM25_AND_G` (1..=8), `BM25_AND_FENCE` (a power of two in
    /// 256..=2048), `BM25_AND_MIN_BLOCKS` (1..=8), `BM25_AND_SMALL` (at most 64),
    /// `BM25_AND_SMALL_ROUNDS` (1..=64), `BM25_AND2_PIECE` (at most 2^20),
    /// `BM25_AND_CUT_LISTS` (2..=64).
    pub bm25_tile: Option<u32>,
    pub bm25_short_lead: Option<u32>,
    pub bm25_and_g: Option<u32>,
    pub bm25_and_fence: Option<u32>,
    pub bm25_and_min_blocks: Option<u32>,
    pub bm25_and_small: Option<u32>,
    pub bm25_and_small_rounds: Option<u32>,
    pub bm25_and2_piece: Option<u32>,
    pub bm25_and_cut_lists: Option<u32>,
    /// `BM25_TRACE=1`: the ranking blocks' timeline recorded (`bm25_trace_take`).
    pub bm25_trace: bool,
    /// `BM25_SOURCE`: a file compiled instead of the embedded kernels/bm25.cu.
    #[cfg(feature = "tuning")]
    pub bm25_source: Option<std::ffi::OsString>,

    // The similarity join (`join`).
    /// `SJ_LARGE_FROM`: pairs whose two sets hold this many tokens together are
    /// verified a block each.
    pub sj_large_from: Option<u64>,
    /// `SJ_FILTER_ONLY` (see [`SjFilterOnly`]).
    #[cfg(feature = "tuning")]
    pub sj_filter_only: SjFilterOnly,
    /// `SJ_DEVICE_FILTER=0`: a join on the GPU filters on the CPU and sends the candidates
    /// to the device for verification, instead of filtering there too.
    pub sj_device_filter: bool,
    /// `SJ_DEVICE_PAIRS`: the most pairs one call of the join on the device returns (at
    /// most the default, 2^20; smaller makes ranges overflow and split, as tests want).
    pub sj_device_pairs: Option<u64>,
    /// `SJ_DEVICE_PARTITIONS`: how many output partitions of a join that `auto` runs on the
    /// GPU take their probe ranges to the device (default all; the others probe on the
    /// CPU, claiming from the same counters).
    pub sj_device_partitions: Option<u64>,
}

impl Knobs {
    /// Every knob unset: what the library runs with unless measured.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
    pub const DEFAULT: Knobs = Knobs {
        gpu_search_ratio: KnownOrder::Warp,
        gpu_stage_piece: None,
        gpu_launch_bytes: None,
        gpu_merge_threads: None,
        gpu_merge_items: None,
        gpu_merge_minb: None,
        gpu_wpiece: None,
        gpu_wpiece_min: None,
        gpu_wpiece_max: None,
        gpu_wpiece_per_sm: None,
        gpu_wminb: None,
        gpu_wplace_per_sm: None,
        gpu_lineinfo: false,
        gpu_graph: true,
        #[cfg(feature = "tuning")]
        gpu_intersect_source: None,
        #[cfg(feature = "tuning")]
        gpu_fault: None,
        bm25_device_plan: true,
        bm25_piece: None,
        bm25_piece_and: None,
        bm25_zero_copy: true,
        bm25_lend: true,
        bm25_and_kernel: true,
        bm25_mapped_in: true,
        bm25_unpack_seq_max: None,
        bm25_tile: None,
        bm25_short_lead: None,
        bm25_and_g: None,
        bm25_and_fence: None,
        bm25_and_min_blocks: None,
        bm25_and_small: None,
        bm25_and_small_rounds: None,
        bm25_and2_piece: None,
        bm25_and_cut_lists: None,
        bm25_trace: false,
        #[cfg(feature = "tuning")]
        bm25_source: None,
        sj_large_from: None,
        #[cfg(feature = "tuning")]
        sj_filter_only: SjFilterOnly::Off,
        sj_device_filter: true,
        sj_device_pairs: None,
        sj_device_partitions: None,
    };

    /// The knobs the environment sets (unset, or not a number: the default).
    #[cfg(feature = "tuning")]
    fn read() -> Self {
        let var = |name: &str| std::env::var(name).ok();
        let num = |name: &str| var(name).and_then(|v| v.trim().parse::<u32>().ok());
        let wide = |name: &str| var(name).and_then(|v| v.trim().parse::<u64>().ok());
        // On unless the variable is a number other than 1.
        let on = |name: &str| wide(name).unwrap_or(1) == 1;
        Knobs {
            gpu_search_ratio: parse_known_order(var("DFSETS_GPU_SEARCH_RATIO").as_deref()),
            gpu_stage_piece: var("DFSETS_GPU_STAGE_PIECE")
                .and_then(|s| s.trim().parse::<usize>().ok()),
            gpu_launch_bytes: var("DFSETS_GPU_LAUNCH_BYTES")
                .and_then(|v| v.trim().parse::<usize>().ok()),
            gpu_merge_threads: num("DFSETS_GPU_MERGE_THREADS"),
            gpu_merge_items: num("DFSETS_GPU_MERGE_ITEMS"),
            gpu_merge_minb: num("DFSETS_GPU_MERGE_MINB"),
            gpu_wpiece: num("DFSETS_GPU_WPIECE"),
            gpu_wpiece_min: num("DFSETS_GPU_WPIECE_MIN"),
            gpu_wpiece_max: num("DFSETS_GPU_WPIECE_MAX"),
            gpu_wpiece_per_sm: num("DFSETS_GPU_WPIECE_PER_SM"),
            gpu_wminb: num("DFSETS_GPU_WMINB"),
            gpu_wplace_per_sm: num("DFSETS_GPU_WPLACE_PER_SM"),
            gpu_lineinfo: std::env::var_os("DFSETS_GPU_LINEINFO").is_some_and(|v| v == "1"),
            gpu_graph: num("DFSETS_GPU_GRAPH") != Some(0),
            gpu_intersect_source: std::env::var_os("DFSETS_GPU_INTERSECT_SOURCE"),
            gpu_fault: var("DFSETS_GPU_FAULT"),
            bm25_device_plan: var("DFSETS_BM25_DEVICE_PLAN").is_none_or(|v| v.trim() != "0"),
            bm25_piece: wide("DFSETS_BM25_PIECE"),
            bm25_piece_and: wide("DFSETS_BM25_PIECE_AND"),
            bm25_zero_copy: on("DFSETS_BM25_ZERO_COPY"),
            bm25_lend: on("DFSETS_BM25_LEND"),
            bm25_and_kernel: on("DFSETS_BM25_AND_KERNEL"),
            bm25_mapped_in: on("DFSETS_BM25_MAPPED_IN"),
            bm25_unpack_seq_max: wide("DFSETS_BM25_UNPACK_SEQ_MAX"),
            bm25_tile: num("DFSETS_BM25_TILE"),
            bm25_short_lead: num("DFSETS_BM25_SHORT_LEAD"),
            bm25_and_g: num("DFSETS_BM25_AND_G"),
            bm25_and_fence: num("DFSETS_BM25_AND_FENCE"),
            bm25_and_min_blocks: num("DFSETS_BM25_AND_MIN_BLOCKS"),
            bm25_and_small: num("DFSETS_BM25_AND_SMALL"),
            bm25_and_small_rounds: num("DFSETS_BM25_AND_SMALL_ROUNDS"),
            bm25_and2_piece: num("DFSETS_BM25_AND2_PIECE"),
            bm25_and_cut_lists: num("DFSETS_BM25_AND_CUT_LISTS"),
            bm25_trace: var("DFSETS_BM25_TRACE").as_deref() == Some("1"),
            bm25_source: std::env::var_os("DFSETS_BM25_SOURCE"),
            sj_large_from: wide("DFSETS_SJ_LARGE_FROM"),
            sj_filter_only: match var("DFSETS_SJ_FILTER_ONLY").as_deref() {
                Some("1") => SjFilterOnly::Count,
                Some("serialize") => SjFilterOnly::Serialize,
                _ => SjFilterOnly::Off,
            },
            sj_device_filter: var("DFSETS_SJ_DEVICE_FILTER").is_none_or(|v| v.trim() != "0"),
            sj_device_pairs: wide("DFSETS_SJ_DEVICE_PAIRS"),
            sj_device_partitions: wide("DFSETS_SJ_DEVICE_PARTITIONS"),
        }
    }
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs::DEFAULT
    }
}

/// The measurement knobs: from the environment, read once (feature `tuning`), else
/// [`Knobs::DEFAULT`].
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn knobs() -> &'static Knobs {
    #[cfg(feature = "tuning")]
    {
        static KNOBS: LazyLock<Knobs> = LazyLock::new(Knobs::read);
        &KNOBS
    }
    #[cfg(not(feature = "tuning"))]
    {
        static KNOBS: Knobs = Knobs::DEFAULT;
        &KNOBS
    }
}

/// The knob `gpu_search_ratio`'s value as a mode (unset or unreadable: `Warp`).
#[cfg_attr(not(feature = "tuning"), allow(dead_code))]
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

// The run-time overrides: `u32::MAX` / `usize::MAX` / 0 while a knob is not set by a call.

/// [`KnownOrder::Warp`]'s encoding in `KNOWN_ORDER`.
const WARP: u32 = 1 << 31;
/// The largest search ratio kept (below `WARP`).
const MAX_RATIO: u32 = WARP - 1;
/// Not set by a call.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
const UNSET: u32 = u32::MAX;

static KNOWN_ORDER: AtomicU32 = AtomicU32::new(UNSET);
static STAGE_PIECE: AtomicUsize = AtomicUsize::new(usize::MAX);
static LENT_MAX: AtomicUsize = AtomicUsize::new(usize::MAX);
static MERGE_MARKS: AtomicU8 = AtomicU8::new(0);
/// 0 not set, 1 on, 2 off.
static BM25_DEVICE_PLAN: AtomicU8 = AtomicU8::new(0);

/// A mode as `KNOWN_ORDER` keeps it (a search ratio clamped to `1..=MAX_RATIO`).
#[cfg_attr(not(feature = "tuning"), allow(dead_code))]
fn encode_known_order(k: KnownOrder) -> u32 {
    match k {
        KnownOrder::Ignore => 0,
        KnownOrder::CheckOnly => u32::MAX - 1,
        KnownOrder::Search(r) => r.clamp(1, MAX_RATIO),
        KnownOrder::Warp => WARP,
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
fn decode_known_order(v: u32) -> KnownOrder {
    match v {
        0 => KnownOrder::Ignore,
        v if v == u32::MAX - 1 => KnownOrder::CheckOnly,
        WARP => KnownOrder::Warp,
        r => KnownOrder::Search(r),
    }
}

/// The use of known row order by the GPU intersection: set by `set_known_order` (feature
/// `tuning`), else the knob `gpu_search_ratio`, else [`KnownOrder::Warp`].
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn known_order() -> KnownOrder {
    match KNOWN_ORDER.load(Ordering::Relaxed) {
        UNSET => knobs().gpu_search_ratio,
        v => decode_known_order(v),
    }
}

/// Sets the use of known row order for later calls of the process (benchmarks and tests).
#[cfg(feature = "tuning")]
pub fn set_known_order(k: KnownOrder) {
    KNOWN_ORDER.store(encode_known_order(k), Ordering::Relaxed);
}

/// The default of [`stage_piece`]: 16 MiB.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
const STAGE_PIECE_DEFAULT: usize = 16 << 20;

/// Bytes of input staged (Arrow memory into pinned memory) per host-to-device copy of the GPU
/// intersection: each piece is copied while the host stages the next, so staging and the
/// copy overlap. 0 stages the whole launch group first and copies it at once (what "from
/// pinned memory" benchmarks measure). Set by `set_stage_piece` (feature `tuning`), else the
/// knob `gpu_stage_piece`, else 16 MiB.
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn stage_piece() -> usize {
    match STAGE_PIECE.load(Ordering::Relaxed) {
        usize::MAX => knobs().gpu_stage_piece.unwrap_or(STAGE_PIECE_DEFAULT),
        v => v,
    }
}

/// Sets the bytes staged per host-to-device copy (see [`stage_piece`]); 0: stage everything,
/// then copy once; `usize::MAX`: back to the environment (or the default). For benchmarks and
/// tests; applies to later calls of the process.
#[cfg(feature = "tuning")]
pub fn set_stage_piece(bytes: usize) {
    STAGE_PIECE.store(bytes, Ordering::Relaxed);
}

/// The default of [`lent_max`]: 4 GiB.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub const LENT_MAX_DEFAULT: usize = 4 << 30;

/// The most bytes of page-locked host memory lent to results at once. A GPU batch's results
/// (`list_intersect`'s values, `topk_bm25`'s answers) are handed to Arrow in the page-locked
/// block the device wrote them into, with no copy; blocks idle in the process's pool count
/// too. A batch that would pass this copies its results into ordinary memory instead.
/// Set by `set_lent_max` (feature `tuning`), else `DFSETS_GPU_LENT_MAX_MB` (MiB), else
/// [`LENT_MAX_DEFAULT`].
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn lent_max() -> usize {
    match LENT_MAX.load(Ordering::Relaxed) {
        usize::MAX => env()
            .gpu_lent_max_mb
            .map_or(LENT_MAX_DEFAULT, |n| n.saturating_mul(1 << 20)),
        v => v,
    }
}

/// Sets [`lent_max`] for later batches of the process (tests: page-locked memory is taken
/// from what the operating system can page out); `usize::MAX` goes back to the default.
#[cfg(feature = "tuning")]
pub fn set_lent_max(bytes: usize) {
    LENT_MAX.store(bytes, Ordering::Relaxed);
}

/// Whether GPU list calls record events around each step's merge kernels
/// (`Timings::merge_ms`). Off unless a benchmark turns it on (`set_merge_marks`): each event
/// is one more operation queued between the kernels, and a call whose kernels are short waits
/// for the host to queue them (kernels/DESIGN.md, "The device waits for the host").
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn merge_marks() -> bool {
    MERGE_MARKS.load(Ordering::Relaxed) == 1
}

/// Turns the merge kernels' own timing (`Timings::merge_ms`) on or off for later calls of the
/// process (benchmarks).
#[cfg(feature = "tuning")]
pub fn set_merge_marks(on: bool) {
    MERGE_MARKS.store(u8::from(on), Ordering::Relaxed);
}

/// Whether a BM25 batch with the whole index resident is planned on the device (the host
/// writes only the term ids) or staged and planned on the host: set by
/// `set_bm25_device_plan` (feature `tuning`), else the knob `bm25_device_plan` (default on).
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn bm25_device_plan() -> bool {
    match BM25_DEVICE_PLAN.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => knobs().bm25_device_plan,
    }
}

/// Plan BM25 batches on the device (`true`, the default) or on the host (benchmarks compare
/// the two in one process).
#[cfg(feature = "tuning")]
pub fn set_bm25_device_plan(on: bool) {
    BM25_DEVICE_PLAN.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

static BM25_PIECE_SLOTS: AtomicU32 = AtomicU32::new(UNSET);

/// Piece slots a device-planned BM25 batch holds per 8 queries it ranks: set by
/// `set_bm25_piece_slots` (feature `tuning`), else `None` (the planner's own choice).
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn bm25_piece_slots() -> Option<usize> {
    match BM25_PIECE_SLOTS.load(Ordering::Relaxed) {
        UNSET => None,
        v => Some(v as usize),
    }
}

/// Sets the piece slots per 8 ranked queries of later device-planned BM25 batches (`None`:
/// the planner's own choice again); benchmarks compare budgets in one process.
#[cfg(feature = "tuning")]
pub fn set_bm25_piece_slots(per_8: Option<u32>) {
    BM25_PIECE_SLOTS.store(per_8.unwrap_or(UNSET), Ordering::Relaxed);
}

static SJ_DEVICE_FILTER: AtomicU8 = AtomicU8::new(0);

/// Whether a similarity join on the GPU filters its candidates there too (the whole join on
/// the device) or on the CPU, verifying on the device: set by `set_sj_device_filter`
/// (feature `tuning`), else the knob `sj_device_filter` (default on).
#[inline]
pub fn sj_device_filter() -> bool {
    match SJ_DEVICE_FILTER.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => knobs().sj_device_filter,
    }
}

/// Filter a GPU join's candidates on the device (`true`, the default) or on the CPU
/// (benchmarks compare the two in one process).
#[cfg(feature = "tuning")]
pub fn set_sj_device_filter(on: bool) {
    SJ_DEVICE_FILTER.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// `u64::MAX`: not set.
static SJ_AUTO_GPU_FROM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The probe work from which `auto` uses the GPU for a similarity join, when a test or a
/// benchmark set one ([`set_sj_auto_gpu_from`]); else the placement policy's own.
#[inline]
pub fn sj_auto_gpu_from() -> Option<u64> {
    match SJ_AUTO_GPU_FROM.load(Ordering::Relaxed) {
        u64::MAX => None,
        w => Some(w),
    }
}

/// Let `auto` use the GPU for similarity joins from `work` posting pairs (`None`: the
/// policy's threshold again): tests run its CPU-and-GPU join on small data.
#[cfg(feature = "tuning")]
pub fn set_sj_auto_gpu_from(work: Option<u64>) {
    SJ_AUTO_GPU_FROM.store(work.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// `u64::MAX`: not set.
static SJ_DEVICE_PARTITIONS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(u64::MAX);

/// How many output partitions of a join `auto` runs on the GPU probe there, when a test
/// ([`set_sj_device_partitions`]) or the knob `sj_device_partitions` says; else all.
#[inline]
pub fn sj_device_partitions() -> Option<u64> {
    match SJ_DEVICE_PARTITIONS.load(Ordering::Relaxed) {
        u64::MAX => knobs().sj_device_partitions,
        k => Some(k),
    }
}

/// Let `auto` send only `k` partitions of a GPU join to the device, the others probing on the
/// CPU (`None`: the knob, else all).
#[cfg(feature = "tuning")]
pub fn set_sj_device_partitions(k: Option<u64>) {
    SJ_DEVICE_PARTITIONS.store(k.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// 0 not set, else 1 + the mode's position in [`SjFilterOnly`].
#[cfg(feature = "tuning")]
static SJ_FILTER_ONLY: AtomicU8 = AtomicU8::new(0);

/// `DFSETS_SJ_FILTER_ONLY` as a similarity join reads it when a partition starts: set by
/// [`set_sj_filter_only`], else the environment. Anything but `Off` is logged as a warning.
#[cfg(feature = "tuning")]
pub fn sj_filter_only() -> SjFilterOnly {
    let mode = match SJ_FILTER_ONLY.load(Ordering::Relaxed) {
        1 => SjFilterOnly::Off,
        2 => SjFilterOnly::Count,
        3 => SjFilterOnly::Serialize,
        _ => knobs().sj_filter_only,
    };
    if mode != SjFilterOnly::Off {
        log::warn!(
            "datafusion-sets: DFSETS_SJ_FILTER_ONLY is set: similarity joins skip verification \
             (benchmarking only; the results are candidates, not answers)"
        );
    }
    mode
}

/// Sets [`sj_filter_only`] for joins started later in the process (`None`: back to the
/// environment). Benchmarks time the filter alone this way, in the process that also runs
/// the real join.
#[cfg(feature = "tuning")]
pub fn set_sj_filter_only(mode: Option<SjFilterOnly>) {
    let v = match mode {
        None => 0,
        Some(SjFilterOnly::Off) => 1,
        Some(SjFilterOnly::Count) => 2,
        Some(SjFilterOnly::Serialize) => 3,
    };
    SJ_FILTER_ONLY.store(v, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::KnownOrder::*;
    use super::*;

    /// The knob `gpu_search_ratio` and `set_known_order`: every mode survives its encoding
    /// (no search ratio read as the warp mode or a marker), and the environment's spellings
    /// mean what the docs say.
    #[test]
    fn the_kernel_cache_directory_follows_the_environment() {
        use std::ffi::OsStr;
        use std::path::PathBuf;
        let s = |v: &'static str| Some(OsStr::new(v));
        assert_eq!(kernel_cache_dir(s("off"), s("/x"), s("/h")), None);
        assert_eq!(kernel_cache_dir(s("0"), None, s("/h")), None);
        assert_eq!(kernel_cache_dir(s(""), None, s("/h")), None);
        assert_eq!(
            kernel_cache_dir(s("/c/k"), s("/x"), s("/h")),
            Some(PathBuf::from("/c/k"))
        );
        assert_eq!(
            kernel_cache_dir(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/datafusion-sets/kernels"))
        );
        assert_eq!(
            kernel_cache_dir(None, s(""), s("/h")),
            Some(PathBuf::from("/h/.cache/datafusion-sets/kernels"))
        );
        assert_eq!(kernel_cache_dir(None, None, None), None);
    }

    #[test]
    fn known_order_modes_round_trip() {
        for k in [
            Ignore,
            CheckOnly,
            Search(1),
            Search(4),
            Search(MAX_RATIO),
            Warp,
        ] {
            assert_eq!(decode_known_order(encode_known_order(k)), k);
            assert_ne!(encode_known_order(k), UNSET);
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

    /// Without the feature the knobs are the defaults, whatever the environment says.
    #[cfg(not(feature = "tuning"))]
    #[test]
    fn without_the_feature_the_knobs_are_the_defaults() {
        assert_eq!(knobs(), &Knobs::DEFAULT);
        assert_eq!(known_order(), Warp);
        assert_eq!(stage_piece(), 16 << 20);
        assert!(!merge_marks());
        assert!(bm25_device_plan());
    }

    /// An override, then back to the environment.
    #[cfg(feature = "tuning")]
    #[test]
    fn a_size_set_by_a_call_then_the_default_again() {
        let env = lent_max();
        set_lent_max(5 << 20);
        assert_eq!(lent_max(), 5 << 20);
        set_lent_max(0);
        assert_eq!(lent_max(), 0);
        set_lent_max(usize::MAX);
        assert_eq!(lent_max(), env);
    }
}
