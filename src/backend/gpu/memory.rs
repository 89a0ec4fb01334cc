//! Device and page-locked host memory: device allocations ([`DevBuf`]), page-locked blocks
//! owned by a workspace ([`Pinned`]) or lent to Arrow buffers ([`LentPinned`], pooled per
//! process within [`lent_max`]), and the [`Workspace`] that pools both between batches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::result;
use cudarc::driver::{CudaEvent, sys};
use datafusion::arrow::buffer::Buffer;

use super::GpuError;
use super::columns::ColumnCache;
use super::fault::{self, Fault};
use super::graph::LaunchGraph;
use super::intersect::ResidentCol;
use super::runtime::{ALIGN, drv};
use crate::tuning::lent_max;

/// A device allocation owned by the workspace.
pub(crate) struct DevBuf {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
}

impl DevBuf {
    /// The bytes [`DevBuf::upload`] allocates for `len` bytes of data (at least 256).
    pub(crate) fn bytes_for(len: usize) -> usize {
        len.max(256)
    }

    /// A new device buffer holding a copy of `v` (at least 256 bytes), copied synchronously;
    /// `alloc` and `copy` name the two steps in errors. The context must be bound.
    pub(crate) fn upload(
        v: &[u8],
        alloc: &'static str,
        copy: &'static str,
    ) -> Result<Self, GpuError> {
        let buf = Self::alloc(v.len(), alloc)?;
        if !v.is_empty() {
            // SAFETY: a synchronous copy of `v` into the buffer, which holds at least
            // `v.len()` bytes (the context is bound by the caller).
            unsafe { result::memcpy_htod_sync(buf.ptr, v) }.map_err(drv(copy))?;
        }
        Ok(buf)
    }

    /// A new device buffer for `len` bytes (at least 256; contents undefined); `alloc` names
    /// the step in errors. The context must be bound.
    pub(crate) fn alloc(len: usize, alloc: &'static str) -> Result<Self, GpuError> {
        let bytes = Self::bytes_for(len);
        if fault::armed(Fault::OutOfMemory) {
            return Err(GpuError::OutOfMemory(alloc));
        }
        // SAFETY: a plain allocation of `bytes` bytes (the context is bound by the caller).
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(drv(alloc))?;
        Ok(DevBuf { ptr, bytes })
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
pub(crate) fn alloc_pinned(bytes: usize) -> Option<*mut u8> {
    let g = super::ready().ok()?;
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
pub(crate) fn free_pinned(ptr: *mut u8) {
    if let Ok(g) = super::runtime::gpu_any() {
        let _ = g.ctx.bind_to_thread();
    }
    // SAFETY: `ptr` came from `malloc_host` and is freed once.
    let _ = unsafe { result::free_host(ptr.cast()) };
}

/// Page-locked host memory: where it lies, its size, and its device address once asked for.
/// Owned by a [`Pinned`] (the workspace's, freed with it) or a [`LentPinned`] (pooled).
pub(crate) struct HostBlock {
    ptr: *mut u8,
    bytes: usize,
    /// Its device address, once asked for (0: not yet).
    dev: u64,
}

impl HostBlock {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes of host memory owned by `self`, and the
        // exclusive borrow of `self` rules out any other view while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address through which kernels read and write this memory across the bus (with
    /// unified addressing, where every page-locked allocation is mapped, the host's own
    /// address; asked of the driver once per allocation all the same). The context must be
    /// bound to this thread.
    pub(crate) fn device_ptr(&mut self) -> Result<u64, GpuError> {
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
pub(crate) struct Pinned(HostBlock);

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
/// [`lent_max`]; past it a batch's results are copied out of the workspace's buffer.
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
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub(crate) fn lent_bytes_now() -> usize {
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
/// [`lent_max`] bytes ([`LENT_BYTES`]): a caller keeping many results would otherwise
/// pin host memory without bound.
pub(crate) struct LentPinned(HostBlock);

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
    /// past [`lent_max`] (the caller copies its results out instead).
    pub(crate) fn take(bytes: usize) -> Result<Option<Self>, GpuError> {
        let bytes = bytes.max(ALIGN);
        let max = lent_max();
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
    pub(crate) unsafe fn buffer(block: &Arc<Self>, at: usize, len: usize) -> Buffer {
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
            if idle + bytes <= LENT_POOL_BYTES && LENT_BYTES.bytes() <= lent_max() {
                pool.push((ptr as usize, bytes, dev));
                return;
            }
        }
        free_pinned(ptr);
        LENT_BYTES.give_back(bytes);
    }
}

/// Pooled memory: named device buffers and two pinned staging buffers, each grown when a
/// batch needs more and kept for the next one (never allocated per batch once large enough).
#[derive(Default)]
pub(crate) struct Workspace {
    dev: Vec<(&'static str, DevBuf)>,
    pub(crate) pin_in: Option<Pinned>,
    pub(crate) pin_out: Option<Pinned>,
    /// A second upload buffer (a `topk_bm25` batch's blocks, laid out after its queries).
    pub(crate) pin_aux: Option<Pinned>,
    /// A block the next batch's answers are written into, then lent to its result (taken
    /// from the pool when a batch needs one; `topk_bm25`'s packed answers).
    pub(crate) pin_lent: Option<LentPinned>,
    /// Bytes of input values per launch group of the list intersection (halved when memory
    /// runs out; set when its kernels are loaded).
    pub(crate) budget: usize,
    /// List columns kept on the device between calls (`sets.gpu_resident_columns`).
    pub(crate) columns: ColumnCache<ResidentCol>,
    /// The last epoch given to a launch with look-back states (see [`Workspace::epoch`]).
    pub(crate) epoch: u32,
    /// `wmerge` calls' and `topk_bm25` batches' launches in one submission (see
    /// [`LaunchGraph`]).
    pub(crate) graph: LaunchGraph,
    /// The events a graph records before its first kernel and after its last (made once;
    /// after `graph`, so that they outlive its graphs).
    pub(crate) span: Option<(CudaEvent, CudaEvent)>,
}

/// Epochs fit the top 24 bits of a look-back state word (`st_word` in kernels/intersect.cu).
pub(crate) const EPOCH_LIMIT: u32 = 1 << 24;

// SAFETY: the raw pointers are owned allocations, only touched under the workspace mutex.
unsafe impl Send for Workspace {}

impl Workspace {
    /// A device buffer of at least `bytes` bytes under `name` (contents undefined).
    pub(crate) fn dev(
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
    pub(crate) fn states(
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
    pub(crate) fn epoch(&mut self, stream: sys::CUstream) -> Result<u32, GpuError> {
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

    pub(crate) fn pinned(slot: &mut Option<Pinned>, bytes: usize) -> Result<&mut Pinned, GpuError> {
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

    /// Frees the device buffers whose names start with `prefix`.
    #[cfg(feature = "tuning")]
    pub(crate) fn free_dev(&mut self, prefix: &str) {
        self.dev.retain(|(n, _)| !n.starts_with(prefix));
    }

    pub(crate) fn clear(&mut self) {
        self.dev.clear();
        self.pin_in = None;
        self.pin_out = None;
        self.pin_aux = None;
        self.pin_lent = None;
        self.columns.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::LentBudget;
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
}
