//! The GPU backend without the `cuda` feature: the same entry points, always
//! [`GpuError::NotCompiled`].

use std::sync::Arc;

use super::{
    Bm25Batch, Bm25Cpu, Bm25Output, Ceilings, DeviceInfo, GpuError, GpuOutput, HostList, Mode,
    PairBuffer, PairGroups, PairToVerify, RowValidity, VerifyAnswer, VerifyTimings,
};
use crate::backend::cpu::SetElem;
use crate::search::index::InvertedIndex;
use crate::search::scoring::Scored;

/// The device the backend runs on: never one without the `cuda` feature.
pub fn device() -> Result<DeviceInfo, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Batched k-way intersection: not available without the `cuda` feature.
pub fn intersect<T: SetElem>(
    _lists: &[HostList<'_, T>],
    _validity: Option<RowValidity<'_>>,
    _mode: Mode,
    _columns_budget: Option<usize>,
    _share_values: bool,
) -> Result<GpuOutput<T>, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Not available without the `cuda` feature.
pub fn intersect_resident<T: SetElem>(
    _lists: &[HostList<'_, T>],
    _validity: Option<RowValidity<'_>>,
    _mode: Mode,
    _columns_budget: usize,
    _share_values: bool,
) -> Result<GpuOutput<T>, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Tests only: no device, no epochs.
#[doc(hidden)]
pub fn set_next_epoch(_next: u32) {}

/// Kernel graphs: none without the `cuda` feature, so never turned off.
pub fn kernel_graphs_off() -> Option<String> {
    None
}

/// Input bytes per launch group: none without the `cuda` feature.
pub fn launch_group_bytes() -> Option<usize> {
    None
}

/// Transfer ceilings: not available without the `cuda` feature.
pub fn measure_ceilings(_bytes: usize) -> Result<Ceilings, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Batched BM25 top-k: not available without the `cuda` feature.
pub fn bm25_topk(
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

/// Drop the resident BM25 index: nothing to drop without the `cuda` feature.
pub fn bm25_evict() {}

/// Host reads of page-locked memory: not available without the `cuda` feature.
pub fn pinned_read_probe(_bytes: usize) -> Result<super::PinnedReads, GpuError> {
    Err(GpuError::NotCompiled)
}

/// The ranking blocks' timeline: none without the `cuda` feature.
pub fn bm25_trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
    Ok(Vec::new())
}

/// Sets on the device: never made without the `cuda` feature.
#[derive(Debug)]
pub struct DeviceSets(());

impl DeviceSets {
    /// Bytes copied to the device for the sets.
    pub fn bytes(&self) -> u64 {
        0
    }

    /// Number of sets.
    pub fn len(&self) -> usize {
        0
    }

    /// Whether there are no sets.
    pub fn is_empty(&self) -> bool {
        true
    }
}

/// Similarity-join sets on the device: not available without the `cuda` feature.
pub fn upload_sets(_tokens: &[u32], _starts: &[usize]) -> Result<DeviceSets, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Similarity-join verification: not available without the `cuda` feature.
pub fn verify_pairs(
    _sets: &DeviceSets,
    _pairs: &[PairToVerify],
    _groups: PairGroups<'_>,
    _exact: bool,
) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
    Err(GpuError::NotCompiled)
}

/// A chunk of pairs at the device: never made without the `cuda` feature.
#[derive(Debug)]
pub struct PendingVerify(Arc<PairBuffer>);

/// Queued verification: without the `cuda` feature, `finish` answers
/// [`GpuError::NotCompiled`].
pub fn submit_pairs(
    _sets: &Arc<DeviceSets>,
    pairs: Arc<PairBuffer>,
    _exact: bool,
) -> PendingVerify {
    PendingVerify(pairs)
}

impl PendingVerify {
    /// The chunk back, with [`GpuError::NotCompiled`].
    pub fn finish(self) -> VerifyAnswer {
        (self.0, Err(GpuError::NotCompiled))
    }
}
