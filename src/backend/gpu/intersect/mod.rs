//! Batched k-way intersection of sorted integer list columns on the GPU: the domain-free
//! driver behind `list_intersect`, `list_intersect_count` and `list_intersect_agg`'s fold.
//!
//! [`intersect`] runs one batch: list offsets and values go to the device in one copy
//! through a pooled pinned staging buffer (sliced arrays included, no per-row work), every
//! step of the k-way intersection runs on the device, and the results come back compacted as
//! Arrow-style values + offsets, in one copy, with a per-row flag for the rows the CPU must
//! recompute (a list not strictly increasing). A batch that does not fit is split into launch
//! groups (`driver`), each run in four phases (`chunk`: its layout and device buffers;
//! `stage`: the inputs into pinned memory and up; `steps`: the kernels of each step;
//! `collect`: the results down and out of pinned memory). List columns that carry their
//! Arrow buffers may stay on the device between calls (`resident`).
//!
//! The entry points go through [`Intersector`], which [`Cuda`] (with the feature `cuda`) and
//! [`NoCuda`] (every call answers [`GpuError::NotCompiled`]) implement.

#[cfg(feature = "cuda")]
mod chunk;
#[cfg(feature = "cuda")]
mod collect;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod resident;
#[cfg(feature = "cuda")]
mod stage;
#[cfg(feature = "cuda")]
mod steps;

use datafusion::arrow::buffer::Buffer;

#[cfg(feature = "cuda")]
use super::Cuda;
use super::{GpuError, NoCuda, Selected};
use crate::backend::cpu::SetElem;

#[cfg(feature = "cuda")]
pub(crate) use kernels::kernels;
#[cfg(feature = "cuda")]
pub(crate) use resident::ResidentCol;

/// Input bytes per launch group (a copy of the workspace's budget, read without its lock); 0
/// before the device is set up.
#[cfg(feature = "cuda")]
static LAUNCH_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The list intersection's entry points, as the CUDA driver and the stub both answer them.
pub(crate) trait Intersector {
    /// See [`intersect`].
    fn intersect<T: SetElem>(
        lists: &[HostList<'_, T>],
        validity: Option<RowValidity<'_>>,
        mode: Mode,
        columns_budget: Option<usize>,
        share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError>;

    /// See [`intersect_resident`].
    fn intersect_resident<T: SetElem>(
        lists: &[HostList<'_, T>],
        validity: Option<RowValidity<'_>>,
        mode: Mode,
        columns_budget: usize,
        share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError>;

    /// See [`launch_group_bytes`].
    fn launch_group_bytes() -> Option<usize>;
}

#[cfg(feature = "cuda")]
impl Intersector for Cuda {
    fn intersect<T: SetElem>(
        lists: &[HostList<'_, T>],
        validity: Option<RowValidity<'_>>,
        mode: Mode,
        columns_budget: Option<usize>,
        share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError> {
        driver::intersect_in(lists, validity, mode, columns_budget, share_values, false)
    }

    fn intersect_resident<T: SetElem>(
        lists: &[HostList<'_, T>],
        validity: Option<RowValidity<'_>>,
        mode: Mode,
        columns_budget: usize,
        share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError> {
        driver::intersect_in(
            lists,
            validity,
            mode,
            Some(columns_budget),
            share_values,
            true,
        )
    }

    fn launch_group_bytes() -> Option<usize> {
        Some(LAUNCH_BYTES.load(std::sync::atomic::Ordering::Relaxed)).filter(|&b| b > 0)
    }
}

/// Without the `cuda` feature: nothing runs on a device.
impl Intersector for NoCuda {
    fn intersect<T: SetElem>(
        _lists: &[HostList<'_, T>],
        _validity: Option<RowValidity<'_>>,
        _mode: Mode,
        _columns_budget: Option<usize>,
        _share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn intersect_resident<T: SetElem>(
        _lists: &[HostList<'_, T>],
        _validity: Option<RowValidity<'_>>,
        _mode: Mode,
        _columns_budget: usize,
        _share_values: bool,
    ) -> Result<GpuOutput<T>, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn launch_group_bytes() -> Option<usize> {
        None
    }
}

/// Run the batched intersection of `lists` (k ≥ 2 list columns with the same number of
/// rows, 32- or 64-bit elements) on the GPU. Rows whose lists are not all strictly
/// increasing come back flagged (their device result is meaningless); the caller recomputes
/// them, and rows holding NULL elements, on the CPU.
///
/// `columns_budget`: `None` stages every list for this call only; `Some(bytes)` keeps the
/// lists that carry their Arrow buffers ([`HostList::column`]) on the device for later
/// calls, within `bytes` of device memory (0: `DFSETS_GPU_COLUMN_BUDGET`, else a quarter of
/// the device's memory), least recently used evicted first.
///
/// `share_values`: in [`Mode::Values`], for a batch done in one launch group, return the
/// values as an Arrow buffer over the page-locked memory the device copied them into, with
/// no host copy ([`GpuOutput::shared_values`], `values` left empty); read them with
/// [`GpuOutput::values_slice`].
///
/// Without the `cuda` feature: [`GpuError::NotCompiled`].
pub fn intersect<T: SetElem>(
    lists: &[HostList<'_, T>],
    validity: Option<RowValidity<'_>>,
    mode: Mode,
    columns_budget: Option<usize>,
    share_values: bool,
) -> Result<GpuOutput<T>, GpuError> {
    <Selected as Intersector>::intersect(lists, validity, mode, columns_budget, share_values)
}

/// As [`intersect`] with the columns kept on the device within `columns_budget`, but only
/// when every list's column is resident or is made resident now: otherwise
/// [`GpuError::Unsupported`], before any kernel runs (`auto` runs such calls on the CPU).
pub fn intersect_resident<T: SetElem>(
    lists: &[HostList<'_, T>],
    validity: Option<RowValidity<'_>>,
    mode: Mode,
    columns_budget: usize,
    share_values: bool,
) -> Result<GpuOutput<T>, GpuError> {
    <Selected as Intersector>::intersect_resident(
        lists,
        validity,
        mode,
        columns_budget,
        share_values,
    )
}

/// Input value bytes one launch group of [`intersect`] takes at most (a batch past it is
/// split), `None` before the device is set up (and without the `cuda` feature).
pub fn launch_group_bytes() -> Option<usize> {
    <Selected as Intersector>::launch_group_bytes()
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
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
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
    /// measured only while [`crate::tuning::merge_marks`] is on (0 otherwise).
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
    /// with the group's parameters; see the knob `gpu_graph`).
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

#[cfg(test)]
mod tests {
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
}
