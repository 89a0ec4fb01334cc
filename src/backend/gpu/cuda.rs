//! The CUDA runtime of the GPU backend: one context per process, the kernels compiled once
//! with NVRTC, pooled device and pinned memory, and the batch driver behind [`intersect`].
//!
//! Everything goes through `cudarc`'s driver and NVRTC bindings, loaded at run time. The
//! first call initializes (a missing library, device or compiler becomes a [`GpuError`],
//! cached for the process); a fault during a batch (a kernel error, a panic in the library)
//! turns the backend off for the rest of the process. One batch runs at a time (a mutex
//! around the workspace); the device work of a batch is one stream.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, sys};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use datafusion::arrow::buffer::Buffer;
use rayon::prelude::*;

use super::columns::{self, Admitted, ColumnCache, Placement};
use super::fault::{self, Fault};
use super::graph::{Launch, LaunchGraph, Word};
use super::{
    Ceilings, DeviceInfo, GpuError, GpuOutput, HostList, HostOffsets, Mode, RowValidity, Timings,
};
use crate::backend::cpu::SetElem;

/// The kernels' source, compiled at run time.
const SOURCE: &str = include_str!("../../../kernels/intersect.cu");

/// Bytes of one tile descriptor (`TileDesc` in the kernel source).
const DESC_BYTES: usize = 32;
/// Path positions per merge thread (`ITEMS` in the kernel source) and threads per merge
/// block, unless set for an experiment.
const MERGE_ITEMS: u32 = 8;
const MERGE_THREADS: u32 = 256;
/// Threads of a gather block (one warp per tile).
const GATHER_THREADS: u32 = 256;
/// Threads of a `wmerge` block (`WBLOCK` in kernels/intersect.cu) and the blocks per
/// multiprocessor it is compiled for (`WMINB`).
const WBLOCK: u32 = 256;
const WMINB: u32 = 6;
/// A `wmerge` step's piece size (see `WPieces`): the most and the fewest A positions per
/// piece, and the pieces per multiprocessor wanted.
const WPIECE_MAX: u32 = 2048;
const WPIECE_MIN: u32 = 256;
const WPIECES_PER_SM: u32 = 96;
/// Elements per block of the scan kernels, and their threads.
const SCAN_SEG: u64 = 4096;
const SCAN_THREADS: u32 = 1024;
/// Threads of the per-row kernels.
const ROW_THREADS: u32 = 256;
/// `wplace` blocks per multiprocessor at most (it strides over the step's pieces): the
/// launch never holds blocks that find no piece (`wmerge`'s launch has a warp for each piece
/// the step can have, most of them past the step's last piece).
const WPLACE_BLOCKS_PER_SM: u32 = 8;
/// The smallest input (bytes of values) a launch group is cut down to when memory runs out.
const MIN_BUDGET: usize = 16 << 20;
/// Alignment of the sections of the staging and device buffers.
const ALIGN: usize = 256;

/// Experiments only: the CUDA source named by the environment variable `var` (another
/// version of an embedded kernel file, same kernel signatures), to be compiled instead of the
/// embedded one so that kernel variants are measured side by side by one binary.
pub(super) fn source_from_env(var: &str) -> Result<Option<String>, GpuError> {
    std::env::var_os(var)
        .map(|p| {
            std::fs::read_to_string(&p).map_err(|e| GpuError::Compile(format!("{var} {p:?}: {e}")))
        })
        .transpose()
}

/// An experiment's setting from the environment: `None` when unset or not a number.
fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
}

/// A numeric knob from the environment (measurements and tests: piece sizes, thresholds),
/// `default` when unset or not a number. Callers keep the value in a `OnceLock`.
pub(super) fn env_knob(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Compiles `source` with NVRTC for `arch` (e.g. `compute_90`) as C++17 plus `extra`
/// options, and loads it into `ctx`. Shared by every kernel family (intersect.cu, bm25.cu);
/// a compile failure carries NVRTC's log.
pub(super) fn compile_module(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    source: &str,
    name: &str,
    extra: Vec<String>,
) -> Result<Arc<CudaModule>, GpuError> {
    let mut options = vec!["--std=c++17".to_string()];
    options.extend(extra);
    let injected;
    let source = if fault::armed(Fault::Compile) {
        injected = format!("#error injected fault (DFSETS_GPU_FAULT=nvrtc)\n{source}");
        injected.as_str()
    } else {
        source
    };
    let ptx = compile_ptx_with_opts(
        source,
        CompileOptions {
            arch: Some(arch),
            options,
            name: Some(name.into()),
            ..Default::default()
        },
    )
    .map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            GpuError::Compile(log.to_string_lossy().into_owned())
        }
        other => GpuError::Compile(format!("{other:?}")),
    })?;
    ctx.load_module(ptx).map_err(drv("module load"))
}

pub(super) fn drv(op: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            GpuError::OutOfMemory(op)
        } else {
            GpuError::Driver {
                op,
                message: e.to_string(),
            }
        }
    }
}

pub(super) fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// The kernels, loaded from the compiled module.
struct Kernels {
    plan_o32: CudaFunction,
    plan_o64: CudaFunction,
    plan_scan_o32: CudaFunction,
    plan_scan_o64: CudaFunction,
    scan_partials: CudaFunction,
    scan_partials_single: CudaFunction,
    scan_apply: CudaFunction,
    compact_rows: CudaFunction,
    /// Indexed by [`elem_index`]: u32, i32, u64, i64.
    partition: [CudaFunction; 4],
    /// Indexed by [`elem_index`].
    merge: [CudaFunction; 4],
    /// The same for calls where a list's row order is known (a resident column's flags):
    /// skips the order check of known rows, searches B where plan says so.
    merge_known: [CudaFunction; 4],
    /// Steps over lists all known increasing ([`super::KnownOrder::Warp`]), by
    /// [`elem_index`].
    wmerge: [CudaFunction; 4],
    /// `wplace_32`, `wplace_64`: after `wmerge`, each piece's matches to their place.
    wplace: [CudaFunction; 2],
    /// 32-bit and 64-bit elements.
    gather: [CudaFunction; 2],
    /// Row order of a resident column, by [`elem_index`], then 32- / 64-bit offsets.
    row_order: [[CudaFunction; 2]; 4],
    /// A kernel that faults ([`Fault::Kernel`]).
    trap: CudaFunction,
}

/// Index of the kernel variant for `T`.
fn elem_index<T: SetElem>() -> Option<usize> {
    match (T::BITS, T::SIGNED) {
        (32, false) => Some(0),
        (32, true) => Some(1),
        (64, false) => Some(2),
        (64, true) => Some(3),
        _ => None,
    }
}

/// A device allocation owned by the workspace.
pub(super) struct DevBuf {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
}

impl DevBuf {
    /// The bytes [`DevBuf::upload`] allocates for `len` bytes of data (at least 256).
    pub(super) fn bytes_for(len: usize) -> usize {
        len.max(256)
    }

    /// A new device buffer holding a copy of `v` (at least 256 bytes), copied synchronously;
    /// `alloc` and `copy` name the two steps in errors. The context must be bound.
    pub(super) fn upload(
        v: &[u8],
        alloc: &'static str,
        copy: &'static str,
    ) -> Result<Self, GpuError> {
        let bytes = Self::bytes_for(v.len());
        if fault::armed(Fault::OutOfMemory) {
            return Err(GpuError::OutOfMemory(alloc));
        }
        // SAFETY: a plain allocation of `bytes` bytes, then a synchronous copy of `v` into
        // it (the context is bound by the caller).
        unsafe {
            let ptr = result::malloc_sync(bytes).map_err(drv(alloc))?;
            let buf = DevBuf { ptr, bytes };
            if !v.is_empty() {
                result::memcpy_htod_sync(ptr, v).map_err(drv(copy))?;
            }
            Ok(buf)
        }
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_sync` and is freed once; the workspace is only
        // dropped or shrunk with the context bound and the stream idle.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// `bytes` of page-locked host memory (the context bound to this thread), or `None` when
/// the backend is unavailable or the allocation fails. Free with [`free_pinned`].
pub(super) fn alloc_pinned(bytes: usize) -> Option<*mut u8> {
    let g = gpu().ok()?;
    if fault::armed(Fault::PinnedOutOfMemory) {
        return None;
    }
    g.ctx.bind_to_thread().ok()?;
    // SAFETY: plain page-locked allocation with the context bound.
    unsafe { result::malloc_host(bytes.max(1), 0) }
        .ok()
        .map(|p| p.cast())
}

/// Free memory from [`alloc_pinned`].
pub(super) fn free_pinned(ptr: *mut u8) {
    if let Ok(g) = gpu_any() {
        let _ = g.ctx.bind_to_thread();
    }
    // SAFETY: `ptr` came from `malloc_host` and is freed once.
    let _ = unsafe { result::free_host(ptr.cast()) };
}

/// Page-locked host memory: where it lies, its size, and its device address once asked for.
/// Owned by a [`Pinned`] (the workspace's, freed with it) or a [`LentPinned`] (pooled).
pub(super) struct HostBlock {
    ptr: *mut u8,
    bytes: usize,
    /// Its device address, once asked for (0: not yet).
    dev: u64,
}

impl HostBlock {
    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes of host memory owned by `self`, and the
        // exclusive borrow of `self` rules out any other view while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address through which kernels read and write this memory across the bus (with
    /// unified addressing, where every page-locked allocation is mapped, the host's own
    /// address; asked of the driver once per allocation all the same). The context must be
    /// bound to this thread.
    pub(super) fn device_ptr(&mut self) -> Result<u64, GpuError> {
        if self.dev == 0 {
            let mut d: sys::CUdeviceptr = 0;
            // SAFETY: `ptr` is a live page-locked allocation of this process's context
            // (`malloc_host`); the driver writes one address into `d`.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr.cast(), 0) }
                .result()
                .map_err(drv("mapped host pointer"))?;
            self.dev = d;
        }
        Ok(self.dev)
    }
}

/// A page-locked host allocation owned by the workspace.
pub(super) struct Pinned(HostBlock);

impl std::ops::Deref for Pinned {
    type Target = HostBlock;
    fn deref(&self) -> &HostBlock {
        &self.0
    }
}

impl std::ops::DerefMut for Pinned {
    fn deref_mut(&mut self) -> &mut HostBlock {
        &mut self.0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` and is freed once.
        let _ = unsafe { result::free_host(self.0.ptr.cast()) };
    }
}

/// Idle lent blocks kept for reuse, at most this many bytes (the rest are freed).
const LENT_POOL_BYTES: usize = 1 << 30;

/// Bytes of page-locked memory in lent blocks: held by results, by a workspace for its next
/// batch, or idle in [`LENT_POOL`]. A block is taken only while this stays within
/// [`super::lent_max`]; past it a batch's results are copied out of the workspace's buffer.
static LENT_BYTES: LentBudget = LentBudget::new();

/// A count of bytes against a ceiling given at each take: a take that would pass it is
/// refused, and counts nothing.
struct LentBudget(AtomicUsize);

impl LentBudget {
    const fn new() -> Self {
        LentBudget(AtomicUsize::new(0))
    }

    /// Counts `bytes` if the count stays within `max`; `false` (nothing counted) otherwise.
    fn try_take(&self, bytes: usize, max: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(bytes).filter(|&after| after <= max)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn bytes(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// Bytes of page-locked memory in lent blocks now (see [`LentPinned`]).
pub(super) fn lent_bytes_now() -> usize {
    LENT_BYTES.bytes()
}

/// Page-locked blocks returned by the Arrow buffers they were lent to: (address, bytes,
/// device address or 0 when not asked for yet).
static LENT_POOL: Mutex<Vec<(usize, usize, u64)>> = Mutex::new(Vec::new());

/// A page-locked block lent to Arrow buffers: a batch's results land in it (copied from the
/// device, or written there by a kernel through its mapped address) and go to the caller as
/// they are, with no host copy (a fresh `Vec` of that size costs its page faults: ~10 ms for
/// 110 MB of results). Dropping the last buffer that holds it puts the block back in
/// [`LENT_POOL`] for a later batch. Lent blocks, pooled ones included, add up to at most
/// [`super::lent_max`] bytes ([`LENT_BYTES`]): a caller keeping many results would otherwise
/// pin host memory without bound.
pub(super) struct LentPinned(HostBlock);

// SAFETY: the block is plain host memory owned by this value; Arrow only reads it through
// the buffers it lends, after the device's writes into it have completed.
unsafe impl Send for LentPinned {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for LentPinned {}
impl std::panic::RefUnwindSafe for LentPinned {}

impl std::ops::Deref for LentPinned {
    type Target = HostBlock;
    fn deref(&self) -> &HostBlock {
        &self.0
    }
}

impl std::ops::DerefMut for LentPinned {
    fn deref_mut(&mut self) -> &mut HostBlock {
        &mut self.0
    }
}

impl LentPinned {
    /// A block of at least `bytes` bytes: a pooled one not more than twice as large (plus
    /// 64 MiB), else a new allocation; `None` when a new block would take the lent blocks
    /// past [`super::lent_max`] (the caller copies its results out instead).
    pub(super) fn take(bytes: usize) -> Result<Option<Self>, GpuError> {
        let bytes = bytes.max(ALIGN);
        let max = super::lent_max();
        if LENT_BYTES.bytes() > max {
            // The ceiling was lowered: the idle blocks go first.
            free_idle_lent();
        }
        if let Ok(mut pool) = LENT_POOL.lock()
            && let Some(i) = pool
                .iter()
                .enumerate()
                .filter(|(_, (_, b, _))| *b >= bytes && *b <= 2 * bytes + (64 << 20))
                .min_by_key(|(_, (_, b, _))| *b)
                .map(|(i, _)| i)
        {
            // Counted already (a pooled block is a lent one).
            let (ptr, bytes, dev) = pool.swap_remove(i);
            return Ok(Some(LentPinned(HostBlock {
                ptr: ptr as *mut u8,
                bytes,
                dev,
            })));
        }
        let grown = bytes + bytes / 4;
        if !LENT_BYTES.try_take(grown, max) {
            // The idle pooled blocks count too: free them and look again.
            free_idle_lent();
            if !LENT_BYTES.try_take(grown, max) {
                return Ok(None);
            }
        }
        let Some(ptr) = alloc_pinned(grown) else {
            LENT_BYTES.give_back(grown);
            return Err(GpuError::OutOfMemory("pinned allocation"));
        };
        Ok(Some(LentPinned(HostBlock {
            ptr,
            bytes: grown,
            dev: 0,
        })))
    }

    /// An Arrow buffer over `len` bytes of the block from byte `at`, holding the block.
    ///
    /// # Safety
    /// `at` must be aligned for the values the buffer will be read as, `at + len` within
    /// the block, those bytes fully written, and nothing may write the block any more.
    pub(super) unsafe fn buffer(block: &Arc<Self>, at: usize, len: usize) -> Buffer {
        assert!(at.checked_add(len).is_some_and(|end| end <= block.bytes));
        // SAFETY: within the block (asserted), non-null (a live allocation); the caller's
        // contract for the contents; the `Arc` keeps the block alive (and out of the pool)
        // for as long as the buffer lives.
        unsafe {
            Buffer::from_custom_allocation(
                std::ptr::NonNull::new_unchecked(block.ptr.add(at)),
                len,
                Arc::clone(block) as Arc<dyn datafusion::arrow::alloc::Allocation>,
            )
        }
    }
}

/// Frees the idle blocks of [`LENT_POOL`].
fn free_idle_lent() {
    let idle = LENT_POOL
        .lock()
        .map(|mut pool| std::mem::take(&mut *pool))
        .unwrap_or_default();
    for (ptr, bytes, _) in idle {
        free_pinned(ptr as *mut u8);
        LENT_BYTES.give_back(bytes);
    }
}

impl Drop for LentPinned {
    fn drop(&mut self) {
        let (ptr, bytes, dev) = (self.0.ptr, self.0.bytes, self.0.dev);
        if let Ok(mut pool) = LENT_POOL.lock() {
            let idle: usize = pool.iter().map(|(_, b, _)| b).sum();
            // Pooled only within the ceiling as it is now (it may have been lowered).
            if idle + bytes <= LENT_POOL_BYTES && LENT_BYTES.bytes() <= super::lent_max() {
                pool.push((ptr as usize, bytes, dev));
                return;
            }
        }
        free_pinned(ptr);
        LENT_BYTES.give_back(bytes);
    }
}

/// How a `wmerge` step sizes its pieces of A positions. The step's A total is known only on
/// the device (a later step's A is the previous step's matches), so the kernels choose
/// (`wpiece_of` in kernels/intersect.cu): `hi` positions, halved (never below `lo`) until the step
/// makes at least `per_sm` pieces per multiprocessor. Large pieces spread each piece's row
/// lookup and first search over more work; enough pieces keep every warp busy to the end of
/// the step (measured on an H200: kernels/NOTES.md, "A piece size per step").
/// `DFSETS_GPU_WPIECE` fixes the size (`lo` = `hi`), `DFSETS_GPU_WPIECE_MIN` / `_MAX` /
/// `_PER_SM` set the rule's terms (experiments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WPieces {
    lo: u32,
    hi: u32,
    per_sm: u32,
}

impl WPieces {
    fn from_env() -> Self {
        let size = |v: &str| env_u32(v).filter(|p| (32..=65_536).contains(p));
        let (lo, hi) = match size("DFSETS_GPU_WPIECE") {
            Some(p) => (p, p),
            None => {
                let hi = size("DFSETS_GPU_WPIECE_MAX").unwrap_or(WPIECE_MAX);
                (
                    size("DFSETS_GPU_WPIECE_MIN").unwrap_or(WPIECE_MIN).min(hi),
                    hi,
                )
            }
        };
        let per_sm = env_u32("DFSETS_GPU_WPIECE_PER_SM")
            .filter(|w| (1..=65_536).contains(w))
            .unwrap_or(WPIECES_PER_SM);
        WPieces { lo, hi, per_sm }
    }

    /// The pieces of any step whose A holds at most `cap` positions, `want` wanted: the
    /// kernels' size keeps halving only while the pieces are fewer than `want`, so a step makes
    /// fewer than 2 `want` of them unless its size stayed `hi` (then at most `cap / hi`), and
    /// never more than pieces of `lo` would make (a small call launches few warps).
    fn pieces_max(&self, cap: u64, want: u64) -> u64 {
        let halved = if self.lo < self.hi { 2 * want } else { 0 };
        cap.div_ceil(u64::from(self.hi))
            .max(halved)
            .min(cap.div_ceil(u64::from(self.lo)))
            .max(1)
    }
}

/// Pooled memory: named device buffers and two pinned staging buffers, each grown when a
/// batch needs more and kept for the next one (never allocated per batch once large enough).
#[derive(Default)]
pub(super) struct Workspace {
    dev: Vec<(&'static str, DevBuf)>,
    pub(super) pin_in: Option<Pinned>,
    pub(super) pin_out: Option<Pinned>,
    /// A second upload buffer (the BM25 batch's blocks, laid out after its queries).
    pub(super) pin_items: Option<Pinned>,
    /// A block the next `topk_bm25` batch's answers are packed into, then lent to its result
    /// (taken from the pool when a batch needs one; see `bm25::packed_on_host`).
    pub(super) pin_lent: Option<LentPinned>,
    /// Bytes of input values per launch group (halved when memory runs out).
    budget: usize,
    /// List columns kept on the device between calls (`sets.gpu_resident_columns`).
    columns: ColumnCache<ResidentCol>,
    /// The last epoch given to a launch with look-back states (see [`Workspace::epoch`]).
    epoch: u32,
    /// `wmerge` calls' and `topk_bm25` batches' launches in one submission (see
    /// [`LaunchGraph`]).
    pub(super) graph: LaunchGraph,
    /// The events a graph records before its first kernel and after its last (made once;
    /// after `graph`, so that they outlive its graphs).
    span: Option<(CudaEvent, CudaEvent)>,
}

/// Epochs fit the top 24 bits of a look-back state word (`st_word` in kernels/intersect.cu).
const EPOCH_LIMIT: u32 = 1 << 24;

// SAFETY: the raw pointers are owned allocations, only touched under the workspace mutex.
unsafe impl Send for Workspace {}

impl Workspace {
    /// A device buffer of at least `bytes` bytes under `name` (contents undefined).
    pub(super) fn dev(
        &mut self,
        name: &'static str,
        bytes: usize,
    ) -> Result<sys::CUdeviceptr, GpuError> {
        let bytes = bytes.max(ALIGN);
        if let Some(i) = self.dev.iter().position(|(n, _)| *n == name) {
            if self.dev[i].1.bytes >= bytes {
                return Ok(self.dev[i].1.ptr);
            }
            self.dev.swap_remove(i);
        }
        let grown = bytes + bytes / 4;
        if fault::armed(Fault::OutOfMemory) {
            return Err(GpuError::OutOfMemory("device allocation"));
        }
        // SAFETY: plain allocation; the context is bound by the caller.
        let ptr = unsafe { result::malloc_sync(grown) }.map_err(drv("device allocation"))?;
        self.dev.push((name, DevBuf { ptr, bytes: grown }));
        Ok(ptr)
    }

    /// A device buffer of look-back states (kernels/intersect.cu, "Decoupled look-back") of at
    /// least `bytes` bytes: cleared on the stream when it is (re)allocated, never per launch
    /// (each launch reads only the words of its own epoch).
    fn states(
        &mut self,
        name: &'static str,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<sys::CUdeviceptr, GpuError> {
        let known = self
            .dev
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b.ptr);
        let ptr = self.dev(name, bytes)?;
        if known != Some(ptr) {
            let len = self
                .dev
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, b)| b.bytes);
            // SAFETY: `ptr` was just allocated with `len` bytes.
            unsafe { result::memset_d8_async(ptr, 0, len, stream) }.map_err(drv("memset"))?;
        }
        Ok(ptr)
    }

    /// The epoch of the next launch that uses look-back states (1 to 2^24 - 1). When the
    /// numbers run out every state buffer is cleared and they start again, so that a word
    /// left by a launch 2^24 epochs ago can never pass for one of the new launch.
    fn epoch(&mut self, stream: sys::CUstream) -> Result<u32, GpuError> {
        self.epoch += 1;
        if self.epoch >= EPOCH_LIMIT {
            self.epoch = 1;
            for (name, b) in &self.dev {
                if name.ends_with("_states") {
                    // SAFETY: the buffer holds `b.bytes` bytes.
                    unsafe { result::memset_d8_async(b.ptr, 0, b.bytes, stream) }
                        .map_err(drv("memset"))?;
                }
            }
        }
        Ok(self.epoch)
    }

    pub(super) fn pinned(slot: &mut Option<Pinned>, bytes: usize) -> Result<&mut Pinned, GpuError> {
        let bytes = bytes.max(ALIGN);
        if slot.as_ref().is_none_or(|p| p.bytes < bytes) {
            *slot = None;
            let grown = bytes + bytes / 4;
            if fault::armed(Fault::PinnedOutOfMemory) {
                return Err(GpuError::OutOfMemory("pinned allocation"));
            }
            // SAFETY: plain page-locked allocation; the context is bound by the caller.
            let ptr = unsafe { result::malloc_host(grown, 0) }.map_err(drv("pinned allocation"))?;
            *slot = Some(Pinned(HostBlock {
                ptr: ptr.cast(),
                bytes: grown,
                dev: 0,
            }));
        }
        slot.as_mut()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))
    }

    pub(super) fn clear(&mut self) {
        self.dev.clear();
        self.pin_in = None;
        self.pin_out = None;
        self.pin_items = None;
        self.pin_lent = None;
        self.columns.clear();
    }
}

/// The process's GPU: context, stream, kernels and memory pools.
pub(super) struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    kernels: Kernels,
    pub(super) info: DeviceInfo,
    /// Threads of a merge block; its tile is `merge_threads * merge_items` path positions.
    merge_threads: u32,
    merge_items: u32,
    /// How a `wmerge` step sizes its pieces.
    wpieces: WPieces,
    /// `wplace` blocks per multiprocessor at most (`WPLACE_BLOCKS_PER_SM`;
    /// `DFSETS_GPU_WPLACE_PER_SM`, 0 = one warp per piece the step can have, as `wmerge`).
    wplace_per_sm: u32,
    /// A `wmerge` call's and a `topk_bm25` batch's launches go through the workspace's kernel
    /// graph (`graph.rs`) unless `DFSETS_GPU_GRAPH=0` (measurements).
    pub(super) graphs: bool,
    pub(super) workspace: Mutex<Workspace>,
    /// Set after a fault that may have left the context unusable.
    broken: Mutex<Option<String>>,
    broken_flag: AtomicBool,
}

static GPU: OnceLock<Result<Gpu, GpuError>> = OnceLock::new();

pub(super) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The process's GPU even after a fault turned the backend off (to free what it holds).
fn gpu_any() -> Result<&'static Gpu, GpuError> {
    GPU.get()
        .ok_or(GpuError::NoDevice)?
        .as_ref()
        .map_err(Clone::clone)
}

pub(super) fn gpu() -> Result<&'static Gpu, GpuError> {
    let g = GPU
        .get_or_init(|| {
            let r = catch_unwind(init).unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
            if let Err(e) = &r {
                log::debug!("datafusion-sets: GPU backend unavailable, using the CPU: {e}");
            }
            r
        })
        .as_ref()
        .map_err(Clone::clone)?;
    if g.broken_flag.load(Ordering::Acquire) {
        let why = g
            .broken
            .lock()
            .map(|b| b.clone().unwrap_or_default())
            .unwrap_or_default();
        return Err(GpuError::Broken(why));
    }
    Ok(g)
}

fn init() -> Result<Gpu, GpuError> {
    if std::env::var_os("DFSETS_DISABLE_GPU").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(GpuError::Disabled);
    }
    // SAFETY: only tries to open the shared libraries.
    if fault::armed(Fault::NoDriver) || !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    // SAFETY: as above.
    if fault::armed(Fault::NoNvrtc) || !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    result::init().map_err(drv("cuInit"))?;
    let count = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    if count < 1 || fault::armed(Fault::NoDevice) {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(0).map_err(drv("context creation"))?;
    // SAFETY: every buffer of this module lives on the one stream below, and the workspace
    // keeps each alive until the stream is synchronized; no cross-stream tracking is needed.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(drv("compute capability"))?;
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    let started = Instant::now();
    // Experiments only (kernels/NOTES.md): `DFSETS_GPU_MERGE_THREADS` (64, 128 or 256) and
    // `DFSETS_GPU_MERGE_ITEMS` (4, 8, 12 or 16; tiles of at most 2,048 positions, so that the
    // 64-bit kernels' shared memory stays under 48 KB) shape the merge block,
    // `DFSETS_GPU_MERGE_MINB` sets the blocks per multiprocessor its 32-bit kernels are
    // compiled for; one binary then measures the variants side by side.
    let (merge_threads, merge_items) = match (
        env_u32("DFSETS_GPU_MERGE_THREADS").filter(|t| [64, 128, 256].contains(t)),
        env_u32("DFSETS_GPU_MERGE_ITEMS").filter(|i| [4, 8, 12, 16].contains(i)),
    ) {
        (t, i) if t.unwrap_or(MERGE_THREADS) * i.unwrap_or(MERGE_ITEMS) <= 2048 => {
            (t.unwrap_or(MERGE_THREADS), i.unwrap_or(MERGE_ITEMS))
        }
        _ => (MERGE_THREADS, MERGE_ITEMS),
    };
    let mut defines = vec![
        format!("-DTHREADS={merge_threads}"),
        format!("-DITEMS={merge_items}"),
    ];
    if let Some(b) = env_u32("DFSETS_GPU_MERGE_MINB").filter(|b| (1..=32).contains(b)) {
        defines.push(format!("-DMINB32={b}"));
    }
    // The same for `wmerge`: its pieces (`WPieces::from_env`) and blocks per multiprocessor
    // (`DFSETS_GPU_WMINB`).
    let wpieces = WPieces::from_env();
    let wminb = env_u32("DFSETS_GPU_WMINB")
        .filter(|b| (1..=8).contains(b))
        .unwrap_or(WMINB);
    defines.push(format!("-DWMINB={wminb}"));
    // plan_scan's blocks are the per-row kernels' (`PSCAN`, its launch bounds).
    defines.push(format!("-DPSCAN={ROW_THREADS}"));
    // Experiments only: `DFSETS_GPU_INTERSECT_SOURCE` names another intersect.cu (same kernel
    // signatures) to compile instead of the embedded one, so that kernel variants are measured
    // side by side by one binary; `DFSETS_GPU_LINEINFO=1` adds line info for the profiler.
    if std::env::var_os("DFSETS_GPU_LINEINFO").is_some_and(|v| v == "1") {
        defines.push("--generate-line-info".to_string());
    }
    let source_override = source_from_env("DFSETS_GPU_INTERSECT_SOURCE")?;
    let source = source_override.as_deref().unwrap_or(SOURCE);
    let module = compile_module(&ctx, arch, source, "intersect.cu", defines)?;
    let f = |name: &str| module.load_function(name).map_err(drv("kernel lookup"));
    let kernels = Kernels {
        plan_o32: f("plan_o32")?,
        plan_o64: f("plan_o64")?,
        plan_scan_o32: f("plan_scan_o32")?,
        plan_scan_o64: f("plan_scan_o64")?,
        scan_partials: f("scan_partials")?,
        scan_partials_single: f("scan_partials_single")?,
        scan_apply: f("scan_apply")?,
        compact_rows: f("compact_rows")?,
        partition: [
            f("partition_u32")?,
            f("partition_i32")?,
            f("partition_u64")?,
            f("partition_i64")?,
        ],
        merge: [
            f("merge_u32")?,
            f("merge_i32")?,
            f("merge_u64")?,
            f("merge_i64")?,
        ],
        merge_known: [
            f("merge_known_u32")?,
            f("merge_known_i32")?,
            f("merge_known_u64")?,
            f("merge_known_i64")?,
        ],
        wmerge: [
            f("wmerge_u32")?,
            f("wmerge_i32")?,
            f("wmerge_u64")?,
            f("wmerge_i64")?,
        ],
        wplace: [f("wplace_32")?, f("wplace_64")?],
        gather: [f("gather_32")?, f("gather_64")?],
        row_order: [
            [f("row_order_u32_o32")?, f("row_order_u32_o64")?],
            [f("row_order_i32_o32")?, f("row_order_i32_o64")?],
            [f("row_order_u64_o32")?, f("row_order_u64_o64")?],
            [f("row_order_i64_o32")?, f("row_order_i64_o64")?],
        ],
        trap: f("fault_trap")?,
    };
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(drv("device attribute"))?
        .max(1) as u32;
    let stream = ctx.new_stream().map_err(drv("stream creation"))?;
    let info = DeviceInfo {
        name: ctx.name().map_err(drv("device name"))?,
        compute_capability: (major, minor),
        total_memory: ctx.total_mem().map_err(drv("device memory"))?,
        multiprocessors: sms,
    };
    log::debug!(
        "datafusion-sets: GPU backend on {} (sm_{major}{minor}, {} SMs), kernels compiled in {:.0} ms",
        info.name,
        sms,
        started.elapsed().as_secs_f64() * 1e3
    );
    // Input bytes per launch group; `DFSETS_GPU_LAUNCH_BYTES` sets it (at least 16 MiB), so
    // that tests can split batches into many groups.
    let budget = std::env::var("DFSETS_GPU_LAUNCH_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(info.total_memory / 8)
        .clamp(MIN_BUDGET, 4 << 30);
    LAUNCH_BYTES.store(budget, Ordering::Relaxed);
    Ok(Gpu {
        ctx,
        stream,
        kernels,
        info,
        merge_threads,
        merge_items,
        wpieces,
        wplace_per_sm: env_u32("DFSETS_GPU_WPLACE_PER_SM").unwrap_or(WPLACE_BLOCKS_PER_SM),
        graphs: env_u32("DFSETS_GPU_GRAPH") != Some(0),
        workspace: Mutex::new(Workspace {
            budget,
            ..Default::default()
        }),
        broken: Mutex::new(None),
        broken_flag: AtomicBool::new(false),
    })
}

/// The device the backend runs on (initializing it on first call).
pub fn device() -> Result<DeviceInfo, GpuError> {
    gpu().map(|g| g.info.clone())
}

/// A kernel parameter: the address of a value that outlives the launch call.
pub(super) fn arg<T>(x: &T) -> *mut c_void {
    (x as *const T).cast_mut().cast()
}

impl Gpu {
    /// Merge-path positions per tile.
    fn tile(&self) -> u64 {
        u64::from(self.merge_threads * self.merge_items)
    }

    /// The pieces wanted per `wmerge` step on this device (the kernels' `wwant`).
    fn wwant(&self) -> u64 {
        u64::from(self.info.multiprocessors) * u64::from(self.wpieces.per_sm)
    }

    pub(super) fn mark_broken(&self, why: &GpuError) {
        if let Ok(mut b) = self.broken.lock() {
            *b = Some(why.to_string());
        }
        self.broken_flag.store(true, Ordering::Release);
        log::debug!("datafusion-sets: GPU backend off for this process: {why}");
    }

    /// Launch `f` on the stream.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number and types, and every device
    /// pointer among them must be valid for the accesses the kernel makes.
    pub(super) unsafe fn launch(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.launch_raw(f.cu_function(), grid, block, params) }
    }

    /// Launch `l` on the stream.
    ///
    /// # Safety
    /// As [`Gpu::launch`]: `l`'s arguments match its kernel's parameter list, and every device
    /// pointer among them is valid for the accesses the kernel makes.
    pub(super) unsafe fn launch_words(&self, l: &Launch) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller's contract; the addresses point at `l`'s words.
        unsafe { self.launch_raw(l.f, l.grid, l.block, &mut l.addrs()) }
    }

    /// # Safety
    /// As [`Gpu::launch`].
    unsafe fn launch_raw(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe {
            result::launch_kernel(
                f,
                (grid.max(1), 1, 1),
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                params,
            )
        }
        .map_err(drv("kernel launch"))
    }

    pub(super) fn event(&self) -> Result<CudaEvent, GpuError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))
    }

    /// Wait until everything queued on `stream` is done, asleep: an event with blocking
    /// sync, where a stream synchronize spins the calling thread's core at full load (the
    /// driver's default with one context on a many-core host). For the similarity join's
    /// waits, while the other partitions' threads filter on the host's cores.
    pub(super) fn wait_asleep(&self, stream: &CudaStream) -> Result<(), GpuError> {
        self.inject_kernel_fault(stream)?;
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(drv("event"))?;
        e.record(stream).map_err(drv("event record"))?;
        e.synchronize().map_err(drv("event synchronize"))
    }

    pub(super) fn record(&self, e: &CudaEvent) -> Result<(), GpuError> {
        e.record(&self.stream).map_err(drv("event record"))
    }

    pub(super) fn sync(&self) -> Result<(), GpuError> {
        self.inject_kernel_fault(&self.stream)?;
        self.stream.synchronize().map_err(drv("stream synchronize"))
    }

    /// With [`Fault::Kernel`] armed, queues a kernel that traps on `stream`: the wait that
    /// follows sees a real launch failure, and the context is lost for the process.
    fn inject_kernel_fault(&self, stream: &CudaStream) -> Result<(), GpuError> {
        if !fault::armed(Fault::Kernel) {
            return Ok(());
        }
        log::debug!("datafusion-sets: injecting a kernel fault (DFSETS_GPU_FAULT=kernel)");
        // SAFETY: `fault_trap` takes no parameters; the launch is asynchronous on `stream`.
        unsafe {
            result::launch_kernel(
                self.kernels.trap.cu_function(),
                (1, 1, 1),
                (1, 1, 1),
                0,
                stream.cu_stream(),
                &mut [],
            )
        }
        .map_err(drv("kernel launch"))
    }

    /// Exclusive scan of `n` u64 at `input` into `n + 1` u64 at `out`.
    fn scan(&self, ws: &mut Workspace, input: u64, n: u64, out: u64) -> Result<(), GpuError> {
        let blocks = n.div_ceil(SCAN_SEG);
        let partials = ws.dev("scan_partials", (blocks as usize) * 8)?;
        let k = &self.kernels;
        // SAFETY: parameters match the kernels in kernels/intersect.cu; `input` holds `n`,
        // `out` `n + 1` and `partials` `blocks` u64.
        unsafe {
            self.launch(
                &k.scan_partials,
                blocks as u32,
                SCAN_THREADS,
                &mut [arg(&input), arg(&n), arg(&partials)],
            )?;
            self.launch(
                &k.scan_partials_single,
                1,
                SCAN_THREADS,
                &mut [arg(&partials), arg(&blocks)],
            )?;
            self.launch(
                &k.scan_apply,
                blocks as u32,
                SCAN_THREADS,
                &mut [arg(&input), arg(&n), arg(&partials), arg(&out)],
            )?;
        }
        Ok(())
    }
}

/// View of a slice of plain integers as bytes.
pub(super) fn bytes_of<T: Copy + 'static>(s: &[T]) -> &[u8] {
    // SAFETY: callers pass slices of primitive integers (no padding, every byte initialized);
    // the byte view covers exactly the slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// Views of the pinned byte buffers as the kernel's element types.
///
/// SAFETY (both): `T` is one of u32, u64, f64 (every bit pattern valid, no padding); the
/// regions start at multiples of 256 bytes in page-aligned pinned buffers (asserted).
pub(super) fn view<T: Copy>(bytes: &[u8]) -> &[T] {
    // SAFETY: see above.
    let (pre, mid, _) = unsafe { bytes.align_to::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}
pub(super) fn view_mut<T: Copy>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: see `view`.
    let (pre, mid, _) = unsafe { bytes.align_to_mut::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}

/// Copy `src` into `dst` (same length), with several threads past two pieces. One core
/// copies about 8 GB/s into pinned memory: with 8 MiB pieces a batch of 8192 W1 rows (7 MB a
/// list) was staged on one thread, 75% of its call (kernels/NOTES.md); 1 MiB pieces spread it.
fn par_copy(dst: &mut [u8], src: &[u8]) {
    const PIECE: usize = 1 << 20;
    if src.len() < 2 * PIECE {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}

/// Offsets `r0..=r1` of one list as raw bytes.
fn offsets_bytes<'a>(o: &HostOffsets<'a>, r0: usize, r1: usize) -> &'a [u8] {
    match o {
        HostOffsets::I32(s) => bytes_of(&s[r0..=r1]),
        HostOffsets::I64(s) => bytes_of(&s[r0..=r1]),
    }
}

/// The end of the launch group starting at row `r0`: as many rows as fit `budget_elems`
/// input values (at least one row). Values per row group are monotone in the end row, so
/// this is a binary search over the offsets (no per-row work).
fn chunk_end<T>(
    lists: &[HostList<'_, T>],
    r0: usize,
    n: usize,
    budget_elems: usize,
    max_rows: usize,
) -> usize {
    let vals = |r1: usize| -> usize {
        lists
            .iter()
            .map(|l| l.offsets.at(r1) - l.offsets.at(r0))
            .sum()
    };
    let hi_cap = n.min(r0.saturating_add(max_rows));
    if vals(hi_cap) <= budget_elems {
        return hi_cap;
    }
    let (mut lo, mut hi) = (r0 + 1, hi_cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if vals(mid) <= budget_elems {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    lo
}

/// Piece size of a column's upload through the two pinned staging buffers.
const UPLOAD_PIECE: usize = 8 << 20;

/// The default budget of resident columns: `DFSETS_GPU_COLUMN_BUDGET` bytes, else a quarter
/// of the device's memory.
fn default_column_budget(g: &Gpu) -> usize {
    std::env::var("DFSETS_GPU_COLUMN_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(g.info.total_memory / 4)
}

/// A list column kept on the device: one allocation holding its values buffer (at 0), its
/// offsets buffer (at `offs_at`) and, when known, the order of its rows.
pub(super) struct ResidentCol {
    buf: DevBuf,
    order: Option<RowOrder>,
}

/// Where a resident column's row-order flags are (one byte per entry of the offsets buffer but
/// the last, 1 = the row is strictly increasing) and what they were computed for: the child
/// values starting `v_shift` bytes into the values buffer, compared as elements of kind
/// `variant` ([`elem_index`]). A call that reads the buffers otherwise does not use them.
#[derive(Clone, Copy)]
struct RowOrder {
    at: usize,
    v_shift: usize,
    variant: usize,
}

/// What [`upload_column`] computes the row order for: the element kind, the offset width in
/// bytes and the byte shift of the child values in the values buffer.
struct OrderOf {
    variant: usize,
    osz: usize,
    v_shift: usize,
}

/// Copy a column's values and offsets buffers into one new device allocation (values at 0,
/// offsets at `offs_at`), in pieces staged through the two pinned buffers so that staging a
/// piece overlaps the copy of the one before; then, with `order`, find which of its rows are
/// strictly increasing (`row_order`, a streaming pass on the device; not when the offsets
/// address values outside the buffer).
fn upload_column(
    g: &Gpu,
    pins: [&mut Option<Pinned>; 2],
    values: &[u8],
    offsets: &[u8],
    offs_at: usize,
    order: Option<OrderOf>,
) -> Result<ResidentCol, GpuError> {
    let esz_of = |variant: usize| if variant < 2 { 4 } else { 8 };
    // Rows of the offsets buffer whose order is computed, and where the flags go.
    let order = order.and_then(|o| {
        let rows = (offsets.len() / o.osz).checked_sub(1).filter(|&r| r > 0)?;
        let entry = |i: usize| -> Option<usize> {
            let b = &offsets[i * o.osz..(i + 1) * o.osz];
            let v = if o.osz == 4 {
                i64::from(i32::from_le_bytes(b.try_into().ok()?))
            } else {
                i64::from_le_bytes(b.try_into().ok()?)
            };
            usize::try_from(v).ok()
        };
        let (first, last) = (entry(0)?, entry(rows)?);
        let esz = esz_of(o.variant);
        let room = values.len().checked_sub(o.v_shift)? / esz;
        (o.v_shift % esz == 0 && first <= last && last <= room).then_some((o, rows))
    });
    let ord_at = align(offs_at + offsets.len());
    let bytes = match order {
        Some((_, rows)) => ord_at + rows,
        None => offs_at + offsets.len(),
    }
    .max(ALIGN);
    if fault::armed(Fault::OutOfMemory) {
        return Err(GpuError::OutOfMemory("resident column allocation"));
    }
    // SAFETY: plain allocation; the context is bound by the caller.
    let ptr = unsafe { result::malloc_sync(bytes) }.map_err(drv("resident column allocation"))?;
    let buf = DevBuf { ptr, bytes };
    let events = [g.event()?, g.event()?];
    let mut in_flight = [false; 2];
    let pieces = values
        .chunks(UPLOAD_PIECE)
        .enumerate()
        .map(|(i, p)| (i * UPLOAD_PIECE, p))
        .chain(
            offsets
                .chunks(UPLOAD_PIECE)
                .enumerate()
                .map(|(i, p)| (offs_at + i * UPLOAD_PIECE, p)),
        );
    for (i, (at, piece)) in pieces.enumerate() {
        let slot = i % 2;
        if in_flight[slot] {
            events[slot]
                .synchronize()
                .map_err(drv("event synchronize"))?;
        }
        let pin = Workspace::pinned(&mut *pins[slot], piece.len())?;
        par_copy(&mut pin.as_mut_slice()[..piece.len()], piece);
        // SAFETY: `ptr + at .. + piece.len()` lies inside the allocation above; the pinned
        // source is not written again before this copy's event has completed (checked above)
        // and outlives the stream synchronize below.
        unsafe {
            result::memcpy_htod_async(
                ptr + at as u64,
                &pin.as_slice()[..piece.len()],
                g.stream.cu_stream(),
            )
        }
        .map_err(drv("host-to-device copy"))?;
        events[slot]
            .record(&g.stream)
            .map_err(drv("event record"))?;
        in_flight[slot] = true;
    }
    let order = match order {
        Some((o, rows)) => {
            let flags = ptr + ord_at as u64;
            let vals = ptr + o.v_shift as u64;
            let offs = ptr + offs_at as u64;
            let rows64 = rows as u64;
            let threads = ROW_THREADS;
            let blocks = (values.len() / esz_of(o.variant))
                .div_ceil(threads as usize)
                .clamp(1, g.info.multiprocessors as usize * 32) as u32;
            // SAFETY: `flags` holds `rows` bytes of the allocation; the kernel reads the
            // offsets buffer's `rows + 1` entries and the values they address, which lie in
            // the values buffer (checked above: first <= last <= its elements past v_shift).
            unsafe {
                result::memset_d8_async(flags, 1, rows, g.stream.cu_stream())
                    .map_err(drv("memset"))?;
                g.launch(
                    &g.kernels.row_order[o.variant][usize::from(o.osz == 8)],
                    blocks,
                    threads,
                    &mut [arg(&vals), arg(&offs), arg(&rows64), arg(&flags)],
                )?;
            }
            Some(RowOrder {
                at: ord_at,
                v_shift: o.v_shift,
                variant: o.variant,
            })
        }
        None => None,
    };
    g.sync()?;
    Ok(ResidentCol { buf, order })
}

/// Device addresses of a list argument kept on the device: its first value, its first offset
/// (the call's `values[0]` and `offsets[0]`; 0 when only the values are kept and the call's
/// offsets are staged) and its first row's order flag (0: not known).
type ResidentAt = Option<(u64, u64, u64)>;

/// Whether the call stages list `r`'s offsets (not kept on the device with its values).
fn stages_offsets(r: &ResidentAt) -> bool {
    !matches!(r, Some((_, offs, _)) if *offs != 0)
}

/// Find or make resident the list columns of a call that can be (see
/// [`columns::placement`]). The rest (and every column after an upload error) are staged.
fn resident_columns<T: SetElem>(
    g: &Gpu,
    ws: &mut Workspace,
    variant: usize,
    lists: &[HostList<'_, T>],
    budget: usize,
    t: &mut Timings,
) -> Vec<ResidentAt> {
    let with_order = super::known_order() != super::KnownOrder::Ignore;
    let stamp = ws.columns.begin_call();
    let mut failed = false;
    lists
        .iter()
        .map(|l| {
            let (vbuf, obuf) = l.column?;
            if failed {
                return None;
            }
            let Placement {
                key,
                v_shift,
                o_shift,
                osz,
                values_only,
            } = columns::placement(l)?;
            let offs_at = align(vbuf.len());
            // What is kept: values, offsets and a byte of row order per offset; or the values
            // alone (a slice of a larger batch: the call stages its offsets, whose address is
            // then 0, and row order is not known).
            let (bytes, offsets, order) = if values_only {
                (offs_at.max(ALIGN), &[][..], None)
            } else {
                let order = OrderOf {
                    variant,
                    osz,
                    v_shift,
                };
                let bytes = align(offs_at + obuf.len()) + obuf.len() / osz;
                (bytes, obuf.as_slice(), Some(order))
            };
            let at = |d: &ResidentCol| {
                let base = d.buf.ptr;
                if values_only {
                    return (base + v_shift as u64, 0, 0);
                }
                let ord = match d.order {
                    Some(o) if with_order && o.v_shift == v_shift && o.variant == variant => {
                        base + (o.at + o_shift / osz) as u64
                    }
                    _ => 0,
                };
                (
                    base + v_shift as u64,
                    base + (offs_at + o_shift) as u64,
                    ord,
                )
            };
            if let Some(d) = ws.columns.get(&key, stamp) {
                t.columns_reused += 1;
                return Some(at(d));
            }
            {
                let Workspace {
                    columns,
                    pin_in,
                    pin_out,
                    ..
                } = &mut *ws;
                let admitted = columns.admit(
                    key,
                    [vbuf.clone(), obuf.clone()],
                    bytes,
                    budget,
                    stamp,
                    || {
                        upload_column(
                            g,
                            [pin_in, pin_out],
                            vbuf.as_slice(),
                            offsets,
                            offs_at,
                            order,
                        )
                    },
                );
                match admitted {
                    Ok(Admitted::Now(d)) => {
                        let got = at(d);
                        t.columns_uploaded += 1;
                        t.h2d_bytes += (vbuf.len() + offsets.len()) as u64;
                        log::debug!(
                            "datafusion-sets: list column of {bytes} bytes kept on the device \
                             ({} columns, {} bytes resident)",
                            columns.len(),
                            columns.bytes()
                        );
                        Some(got)
                    }
                    Ok(Admitted::DoesNotFit) => None,
                    Err(e) => {
                        log::debug!(
                            "datafusion-sets: list column staged, not kept on the device: {e}"
                        );
                        failed = true;
                        None
                    }
                }
            }
        })
        .collect()
}

/// Input bytes per launch group (a copy of the workspace's budget, read without its lock); 0
/// before the device is set up.
static LAUNCH_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Tests only: the epoch the next launch with look-back states gets (from 1; at 2^24 the
/// numbers start again at 1 and the state buffers are cleared), so that a test can reach the
/// wrap-around in a few calls. No effect before the device is set up.
#[doc(hidden)]
pub fn set_next_epoch(next: u32) {
    if let Ok(g) = gpu() {
        let mut ws = g.workspace.lock().unwrap_or_else(|e| e.into_inner());
        ws.epoch = next.clamp(1, EPOCH_LIMIT) - 1;
    }
}

/// Why kernel graphs (one submission for a `wmerge` call's or a `topk_bm25` batch's
/// launches) were turned off in this process: the graph call that failed; `None` while they
/// are on (or before the device is set up). Tests and diagnostics.
pub fn kernel_graphs_off() -> Option<String> {
    let g = gpu().ok()?;
    let ws = g.workspace.lock().unwrap_or_else(|e| e.into_inner());
    ws.graph.off.clone()
}

/// Input value bytes one launch group of [`intersect`] takes at most (a batch past it is
/// split), `None` before the device is set up.
pub fn launch_group_bytes() -> Option<usize> {
    Some(LAUNCH_BYTES.load(Ordering::Relaxed)).filter(|&b| b > 0)
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
pub fn intersect<T: SetElem>(
    lists: &[HostList<'_, T>],
    validity: Option<RowValidity<'_>>,
    mode: Mode,
    columns_budget: Option<usize>,
    share_values: bool,
) -> Result<GpuOutput<T>, GpuError> {
    intersect_in(lists, validity, mode, columns_budget, share_values, false)
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
    intersect_in(
        lists,
        validity,
        mode,
        Some(columns_budget),
        share_values,
        true,
    )
}

fn intersect_in<T: SetElem>(
    lists: &[HostList<'_, T>],
    validity: Option<RowValidity<'_>>,
    mode: Mode,
    columns_budget: Option<usize>,
    share_values: bool,
    resident_only: bool,
) -> Result<GpuOutput<T>, GpuError> {
    let Some(variant) = elem_index::<T>() else {
        return Err(GpuError::Unsupported(format!("{}-bit elements", T::BITS)));
    };
    if lists.len() < 2 {
        return Err(GpuError::Unsupported("fewer than two lists".into()));
    }
    let n = lists[0].offsets.rows();
    for l in lists {
        let rows = l.offsets.rows();
        let (first, last) = if rows == n {
            (l.offsets.at(0), l.offsets.at(n))
        } else {
            (1, 0)
        };
        if rows != n || first > last || last > l.values.len() {
            return Err(GpuError::Unsupported(
                "list columns of different lengths or bad offsets".into(),
            ));
        }
    }
    if n > (u32::MAX as usize) - 1 {
        return Err(GpuError::Unsupported(
            "more than 2^32 - 2 rows in one batch".into(),
        ));
    }
    if let Some(v) = validity
        && v.bits.len() * 8 < v.bit_offset + n
    {
        return Err(GpuError::Unsupported(
            "validity bitmap shorter than the batch".into(),
        ));
    }
    let g = gpu()?;
    let started = Instant::now();
    let mut out = GpuOutput::<T> {
        offsets: Vec::with_capacity(n + 1),
        ..Default::default()
    };
    out.offsets.push(0);
    out.flagged = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    let mut ws = match g.workspace.lock() {
        Ok(ws) => ws,
        Err(poisoned) => {
            let mut ws = poisoned.into_inner();
            ws.clear();
            ws
        }
    };
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let esz = std::mem::size_of::<T>();
    let mut resident = match columns_budget {
        Some(b) => {
            let budget = if b == 0 { default_column_budget(g) } else { b };
            resident_columns(g, &mut ws, variant, lists, budget, &mut out.timings)
        }
        None => vec![None; lists.len()],
    };
    if resident_only && resident.iter().any(Option::is_none) {
        return Err(GpuError::Unsupported(
            "a list column is not on the device".into(),
        ));
    }
    let mut r0 = 0;
    while r0 < n {
        let budget_elems = (ws.budget / esz).max(1);
        let max_rows = (ws.budget / 64).max(1);
        let r1 = chunk_end(lists, r0, n, budget_elems, max_rows);
        let lend = share_values && mode == Mode::Values && r0 == 0 && r1 == n;
        let res = catch_unwind(AssertUnwindSafe(|| {
            run_chunk(
                g, &mut ws, variant, lists, &resident, validity, r0, r1, mode, lend, &mut out,
            )
        }))
        .unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
        match res {
            Ok(()) => r0 = r1,
            Err(GpuError::OutOfMemory(what)) => {
                // Free the pools, wait for the stream, and retry with half the input.
                let _ = g.sync();
                ws.clear();
                resident.iter_mut().for_each(|r| *r = None);
                if ws.budget <= MIN_BUDGET || r1 == r0 + 1 {
                    return Err(GpuError::OutOfMemory(what));
                }
                ws.budget /= 2;
                LAUNCH_BYTES.store(ws.budget, Ordering::Relaxed);
                log::debug!(
                    "datafusion-sets: GPU memory short ({what}); launch groups cut to {} bytes",
                    ws.budget
                );
            }
            Err(e) => {
                if matches!(
                    e,
                    GpuError::Kernel(_) | GpuError::Panic(_) | GpuError::Driver { .. }
                ) {
                    g.mark_broken(&e);
                }
                return Err(e);
            }
        }
    }
    out.any_flagged = out.flagged.iter().any(|&f| f);
    out.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}

/// One launch group: rows `r0..r1`, appended to `out`.
#[allow(clippy::too_many_arguments)]
fn run_chunk<T: SetElem>(
    g: &Gpu,
    ws: &mut Workspace,
    variant: usize,
    lists: &[HostList<'_, T>],
    resident: &[ResidentAt],
    validity: Option<RowValidity<'_>>,
    r0: usize,
    r1: usize,
    mode: Mode,
    lend: bool,
    out: &mut GpuOutput<T>,
) -> Result<(), GpuError> {
    let k = lists.len();
    let n = r1 - r0;
    let esz = std::mem::size_of::<T>();
    let osz = match lists[0].offsets {
        HostOffsets::I32(_) => 4,
        HostOffsets::I64(_) => 8,
    };
    if lists
        .iter()
        .any(|l| matches!(l.offsets, HostOffsets::I32(_)) != (osz == 4))
    {
        return Err(GpuError::Unsupported(
            "List and LargeList arguments mixed".into(),
        ));
    }

    // Layout of the input region, identical in pinned staging and on the device.
    let counts: Vec<usize> = lists
        .iter()
        .map(|l| l.offsets.at(r1) - l.offsets.at(r0))
        .collect();
    // Lists resident on the device have no section: the kernels read their copies.
    let mut val_at = Vec::with_capacity(k);
    let mut pos = 0usize;
    for (&c, r) in counts.iter().zip(resident) {
        val_at.push(pos);
        if r.is_none() {
            pos += align(c * esz);
        }
    }
    let mut off_at = Vec::with_capacity(k);
    for r in resident {
        off_at.push(pos);
        if stages_offsets(r) {
            pos += align((n + 1) * osz);
        }
    }
    let valid = validity.map(|v| {
        let first_bit = v.bit_offset + r0;
        let (b0, b1) = (first_bit / 8, (first_bit + n).div_ceil(8));
        (&v.bits[b0..b1], (first_bit % 8) as u64)
    });
    let valid_at = pos;
    pos += align(valid.map_or(0, |(b, _)| b.len()));
    let ptrs_at = pos;
    pos += align(k * 8);
    let bases_at = pos;
    pos += align(k * 8);
    let ords_at = pos;
    pos += align(k * 8);
    let in_bytes = pos;

    let cap = counts.iter().copied().min().unwrap_or(0);
    let max_b = counts.iter().copied().max().unwrap_or(0);
    let total_values: usize = counts.iter().sum();
    // Every list known increasing and the warp kernel asked for: `wmerge`'s pieces (each
    // step's size chosen by the kernels, see `WPieces`; A never holds more than `cap` values)
    // replace tiles. (A step's counts fit the look-back states' 38 bits: at most `cap`.)
    let warp = super::known_order() == super::KnownOrder::Warp
        && resident
            .iter()
            .all(|r| matches!(r, Some((_, _, ord)) if *ord != 0))
        && (cap as u64) < 1 << 38;
    let wp = g.wpieces;
    let wwant = g.wwant();
    let pieces_max = wp.pieces_max(cap as u64, wwant);
    // The tiles' (or pieces') counts and slots: every entry up to `tiles_max` is written by
    // the step's merge kernel before the scan and `gather` read it (the buffers are reused).
    // Tiles: every step's merge path is at most the shortest list's values (A: the row's
    // shortest list, or the previous step's result) plus the longest list's (B).
    let tiles_max = if warp {
        pieces_max
    } else {
        ((cap + max_b) as u64).div_ceil(g.tile()).max(1)
    };
    // The merge without the known-order code unless a list's row order is known.
    let merge = if resident
        .iter()
        .any(|r| matches!(r, Some((_, _, ord)) if *ord != 0))
    {
        &g.kernels.merge_known[variant]
    } else {
        &g.kernels.merge[variant]
    };
    let gather = &g.kernels.gather[usize::from(esz == 8)];
    let n64 = n as u64;

    // Device buffers.
    let d_in = ws.dev("in", in_bytes)?;
    let sel = ws.dev("sel", n * 4)?;
    let a_pos = ws.dev("a_pos", n * 8)?;
    let a_len = ws.dev("a_len", n * 8)?;
    let b_pos = ws.dev("b_pos", n * 8)?;
    let b_len = ws.dev("b_len", n * 8)?;
    let plen = ws.dev("plen", n * 8)?;
    let nz = ws.dev("nz", n * 8)?;
    let act_start = ws.dev("act_start", (n + 1) * 8)?;
    let row_cnt = ws.dev("row_cnt", n * 8)?;
    // The tile path's compaction of the rows with work (`wmerge`'s plan_scan places every row
    // itself), its tile descriptors and the scan of the tiles' counts; `wmerge` has none of
    // them (0: never passed to a kernel it launches), its steps' look-back states (per block
    // of plan_scan, per piece of wplace) instead.
    let (act_at, act_row, act_len, descs, tile_excl) = if warp {
        (0, 0, 0, 0, 0)
    } else {
        (
            ws.dev("act_at", (n + 1) * 8)?,
            ws.dev("act_row", n * 4)?,
            ws.dev("act_len", n * 8)?,
            ws.dev("descs", tiles_max as usize * DESC_BYTES)?,
            ws.dev("tile_excl", (tiles_max as usize + 1) * 8)?,
        )
    };
    let (row_states, piece_states) = if warp {
        let cs = g.stream.cu_stream();
        (
            ws.states("row_states", n.div_ceil(ROW_THREADS as usize) * 8, cs)?,
            ws.states("piece_states", pieces_max as usize * 8, cs)?,
        )
    } else {
        (0, 0)
    };
    let tile_cnt = ws.dev("tile_cnt", tiles_max as usize * 8)?;
    let tile_pos = ws.dev("tile_pos", tiles_max as usize * 8)?;
    // Matches of each tile before `gather` puts them in place (a step makes at most `cap`).
    let scratch = ws.dev("scratch", cap * esz)?;
    // err u32 @4, scratch top u64 @16, wmerge's piece size u32 @28
    let misc = ws.dev("misc", 64)?;
    let roff = [ws.dev("roff0", (n + 1) * 8)?, ws.dev("roff1", (n + 1) * 8)?];
    let res = if k > 2 {
        [ws.dev("res0", cap * esz)?, ws.dev("res1", cap * esz)?]
    } else {
        [0, 0]
    };
    // Output region: flags (n bytes) | offsets ((n + 1) u64) | values (cap elements).
    let flags_at = 0usize;
    let offs_out_at = align(n);
    let vals_out_at = offs_out_at + align((n + 1) * 8);
    let out_cap = vals_out_at + if mode == Mode::Values { cap * esz } else { 0 };
    let d_out = ws.dev("out", out_cap)?;

    // Stage the inputs into pinned memory: offsets, validity, pointer table and bases first
    // (they follow the value sections), then the values piece by piece, each piece's copy to
    // the device queued as soon as it is staged so that the copy of one overlaps the staging
    // of the next (`stage_piece() == 0`: everything staged, then one copy).
    let piece = super::stage_piece();
    let small_at = off_at.first().copied().unwrap_or(in_bytes);
    let (e0, e1, e2, e3, e4) = (g.event()?, g.event()?, g.event()?, g.event()?, g.event()?);
    // Around each step's merge kernels (partition and merge, or `wmerge` and `wplace`), for the
    // benchmarks' breakdown when they ask for it (`set_merge_marks`: each mark is one more
    // operation the host queues between the kernels, while the device may be waiting for the
    // next launch); made here, so that nothing but launches sits between the kernels.
    let merge_marks = if super::merge_marks() {
        (1..k)
            .map(|_| Ok((g.event()?, g.event()?)))
            .collect::<Result<Vec<_>, GpuError>>()?
    } else {
        Vec::new()
    };
    let mark = |step: u32, end: bool| -> Result<(), GpuError> {
        match merge_marks.get(step as usize - 1) {
            Some((m0, m1)) => g.record(if end { m1 } else { m0 }),
            None => Ok(()),
        }
    };
    let t_stage = Instant::now();
    {
        let pin = Workspace::pinned(&mut ws.pin_in, in_bytes)?.as_mut_slice();
        for (j, l) in lists.iter().enumerate() {
            if !stages_offsets(&resident[j]) {
                continue;
            }
            let ob = offsets_bytes(&l.offsets, r0, r1);
            pin[off_at[j]..off_at[j] + ob.len()].copy_from_slice(ob);
        }
        if let Some((bits, _)) = valid {
            pin[valid_at..valid_at + bits.len()].copy_from_slice(bits);
        }
        for j in 0..k {
            let first = lists[j].offsets.at(r0) as i64;
            // Values of list j live at element positions `base + offset` from `d_in`. A
            // resident copy holds the whole values buffer, so an offset indexes it as is (the
            // staged section starts at the group's first offset instead); it may lie below
            // `d_in` (a negative base; the device's 64-bit address arithmetic wraps back).
            // A resident list's row-order flags (0: not known; staged lists are checked).
            // Values kept alone: the staged offsets index the kept values as is.
            let (p, base, ord) = match resident[j] {
                Some((vals, 0, _)) => (
                    d_in + off_at[j] as u64,
                    (vals as i64).wrapping_sub(d_in as i64) / esz as i64,
                    0,
                ),
                Some((vals, offs, ord)) => (
                    offs + (r0 * osz) as u64,
                    (vals as i64).wrapping_sub(d_in as i64) / esz as i64,
                    if ord == 0 { 0 } else { ord + r0 as u64 },
                ),
                None => (d_in + off_at[j] as u64, (val_at[j] / esz) as i64 - first, 0),
            };
            pin[ptrs_at + 8 * j..ptrs_at + 8 * j + 8].copy_from_slice(&p.to_le_bytes());
            pin[bases_at + 8 * j..bases_at + 8 * j + 8].copy_from_slice(&base.to_le_bytes());
            pin[ords_at + 8 * j..ords_at + 8 * j + 8].copy_from_slice(&ord.to_le_bytes());
        }
        // SAFETY (copies): `d_in` holds `in_bytes` bytes; each pinned source range is written
        // before its copy is queued and never again until the stream is synchronized below
        // (the workspace owns the buffer).
        let cs = g.stream.cu_stream();
        let copy = |pin: &[u8], at: usize, len: usize| {
            unsafe { result::memcpy_htod_async(d_in + at as u64, &pin[at..at + len], cs) }
                .map_err(drv("host-to-device copy"))
        };
        let mut started = false;
        for (j, l) in lists.iter().enumerate() {
            if resident[j].is_some() {
                continue;
            }
            let (v0, v1) = (l.offsets.at(r0), l.offsets.at(r1));
            let src = bytes_of(&l.values[v0..v1]);
            let step = if piece == 0 { src.len().max(1) } else { piece };
            for (i, part) in src.chunks(step).enumerate() {
                let at = val_at[j] + i * step;
                par_copy(&mut pin[at..at + part.len()], part);
                if piece > 0 {
                    if !started {
                        g.record(&e0)?;
                        started = true;
                    }
                    copy(pin, at, part.len())?;
                }
            }
        }
        if piece == 0 {
            g.record(&e0)?;
            copy(pin, 0, in_bytes)?;
        } else {
            if !started {
                g.record(&e0)?;
            }
            copy(pin, small_at, in_bytes - small_at)?;
        }
    }
    let stage_ms = t_stage.elapsed().as_secs_f64() * 1e3;
    // `wmerge`'s launches are queued after the loop below in one submission (the workspace's
    // kernel graph), unless merge marks must sit between them (then each goes out at once).
    // The kernels' window opens then, once the graph's parameters are set (`submit`).
    let one_submission = warp && merge_marks.is_empty();
    if !one_submission {
        g.record(&e1)?;
    }

    let kern = &g.kernels;
    let cs = g.stream.cu_stream();
    // SAFETY (memsets): every target lies inside a buffer allocated above with that size.
    // (`wmerge`'s plan_scan clears the flags and the error word itself: its call queues
    // nothing but its three launches per step.)
    if !warp {
        unsafe {
            result::memset_d8_async(d_out + flags_at as u64, 0, n, cs).map_err(drv("memset"))?;
            result::memset_d8_async(misc, 0, 64, cs).map_err(drv("memset"))?;
        }
    }
    let ptrs = d_in + ptrs_at as u64;
    let bases = d_in + bases_at as u64;
    let ords = d_in + ords_at as u64;
    // Bit 31 tells plan that the step runs `wmerge` (a path of A alone for every row).
    let ratio: u32 = match (warp, super::known_order()) {
        (true, _) => 1 << 31,
        (false, super::KnownOrder::Search(r)) => r,
        (false, super::KnownOrder::Warp) => 4,
        _ => 0,
    };
    let (valid_ptr, valid_bit) = match valid {
        Some((_, bit)) => (d_in + valid_at as u64, bit),
        None => (0u64, 0u64),
    };
    let in_vals = d_in;
    let flags = d_out + flags_at as u64;
    let err = misc + 4;
    let scratch_top = misc + 16;
    let wsize = misc + 28;
    let scratch_cap = cap as u64;
    let k32 = k as u32;
    let n32 = n as u32;
    let tile32 = g.tile() as u32;
    let row_blocks = n.div_ceil(ROW_THREADS as usize) as u32;
    let part_blocks =
        (tiles_max.div_ceil(ROW_THREADS as u64)).min(g.info.multiprocessors as u64 * 16) as u32;
    let merge_blocks = u32::try_from(tiles_max)
        .map_err(|_| GpuError::Unsupported(format!("{tiles_max} tiles in one launch group")))?;
    let gather_blocks = (tiles_max * 32).div_ceil(u64::from(GATHER_THREADS)) as u32;
    let mut queued: Vec<Launch> = Vec::new();
    let mut queue = |l: Launch| -> Result<(), GpuError> {
        if one_submission {
            queued.push(l);
            Ok(())
        } else {
            // SAFETY: each launch is made below for its kernel's signature in
            // kernels/intersect.cu, from buffers sized for its accesses (see there).
            unsafe { g.launch_words(&l) }
        }
    };
    for step in 1..k as u32 {
        let last = step as usize == k - 1;
        let prev_off = roff[(step as usize + 1) % 2];
        let this_off = if last {
            d_out + offs_out_at as u64
        } else {
            roff[step as usize % 2]
        };
        let a_vals = if step == 1 {
            in_vals
        } else {
            res[(step as usize + 1) % 2]
        };
        let dst_vals = match (last, mode) {
            (true, Mode::Values) => d_out + vals_out_at as u64,
            (true, Mode::Counts) => 0u64,
            (false, _) => res[step as usize % 2],
        };
        // Counting needs no values: the merge then writes no scratch.
        let scratch_ptr = if dst_vals == 0 { 0u64 } else { scratch };
        // `wmerge`'s steps plan and scan in one launch (plan_scan: no compaction, the flags
        // cleared at step 1); each of its two look-backs gets an epoch of its own.
        let plan = match (warp, osz == 4) {
            (true, true) => &kern.plan_scan_o32,
            (true, false) => &kern.plan_scan_o64,
            (false, true) => &kern.plan_o32,
            (false, false) => &kern.plan_o64,
        };
        let (row_epoch, piece_epoch) = if warp {
            (ws.epoch(cs)?, ws.epoch(cs)?)
        } else {
            (0, 0)
        };
        let step_flags = if step == 1 { flags } else { 0u64 };
        // The rows' plan: plan_scan (`wmerge`) or plan, scans and compaction (tiles).
        let plan_args: Vec<Word> = vec![
            n32.into(),
            k32.into(),
            step.into(),
            ptrs.into(),
            bases.into(),
            valid_ptr.into(),
            valid_bit.into(),
            prev_off.into(),
            ords.into(),
            ratio.into(),
            sel.into(),
            a_pos.into(),
            a_len.into(),
            b_pos.into(),
            b_len.into(),
            plen.into(),
            nz.into(),
            row_cnt.into(),
        ];
        if warp {
            let mut args = plan_args;
            args.extend::<[Word; 9]>([
                act_start.into(),
                row_states.into(),
                row_epoch.into(),
                step_flags.into(),
                err.into(),
                wp.lo.into(),
                wp.hi.into(),
                wwant.into(),
                wsize.into(),
            ]);
            queue(Launch {
                f: plan.cu_function(),
                grid: row_blocks,
                block: ROW_THREADS,
                args,
            })?;
        } else {
            // SAFETY: parameters match the kernels' signatures in kernels/intersect.cu; every
            // pointer is a buffer above sized for the accesses the kernel makes (n rows, n + 1
            // offsets, tiles_max tiles (+ 1 for the scan of their counts), cap result values
            // in the scratch and the destination), and the values each list's offsets address
            // lie within its section of the input region (or its resident copy).
            unsafe {
                g.launch_words(&Launch {
                    f: plan.cu_function(),
                    grid: row_blocks,
                    block: ROW_THREADS,
                    args: plan_args,
                })?;
                g.scan(ws, nz, n64, act_at)?;
                g.launch(
                    &kern.compact_rows,
                    row_blocks,
                    ROW_THREADS,
                    &mut [
                        arg(&n32),
                        arg(&plen),
                        arg(&act_at),
                        arg(&act_row),
                        arg(&act_len),
                    ],
                )?;
                g.scan(ws, act_len, n64, act_start)?;
                result::memset_d8_async(scratch_top, 0, 8, cs).map_err(drv("memset"))?;
            }
        }
        mark(step, false)?;
        if warp {
            // A warp for each piece the step can have. `wplace` strides over the pieces with
            // at most `wplace_per_sm` blocks per multiprocessor.
            let wblocks = (pieces_max * 32).div_ceil(u64::from(WBLOCK));
            let wblocks = u32::try_from(wblocks).map_err(|_| {
                GpuError::Unsupported(format!("{pieces_max} pieces in one launch group"))
            })?;
            let wplace_blocks = match g.wplace_per_sm {
                0 => wblocks,
                per_sm => wblocks.min(g.info.multiprocessors.saturating_mul(per_sm).max(1)),
            };
            // `tile_cnt` (the pieces' counts), `tile_pos` (the rows each owns) and
            // `piece_states` hold `pieces_max` entries (the kernels check that the step's
            // pieces fit); a piece writes its matches into the scratch at its own A positions
            // (fewer than `cap`, checked by the kernel), `wplace` copies them to `dst_vals`
            // (at most `cap` in all), and the row offsets go to `this_off` (n + 1 entries, as
            // `act_start`).
            queue(Launch {
                f: kern.wmerge[variant].cu_function(),
                grid: wblocks,
                block: WBLOCK,
                args: vec![
                    n32.into(),
                    wsize.into(),
                    pieces_max.into(),
                    act_start.into(),
                    a_vals.into(),
                    in_vals.into(),
                    a_pos.into(),
                    a_len.into(),
                    b_pos.into(),
                    b_len.into(),
                    tile_cnt.into(),
                    tile_pos.into(),
                    scratch_cap.into(),
                    flags.into(),
                    scratch_ptr.into(),
                    this_off.into(),
                    err.into(),
                ],
            })?;
            queue(Launch {
                f: kern.wplace[usize::from(esz == 8)].cu_function(),
                grid: wplace_blocks,
                block: WBLOCK,
                args: vec![
                    n32.into(),
                    wsize.into(),
                    pieces_max.into(),
                    act_start.into(),
                    tile_cnt.into(),
                    tile_pos.into(),
                    piece_states.into(),
                    piece_epoch.into(),
                    scratch_ptr.into(),
                    dst_vals.into(),
                    this_off.into(),
                ],
            })?;
        } else {
            // SAFETY: as above.
            unsafe {
                g.launch(
                    &kern.partition[variant],
                    part_blocks,
                    ROW_THREADS,
                    &mut [
                        arg(&n32),
                        arg(&tile32),
                        arg(&act_start),
                        arg(&act_row),
                        arg(&a_vals),
                        arg(&in_vals),
                        arg(&a_pos),
                        arg(&a_len),
                        arg(&b_pos),
                        arg(&b_len),
                        arg(&descs),
                    ],
                )?;
                g.launch(
                    merge,
                    merge_blocks,
                    g.merge_threads,
                    &mut [
                        arg(&n32),
                        arg(&act_start),
                        arg(&act_row),
                        arg(&a_vals),
                        arg(&in_vals),
                        arg(&a_pos),
                        arg(&a_len),
                        arg(&b_pos),
                        arg(&b_len),
                        arg(&descs),
                        arg(&row_cnt),
                        arg(&tile_cnt),
                        arg(&tile_pos),
                        arg(&scratch_top),
                        arg(&scratch_cap),
                        arg(&flags),
                        arg(&scratch_ptr),
                        arg(&err),
                    ],
                )?;
            }
        }
        mark(step, true)?;
        // `wplace` placed the step's values and finished its offsets.
        if warp {
            continue;
        }
        // SAFETY: as above.
        unsafe {
            if dst_vals != 0 {
                g.scan(ws, tile_cnt, tiles_max, tile_excl)?;
                g.launch(
                    gather,
                    gather_blocks,
                    GATHER_THREADS,
                    &mut [
                        arg(&tiles_max),
                        arg(&tile_cnt),
                        arg(&tile_pos),
                        arg(&tile_excl),
                        arg(&scratch),
                        arg(&dst_vals),
                    ],
                )?;
            }
            g.scan(ws, row_cnt, n64, this_off)?;
        }
    }
    let mut spanned = false;
    if one_submission {
        if ws.span.is_none() {
            ws.span = Some((g.event()?, g.event()?));
        }
        let Workspace { graph, span, .. } = &mut *ws;
        let span = span.as_ref().expect("made above");
        let span_raw = (span.0.cu_event(), span.1.cu_event());
        // SAFETY: as each launch's note in the loop; the span's events live in the workspace
        // after its graphs.
        if unsafe {
            graph.submit(
                &queued,
                cs,
                g.graphs,
                Some(span_raw),
                |_| g.record(&e1),
                |l| g.launch_words(l),
            )?
        } {
            out.timings.graph_launches += 1;
            spanned = true;
        }
    }
    g.record(&e2)?;

    // The result size and the kernels' error word, then the results in one copy.
    let mut head = [0u64; 2];
    let mut tail = [0u64; 1];
    // SAFETY: `misc` holds 64 bytes and `d_out` the offsets section; the host arrays live
    // across the synchronizing copies.
    unsafe {
        result::memcpy_dtoh_async(&mut head[..], misc, cs).map_err(drv("device-to-host copy"))?;
        result::memcpy_dtoh_async(&mut tail[..], d_out + (offs_out_at + n * 8) as u64, cs)
            .map_err(drv("device-to-host copy"))?;
    }
    g.sync()?;
    let kernel_err = (head[0] >> 32) as u32;
    if kernel_err != 0 {
        return Err(GpuError::Kernel(format!(
            "merge results overflowed their buffer (code {kernel_err})"
        )));
    }
    let got = tail[0] as usize;
    if got > cap {
        return Err(GpuError::Kernel(format!(
            "{got} results for a capacity of {cap}"
        )));
    }
    let back_bytes = vals_out_at + if mode == Mode::Values { got * esz } else { 0 };
    g.record(&e3)?;
    // The results land in the workspace's pinned buffer, or in a block lent to the Arrow
    // buffer that will hold the values.
    let mut lent = if lend {
        LentPinned::take(back_bytes)?
    } else {
        None
    };
    {
        let dst = match &mut lent {
            Some(b) => &mut b.as_mut_slice()[..back_bytes],
            None => {
                &mut Workspace::pinned(&mut ws.pin_out, back_bytes)?.as_mut_slice()[..back_bytes]
            }
        };
        // SAFETY: `d_out` holds at least `back_bytes` bytes (`got` ≤ `cap`); the pinned
        // destination is owned by the workspace (or `lent`) and read only after the
        // synchronize below.
        unsafe {
            result::memcpy_dtoh_async(dst, d_out, cs).map_err(drv("device-to-host copy"))?;
        }
    }
    g.record(&e4)?;
    g.sync()?;

    // Unstage: flags, offsets (shifted by what earlier launch groups produced), values.
    let t_unstage = Instant::now();
    let pin = match &lent {
        Some(b) => &b.as_slice()[..back_bytes],
        None => ws
            .pin_out
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?
            .as_slice(),
    };
    out.flagged
        .extend(pin[flags_at..flags_at + n].iter().map(|&f| f != 0));
    let base = out.offsets.last().copied().unwrap_or(0);
    let offs = &pin[offs_out_at + 8..offs_out_at + 8 * (n + 1)];
    out.offsets.extend(offs.chunks_exact(8).map(|c| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        base + u64::from_le_bytes(w)
    }));
    if let Some(block) = lent {
        // SAFETY: `vals_out_at` is 256-byte aligned within the block and starts the
        // `got * esz` bytes of values the device wrote (the copy is synchronized).
        out.shared_values =
            Some(unsafe { LentPinned::buffer(&Arc::new(block), vals_out_at, got * esz) });
    } else if mode == Mode::Values {
        let src = &pin[vals_out_at..vals_out_at + got * esz];
        let old = out.values.len();
        out.values.reserve(got);
        // SAFETY: `reserve` made room for `got` more elements; `src` holds exactly `got`
        // elements' bytes written by the device as values of `T` (a primitive integer, for
        // which every bit pattern is valid); `set_len` follows the full initialization.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(
                out.values.as_mut_ptr().add(old).cast::<u8>(),
                got * esz,
            );
            par_copy(dst, src);
            out.values.set_len(old + got);
        }
    }
    let unstage_ms = t_unstage.elapsed().as_secs_f64() * 1e3;

    let ms =
        |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map(f64::from).map_err(drv("event timing"));
    let t = &mut out.timings;
    t.stage_ms += stage_ms;
    t.h2d_ms += ms(&e0, &e1)?;
    t.kernel_ms += ms(&e1, &e2)?;
    if let (true, Some((s0, s1))) = (spanned, &ws.span) {
        t.kernel_span_ms += ms(s0, s1)?;
    }
    for (a, b) in &merge_marks {
        t.merge_ms += ms(a, b)?;
    }
    t.d2h_ms += ms(&e3, &e4)?;
    t.unstage_ms += unstage_ms;
    t.h2d_bytes += in_bytes as u64;
    t.d2h_bytes += back_bytes as u64;
    t.input_values += total_values as u64;
    t.chunks += 1;
    Ok(())
}

/// The process's GPU, its workspace locked and its context bound to this thread (the
/// diagnostics below).
fn locked() -> Result<(&'static Gpu, std::sync::MutexGuard<'static, Workspace>), GpuError> {
    let g = gpu()?;
    let ws = g
        .workspace
        .lock()
        .map_err(|_| GpuError::Broken("workspace lock poisoned".into()))?;
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    Ok((g, ws))
}

/// See [`super::PinnedReads`] (diagnostics: the benchmarks print it beside the host's timings).
pub fn pinned_read_probe(bytes: usize) -> Result<super::PinnedReads, GpuError> {
    use super::pinned_read::sum_words;
    let (g, mut ws) = locked()?;
    let words = bytes.max(1 << 20) / 8;
    let bytes = words * 8;
    let dev = ws.dev("probe_src", bytes)?;
    let cs = g.stream.cu_stream();
    // SAFETY: `dev` holds at least `bytes` bytes.
    unsafe { result::memset_d8_async(dev, 0x11, bytes, cs) }.map_err(drv("memset"))?;
    let ordinary = vec![0x1111_1111_1111_1111u64; words];
    let pin = Workspace::pinned(&mut ws.pin_out, bytes)?;
    let mut best = [f64::MAX; 4];
    let mut check = 0u64;
    for _ in 0..5 {
        for (i, streaming) in [(0, false), (1, true)] {
            // SAFETY: `pin` holds at least `bytes` bytes, read after the synchronize.
            unsafe { result::memcpy_dtoh_async(&mut pin.as_mut_slice()[..bytes], dev, cs) }
                .map_err(drv("device-to-host copy"))?;
            g.sync()?;
            let host = &pin.as_mut_slice()[..bytes];
            // SAFETY: the pinned allocation is page-aligned, so its words are aligned.
            let w = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u64>(), words) };
            let t = Instant::now();
            check = check.wrapping_add(sum_words(w, streaming));
            best[i] = best[i].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            check = check.wrapping_add(sum_words(std::hint::black_box(&ordinary), streaming));
            best[2 + i] = best[2 + i].min(t.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(check);
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    Ok(super::PinnedReads {
        pinned_plain_gbs: gbs(best[0]),
        pinned_stream_gbs: gbs(best[1]),
        ordinary_plain_gbs: gbs(best[2]),
        ordinary_stream_gbs: gbs(best[3]),
    })
}

/// Measure the device's copy ceilings with `bytes`-byte buffers: device-to-device (bytes
/// read plus written), pinned host-to-device and device-to-pinned-host; median of 5.
pub fn measure_ceilings(bytes: usize) -> Result<Ceilings, GpuError> {
    let (g, mut ws) = locked()?;
    let bytes = bytes.max(1 << 20);
    let a = ws.dev("ceil_a", bytes)?;
    let b = ws.dev("ceil_b", bytes)?;
    let cs = g.stream.cu_stream();
    // SAFETY: `a` holds at least `bytes` bytes.
    unsafe { result::memset_d8_async(a, 0x5a, bytes, cs) }.map_err(drv("memset"))?;
    let time = |f: &dyn Fn() -> Result<(), GpuError>| -> Result<f64, GpuError> {
        let mut v = Vec::new();
        f()?; // warm-up
        for _ in 0..5 {
            let (s, e) = (g.event()?, g.event()?);
            g.record(&s)?;
            f()?;
            g.record(&e)?;
            g.sync()?;
            v.push(f64::from(s.elapsed_ms(&e).map_err(drv("event timing"))?));
        }
        v.sort_by(f64::total_cmp);
        Ok(v[2])
    };
    // SAFETY: both buffers hold at least `bytes` bytes.
    let d2d = time(&|| {
        unsafe { result::memcpy_dtod_async(b, a, bytes, cs) }.map_err(drv("device copy"))
    })?;
    let pin = Workspace::pinned(&mut ws.pin_in, bytes)?;
    let host = pin.as_mut_slice();
    host[..bytes].fill(0x3c);
    let host_ptr = host.as_mut_ptr();
    let h2d = time(&|| {
        // SAFETY: `host_ptr` points to at least `bytes` pinned bytes that outlive the
        // synchronized copy; `a` holds `bytes` bytes.
        unsafe {
            let src = std::slice::from_raw_parts(host_ptr.cast_const(), bytes);
            result::memcpy_htod_async(a, src, cs)
        }
        .map_err(drv("host-to-device copy"))
    })?;
    let d2h = time(&|| {
        // SAFETY: as above, in the other direction.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(host_ptr, bytes);
            result::memcpy_dtoh_async(dst, a, cs)
        }
        .map_err(drv("device-to-host copy"))
    })?;
    ws.dev.retain(|(n, _)| !n.starts_with("ceil_"));
    let gbps = |b: f64, ms: f64| b / (ms * 1e-3) / 1e9;
    Ok(Ceilings {
        d2d_gbps: gbps(2.0 * bytes as f64, d2d),
        h2d_gbps: gbps(bytes as f64, h2d),
        d2h_gbps: gbps(bytes as f64, d2h),
    })
}

#[cfg(test)]
mod tests {
    use super::{LentBudget, WPieces};
    use proptest::prelude::*;

    /// The lent blocks' count: takes within the ceiling count, a take past it (or past
    /// `usize::MAX`) is refused and counts nothing, and what is given back can be taken again.
    #[test]
    fn lent_budget_refuses_past_its_ceiling() {
        let b = LentBudget::new();
        assert!(b.try_take(600, 1000));
        assert!(b.try_take(400, 1000), "an exact fit is taken");
        assert_eq!(b.bytes(), 1000);
        assert!(!b.try_take(1, 1000));
        assert_eq!(b.bytes(), 1000, "a refused take counts nothing");
        assert!(b.try_take(1, 2000), "a higher ceiling for a later take");
        b.give_back(401);
        assert_eq!(b.bytes(), 600);
        assert!(b.try_take(400, 1000));
        assert!(!b.try_take(usize::MAX, usize::MAX), "no overflow");
        assert_eq!(b.bytes(), 1000);
    }

    proptest! {
        /// Any sequence of takes and gives back, on two threads at once: the count is what was
        /// taken and not given back, and never passed the ceiling.
        #[test]
        fn lent_budget_counts_what_it_took(sizes in proptest::collection::vec(1usize..500, 1..60)) {
            let b = std::sync::Arc::new(LentBudget::new());
            let max = 4000;
            let run = |sizes: Vec<usize>| {
                let b = std::sync::Arc::clone(&b);
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for (i, s) in sizes.into_iter().enumerate() {
                        if b.try_take(s, max) {
                            assert!(b.bytes() <= max);
                            held.push(s);
                        }
                        if i % 3 == 2 && let Some(s) = held.pop() {
                            b.give_back(s);
                        }
                    }
                    held.iter().sum::<usize>()
                })
            };
            let (x, y) = (run(sizes.clone()), run(sizes.iter().rev().copied().collect()));
            let held = x.join().unwrap() + y.join().unwrap();
            prop_assert_eq!(b.bytes(), held);
            prop_assert!(held <= max);
        }
    }

    /// The kernels' `wpiece_of` and `wpieces` (kernels/intersect.cu), step by step.
    fn kernel_pieces(w: WPieces, total: u64, want: u64) -> u64 {
        let mut p = w.hi;
        while p / 2 >= w.lo && total / u64::from(p) < want {
            p >>= 1;
        }
        if total == 0 {
            1
        } else {
            total.div_ceil(u64::from(p))
        }
    }

    proptest! {
        /// Whatever A total a step has (at most the call's shortest column), the pieces the
        /// kernels make of it fit the buffers the host sizes (the kernels flag a step that
        /// would not, as an error, never silently).
        #[test]
        fn any_step_fits_the_pieces_sized(
            lo in 32u32..4096,
            hi in 32u32..65_536,
            fixed in any::<bool>(),
            want in 1u64..100_000,
            cap in 0u64..(1 << 38),
            frac in 0.0f64..=1.0,
        ) {
            let w = if fixed {
                WPieces { lo: hi, hi, per_sm: 1 }
            } else {
                WPieces { lo: lo.min(hi), hi, per_sm: 1 }
            };
            let max = w.pieces_max(cap, want);
            for total in [0, 1, cap / 2, cap, (cap as f64 * frac) as u64] {
                let total = total.min(cap);
                prop_assert!(kernel_pieces(w, total, want) <= max, "total {total}: {w:?}, max {max}");
            }
        }
    }

    #[test]
    fn the_step_sizes_measured_on_the_h200() {
        // 132 multiprocessors, the defaults: the issue shape's first step (41.8 M A positions)
        // takes pieces of 2,048, its second (16.5 M) pieces of 1,024, the skewed shape's
        // (2.1 M) pieces of 256 (kernels/NOTES.md, "A piece size per step").
        let w = WPieces {
            lo: super::WPIECE_MIN,
            hi: super::WPIECE_MAX,
            per_sm: super::WPIECES_PER_SM,
        };
        let want = 132 * u64::from(w.per_sm);
        let size = |total: u64| total.div_ceil(kernel_pieces(w, total, want));
        assert_eq!(size(41_800_000), 2048);
        assert_eq!(size(16_500_000), 1024);
        assert_eq!(size(2_100_000), 256);
        assert_eq!(
            w.pieces_max(145_000_000, want),
            145_000_000u64.div_ceil(2048)
        );
        // (A call whose shortest column is 2.1 M values: no more pieces than of 256.)
        assert_eq!(w.pieces_max(2_100_000, want), 2_100_000u64.div_ceil(256));
        assert_eq!(w.pieces_max(1000, want), 4);
    }
}
