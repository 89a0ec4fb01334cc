//! The GPU backend without the `cuda` feature: the same entry points, always
//! [`GpuError::NotCompiled`].

use super::{Ceilings, DeviceInfo, GpuError, GpuOutput, HostList, Mode, RowValidity};
use crate::backend::cpu::SetElem;

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
