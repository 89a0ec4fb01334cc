//! The kernel modules: the CUDA sources of kernels/*.cu, embedded in the binary, each
//! compiled with NVRTC for the device's own architecture once per process, on first use, and
//! loaded into the context (candle keeps its CUDA modules the same way). A compile failure
//! carries NVRTC's log and is kept: the module is not compiled again.
//!
//! The driver that asks for a module first gives its compile options (the `-D` shapes its
//! kernels take, from the measurement knobs); the runtime compiles the base module,
//! kernels/intersect.cu, when it starts (`super::ready`).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use super::GpuError;
#[cfg(feature = "tuning")]
use super::fault::{self, Fault};
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

/// The process's modules, each compiled once for `arch` (e.g. `compute_90`).
pub(crate) struct Modules {
    arch: &'static str,
    slots: [OnceLock<Result<Arc<CudaModule>, GpuError>>; Module::COUNT],
}

impl Modules {
    pub(crate) fn new(arch: &'static str) -> Self {
        Modules {
            arch,
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
                compile(ctx, self.arch, &source, m.file(), options())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Module `m` if it was compiled.
    #[cfg(feature = "tuning")]
    pub(crate) fn compiled(&self, m: Module) -> Option<&Arc<CudaModule>> {
        self.slots[m.slot()].get()?.as_ref().ok()
    }
}

/// Compiles `source` with NVRTC for `arch` as C++17 plus `extra` options, and loads it into
/// `ctx`; a compile failure carries NVRTC's log.
fn compile(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    source: &str,
    name: &str,
    extra: Vec<String>,
) -> Result<Arc<CudaModule>, GpuError> {
    let mut options = vec!["--std=c++17".to_string()];
    options.extend(extra);
    #[cfg(feature = "tuning")]
    let injected;
    #[cfg(feature = "tuning")]
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
