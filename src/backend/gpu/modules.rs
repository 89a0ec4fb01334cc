//! The kernel modules: the CUDA sources of kernels/*.cu, embedded in the binary, each
//! compiled with NVRTC into a CUBIN for the device's own architecture (`sm_XY`) once per
//! process, on first use, and loaded into the context (candle keeps its CUDA modules the same
//! way). A compile failure carries NVRTC's log and is kept: the module is not compiled again.
//! Compiled images are kept on disk (`super::kernel_cache`), so a later process loads them
//! instead of compiling: NVRTC takes from a fraction of a second to several seconds per module.
//!
//! The driver that asks for a module first gives its compile options (the `-D` shapes its
//! kernels take, from the measurement knobs); the runtime compiles the base module,
//! kernels/intersect.cu, when it starts (`super::ready`).

use std::borrow::Cow;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::GpuError;
#[cfg(feature = "tuning")]
use super::fault::{self, Fault};
use super::kernel_cache::{self, Key};
use super::runtime::drv;

/// A kernel source file, compiled into one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Module {
    /// kernels/intersect.cu: the list intersection (and `fault_trap`, which the fault
    /// injection queues).
    Intersect,
    /// kernels/bm25.cu: `topk_bm25`.
    Bm25,
    /// kernels/simjoin.cu: the similarity join's verification.
    Simjoin,
}

impl Module {
    const COUNT: usize = 3;

    fn slot(self) -> usize {
        match self {
            Module::Intersect => 0,
            Module::Bm25 => 1,
            Module::Simjoin => 2,
        }
    }

    /// The file's name (NVRTC's name for the program, in its log).
    pub(crate) fn file(self) -> &'static str {
        match self {
            Module::Intersect => "intersect.cu",
            Module::Bm25 => "bm25.cu",
            Module::Simjoin => "simjoin.cu",
        }
    }

    fn embedded(self) -> &'static str {
        match self {
            Module::Intersect => include_str!("../../../kernels/intersect.cu"),
            Module::Bm25 => include_str!("../../../kernels/bm25.cu"),
            Module::Simjoin => include_str!("../../../kernels/simjoin.cu"),
        }
    }

    /// The source to compile: the embedded file, or (feature `tuning`; experiments) the file
    /// a source knob names instead, another version of the same kernels (same signatures), so
    /// that kernel variants are measured side by side by one binary.
    fn source(self) -> Result<Cow<'static, str>, GpuError> {
        #[cfg(feature = "tuning")]
        {
            let knobs = crate::tuning::knobs();
            let (var, path) = match self {
                Module::Intersect => ("DFSETS_GPU_INTERSECT_SOURCE", &knobs.gpu_intersect_source),
                Module::Bm25 => ("DFSETS_BM25_SOURCE", &knobs.bm25_source),
                Module::Simjoin => ("", &None),
            };
            if let Some(p) = path {
                return std::fs::read_to_string(p)
                    .map(Cow::Owned)
                    .map_err(|e| GpuError::Compile(format!("{var} {p:?}: {e}")));
            }
        }
        Ok(Cow::Borrowed(self.embedded()))
    }
}

/// Modules compiled by NVRTC in this process.
pub(crate) static COMPILED: AtomicU64 = AtomicU64::new(0);
/// Modules loaded from the kernel cache in this process.
pub(crate) static FROM_CACHE: AtomicU64 = AtomicU64::new(0);

/// The process's modules, each compiled once for `arch` (e.g. `sm_90`).
pub(crate) struct Modules {
    arch: String,
    slots: [OnceLock<Result<Arc<CudaModule>, GpuError>>; Module::COUNT],
}

impl Modules {
    /// The modules of a device of compute capability `major.minor`.
    pub(crate) fn new((major, minor): (i32, i32)) -> Self {
        Modules {
            arch: format!("sm_{major}{minor}"),
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Module `m`: compiled and loaded into `ctx` on the first call (with `options`), the
    /// same module or the same error after.
    pub(crate) fn get(
        &self,
        ctx: &Arc<CudaContext>,
        m: Module,
        options: impl FnOnce() -> Vec<String>,
    ) -> Result<&Arc<CudaModule>, GpuError> {
        self.slots[m.slot()]
            .get_or_init(|| {
                let source = m.source()?;
                load(ctx, &self.arch, &source, m.file(), options())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Whether module `m` (with `options`) is loaded, or its compiled image is in the kernel
    /// cache, whole: then [`get`](Self::get) takes milliseconds, not an NVRTC compile.
    pub(crate) fn loads_fast(&self, m: Module, options: impl FnOnce() -> Vec<String>) -> bool {
        if self.slots[m.slot()].get().is_some() {
            return true;
        }
        let Ok(source) = m.source() else {
            return false;
        };
        let job = Job::new(&self.arch, &source, m.file(), options());
        crate::tuning::env()
            .kernel_cache
            .as_deref()
            .is_some_and(|d| kernel_cache::read(d, &job.key).is_some())
    }

    /// Module `m` if it was compiled.
    #[cfg(feature = "tuning")]
    pub(crate) fn compiled(&self, m: Module) -> Option<&Arc<CudaModule>> {
        self.slots[m.slot()].get()?.as_ref().ok()
    }
}

/// One module to load: its source (with an injected fault, feature `tuning`), NVRTC's
/// options and the kernel cache's key of both.
struct Job<'a> {
    source: Cow<'a, str>,
    options: Vec<String>,
    key: Key,
}

impl<'a> Job<'a> {
    /// `source` compiled for `arch` as C++17 plus `extra` options.
    fn new(arch: &str, source: &'a str, name: &'a str, extra: Vec<String>) -> Self {
        let mut options = vec![
            "--std=c++17".to_string(),
            format!("--gpu-architecture={arch}"),
        ];
        options.extend(extra);
        #[cfg(feature = "tuning")]
        let source: Cow<'a, str> = if fault::armed(Fault::Compile) {
            Cow::Owned(format!(
                "#error injected fault (DFSETS_GPU_FAULT=nvrtc)\n{source}"
            ))
        } else {
            Cow::Borrowed(source)
        };
        #[cfg(not(feature = "tuning"))]
        let source = Cow::Borrowed(source);
        let key = Key::of(
            [
                env!("CARGO_PKG_VERSION").as_bytes(),
                nvrtc_version().as_bytes(),
                name.as_bytes(),
                source.as_bytes(),
            ]
            .into_iter()
            .chain(options.iter().map(|o| o.as_bytes())),
        );
        Job {
            source,
            options,
            key,
        }
    }
}

/// Loads `source` compiled for `arch` as C++17 plus `extra` options into `ctx`: from the
/// kernel cache when it holds the image, else compiled by NVRTC (and stored in the cache). A
/// compile failure carries NVRTC's log.
fn load(
    ctx: &Arc<CudaContext>,
    arch: &str,
    source: &str,
    name: &str,
    extra: Vec<String>,
) -> Result<Arc<CudaModule>, GpuError> {
    let job = Job::new(arch, source, name, extra);
    let dir = crate::tuning::env().kernel_cache.as_deref();
    if let Some(image) = dir.and_then(|d| kernel_cache::read(d, &job.key)) {
        let started = Instant::now();
        match ctx.load_module(Ptx::from_binary(image)) {
            Ok(m) => {
                FROM_CACHE.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "GPU: {name} loaded from the kernel cache in {:.1} ms",
                    started.elapsed().as_secs_f64() * 1e3
                );
                return Ok(m);
            }
            // An image the driver refuses (a driver older than the compiler that wrote it,
            // say) is compiled again and replaced.
            Err(e) => {
                log::debug!("GPU: {name} from the kernel cache did not load ({e}); compiling")
            }
        }
    }
    let started = Instant::now();
    let image = match compile(&job.source, name, &job.options) {
        Ok(image) => image,
        // A compiler that cannot write this architecture's CUBIN: PTX for the driver to
        // compile, as before the cache (not kept). A source that does not compile fails both
        // ways, with the first error (NVRTC's log).
        Err(e) => return load_ptx(ctx, arch, &job.source, name, &job.options).map_err(|_| e),
    };
    COMPILED.fetch_add(1, Ordering::Relaxed);
    log::debug!(
        "GPU: {name} compiled by NVRTC for {arch} in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    if let Some(d) = dir
        && let Err(e) = kernel_cache::write(d, &job.key, &image)
    {
        log::debug!("GPU: the kernel cache {d:?} is not writable ({e}); compiling every process");
    }
    ctx.load_module(Ptx::from_binary(image))
        .map_err(drv("module load"))
}

/// `source` compiled by NVRTC to PTX for `arch`'s virtual architecture (`compute_XY`) and
/// loaded into `ctx`: the driver compiles it for the device.
fn load_ptx(
    ctx: &Arc<CudaContext>,
    arch: &str,
    source: &str,
    name: &str,
    options: &[String],
) -> Result<Arc<CudaModule>, GpuError> {
    let virtual_arch = arch.replacen("sm_", "compute_", 1);
    let options: Vec<String> = options
        .iter()
        .map(|o| match o.strip_prefix("--gpu-architecture=") {
            Some(_) => format!("--gpu-architecture={virtual_arch}"),
            None => o.clone(),
        })
        .collect();
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(
        source,
        cudarc::nvrtc::CompileOptions {
            options,
            name: Some(name.into()),
            ..Default::default()
        },
    )
    .map_err(|e| GpuError::Compile(format!("{name} as PTX: {e:?}")))?;
    COMPILED.fetch_add(1, Ordering::Relaxed);
    log::debug!("GPU: {name} compiled by NVRTC as PTX for {virtual_arch} (no CUBIN for {arch})");
    ctx.load_module(ptx).map_err(drv("module load"))
}

/// NVRTC's version, `major.minor` (part of the cache key: another compiler, another image).
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints through the pointers, which are valid for the call.
    match unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result() {
        Ok(()) => format!("{major}.{minor}"),
        Err(_) => "unknown".into(),
    }
}

/// An NVRTC program, destroyed when dropped.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `nvrtc::create_program` and is destroyed once.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// Compiles `source` with NVRTC and `options` (the architecture among them, an `sm_XY`) into
/// a CUBIN; a compile failure carries NVRTC's log.
fn compile(source: &str, name: &str, options: &[String]) -> Result<Vec<u8>, GpuError> {
    let failed =
        |what: &str, e: nvrtc::NvrtcError| GpuError::Compile(format!("{name}: {what}: {e:?}"));
    let src = CString::new(source)
        .map_err(|_| GpuError::Compile(format!("{name}: the source holds a NUL byte")))?;
    let cname = CString::new(name)
        .map_err(|_| GpuError::Compile(format!("{name}: the name holds a NUL byte")))?;
    if options.iter().any(|o| o.contains('\0')) {
        return Err(GpuError::Compile(format!(
            "{name}: an option holds a NUL byte"
        )));
    }
    let prog = Program(nvrtc::create_program(&src, Some(&cname)).map_err(|e| failed("create", e))?);
    // SAFETY: `prog` is a live program; the options hold no NUL byte (checked above), so the
    // conversion inside cannot fail.
    if let Err(e) = unsafe { nvrtc::compile_program(prog.0, options) } {
        // SAFETY: `prog` is a live program.
        let log = unsafe { nvrtc::get_program_log(prog.0) }
            .map(|l| {
                let bytes: Vec<u8> = l
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_else(|_| format!("{e:?}"));
        return Err(GpuError::Compile(log));
    }
    let mut size = 0usize;
    // SAFETY: `prog` is compiled; NVRTC writes the image's size through the pointer.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| failed("CUBIN size", e))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC said the CUBIN takes.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| failed("CUBIN", e))?;
    if image.is_empty() {
        return Err(GpuError::Compile(format!(
            "{name}: NVRTC returned no CUBIN"
        )));
    }
    Ok(image)
}
