//! The GPU backend: a CUDA runtime and the batched k-way intersection of sorted integer list
//! columns, on NVIDIA GPUs. It knows integer lists and nothing of SQL, BM25 or joins.
//!
//! - The runtime (with the cargo feature `cuda`, on by default) loads the driver and NVRTC at
//!   run time through `cudarc`, so the crate builds, tests and runs with no CUDA installed:
//!   without a driver or a device every entry point returns a [`GpuError`] and the caller
//!   stays on the CPU (the reason goes to the debug log). `runtime`: one context and stream
//!   per process, launches and waits; `modules`: the kernels of kernels/*.cu, embedded in the
//!   binary, each compiled once per process with NVRTC for the device's own architecture,
//!   or loaded from `kernel_cache`, the compiled modules kept on disk across processes;
//!   `memory`: pooled device and page-locked memory (the results lent to Arrow buffers within
//!   [`crate::tuning::lent_max`]); `graph`: one submission for a sequence of launches;
//!   `fault`: fault injection (feature `tuning`); `probes`: the device's transfer ceilings
//!   and other measurements (feature `tuning`).
//! - [`intersect`] (`intersect/`): one batch of list intersections on the device, its columns
//!   optionally kept resident (`columns`: which, within which budget); `fold`: many groups'
//!   sets folded by rounds of batched intersections (`list_intersect_agg`).
//! - `intersect::gpu` (above this layer) connects the intersection to the SQL functions.
//!
//! The drivers of the other features live with their engines (`topk_bm25`'s in
//! the search engine's `gpu` module, the similarity join's verifier in the join's) and use the
//! runtime through this module's `pub(crate)` items, starting from `ready`.
//!
//! Every driver's entry points go through a trait ([`Runtime`] here, `Intersector` for the
//! intersection, the others' with them) implemented by `Cuda` (the real driver, with the
//! feature) and by `NoCuda` (every call answers [`GpuError::NotCompiled`]); `NoCuda`'s impls
//! are compiled in every build, so the compiler checks the stub against the driver's trait
//! wherever either changes. `Selected` is the one this build runs.

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod columns;
mod error;
#[cfg(feature = "tuning")]
pub mod fault;
mod fold;
mod intersect;

#[cfg(feature = "cuda")]
mod graph;
#[cfg(feature = "cuda")]
mod kernel_cache;
#[cfg(feature = "cuda")]
pub(crate) mod memory;
#[cfg(feature = "cuda")]
pub(crate) mod modules;
#[cfg(all(feature = "cuda", feature = "tuning"))]
mod pinned_read;
#[cfg(all(feature = "cuda", feature = "tuning"))]
mod probes;
#[cfg(feature = "cuda")]
pub(crate) mod runtime;

/// Without the feature `tuning` no fault is ever injected: each check is a constant `false`.
#[cfg(not(feature = "tuning"))]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod fault {
    /// The failures the feature `tuning` can inject (`fault.rs`).
    #[derive(Clone, Copy)]
    pub(crate) enum Fault {
        OutOfMemory,
        PinnedOutOfMemory,
    }

    #[inline(always)]
    pub(crate) fn armed(_fault: Fault) -> bool {
        false
    }
}

pub use error::GpuError;
#[cfg(test)]
pub(crate) use fold::fold_groups_emulated;
pub use fold::{FoldOutput, fold_groups};
#[cfg(feature = "cuda")]
pub(crate) use graph::Launch;
pub use intersect::{
    GpuOutput, HostList, HostOffsets, Mode, RowValidity, Timings, intersect, intersect_resident,
    launch_group_bytes, staging_bytes,
};
#[cfg(feature = "cuda")]
pub(crate) use memory::{DevBuf, LentPinned, Workspace};
#[cfg(feature = "cuda")]
pub(crate) use modules::Module;
#[cfg(feature = "cuda")]
pub(crate) use runtime::{
    Gpu, align, arg, bytes_of, drv, launch_on, panic_message, par_copy, view, view_mut,
};

/// The CUDA drivers (feature `cuda`): each driver's trait is implemented for it.
#[cfg(feature = "cuda")]
pub(crate) struct Cuda;

/// The stub of every driver: each call answers [`GpuError::NotCompiled`] (or has nothing to
/// do). Compiled in every build.
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub(crate) struct NoCuda;

/// The drivers this build runs: [`Cuda`] with the feature `cuda`, else [`NoCuda`].
#[cfg(feature = "cuda")]
pub(crate) type Selected = Cuda;
/// The drivers this build runs: [`Cuda`] with the feature `cuda`, else [`NoCuda`].
#[cfg(not(feature = "cuda"))]
pub(crate) type Selected = NoCuda;

/// The process's GPU, ready for any driver: its context up (started on first call) and its
/// base module compiled (kernels/intersect.cu: the list kernels every SQL function may use,
/// and the trap the fault injection queues). Every entry point of every driver starts here;
/// a failure to start is kept for the process, and a fault during a batch turns the backend
/// off ([`GpuError::Broken`]).
#[cfg(feature = "cuda")]
pub(crate) fn ready() -> Result<&'static Gpu, GpuError> {
    let g = runtime::context()?;
    intersect::kernels(g)?;
    Ok(g)
}

/// The runtime's entry points, as the CUDA runtime and the stub both answer them.
pub(crate) trait Runtime {
    /// See [`device`].
    fn device() -> Result<DeviceInfo, GpuError>;
    /// See [`lent_bytes`].
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    fn lent_bytes() -> usize;
    /// `bytes` of page-locked host memory (the context bound to this thread), or `None` when
    /// the backend is unavailable or the allocation fails. Free with
    /// [`Runtime::free_pinned`].
    fn alloc_pinned(bytes: usize) -> Option<*mut u8>;
    /// Free memory from [`Runtime::alloc_pinned`].
    ///
    /// # Safety
    /// `ptr` came from [`Runtime::alloc_pinned`] and is freed once, with nothing reading or
    /// writing it any more.
    unsafe fn free_pinned(ptr: *mut u8);
    /// See [`kernel_graphs_off`].
    #[cfg(feature = "tuning")]
    fn kernel_graphs_off() -> Option<String>;
    /// See [`set_next_epoch`].
    #[cfg(feature = "tuning")]
    fn set_next_epoch(next: u32);
    /// See [`measure_ceilings`].
    #[cfg(feature = "tuning")]
    fn measure_ceilings(bytes: usize) -> Result<Ceilings, GpuError>;
    /// See [`pinned_read_probe`].
    #[cfg(feature = "tuning")]
    fn pinned_read_probe(bytes: usize) -> Result<PinnedReads, GpuError>;
}

#[cfg(feature = "cuda")]
impl Runtime for Cuda {
    fn device() -> Result<DeviceInfo, GpuError> {
        ready().map(|g| g.info.clone())
    }

    fn lent_bytes() -> usize {
        memory::lent_bytes_now()
    }

    fn alloc_pinned(bytes: usize) -> Option<*mut u8> {
        memory::alloc_pinned(bytes)
    }

    unsafe fn free_pinned(ptr: *mut u8) {
        memory::free_pinned(ptr)
    }

    #[cfg(feature = "tuning")]
    fn kernel_graphs_off() -> Option<String> {
        probes::kernel_graphs_off()
    }

    #[cfg(feature = "tuning")]
    fn set_next_epoch(next: u32) {
        probes::set_next_epoch(next)
    }

    #[cfg(feature = "tuning")]
    fn measure_ceilings(bytes: usize) -> Result<Ceilings, GpuError> {
        probes::measure_ceilings(bytes)
    }

    #[cfg(feature = "tuning")]
    fn pinned_read_probe(bytes: usize) -> Result<PinnedReads, GpuError> {
        probes::pinned_read_probe(bytes)
    }
}

/// Without the `cuda` feature: no device, no page-locked memory, nothing to probe.
impl Runtime for NoCuda {
    fn device() -> Result<DeviceInfo, GpuError> {
        Err(GpuError::NotCompiled)
    }

    fn lent_bytes() -> usize {
        0
    }

    fn alloc_pinned(_bytes: usize) -> Option<*mut u8> {
        None
    }

    unsafe fn free_pinned(_ptr: *mut u8) {}

    #[cfg(feature = "tuning")]
    fn kernel_graphs_off() -> Option<String> {
        None
    }

    #[cfg(feature = "tuning")]
    fn set_next_epoch(_next: u32) {}

    #[cfg(feature = "tuning")]
    fn measure_ceilings(_bytes: usize) -> Result<Ceilings, GpuError> {
        Err(GpuError::NotCompiled)
    }

    #[cfg(feature = "tuning")]
    fn pinned_read_probe(_bytes: usize) -> Result<PinnedReads, GpuError> {
        Err(GpuError::NotCompiled)
    }
}

/// The device the backend runs on (starting the backend on first call).
pub fn device() -> Result<DeviceInfo, GpuError> {
    <Selected as Runtime>::device()
}

/// Whether a GPU is usable by this process (starting the backend on first call).
pub fn is_available() -> bool {
    device().is_ok()
}

/// Bytes of page-locked host memory in lent blocks now: held by results or by a workspace,
/// or idle in the process's pool of them (0 without the `cuda` feature). A block is taken
/// only while this stays within [`crate::tuning::lent_max`].
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub fn lent_bytes() -> usize {
    <Selected as Runtime>::lent_bytes()
}

/// Why kernel graphs (one submission for a `wmerge` call's or a `topk_bm25` batch's
/// launches) were turned off in this process: the graph call that failed; `None` while they
/// are on (or before the device is set up, or without the `cuda` feature). Tests and
/// diagnostics.
#[cfg(feature = "tuning")]
pub fn kernel_graphs_off() -> Option<String> {
    <Selected as Runtime>::kernel_graphs_off()
}

/// Tests only: the epoch the next launch with look-back states gets (from 1; at 2^24 the
/// numbers start again at 1 and the state buffers are cleared), so that a test can reach the
/// wrap-around in a few calls. No effect before the device is set up.
#[cfg(feature = "tuning")]
pub fn set_next_epoch(next: u32) {
    <Selected as Runtime>::set_next_epoch(next)
}

/// Measure the device's copy ceilings with `bytes`-byte buffers: device-to-device (bytes
/// read plus written), pinned host-to-device and device-to-pinned-host; median of 5.
#[cfg(feature = "tuning")]
pub fn measure_ceilings(bytes: usize) -> Result<Ceilings, GpuError> {
    <Selected as Runtime>::measure_ceilings(bytes)
}

/// One host thread reading `bytes` of page-locked memory the device has just written, and
/// ordinary memory, both ways (see [`PinnedReads`]; diagnostics: the benchmarks print it
/// beside the host's timings).
#[cfg(feature = "tuning")]
pub fn pinned_read_probe(bytes: usize) -> Result<PinnedReads, GpuError> {
    <Selected as Runtime>::pinned_read_probe(bytes)
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

/// Kernel modules this process compiled with NVRTC, and loaded from the kernel cache
/// (`DFSETS_KERNEL_CACHE`), in that order (for tests and diagnostics).
pub fn kernel_modules() -> (u64, u64) {
    #[cfg(feature = "cuda")]
    {
        use std::sync::atomic::Ordering::Relaxed;
        (
            modules::COMPILED.load(Relaxed),
            modules::FROM_CACHE.load(Relaxed),
        )
    }
    #[cfg(not(feature = "cuda"))]
    (0, 0)
}

/// Measured transfer ceilings of the device (GB/s).
#[cfg(feature = "tuning")]
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
#[cfg(feature = "tuning")]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PinnedReads {
    pub pinned_plain_gbs: f64,
    pub pinned_stream_gbs: f64,
    pub ordinary_plain_gbs: f64,
    pub ordinary_stream_gbs: f64,
}
