//! PLACEHOLDER for the SSE4.2 STTNI kernels (a colleague owns this file and will replace it).
//!
//! These stubs only fix the public API that `mod.rs` dispatches to; they forward to the
//! scalar merge and run no SSE4.2 code.

use super::SetElem;

/// Whether the CPU has SSE4.2 (placeholder: real detection, scalar body).
pub fn sse42_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// PLACEHOLDER: forwards to the scalar merge.
///
/// # Safety
/// Caller checked `sse42_available()`; `a`, `b` strictly increasing.
pub unsafe fn intersect_u16(a: &[u16], b: &[u16], out: &mut Vec<u16>) -> usize {
    super::intersect(super::Kernel::Scalar, a, b, out)
}

/// PLACEHOLDER: forwards to the scalar merge (the real one: hierarchical, upper-16-bit blocks).
///
/// # Safety
/// Caller checked `sse42_available()`; `T` of 32 bits; `a`, `b` strictly increasing.
pub unsafe fn intersect_u32_hier<T: SetElem>(a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    super::intersect(super::Kernel::Scalar, a, b, out)
}

/// PLACEHOLDER: forwards to the scalar merge.
///
/// # Safety
/// Caller checked `sse42_available()`; `a`, `b` strictly increasing.
pub unsafe fn intersect_i16(a: &[i16], b: &[i16], out: &mut Vec<i16>) -> usize {
    super::intersect(super::Kernel::Scalar, a, b, out)
}
