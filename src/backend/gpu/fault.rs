//! Fault injection for the GPU backend's failure paths.
//!
//! Every way the GPU can fail has a path that must end with the query on the CPU (or a clear
//! `DataFusionError`), never a panic, a hang or a wrong answer. Most of those failures cannot
//! be caused at will on a healthy machine, so the backend checks these switches at the points
//! where they happen for real (only with the cargo feature `tuning`: without it each check
//! is a constant `false` and nothing is injected):
//!
//! | fault | where | effect |
//! | --- | --- | --- |
//! | `no-driver` | backend start | as if `libcuda` were missing ([`GpuError::NoDriver`]) |
//! | `no-nvrtc` | backend start | as if `libnvrtc` were missing ([`GpuError::NoNvrtc`]) |
//! | `no-device` | backend start | the driver reports no device ([`GpuError::NoDevice`]) |
//! | `nvrtc` | every kernel compile | the source handed to NVRTC gets an `#error` line: a real compile failure with NVRTC's log ([`GpuError::Compile`]) |
//! | `oom` | every device allocation | the allocation fails ([`GpuError::OutOfMemory`]) |
//! | `pinned-oom` | every page-locked host allocation | as `oom`, for pinned staging memory |
//! | `kernel` | every wait for the device | a kernel that executes `__trap()` is queued first: a real kernel fault, which leaves the context unusable (sticky), as an illegal address would |
//!
//! The backend-start faults act on the first use of the GPU in a process (the backend starts
//! once); the others act on every call while armed. The switches come from the environment
//! variable `DFSETS_GPU_FAULT` (a comma-separated list of the names above), read once, and can
//! be flipped at run time with [`arm`] / [`disarm`]. With none armed each check is one relaxed
//! atomic load. `tests/gpu_faults.rs` (built with `--features tuning`) runs every fault
//! against every GPU entry point, on a machine without a GPU (CI) and on the GPU machine
//! (`scripts/gpu/run.sh`).
//!
//! [`GpuError::NoDriver`]: super::GpuError::NoDriver
//! [`GpuError::NoNvrtc`]: super::GpuError::NoNvrtc
//! [`GpuError::NoDevice`]: super::GpuError::NoDevice
//! [`GpuError::Compile`]: super::GpuError::Compile
//! [`GpuError::OutOfMemory`]: super::GpuError::OutOfMemory

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// A failure the GPU backend can be made to suffer (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    NoDriver,
    NoNvrtc,
    NoDevice,
    Compile,
    OutOfMemory,
    PinnedOutOfMemory,
    Kernel,
}

impl Fault {
    /// Every fault, in the order of the module docs' table.
    pub const ALL: [Fault; 7] = [
        Fault::NoDriver,
        Fault::NoNvrtc,
        Fault::NoDevice,
        Fault::Compile,
        Fault::OutOfMemory,
        Fault::PinnedOutOfMemory,
        Fault::Kernel,
    ];

    /// The fault's name in `DFSETS_GPU_FAULT`.
    pub fn name(self) -> &'static str {
        match self {
            Fault::NoDriver => "no-driver",
            Fault::NoNvrtc => "no-nvrtc",
            Fault::NoDevice => "no-device",
            Fault::Compile => "nvrtc",
            Fault::OutOfMemory => "oom",
            Fault::PinnedOutOfMemory => "pinned-oom",
            Fault::Kernel => "kernel",
        }
    }

    /// The fault named `name` (as in `DFSETS_GPU_FAULT`).
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name.trim())
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

static ARMED: AtomicU32 = AtomicU32::new(0);
static FROM_ENV: OnceLock<()> = OnceLock::new();

/// Arms the switches `DFSETS_GPU_FAULT` names (the knob `gpu_fault`), once per process.
/// Unknown names are logged and ignored.
fn read_env() {
    FROM_ENV.get_or_init(|| {
        let Some(spec) = &crate::tuning::knobs().gpu_fault else {
            return;
        };
        for name in spec.split(',').filter(|s| !s.trim().is_empty()) {
            match Fault::parse(name) {
                Some(f) => {
                    ARMED.fetch_or(f.bit(), Ordering::Relaxed);
                }
                None => log::warn!("datafusion-sets: DFSETS_GPU_FAULT: unknown fault {name:?}"),
            }
        }
    });
}

/// Makes `fault` happen at its point from now on.
pub fn arm(fault: Fault) {
    read_env();
    ARMED.fetch_or(fault.bit(), Ordering::Relaxed);
}

/// Stops injecting `fault` (a fault that already happened stays happened: a context lost to
/// `kernel` stays lost).
pub fn disarm(fault: Fault) {
    read_env();
    ARMED.fetch_and(!fault.bit(), Ordering::Relaxed);
}

/// Whether `fault` is armed.
pub fn armed(fault: Fault) -> bool {
    read_env();
    ARMED.load(Ordering::Relaxed) & fault.bit() != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Fault::ALL {
            assert_eq!(Fault::parse(f.name()), Some(f));
        }
        assert_eq!(Fault::parse(" oom "), Some(Fault::OutOfMemory));
        assert_eq!(Fault::parse("segfault"), None);
        let bits: Vec<u32> = Fault::ALL.iter().map(|f| f.bit()).collect();
        for (i, b) in bits.iter().enumerate() {
            assert_eq!(b.count_ones(), 1);
            assert!(bits[..i].iter().all(|o| o != b), "{:?}", Fault::ALL[i]);
        }
    }
}
