//! AVX2 kernels: 8x8 (32-bit) and 4x4 (64-bit) all-pairs block compare with compaction by a
//! permutation from a lookup table, and the SIMD finisher of galloping.
//!
//! One vector of `a` is compared with each value of the current block of `b` broadcast
//! (`vpbroadcastd` from memory, `vpcmpeqd`), the results OR-ed, the match mask taken with
//! `vmovmskps`/`vmovmskpd`, and the matched lanes packed to the front with `vpermd` and a
//! permutation from a 256-entry (32-bit) or 16-entry (64-bit) table, then stored whole into
//! reserved capacity. The block with the smaller maximum advances (both on a tie),
//! branch-free; remainders go to the scalar tail.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::gallop::{gallop_with, prefetch, skewed, tail};
use super::{PREFETCH_BYTES, SetElem};

/// `PERM32[m]`: `vpermd` indices moving the lanes set in the 8-bit mask `m` to the front.
static PERM32: [[u32; 8]; 256] = perm32();
/// `PERM64[m]`: `vpermd` indices moving the 64-bit lanes set in the 4-bit `m` to the front.
static PERM64: [[u32; 8]; 16] = perm64();

const fn perm32() -> [[u32; 8]; 256] {
    let mut t = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut n = 0;
        let mut lane = 0;
        while lane < 8 {
            if m & (1 << lane) != 0 {
                t[m][n] = lane as u32;
                n += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
}

const fn perm64() -> [[u32; 8]; 16] {
    let mut t = [[0u32; 8]; 16];
    let mut m = 0;
    while m < 16 {
        let mut n = 0;
        let mut lane = 0;
        while lane < 4 {
            if m & (1 << lane) != 0 {
                t[m][2 * n] = 2 * lane as u32;
                t[m][2 * n + 1] = 2 * lane as u32 + 1;
                n += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
}

/// All-pairs AVX2 block kernel.
macro_rules! block_kernel {
    ($name:ident, $bits:literal, $lanes:literal, $lane:ty, $set1:ident, $cmpeq:ident,
     $movemask:expr, $perm:ident, $maskload:ident, $lanes_below:expr) => {
        #[doc = concat!("AVX2 ", stringify!($lanes), "x", stringify!($lanes),
                        " all-pairs block intersection of ", stringify!($bits), "-bit values.")]
        ///
        /// # Safety
        /// AVX2 present; `T::BITS` is the kernel's width; `a`, `b` strictly increasing; when
        /// `WRITE`, `dst` valid for writes of `min(a.len(), b.len()) + 256 / BITS` elements.
        #[target_feature(enable = "avx2,popcnt")]
        pub(crate) unsafe fn $name<T: SetElem, const WRITE: bool>(
            a: &[T],
            b: &[T],
            dst: *mut T,
        ) -> usize {
            const L: usize = $lanes;
            const PF: usize = PREFETCH_BYTES / ($bits / 8);
            assert!(size_of::<T>() * 8 == $bits);
            let (na, nb) = (a.len(), b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let (mut i, mut j, mut k) = (0usize, 0usize, 0usize);
            while i + L <= na && j + L <= nb {
                // SAFETY: i + L <= na: the vector lies inside `a`; T is a primitive integer of
                // the lane width (sealed trait).
                let va = unsafe { _mm256_loadu_si256(pa.add(i).cast()) };
                prefetch(pa.wrapping_add(i + PF));
                prefetch(pb.wrapping_add(j + PF));
                let lb = pb.wrapping_add(j).cast::<$lane>();
                let mut acc = _mm256_setzero_si256();
                for t in 0..L {
                    // SAFETY: j + t < j + L <= nb: inside `b`.
                    let y = unsafe { lb.add(t).read() };
                    acc = _mm256_or_si256(acc, $cmpeq(va, $set1(y as _)));
                }
                let m = ($movemask)(acc) as usize;
                if WRITE {
                    // `m < 2^L` indexes the table.
                    let perm = &$perm[m];
                    // SAFETY: `perm` is 8 u32; the store stays in the caller's
                    // min(na, nb) + L elements since k <= min(na, nb).
                    unsafe {
                        let p = _mm256_loadu_si256(perm.as_ptr().cast());
                        _mm256_storeu_si256(dst.add(k).cast(), _mm256_permutevar8x32_epi32(va, p));
                    }
                }
                k += m.count_ones() as usize;
                // SAFETY: i + L - 1 < na and j + L - 1 < nb.
                let (amax, bmax) = unsafe { (*pa.add(i + L - 1), *pb.add(j + L - 1)) };
                i += L * usize::from(amax <= bmax);
                j += L * usize::from(bmax <= amax);
            }
            // Tail: partial blocks with masked loads (masked-off lanes are not read), padded
            // with the block's maximum; matches restricted to the valid lanes of `a`; skewed
            // remainders gallop instead.
            while i < na && j < nb {
                let (ra, rb) = ((na - i).min(L), (nb - j).min(L));
                if skewed(na - i, nb - j) {
                    break;
                }
                // SAFETY: i + ra <= na and j + rb <= nb.
                let (amax, bmax) = unsafe { (*pa.add(i + ra - 1), *pb.add(j + rb - 1)) };
                let valid = ($lanes_below)(ra);
                // SAFETY: only the `ra` lanes selected by `valid` are read, all inside `a`;
                // the maximum is read in bounds.
                let va = unsafe {
                    let pad = $set1(*pa.add(i + ra - 1).cast::<$lane>() as _);
                    _mm256_blendv_epi8(pad, $maskload(pa.add(i).cast(), valid), valid)
                };
                let lb = pb.wrapping_add(j).cast::<$lane>();
                let mut acc = _mm256_setzero_si256();
                for t in 0..rb {
                    // SAFETY: j + t < j + rb <= nb.
                    let y = unsafe { lb.add(t).read() };
                    acc = _mm256_or_si256(acc, $cmpeq(va, $set1(y as _)));
                }
                let m = ($movemask)(_mm256_and_si256(acc, valid)) as usize;
                if WRITE {
                    let perm = &$perm[m];
                    // SAFETY: as in the main loop.
                    unsafe {
                        let p = _mm256_loadu_si256(perm.as_ptr().cast());
                        _mm256_storeu_si256(dst.add(k).cast(), _mm256_permutevar8x32_epi32(va, p));
                    }
                }
                k += m.count_ones() as usize;
                i += ra * usize::from(amax <= bmax);
                j += rb * usize::from(bmax <= amax);
            }
            // SAFETY: i <= na, j <= nb; k + min(na - i, nb - j) <= min(na, nb) + L (see the
            // AVX-512 kernels), inside the caller's capacity.
            k + unsafe { tail::<T, WRITE>(a.get_unchecked(i..), b.get_unchecked(j..), dst.add(k)) }
        }
    };
}

block_kernel!(
    block32,
    32,
    8,
    u32,
    _mm256_set1_epi32,
    _mm256_cmpeq_epi32,
    |v| _mm256_movemask_ps(_mm256_castsi256_ps(v)),
    PERM32,
    _mm256_maskload_epi32,
    |r: usize| _mm256_cmpgt_epi32(
        _mm256_set1_epi32(r as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
    )
);
block_kernel!(
    block64,
    64,
    4,
    u64,
    _mm256_set1_epi64x,
    _mm256_cmpeq_epi64,
    |v| _mm256_movemask_pd(_mm256_castsi256_pd(v)),
    PERM64,
    _mm256_maskload_epi64,
    |r: usize| _mm256_cmpgt_epi64(_mm256_set1_epi64x(r as i64), _mm256_setr_epi64x(0, 1, 2, 3))
);

/// Galloping of 32-bit values finished by one 8-lane compare.
///
/// # Safety
/// AVX2 present; `small`, `big` strictly increasing; when `WRITE`, `dst` valid for
/// `small.len()` writes.
#[target_feature(enable = "avx2,popcnt")]
pub(crate) unsafe fn gallop32<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    // Signed compare; unsigned values are biased by the sign bit first.
    let bias = if T::SIGNED { 0 } else { i32::MIN };
    let vbias = _mm256_set1_epi32(bias);
    let count_lt = |p: *const T, x: T| {
        // SAFETY: `gallop_with` passes `p` with 8 values of `big` after it.
        let v = unsafe { _mm256_loadu_si256(p.cast()) };
        // SAFETY: T is a 4-byte primitive integer (sealed trait, checked by the caller's
        // dispatch on T::BITS).
        let xb: i32 = unsafe { std::mem::transmute_copy::<T, i32>(&x) };
        let vx = _mm256_set1_epi32(xb ^ bias);
        let lt = _mm256_cmpgt_epi32(vx, _mm256_xor_si256(v, vbias));
        _mm256_movemask_ps(_mm256_castsi256_ps(lt)).count_ones() as usize
    };
    assert!(size_of::<T>() == 4);
    // SAFETY: the caller's promise; `count_lt` reads exactly 8 values.
    unsafe { gallop_with::<T, WRITE, 8>(small, big, dst, count_lt) }
}

/// Galloping of 64-bit values finished by one 4-lane compare.
///
/// # Safety
/// As [`gallop32`].
#[target_feature(enable = "avx2,popcnt")]
pub(crate) unsafe fn gallop64<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    let bias = if T::SIGNED { 0 } else { i64::MIN };
    let vbias = _mm256_set1_epi64x(bias);
    let count_lt = |p: *const T, x: T| {
        // SAFETY: `gallop_with` passes `p` with 4 values of `big` after it.
        let v = unsafe { _mm256_loadu_si256(p.cast()) };
        // SAFETY: T is an 8-byte primitive integer (sealed trait, dispatch on T::BITS).
        let xb: i64 = unsafe { std::mem::transmute_copy::<T, i64>(&x) };
        let vx = _mm256_set1_epi64x(xb ^ bias);
        let lt = _mm256_cmpgt_epi64(vx, _mm256_xor_si256(v, vbias));
        _mm256_movemask_pd(_mm256_castsi256_pd(lt)).count_ones() as usize
    };
    assert!(size_of::<T>() == 8);
    // SAFETY: the caller's promise; `count_lt` reads exactly 4 values.
    unsafe { gallop_with::<T, WRITE, 4>(small, big, dst, count_lt) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perm_tables() {
        assert_eq!(PERM32[0b1010_0101], [0, 2, 5, 7, 0, 0, 0, 0]);
        assert_eq!(PERM32[0xff], [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(PERM64[0b1010], [2, 3, 6, 7, 0, 0, 0, 0]);
    }
}
