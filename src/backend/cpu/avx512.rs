//! AVX-512 kernels: all-pairs block compare (AVX-512F for 32/64-bit lanes, BW + VBMI2 for
//! 8/16-bit), VP2INTERSECT (32/64-bit) and the SIMD finisher of galloping.
//!
//! Block kernels load one vector of `a` (L lanes) and compare it with each of the L values of
//! the current block of `b` broadcast (embedded-broadcast compares into mask registers; on
//! the dev machine this measured faster than rotating the `b` vector with `valignd`, see
//! the notes in `mod.rs`), OR the masks, compress the matched lanes of `a` into the low lanes
//! (`vpcompress*` into a register, then one unaligned store into reserved capacity), and
//! advance whichever block has the smaller maximum (both on a tie), branch-free. The
//! remainders (< L values on one side) go to the scalar tail. Equality is tested on the raw
//! lane bits; order decisions compare `T` values, so signed types need nothing special.
//!
//! VP2INTERSECT replaces the L compares with one `vp2intersectd`/`vp2intersectq`. That
//! instruction has no stable intrinsic in `std::arch` (Rust 1.95), so it is emitted with
//! `asm!` into a fixed mask-register pair (`k2`, `k3`).
#![cfg(target_arch = "x86_64")]

use std::arch::asm;
use std::arch::x86_64::*;

use super::gallop::{gallop_with, prefetch, skewed, tail};
use super::{PREFETCH_BYTES, SetElem, Sortedness, sortedness};

/// The bits of a 32-bit `T`.
#[inline(always)]
fn bits32<T: SetElem>(x: T) -> u32 {
    assert!(size_of::<T>() == 4);
    // SAFETY: T is a 4-byte primitive integer (sealed trait, asserted size).
    unsafe { std::mem::transmute_copy::<T, u32>(&x) }
}

/// The bits of a 64-bit `T`.
#[inline(always)]
fn bits64<T: SetElem>(x: T) -> u64 {
    assert!(size_of::<T>() == 8);
    // SAFETY: T is an 8-byte primitive integer (sealed trait, asserted size).
    unsafe { std::mem::transmute_copy::<T, u64>(&x) }
}

/// All-pairs block kernel over one 512-bit vector per side, and its order-checking twin.
macro_rules! block_kernel {
    ($name:ident, $checked:ident, $core:ident, $feat:literal, $bits:literal, $lanes:literal,
     $mask:ty, $lane:ty, $set1:ident, $cmpeq:ident, $compress:ident, $maskload:ident,
     $ltu:ident, $lti:ident) => {
        #[doc = concat!("AVX-512 ", stringify!($lanes), "x", stringify!($lanes),
                        " all-pairs block intersection of ", stringify!($bits), "-bit values.")]
        ///
        /// # Safety
        /// The CPU has the enabled target features; `T::BITS` is the kernel's width; `a`, `b`
        /// strictly increasing; when `WRITE`, `dst` valid for writes of
        /// `min(a.len(), b.len()) + 512 / BITS` elements.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name<T: SetElem, const WRITE: bool>(
            a: &[T],
            b: &[T],
            dst: *mut T,
        ) -> usize {
            // SAFETY: the caller's promises; without CHECK the result is always `Some`.
            unsafe { $core::<T, WRITE, false>(a, b, dst) }.unwrap_or_default()
        }

        #[doc = concat!("[`", stringify!($name), "`] on inputs not known to be sorted: ",
                        "`None` unless both are strictly increasing.")]
        ///
        /// The block loop checks each block it loads (and the value after it) with one
        /// vector compare per side, so the order check reads the values the kernel reads
        /// anyway instead of making its own pass over memory; whatever the loop did not reach
        /// is checked before the tail runs. On unsorted input the loop's stores stay inside
        /// the capacity below and the written values are garbage (the caller discards them).
        ///
        /// # Safety
        /// The CPU has the enabled target features; `T::BITS` is the kernel's width; when
        /// `WRITE`, `dst` valid for writes of `min(a.len(), b.len()) + 512 / BITS` elements.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $checked<T: SetElem, const WRITE: bool>(
            a: &[T],
            b: &[T],
            dst: *mut T,
        ) -> Option<usize> {
            // SAFETY: forwarded; CHECK drops the order precondition.
            unsafe { $core::<T, WRITE, true>(a, b, dst) }
        }

        /// The kernel; with `CHECK`, `None` when `a` or `b` is not strictly increasing.
        ///
        /// # Safety
        /// As [`$name`], except that with `CHECK` the inputs may be in any order.
        #[target_feature(enable = $feat)]
        unsafe fn $core<T: SetElem, const WRITE: bool, const CHECK: bool>(
            a: &[T],
            b: &[T],
            dst: *mut T,
        ) -> Option<usize> {
            const L: usize = $lanes;
            const PF: usize = PREFETCH_BYTES / ($bits / 8);
            assert!(size_of::<T>() * 8 == $bits);
            let (na, nb) = (a.len(), b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let (mut i, mut j, mut k) = (0usize, 0usize, 0usize);
            // CHECK: `ordered` keeps the lanes whose value was below its successor in every
            // block checked; the loop stops one value early so that successor is in bounds.
            let stop = usize::from(CHECK);
            let limit = na.min(nb);
            let mut ordered: $mask = <$mask>::MAX;
            while i + L + stop <= na && j + L + stop <= nb {
                // SAFETY: i + L <= na, so the L values at pa+i are inside `a`; T is a primitive
                // integer of the lane width (sealed trait), so its bytes are plain lanes.
                let va = unsafe { _mm512_loadu_si512(pa.add(i).cast()) };
                if CHECK {
                    // SAFETY: i + L + 1 <= na and j + L + 1 <= nb (the loop's bound).
                    let (va1, vb, vb1) = unsafe {
                        (
                            _mm512_loadu_si512(pa.add(i + 1).cast()),
                            _mm512_loadu_si512(pb.add(j).cast()),
                            _mm512_loadu_si512(pb.add(j + 1).cast()),
                        )
                    };
                    ordered &= if T::SIGNED {
                        $lti(va, va1) & $lti(vb, vb1)
                    } else {
                        $ltu(va, va1) & $ltu(vb, vb1)
                    };
                }
                prefetch(pa.wrapping_add(i + PF));
                prefetch(pb.wrapping_add(j + PF));
                let lb = pb.wrapping_add(j).cast::<$lane>();
                let mut m: $mask = 0;
                for t in 0..L {
                    // SAFETY: j + t < j + L <= nb: inside `b`.
                    let y = unsafe { lb.add(t).read() };
                    m |= $cmpeq(va, $set1(y as _));
                }
                if WRITE {
                    // SAFETY: k (matches so far) <= min(na, nb) (for sorted input by the
                    // merge, under CHECK also by the clamp below), so the L-lane store stays
                    // in the min(na, nb) + L elements the caller made valid at `dst`.
                    unsafe { _mm512_storeu_si512(dst.add(k).cast(), $compress(m, va)) };
                }
                k += m.count_ones() as usize;
                if CHECK {
                    // Unsorted input can match a value more than once.
                    k = k.min(limit);
                }
                // SAFETY: i + L - 1 < na and j + L - 1 < nb.
                let (amax, bmax) = unsafe { (*pa.add(i + L - 1), *pb.add(j + L - 1)) };
                // The maxima pass through general registers: without that, LLVM vectorised
                // the pair of steps in the checked kernel (both compares and both adds in one
                // XMM register), a longer loop-carried chain into the next iteration's
                // addresses (W2 ~1.5x slower). The asm is a comment: no instruction.
                let (mut x, mut y) = (amax.order_bits(), bmax.order_bits());
                // SAFETY: no instruction; it only pins the values to registers.
                unsafe {
                    asm!("/* {0} {1} */", inout(reg) x, inout(reg) y,
                         options(pure, nomem, nostack, preserves_flags));
                }
                i += L * usize::from(x <= y);
                j += L * usize::from(y <= x);
            }
            // CHECK: every neighbour pair before positions i and j is checked; the rest is
            // checked before the tail, which needs sorted input.
            if CHECK
                && (ordered != <$mask>::MAX
                    || sortedness(&a[i..]) != Sortedness::Strict
                    || sortedness(&b[j..]) != Sortedness::Strict)
            {
                return None;
            }
            // Tail: one side has fewer than L values left. Partial blocks: masked loads
            // (masked-off lanes are not read) padded with the block's maximum, matches
            // restricted to the valid lanes of `a`; skewed remainders gallop instead.
            while i < na && j < nb {
                let (ra, rb) = ((na - i).min(L), (nb - j).min(L));
                if skewed(na - i, nb - j) {
                    break;
                }
                let fa: $mask = <$mask>::MAX >> (L - ra);
                // SAFETY: i + ra <= na and j + rb <= nb.
                let (amax, bmax) = unsafe { (*pa.add(i + ra - 1), *pb.add(j + rb - 1)) };
                // SAFETY: only the `ra` lanes selected by `fa` are read, all inside `a`.
                let va = unsafe {
                    $maskload($set1(*pa.add(i + ra - 1).cast::<$lane>() as _), fa, pa.add(i).cast())
                };
                let lb = pb.wrapping_add(j).cast::<$lane>();
                let mut m: $mask = 0;
                for t in 0..rb {
                    // SAFETY: j + t < j + rb <= nb.
                    let y = unsafe { lb.add(t).read() };
                    m |= $cmpeq(va, $set1(y as _));
                }
                m &= fa;
                if WRITE {
                    // SAFETY: as in the main loop.
                    unsafe { _mm512_storeu_si512(dst.add(k).cast(), $compress(m, va)) };
                }
                k += m.count_ones() as usize;
                i += ra * usize::from(amax <= bmax);
                j += rb * usize::from(bmax <= amax);
            }
            // SAFETY: i <= na, j <= nb. Matches so far used values of a[..i + L] and
            // b[..j + L], so k + min(na - i, nb - j) <= min(na, nb) + L: the tail's writes
            // stay in the caller's capacity.
            Some(k + unsafe { tail::<T, WRITE>(a.get_unchecked(i..), b.get_unchecked(j..), dst.add(k)) })
        }
    };
}

block_kernel!(
    block32,
    block32_checked,
    block32_core,
    "avx512f,popcnt",
    32,
    16,
    u16,
    u32,
    _mm512_set1_epi32,
    _mm512_cmpeq_epi32_mask,
    _mm512_maskz_compress_epi32,
    _mm512_mask_loadu_epi32,
    _mm512_cmplt_epu32_mask,
    _mm512_cmplt_epi32_mask
);
block_kernel!(
    block64,
    block64_checked,
    block64_core,
    "avx512f,popcnt",
    64,
    8,
    u8,
    u64,
    _mm512_set1_epi64,
    _mm512_cmpeq_epi64_mask,
    _mm512_maskz_compress_epi64,
    _mm512_mask_loadu_epi64,
    _mm512_cmplt_epu64_mask,
    _mm512_cmplt_epi64_mask
);
block_kernel!(
    block16,
    block16_checked,
    block16_core,
    "avx512f,avx512bw,avx512vbmi2,popcnt",
    16,
    32,
    u32,
    u16,
    _mm512_set1_epi16,
    _mm512_cmpeq_epi16_mask,
    _mm512_maskz_compress_epi16,
    _mm512_mask_loadu_epi16,
    _mm512_cmplt_epu16_mask,
    _mm512_cmplt_epi16_mask
);
block_kernel!(
    block8,
    block8_checked,
    block8_core,
    "avx512f,avx512bw,avx512vbmi2,popcnt",
    8,
    64,
    u64,
    u8,
    _mm512_set1_epi8,
    _mm512_cmpeq_epi8_mask,
    _mm512_maskz_compress_epi8,
    _mm512_mask_loadu_epi8,
    _mm512_cmplt_epu8_mask,
    _mm512_cmplt_epi8_mask
);

/// `vp2intersectd`: mask of the lanes of `a` equal to some lane of `b`.
///
/// # Safety
/// The CPU has AVX512F and AVX512_VP2INTERSECT.
#[inline]
#[target_feature(enable = "avx512f,avx512vp2intersect")]
pub(super) unsafe fn vp2intersect_d(a: __m512i, b: __m512i) -> u16 {
    let ma: u16;
    // SAFETY: the caller checked the feature; the instruction only writes k2 (lanes of `a`
    // found in `b`) and k3 (lanes of `b` found in `a`), both declared as outputs.
    unsafe {
        asm!("vp2intersectd k2, {a}, {b}", a = in(zmm_reg) a, b = in(zmm_reg) b,
             out("k2") ma, out("k3") _, options(pure, nomem, nostack));
    }
    ma
}

/// `vp2intersectq`: mask of the lanes of `a` equal to some lane of `b`.
///
/// # Safety
/// The CPU has AVX512F and AVX512_VP2INTERSECT.
#[inline]
#[target_feature(enable = "avx512f,avx512vp2intersect")]
unsafe fn vp2intersect_q(a: __m512i, b: __m512i) -> u8 {
    let ma: u8;
    // SAFETY: as in `vp2intersect_d`.
    unsafe {
        asm!("vp2intersectq k2, {a}, {b}", a = in(zmm_reg) a, b = in(zmm_reg) b,
             out("k2") ma, out("k3") _, options(pure, nomem, nostack));
    }
    ma
}

/// Block kernel whose L x L compare is one mask-producing operation `m(va, vb)`.
macro_rules! pair_kernel {
    ($name:ident, $feat:literal, $bits:literal, $lanes:literal, $mask:ty, $pairmask:path,
     $set1:ident, $compress:ident, $maskload:ident, $lane:ty) => {
        #[doc = concat!("Block intersection of ", stringify!($bits), "-bit values with `",
                                stringify!($pairmask), "` (", stringify!($lanes), " lanes).")]
        ///
        /// # Safety
        /// As the AVX-512 block kernels, and the CPU has the features of the mask operation.
        #[target_feature(enable = $feat)]
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
                // SAFETY: both vectors lie inside their slices (i + L <= na, j + L <= nb);
                // T is a primitive integer of the lane width (sealed trait).
                let (va, vb) = unsafe {
                    (
                        _mm512_loadu_si512(pa.add(i).cast()),
                        _mm512_loadu_si512(pb.add(j).cast()),
                    )
                };
                prefetch(pa.wrapping_add(i + PF));
                prefetch(pb.wrapping_add(j + PF));
                // SAFETY: the caller checked the mask operation's CPU features.
                let m = unsafe { $pairmask(va, vb) };
                if WRITE {
                    // SAFETY: as in the block kernels: k <= min(na, nb), capacity + L.
                    unsafe { _mm512_storeu_si512(dst.add(k).cast(), $compress(m, va)) };
                }
                k += m.count_ones() as usize;
                // SAFETY: i + L - 1 < na and j + L - 1 < nb.
                let (amax, bmax) = unsafe { (*pa.add(i + L - 1), *pb.add(j + L - 1)) };
                i += L * usize::from(amax <= bmax);
                j += L * usize::from(bmax <= amax);
            }
            // Tail with partial blocks, as in the block kernels; both vectors are padded with
            // their block's maximum (a value of that block, so no false match).
            while i < na && j < nb {
                let (ra, rb) = ((na - i).min(L), (nb - j).min(L));
                if skewed(na - i, nb - j) {
                    break;
                }
                let (fa, fb): ($mask, $mask) = (<$mask>::MAX >> (L - ra), <$mask>::MAX >> (L - rb));
                // SAFETY: i + ra <= na and j + rb <= nb.
                let (amax, bmax) = unsafe { (*pa.add(i + ra - 1), *pb.add(j + rb - 1)) };
                // SAFETY: only the lanes selected by `fa`/`fb` are read, all inside the slices;
                // the maxima are read at in-bounds positions.
                let (va, vb) = unsafe {
                    let pada = $set1(*pa.add(i + ra - 1).cast::<$lane>() as _);
                    let padb = $set1(*pb.add(j + rb - 1).cast::<$lane>() as _);
                    (
                        $maskload(pada, fa, pa.add(i).cast()),
                        $maskload(padb, fb, pb.add(j).cast()),
                    )
                };
                // SAFETY: the caller checked the mask operation's CPU features.
                let m = unsafe { $pairmask(va, vb) } & fa;
                if WRITE {
                    // SAFETY: as in the main loop.
                    unsafe { _mm512_storeu_si512(dst.add(k).cast(), $compress(m, va)) };
                }
                k += m.count_ones() as usize;
                i += ra * usize::from(amax <= bmax);
                j += rb * usize::from(bmax <= amax);
            }
            // SAFETY: as in the block kernels.
            k + unsafe { tail::<T, WRITE>(a.get_unchecked(i..), b.get_unchecked(j..), dst.add(k)) }
        }
    };
}

pair_kernel!(
    vp2i32,
    "avx512f,avx512vp2intersect,popcnt",
    32,
    16,
    u16,
    vp2intersect_d,
    _mm512_set1_epi32,
    _mm512_maskz_compress_epi32,
    _mm512_mask_loadu_epi32,
    u32
);
pair_kernel!(
    vp2i64,
    "avx512f,avx512vp2intersect,popcnt",
    64,
    8,
    u8,
    vp2intersect_q,
    _mm512_set1_epi64,
    _mm512_maskz_compress_epi64,
    _mm512_mask_loadu_epi64,
    u64
);

/// Galloping of 32-bit values finished by one 16-lane compare.
///
/// # Safety
/// AVX512F present; `small`, `big` strictly increasing; when `WRITE`, `dst` valid for
/// `small.len()` writes.
#[target_feature(enable = "avx512f,popcnt")]
pub(crate) unsafe fn gallop32<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    let count_lt = |p: *const T, x: T| {
        // SAFETY: `gallop_with` passes `p` with 16 values of `big` after it.
        let v = unsafe { _mm512_loadu_si512(p.cast()) };
        let vx = _mm512_set1_epi32(bits32(x) as i32);
        let m = if T::SIGNED {
            _mm512_cmplt_epi32_mask(v, vx)
        } else {
            _mm512_cmplt_epu32_mask(v, vx)
        };
        m.count_ones() as usize
    };
    // SAFETY: the caller's promise; `count_lt` reads exactly 16 values.
    unsafe { gallop_with::<T, WRITE, 16>(small, big, dst, count_lt) }
}

/// Galloping of 64-bit values finished by one 8-lane compare.
///
/// # Safety
/// As [`gallop32`].
#[target_feature(enable = "avx512f,popcnt")]
pub(crate) unsafe fn gallop64<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    let count_lt = |p: *const T, x: T| {
        // SAFETY: `gallop_with` passes `p` with 8 values of `big` after it.
        let v = unsafe { _mm512_loadu_si512(p.cast()) };
        let vx = _mm512_set1_epi64(bits64(x) as i64);
        let m = if T::SIGNED {
            _mm512_cmplt_epi64_mask(v, vx)
        } else {
            _mm512_cmplt_epu64_mask(v, vx)
        };
        m.count_ones() as usize
    };
    // SAFETY: the caller's promise; `count_lt` reads exactly 8 values.
    unsafe { gallop_with::<T, WRITE, 8>(small, big, dst, count_lt) }
}

/// `vp2intersectd`'s first mask computed with AVX-512F only: `a` against the 16 rotations of
/// `b` (`valignd`). The VP2INTERSECT emulation of the tests, so the kernels' logic is checked
/// on CPUs without the instruction (most: of ours, only AMD Zen 5 has it); as a production
/// kernel it measured 1.6-2.7x slower than broadcasts.
///
/// # Safety
/// The CPU has AVX512F (same contract shape as [`vp2intersect_d`]).
#[cfg(test)]
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rot_mask_d(a: __m512i, b: __m512i) -> u16 {
    macro_rules! rot {
        ($($r:literal)*) => { 0 $(| _mm512_cmpeq_epi32_mask(a, _mm512_alignr_epi32::<$r>(b, b)))* };
    }
    _mm512_cmpeq_epi32_mask(a, b) | rot!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
}

/// `vp2intersectq`'s first mask with AVX-512F only (8 rotations with `valignq`).
///
/// # Safety
/// The CPU has AVX512F.
#[cfg(test)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rot_mask_q(a: __m512i, b: __m512i) -> u8 {
    macro_rules! rot {
        ($($r:literal)*) => { 0 $(| _mm512_cmpeq_epi64_mask(a, _mm512_alignr_epi64::<$r>(b, b)))* };
    }
    _mm512_cmpeq_epi64_mask(a, b) | rot!(1 2 3 4 5 6 7)
}

#[cfg(test)]
pair_kernel!(
    rot32,
    "avx512f,popcnt",
    32,
    16,
    u16,
    rot_mask_d,
    _mm512_set1_epi32,
    _mm512_maskz_compress_epi32,
    _mm512_mask_loadu_epi32,
    u32
);
#[cfg(test)]
pair_kernel!(
    rot64,
    "avx512f,popcnt",
    64,
    8,
    u8,
    rot_mask_q,
    _mm512_set1_epi64,
    _mm512_maskz_compress_epi64,
    _mm512_mask_loadu_epi64,
    u64
);

#[cfg(test)]
mod tests {
    use super::super::tests::naive;
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    type Kern<T> = unsafe fn(&[T], &[T], *mut T) -> usize;

    /// Run `kw`/`kc` (write/count instances) on sub-slices at offset 1 against the reference.
    fn check<T: SetElem>(a: &[T], b: &[T], kw: Kern<T>, kc: Kern<T>) {
        let (mut ba, mut bb) = (vec![T::default()], vec![T::default()]);
        ba.extend_from_slice(a);
        bb.extend_from_slice(b);
        let (a, b) = (&ba[1..], &bb[1..]);
        let expect = naive(a, b);
        let mut out: Vec<T> = Vec::with_capacity(a.len().min(b.len()) + 16);
        // SAFETY: the CPU has AVX-512F (checked by the caller); capacity min + 16 lanes.
        let n = unsafe { kw(a, b, out.as_mut_ptr()) };
        // SAFETY: n values written.
        unsafe { out.set_len(n) };
        assert_eq!(out, expect);
        // SAFETY: as above; count-only writes nothing.
        assert_eq!(unsafe { kc(a, b, std::ptr::null_mut()) }, expect.len());
    }

    fn sets<T: Copy + Ord>(rng: &mut StdRng, f: impl Fn(u64) -> T) -> (Vec<T>, Vec<T>) {
        let (la, lb) = (rng.random_range(0..300usize), rng.random_range(0..300usize));
        let span = [2 * (la + lb) as u64 + 1, 1 << 40][rng.random_range(0..2)];
        let mut gen_set = |n: usize| {
            let mut v: Vec<T> = (0..n).map(|_| f(rng.random::<u64>() % span)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        (gen_set(la), gen_set(lb))
    }

    /// The VP2INTERSECT kernels' loop, tails and compaction, with the instruction emulated.
    #[test]
    fn vp2intersect_kernel_logic_emulated() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("popcnt"))
        {
            return;
        }
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let (a, b) = sets(&mut rng, |r| r as u32);
            check::<u32>(&a, &b, rot32::<u32, true>, rot32::<u32, false>);
            let (a, b) = sets(&mut rng, |r| (r as i32).wrapping_sub(1 << 20));
            check::<i32>(&a, &b, rot32::<i32, true>, rot32::<i32, false>);
            let (a, b) = sets(&mut rng, |r| r.wrapping_mul(0x9e37) ^ (1 << 63));
            check::<u64>(&a, &b, rot64::<u64, true>, rot64::<u64, false>);
            let (a, b) = sets(&mut rng, |r| (r as i64) - (1 << 39));
            check::<i64>(&a, &b, rot64::<i64, true>, rot64::<i64, false>);
        }
    }

    /// The instruction itself against a naive mask and the AVX-512F emulation, on random
    /// vectors from small domains (so that every lane matches in some draws), both widths.
    /// Runs where the CPU has VP2INTERSECT (AMD Zen 5; no lent GPU host has it).
    #[test]
    fn vp2intersect_masks() {
        if !std::arch::is_x86_feature_detected!("avx512vp2intersect") {
            return;
        }
        let mut rng = StdRng::seed_from_u64(11);
        let mut seen_d = 0u16;
        let mut seen_q = 0u8;
        for round in 0..2_000u32 {
            let domain = [17u32, 40, 1 << 20][round as usize % 3];
            let a: Vec<u32> = (0..16).map(|_| rng.random_range(0..domain)).collect();
            let b: Vec<u32> = (0..16).map(|_| rng.random_range(0..domain)).collect();
            let expect = (0..16)
                .filter(|&i| b.contains(&a[i]))
                .fold(0u16, |m, i| m | 1 << i);
            let (qa, qb): (Vec<u64>, Vec<u64>) = (
                a[..8].iter().map(|&x| u64::from(x) << 33 | 5).collect(),
                b[..8].iter().map(|&x| u64::from(x) << 33 | 5).collect(),
            );
            let expect_q = (0..8)
                .filter(|&i| qb.contains(&qa[i]))
                .fold(0u8, |m, i| m | 1 << i);
            // SAFETY: feature checked; 16 lanes of u32 and 8 of u64 each.
            let (got, emu, got_q, emu_q) = unsafe {
                let (va, vb) = (
                    _mm512_loadu_si512(a.as_ptr().cast()),
                    _mm512_loadu_si512(b.as_ptr().cast()),
                );
                let (wa, wb) = (
                    _mm512_loadu_si512(qa.as_ptr().cast()),
                    _mm512_loadu_si512(qb.as_ptr().cast()),
                );
                (
                    vp2intersect_d(va, vb),
                    rot_mask_d(va, vb),
                    vp2intersect_q(wa, wb),
                    rot_mask_q(wa, wb),
                )
            };
            assert_eq!((got, emu), (expect, expect), "{a:?} {b:?}");
            assert_eq!((got_q, emu_q), (expect_q, expect_q), "{qa:?} {qb:?}");
            seen_d |= got;
            seen_q |= got_q;
        }
        assert_eq!(
            (seen_d, seen_q),
            (u16::MAX, u8::MAX),
            "some lane never matched"
        );
    }
}
