//! The GPU backend's one error type.

use datafusion::common::DataFusionError;

/// Why the GPU backend could not run a batch. Every variant leaves the process usable: the
/// SQL layer runs the batch on the CPU instead (the reason goes to the debug log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The crate was built without the `cuda` feature.
    #[error("GPU backend not compiled in (cargo feature `cuda` is off)")]
    NotCompiled,
    /// `DFSETS_DISABLE_GPU` is set in the environment.
    #[error("GPU backend disabled by DFSETS_DISABLE_GPU")]
    Disabled,
    /// No CUDA driver library (`libcuda`) could be loaded.
    #[error("no CUDA driver library (libcuda) found")]
    NoDriver,
    /// No NVRTC library (`libnvrtc`) could be loaded.
    #[error("no NVRTC library (libnvrtc) found")]
    NoNvrtc,
    /// The driver loaded but reports no device.
    #[error("no CUDA device")]
    NoDevice,
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {op}: {message}")]
    Driver {
        /// The operation that failed.
        op: &'static str,
        /// The driver's error.
        message: String,
    },
    /// Device or pinned host memory ran out (after splitting the input as far as allowed).
    #[error("out of GPU or pinned memory in {0}")]
    OutOfMemory(&'static str),
    /// The query's memory pool refused the host memory the call would stage through.
    #[error("the memory pool refused {0}")]
    MemoryLimit(String),
    /// NVRTC could not compile the kernels.
    #[error("NVRTC failed to compile the kernels: {0}")]
    Compile(String),
    /// A kernel reported an internal error (the batch's results were discarded).
    #[error("GPU kernel error: {0}")]
    Kernel(String),
    /// A fault earlier in this process left the device unusable; the CPU runs everything.
    #[error("GPU backend disabled for this process after an earlier fault: {0}")]
    Broken(String),
    /// The input is not something the GPU kernels take (element width, shapes).
    #[error("not supported on the GPU: {0}")]
    Unsupported(String),
    /// The CUDA library panicked (caught; the GPU backend is then off for this process).
    #[error("the CUDA library panicked: {0}")]
    Panic(String),
}

impl From<GpuError> for DataFusionError {
    fn from(e: GpuError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}
