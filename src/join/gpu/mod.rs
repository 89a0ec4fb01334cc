//! The similarity join's verification on the GPU: the candidate pairs the join hands the
//! device ([`PairToVerify`], in chunks of page-locked memory: [`PairBuffer`]), and the
//! verifier (`simjoin`, with the cargo feature `cuda`) behind [`upload_sets`],
//! [`verify_pairs`] and [`submit_pairs`]. The verifier uses the GPU runtime of
//! `crate::backend::gpu` (its context, the kernel module, pooled memory).
//!
//! The whole join on the device (`probe`, with the feature `cuda`): the prefix indexes
//! uploaded beside the sets ([`upload_join`]) and ranges of probe sets filtered and verified
//! there ([`probe_sets`]), only the passing pairs coming back.
//!
//! The entry points go through [`PairVerifier`] and [`JoinProber`], which the CUDA drivers
//! and the stub (every call answers [`GpuError::NotCompiled`]) both implement;
//! [`DeviceSets`], [`PendingVerify`] and [`DeviceJoin`] wrap the selected one's sets, queued
//! chunks and indexes.

mod pair_buffer;
#[cfg(feature = "cuda")]
mod probe;
#[cfg(feature = "cuda")]
mod simjoin;

use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::backend::gpu::Cuda;
use crate::backend::gpu::{GpuError, NoCuda, Selected};
use crate::join::threshold::Threshold;

#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub use pair_buffer::{PairBuffer, PassOrder, in_chunk_order};

/// The verifier's entry points, as the CUDA verifier and the stub both answer them.
pub(crate) trait PairVerifier {
    /// One join's sets on the device.
    type Sets: Send + Sync + std::fmt::Debug;
    /// A chunk of pairs queued at the device.
    type Pending: Send + std::fmt::Debug;

    /// See [`upload_sets`].
    fn upload_sets(tokens: &[u32], starts: &[usize]) -> Result<Self::Sets, GpuError>;
    /// Bytes copied to the device for the sets.
    fn sets_bytes(sets: &Self::Sets) -> u64;
    /// Number of sets.
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    fn sets_len(sets: &Self::Sets) -> usize;
    /// See [`verify_pairs`].
    fn verify_pairs(
        sets: &Self::Sets,
        pairs: &[PairToVerify],
        groups: PairGroups<'_>,
        exact: bool,
    ) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError>;
    /// See [`submit_pairs`].
    fn submit_pairs(sets: &Arc<Self::Sets>, pairs: Arc<PairBuffer>, exact: bool) -> Self::Pending;
    /// See [`PendingVerify::finish`].
    fn finish(pending: Self::Pending) -> VerifyAnswer;
}

#[cfg(feature = "cuda")]
impl PairVerifier for Cuda {
    type Sets = simjoin::Sets;
    type Pending = simjoin::Pending;

    fn upload_sets(tokens: &[u32], starts: &[usize]) -> Result<Self::Sets, GpuError> {
        simjoin::upload_sets(tokens, starts)
    }

    fn sets_bytes(sets: &Self::Sets) -> u64 {
        sets.bytes()
    }

    fn sets_len(sets: &Self::Sets) -> usize {
        sets.len()
    }

    fn verify_pairs(
        sets: &Self::Sets,
        pairs: &[PairToVerify],
        groups: PairGroups<'_>,
        exact: bool,
    ) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
        simjoin::verify_pairs(sets, pairs, groups, exact)
    }

    fn submit_pairs(sets: &Arc<Self::Sets>, pairs: Arc<PairBuffer>, exact: bool) -> Self::Pending {
        simjoin::submit_pairs(sets, pairs, exact)
    }

    fn finish(pending: Self::Pending) -> VerifyAnswer {
        pending.finish()
    }
}

/// The whole join on the device: candidate generation and verification.
pub(crate) trait JoinProber: PairVerifier {
    /// One join's prefix indexes on the device.
    type Index: Send + Sync + std::fmt::Debug;

    /// See [`upload_join`].
    fn upload_index(
        sets: &Arc<Self::Sets>,
        sides: &[u8],
        indexes: &[IndexView<'_>],
    ) -> Result<Self::Index, GpuError>;
    /// Bytes copied to the device for the indexes.
    fn index_bytes(index: &Self::Index) -> u64;
    /// See [`probe_sets`].
    fn probe(
        index: &Self::Index,
        threshold: &Threshold,
        range: (usize, usize),
        exact: bool,
        emit: bool,
        cap: usize,
    ) -> Result<Probed, GpuError>;
}

#[cfg(feature = "cuda")]
impl JoinProber for Cuda {
    type Index = probe::Index;

    fn upload_index(
        sets: &Arc<Self::Sets>,
        sides: &[u8],
        indexes: &[IndexView<'_>],
    ) -> Result<Self::Index, GpuError> {
        probe::upload_index(sets, sides, indexes)
    }

    fn index_bytes(index: &Self::Index) -> u64 {
        index.bytes()
    }

    fn probe(
        index: &Self::Index,
        threshold: &Threshold,
        range: (usize, usize),
        exact: bool,
        emit: bool,
        cap: usize,
    ) -> Result<Probed, GpuError> {
        probe::probe(index, threshold, range, exact, emit, cap)
    }
}

/// Without the `cuda` feature: no index reaches a device.
impl JoinProber for NoCuda {
    type Index = NoSets;

    fn upload_index(
        _sets: &Arc<Self::Sets>,
        _sides: &[u8],
        _indexes: &[IndexView<'_>],
    ) -> Result<Self::Index, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn index_bytes(_index: &Self::Index) -> u64 {
        0
    }

    fn probe(
        _index: &Self::Index,
        _threshold: &Threshold,
        _range: (usize, usize),
        _exact: bool,
        _emit: bool,
        _cap: usize,
    ) -> Result<Probed, GpuError> {
        Err(GpuError::NotCompiled)
    }
}

/// One side's prefix index as the device reads it: token `w`'s postings are
/// `postings[3 * offsets[w]..3 * offsets[w + 1]]`, each (set, position of `w` in it, set
/// size), in the sets' global order.
#[derive(Clone, Copy, Debug)]
pub struct IndexView<'a> {
    pub offsets: &'a [usize],
    pub postings: &'a [u32],
}

/// What [`probe_sets`] found for a range of probe sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Probed {
    /// Pairs that passed.
    pub passed: u64,
    /// The pairs (probe set, partner, overlap), when asked for and at most `cap` passed.
    pub pairs: Vec<(u32, u32, u32)>,
    /// More than `cap` pairs passed (or too many to count): `pairs` is empty, and the range
    /// must be probed again in parts.
    pub overflow: bool,
    /// Candidates that survived the filters and were verified.
    pub verified: u64,
    pub timings: VerifyTimings,
}

/// One join's sets and prefix indexes on the device (freed when the last holder drops them).
#[derive(Debug)]
pub struct DeviceJoin(<Selected as JoinProber>::Index);

impl DeviceJoin {
    /// Bytes copied to the device for the indexes (the sets' are [`DeviceSets::bytes`]).
    pub fn bytes(&self) -> u64 {
        <Selected as JoinProber>::index_bytes(&self.0)
    }
}

/// Whether the join's kernels are ready, or were just loaded from the kernel cache (an image
/// compiled by an earlier process: milliseconds), so that a first device call does not wait
/// 0.4-5 s for NVRTC; `false` when they still need it (or without the `cuda` feature).
pub fn kernels_ready_or_cached() -> bool {
    #[cfg(feature = "cuda")]
    {
        simjoin::kernels_ready() || simjoin::kernels_load_fast()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Start compiling the join's kernels in the background (once per process; nothing without
/// the `cuda` feature), for [`kernels_ready_or_cached`].
pub fn prepare_kernels() {
    #[cfg(feature = "cuda")]
    simjoin::prepare_kernels();
}

/// Copy a join's prefix indexes to the device beside its `sets`: one index for a self-join,
/// else one per side (index 0 over side 0's sets, read by side 1's probe sets), with each
/// set's side (0 or 1). They stay there while the [`DeviceJoin`] lives.
pub fn upload_join(
    sets: &DeviceSets,
    sides: &[u8],
    indexes: &[IndexView<'_>],
) -> Result<DeviceJoin, GpuError> {
    <Selected as JoinProber>::upload_index(&sets.0, sides, indexes).map(DeviceJoin)
}

/// Filter and verify the probe sets `range` (global positions) on the device: every pair of
/// a probe set with a set before it (of the other side, for an R-S join) that passes
/// `threshold`, exactly the pairs of the CPU's filter and verification. With `emit` the pairs
/// come back when at most `cap` passed, else only their count; `exact = false` lets a
/// passing pair's overlap stop at its minimum.
pub fn probe_sets(
    join: &DeviceJoin,
    threshold: &Threshold,
    range: (usize, usize),
    exact: bool,
    emit: bool,
    cap: usize,
) -> Result<Probed, GpuError> {
    <Selected as JoinProber>::probe(&join.0, threshold, range, exact, emit, cap)
}

/// Sets on the device: never made without the `cuda` feature.
#[derive(Debug)]
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub(crate) struct NoSets(());

/// A chunk "queued" without the `cuda` feature: its answer is [`GpuError::NotCompiled`].
#[derive(Debug)]
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub(crate) struct NoPending(Arc<PairBuffer>);

/// Without the `cuda` feature: nothing is verified on a device.
impl PairVerifier for NoCuda {
    type Sets = NoSets;
    type Pending = NoPending;

    fn upload_sets(_tokens: &[u32], _starts: &[usize]) -> Result<Self::Sets, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn sets_bytes(_sets: &Self::Sets) -> u64 {
        0
    }

    fn sets_len(_sets: &Self::Sets) -> usize {
        0
    }

    fn verify_pairs(
        _sets: &Self::Sets,
        _pairs: &[PairToVerify],
        _groups: PairGroups<'_>,
        _exact: bool,
    ) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn submit_pairs(
        _sets: &Arc<Self::Sets>,
        pairs: Arc<PairBuffer>,
        _exact: bool,
    ) -> Self::Pending {
        NoPending(pairs)
    }

    fn finish(pending: Self::Pending) -> VerifyAnswer {
        (pending.0, Err(GpuError::NotCompiled))
    }
}

/// One join's sets on the device (freed when the last holder drops them).
#[derive(Debug)]
pub struct DeviceSets(Arc<<Selected as PairVerifier>::Sets>);

impl DeviceSets {
    /// Bytes copied to the device for the sets.
    pub fn bytes(&self) -> u64 {
        <Selected as PairVerifier>::sets_bytes(&self.0)
    }

    /// Number of sets.
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    pub fn len(&self) -> usize {
        <Selected as PairVerifier>::sets_len(&self.0)
    }

    /// Whether there are no sets.
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A chunk of pairs at the device: its copies and kernels queued on a lane of its own by
/// [`submit_pairs`], its answer taken by [`PendingVerify::finish`]. The caller goes on (the
/// join filters its next chunk) while the device works. Dropped unfinished, it waits for
/// its stream first, so the device never reads the chunk's memory after it is freed.
#[derive(Debug)]
pub struct PendingVerify(<Selected as PairVerifier>::Pending);

impl PendingVerify {
    /// Wait (asleep) for the device and take the answer, with the chunk back. The answer's
    /// `total_ms` is the host's time in the call: submitting plus finishing (the wait
    /// included), not the time the chunk spent at the device meanwhile. Without the `cuda`
    /// feature: the chunk back with [`GpuError::NotCompiled`].
    pub fn finish(self) -> VerifyAnswer {
        <Selected as PairVerifier>::finish(self.0)
    }
}

/// Copy sets to the device: set `s` is `tokens[starts[s]..starts[s + 1]]`, ascending and
/// distinct (the join's token ranks). They stay there while the [`DeviceSets`] lives.
pub fn upload_sets(tokens: &[u32], starts: &[usize]) -> Result<DeviceSets, GpuError> {
    <Selected as PairVerifier>::upload_sets(tokens, starts).map(|s| DeviceSets(Arc::new(s)))
}

/// Verify a chunk of candidate pairs against sets on the device. The answer lists the pairs
/// that reach their `alpha`, as (index in `pairs`, overlap), by ascending index. `groups`:
/// each pair's probe set (see [`PairGroups`]). `exact = false` lets a passing pair stop
/// counting at its `alpha`.
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub fn verify_pairs(
    sets: &DeviceSets,
    pairs: &[PairToVerify],
    groups: PairGroups<'_>,
    exact: bool,
) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
    <Selected as PairVerifier>::verify_pairs(&sets.0, pairs, groups, exact)
}

/// Queue the verification of the chunk `pairs` (its groups as the join recorded them) on a
/// lane of its own and return at once; [`PendingVerify::finish`] waits for the answer, which
/// is [`verify_pairs`]'s. A failure to queue is kept and returned by `finish`.
pub fn submit_pairs(sets: &Arc<DeviceSets>, pairs: Arc<PairBuffer>, exact: bool) -> PendingVerify {
    PendingVerify(<Selected as PairVerifier>::submit_pairs(
        &sets.0, pairs, exact,
    ))
}

static SIMJOIN_CHUNKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Chunks of similarity-join candidates verified on the GPU in this process.
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub fn simjoin_chunks_run() -> u64 {
    SIMJOIN_CHUNKS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_simjoin_chunk() {
    SIMJOIN_CHUNKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

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
    Arc<PairBuffer>,
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
