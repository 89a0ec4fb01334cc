//! The GPU backend without the `cuda` feature: the same entry points, always
//! [`GpuError::NotCompiled`].

use std::sync::Arc;

use super::{
    Bm25Batch, Bm25Cpu, Bm25Output, Ceilings, DeviceInfo, GpuError, GpuOutput, HostList, Mode,
    RowValidity,
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
) -> Result<GpuOutput<T>, GpuError> {
    Err(GpuError::NotCompiled)
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
) -> Result<Bm25Output, GpuError> {
    Err(GpuError::NotCompiled)
}

/// Drop the resident BM25 index: nothing to drop without the `cuda` feature.
pub fn bm25_evict() {}
