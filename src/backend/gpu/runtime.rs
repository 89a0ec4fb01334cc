//! The CUDA runtime of the GPU backend: one context and one stream per process, the kernel
//! modules ([`Modules`]), the memory pools behind one workspace lock, kernel launches and
//! waits.
//!
//! Everything goes through `cudarc`'s driver and NVRTC bindings, loaded at run time. The
//! first call starts the runtime (a missing library or device becomes a [`GpuError`], kept
//! for the process); a fault during a batch (a kernel error, a panic in the library) turns
//! the backend off for the rest of the process ([`Gpu::mark_broken`]). The drivers hold the
//! workspace's lock for a batch (one batch at a time), whose device work is one stream; the
//! similarity join's verifier runs its chunks on streams of its own.

use std::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, sys};
use rayon::prelude::*;

#[cfg(feature = "tuning")]
use super::fault::{self, Fault};
use super::graph::Launch;
use super::memory::Workspace;
use super::modules::{Module, Modules};
use super::{DeviceInfo, GpuError};
use crate::tuning::{env, knobs};

/// Alignment of the sections of the staging and device buffers.
pub(crate) const ALIGN: usize = 256;

/// A driver error as the backend's: out of memory, or a failed call `op`.
pub(crate) fn drv(op: &'static str) -> impl Fn(DriverError) -> GpuError {
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

/// `x` rounded up to [`ALIGN`].
pub(crate) fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// The process's GPU: context, stream, kernel modules and memory pools.
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) info: DeviceInfo,
    /// The kernel modules, compiled on first use.
    modules: Modules,
    /// Launch sequences that repeat (a `wmerge` call's, a `topk_bm25` batch's) go through the
    /// workspace's kernel graph (`graph.rs`) unless the knob `gpu_graph` is off
    /// (measurements).
    pub(crate) graphs: bool,
    pub(crate) workspace: Mutex<Workspace>,
    /// Set after a fault that may have left the context unusable.
    broken: Mutex<Option<String>>,
    broken_flag: AtomicBool,
}

static GPU: OnceLock<Result<Gpu, GpuError>> = OnceLock::new();

/// A caught panic's message.
pub(crate) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The process's GPU even after a fault turned the backend off (to free what it holds).
pub(crate) fn gpu_any() -> Result<&'static Gpu, GpuError> {
    GPU.get()
        .ok_or(GpuError::NoDevice)?
        .as_ref()
        .map_err(Clone::clone)
}

/// The process's context (started on first call), unless a fault turned the backend off.
/// The drivers start from `super::ready`, which also has the base kernels compiled.
pub(crate) fn context() -> Result<&'static Gpu, GpuError> {
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
    if env().disable_gpu {
        return Err(GpuError::Disabled);
    }
    #[cfg(feature = "tuning")]
    let (no_driver, no_nvrtc) = (fault::armed(Fault::NoDriver), fault::armed(Fault::NoNvrtc));
    #[cfg(not(feature = "tuning"))]
    let (no_driver, no_nvrtc) = (false, false);
    // SAFETY: only tries to open the shared libraries.
    if no_driver || !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    // SAFETY: as above.
    if no_nvrtc || !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    result::init().map_err(drv("cuInit"))?;
    let count = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    #[cfg(feature = "tuning")]
    let no_device = fault::armed(Fault::NoDevice);
    #[cfg(not(feature = "tuning"))]
    let no_device = false;
    if count < 1 || no_device {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(0).map_err(drv("context creation"))?;
    // SAFETY: every buffer of this backend lives on one stream (the process's, or a verifier
    // lane's), and the workspace keeps each alive until its stream is synchronized; no
    // cross-stream tracking is needed.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(drv("compute capability"))?;
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
    Ok(Gpu {
        modules: Modules::new((major, minor)),
        ctx,
        stream,
        info,
        graphs: knobs().gpu_graph,
        workspace: Mutex::new(Workspace::default()),
        broken: Mutex::new(None),
        broken_flag: AtomicBool::new(false),
    })
}

/// A kernel parameter: the address of a value that outlives the launch call.
pub(crate) fn arg<T>(x: &T) -> *mut c_void {
    (x as *const T).cast_mut().cast()
}

/// Launch `f` on `stream` (one-dimensional grid and block, no dynamic shared memory).
///
/// # Safety
/// `params` must match the kernel's parameter list in number and types, and every device
/// pointer among them must be valid for the accesses the kernel makes.
pub(crate) unsafe fn launch_on(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
) -> Result<(), GpuError> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_raw(f.cu_function(), grid, block, stream.cu_stream(), params) }
}

/// # Safety
/// As [`launch_on`].
unsafe fn launch_raw(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), GpuError> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { result::launch_kernel(f, (grid.max(1), 1, 1), (block, 1, 1), 0, stream, params) }
        .map_err(drv("kernel launch"))
}

impl Gpu {
    /// Kernel module `m`, compiled and loaded on first call with `options` (NVRTC options
    /// beyond C++17, the driver's: asked for only then); the same module, or the same error,
    /// after that.
    pub(crate) fn module(
        &self,
        m: Module,
        options: impl FnOnce() -> Vec<String>,
    ) -> Result<&Arc<CudaModule>, GpuError> {
        self.modules.get(&self.ctx, m, options)
    }

    /// Whether [`module`](Self::module) would answer in milliseconds: `m` is loaded, or its
    /// image is in the kernel cache.
    pub(crate) fn module_loads_fast(
        &self,
        m: Module,
        options: impl FnOnce() -> Vec<String>,
    ) -> bool {
        self.modules.loads_fast(m, options)
    }

    /// Turns the backend off for the rest of the process (the reason goes with every later
    /// [`GpuError::Broken`]).
    pub(crate) fn mark_broken(&self, why: &GpuError) {
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
    pub(crate) unsafe fn launch(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe {
            launch_raw(
                f.cu_function(),
                grid,
                block,
                self.stream.cu_stream(),
                params,
            )
        }
    }

    /// Launch `l` on the stream.
    ///
    /// # Safety
    /// As [`Gpu::launch`]: `l`'s arguments match its kernel's parameter list, and every device
    /// pointer among them is valid for the accesses the kernel makes.
    pub(crate) unsafe fn launch_words(&self, l: &Launch) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller's contract; the addresses point at `l`'s words.
        unsafe {
            launch_raw(
                l.f,
                l.grid,
                l.block,
                self.stream.cu_stream(),
                &mut l.addrs(),
            )
        }
    }

    pub(crate) fn event(&self) -> Result<CudaEvent, GpuError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))
    }

    /// Wait until everything queued on `stream` is done, asleep: an event with blocking
    /// sync, where a stream synchronize spins the calling thread's core at full load (the
    /// driver's default with one context on a many-core host). For the similarity join's
    /// waits, while the other partitions' threads filter on the host's cores.
    pub(crate) fn wait_asleep(&self, stream: &CudaStream) -> Result<(), GpuError> {
        self.inject_kernel_fault(stream)?;
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(drv("event"))?;
        e.record(stream).map_err(drv("event record"))?;
        e.synchronize().map_err(drv("event synchronize"))
    }

    pub(crate) fn record(&self, e: &CudaEvent) -> Result<(), GpuError> {
        e.record(&self.stream).map_err(drv("event record"))
    }

    pub(crate) fn sync(&self) -> Result<(), GpuError> {
        self.inject_kernel_fault(&self.stream)?;
        self.stream.synchronize().map_err(drv("stream synchronize"))
    }

    /// With [`Fault::Kernel`] armed, queues a kernel that traps on `stream`
    /// (`fault_trap` of kernels/intersect.cu, the base module): the wait that follows sees a
    /// real launch failure, and the context is lost for the process.
    #[cfg(feature = "tuning")]
    fn inject_kernel_fault(&self, stream: &CudaStream) -> Result<(), GpuError> {
        if !fault::armed(Fault::Kernel) {
            return Ok(());
        }
        log::debug!("datafusion-sets: injecting a kernel fault (DFSETS_GPU_FAULT=kernel)");
        // Compiled by `ready`, which every caller passed before it could wait.
        let trap = self
            .modules
            .compiled(Module::Intersect)
            .ok_or_else(|| GpuError::Kernel("injected fault before the kernels loaded".into()))?
            .load_function("fault_trap")
            .map_err(drv("kernel lookup"))?;
        // SAFETY: `fault_trap` takes no parameters; the launch is asynchronous on `stream`.
        unsafe { launch_on(stream, &trap, 1, 1, &mut []) }
    }

    /// No fault is injected without the feature `tuning`.
    #[cfg(not(feature = "tuning"))]
    #[inline(always)]
    fn inject_kernel_fault(&self, _stream: &CudaStream) -> Result<(), GpuError> {
        Ok(())
    }
}

/// View of a slice of plain integers as bytes.
pub(crate) fn bytes_of<T: Copy + 'static>(s: &[T]) -> &[u8] {
    // SAFETY: callers pass slices of primitive integers (no padding, every byte initialized);
    // the byte view covers exactly the slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// Views of the pinned byte buffers as the kernel's element types.
///
/// SAFETY (both): `T` is one of u32, u64, f64 (every bit pattern valid, no padding); the
/// regions start at multiples of 256 bytes in page-aligned pinned buffers (asserted).
pub(crate) fn view<T: Copy>(bytes: &[u8]) -> &[T] {
    // SAFETY: see above.
    let (pre, mid, _) = unsafe { bytes.align_to::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}
pub(crate) fn view_mut<T: Copy>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: see `view`.
    let (pre, mid, _) = unsafe { bytes.align_to_mut::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}

/// Copy `src` into `dst` (same length), with several threads past two pieces. One core
/// copies about 8 GB/s into pinned memory: with 8 MiB pieces a batch of 8192 W1 rows (7 MB a
/// list) was staged on one thread, 75% of its call (kernels/DESIGN.md); 1 MiB pieces spread it.
pub(crate) fn par_copy(dst: &mut [u8], src: &[u8]) {
    const PIECE: usize = 1 << 20;
    if src.len() < 2 * PIECE {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}
