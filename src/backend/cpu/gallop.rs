//! Galloping: the values of the shorter list are searched in the longer one.
//!
//! Two engines (measured on the dev machine; W3 = 5k rows, |a| 5..50, |b| 5e3..5e4, u32,
//! cold data): one value at a time, exponential search from the last position then binary
//! search whose last levels are one SIMD compare (`gallop_with`), 30-50 ms; and batches of
//! values searched in lockstep (`gallop_batched`), 12-13 ms: the independent loads of one
//! level overlap their cache misses, and every level prefetches both candidates of the
//! next. The lockstep search must stay branch-free (`select_unpredictable`): compiled with a
//! branch, its ~50% mispredictions squash the overlapping loads (W3 took 16 ms so, and the
//! all-galloping W1 546 ms instead of 155). Interpolation-guided windows were tried and
//! lost on every variant (15 ms).

use std::hint::select_unpredictable;

use super::SetElem;

/// Galloping intersection core.
///
/// For each `x` in `small` (ascending) it finds the first position `pos >= lo` of `big` with
/// `big[pos] >= x`: exponential probes at `lo + LANES - 1`, then doubling steps, then a
/// branch-free binary search down to a window of at most `LANES` candidates, finished by
/// `count_lt(p, x)`, which must return how many of the `LANES` values at `p` are `< x`
/// (for `LANES == 1` a plain compare). Stops as soon as `big` is exhausted.
///
/// # Safety
/// `small`, `big` strictly increasing; `count_lt` may read `LANES` values at `p` (it is
/// only called with `p..p + LANES` inside `big`); when `WRITE`, `dst` is valid for writes of
/// `small.len()` elements.
#[inline(always)]
pub(crate) unsafe fn gallop_with<T: SetElem, const WRITE: bool, const LANES: usize>(
    small: &[T],
    big: &[T],
    dst: *mut T,
    count_lt: impl Fn(*const T, T) -> usize,
) -> usize {
    let nb = big.len();
    let pb = big.as_ptr();
    // SAFETY: every caller of `at` below passes an index < nb.
    let at = |idx: usize| unsafe { *pb.add(idx) };
    let (mut lo, mut k) = (0usize, 0usize);
    for &x in small {
        // Exponential search: invariant big[..lo] < x.
        let mut hi = lo + (LANES - 1);
        let mut step = LANES;
        while hi < nb && at(hi) < x {
            lo = hi + 1;
            hi += step;
            step <<= 1;
        }
        // Now the answer (first index with big[idx] >= x) lies in [lo, min(hi, nb)].
        let end = if hi < nb { hi + 1 } else { nb };
        let (mut base, mut n) = (lo, end - lo);
        // Branch-free binary search: the answer stays in [base, base + n].
        while n > LANES {
            let half = n / 2;
            // A branch here measured faster than a select (one search at a time: the
            // speculated loads run ahead like prefetches).
            base = if at(base + half - 1) < x {
                base + half
            } else {
                base
            };
            n -= half;
        }
        let pos = if base + LANES <= nb {
            // The window base..base+LANES is sorted and holds the answer, so the count of
            // values below x is the answer's offset.
            base + count_lt(pb.wrapping_add(base), x)
        } else {
            while base < end && at(base) < x {
                base += 1;
            }
            base
        };
        if pos >= nb {
            break;
        }
        let hit = at(pos) == x;
        if WRITE {
            // SAFETY: k counts matches of earlier values of `small`, so k < small.len().
            unsafe { dst.add(k).write(x) };
        }
        k += usize::from(hit);
        lo = pos + usize::from(hit);
    }
    k
}

/// Scalar galloping of `small` into `big`.
///
/// # Safety
/// `small`, `big` strictly increasing; when `WRITE`, `dst` valid for `small.len()` writes.
#[inline]
pub(crate) unsafe fn gallop_scalar<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    // SAFETY: the caller's promise; with LANES = 1 `count_lt` reads the one value at `p`,
    // which `gallop_with` keeps inside `big`.
    unsafe {
        gallop_with::<T, WRITE, 1>(small, big, dst, |p, x| {
            // SAFETY: `p` points into `big` (see above).
            usize::from(*p < x)
        })
    }
}

/// Values of the short list searched in lockstep by [`gallop_batched`] while more than 64
/// are left (a last chunk of up to 64 runs as one lockstep group of 4 to 64).
const G: usize = 16;
/// Levels of the search tree whose pivots [`batch_lower_bound`] prefetches up front.
const TREE_PREFETCH: usize = 5;
/// Short lists of at least this many values gallop in batches ([`gallop_batched`]); a
/// single value is searched alone (exponential search, SIMD finisher). Measured u32, 4
/// values in 1024 (ratio 256): batched 504 ns, one at a time 674.
const BATCH_MIN: usize = 2;
/// [`gallop_batched`] searches to the end of the long list when at most this many values of
/// the short list are left.
const UNBOUNDED: usize = 64;

/// Lower bounds (first index with `big[idx] >= x[g]`) of all `x[g]` in `big[lo..end]`,
/// answers in `[lo, end]`, by `G` branch-free binary searches run in lockstep: the `G` loads
/// of one level are independent, so their cache misses overlap. The pivots of the first
/// [`TREE_PREFETCH`] levels (shared by all searches) are prefetched up front, and at every
/// level both candidates of each search's next probe, so the dependent chain of cache misses
/// is a fraction of the search depth.
///
/// # Safety
/// `lo <= end <= big.len()`; `big` sorted.
#[inline(always)]
unsafe fn batch_lower_bound<T: SetElem, const G: usize>(
    big: &[T],
    lo: usize,
    end: usize,
    x: &[T; G],
) -> [usize; G] {
    let pb = big.as_ptr();
    let mut base = [lo; G];
    let mut n = end - lo;
    if n * size_of::<T>() >= 64 << TREE_PREFETCH {
        // The implicit search tree's top levels: level t has 2^t pivots.
        let mut bases = [lo; 1 << TREE_PREFETCH];
        let mut m = n;
        for t in 0..TREE_PREFETCH {
            let half = m / 2;
            for i in (0..1usize << t).rev() {
                let b = bases[i];
                prefetch(pb.wrapping_add(b + half - 1));
                bases[2 * i] = b;
                bases[2 * i + 1] = b + half;
            }
            m -= half;
        }
    }
    // Invariant: each answer lies in [base[g], base[g] + n] and base[g] + n <= end.
    while n > 1 {
        let half = n / 2;
        // Prefetch both candidates of the next level's probe while this level's loads
        // (prefetched one level earlier) resolve: one level of latency is hidden. Only
        // where the candidates lie in different cache lines.
        let next = (n - half) / 2;
        if next * size_of::<T>() >= 64 {
            for &bg in &base {
                prefetch(pb.wrapping_add(bg + next - 1));
                prefetch(pb.wrapping_add(bg + half + next - 1));
            }
        }
        for (bg, &xg) in base.iter_mut().zip(x) {
            // SAFETY: base + half - 1 < base + n <= end <= big.len().
            let v = unsafe { *pb.add(*bg + half - 1) };
            *bg = select_unpredictable(v < xg, *bg + half, *bg);
        }
        n -= half;
    }
    if n == 1 {
        for (bg, &xg) in base.iter_mut().zip(x) {
            // SAFETY: base < base + 1 <= end <= big.len().
            let v = unsafe { *pb.add(*bg) };
            *bg += usize::from(v < xg);
        }
    }
    base
}

/// Hint the CPU to fetch the cache line at `p` (any address: a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint: it reads nothing architecturally and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// First index `>= lo` with `big[idx] >= x` (or `big.len()`), by exponential search from
/// `lo` then a branch-free binary search.
#[inline(always)]
fn exp_lower_bound<T: SetElem>(big: &[T], mut lo: usize, x: T) -> usize {
    let nb = big.len();
    let mut hi = lo;
    let mut step = 1;
    while hi < nb && big[hi] < x {
        lo = hi + 1;
        hi += step;
        step <<= 1;
    }
    let end = hi.min(nb);
    let (mut base, mut n) = (lo, end - lo);
    while n > 1 {
        let half = n / 2;
        base = select_unpredictable(big[base + half - 1] < x, base + half, base);
        n -= half;
    }
    if n == 1 && big[base] < x {
        base + 1
    } else {
        base
    }
}

/// Galloping in batches: the short list is cut into chunks of `G` values; the search range of
/// a chunk ends at the position of its last value (found by exponential search from the
/// previous chunk's end; the final chunk searches to the end of `big`), and the chunk's
/// values are then located by [`batch_lower_bound`] in lockstep.
///
/// # Safety
/// `small`, `big` strictly increasing; when `WRITE`, `dst` valid for `small.len()` writes.
pub(crate) unsafe fn gallop_batched<T: SetElem, const WRITE: bool>(
    small: &[T],
    big: &[T],
    dst: *mut T,
) -> usize {
    let (ns, nb) = (small.len(), big.len());
    let (mut lo, mut k, mut s) = (0usize, 0usize, 0usize);
    while s < ns && lo < nb {
        let rest = ns - s;
        // SAFETY: s < ns; the caller's promise covers `dst` (k < ns).
        let (n, next, used) = unsafe {
            let (r, d) = (&small[s..], dst.add(k));
            match rest {
                0..=4 => batch_chunk::<T, WRITE, 4>(r, big, lo, d),
                5..=8 => batch_chunk::<T, WRITE, 8>(r, big, lo, d),
                9..=12 => batch_chunk::<T, WRITE, 12>(r, big, lo, d),
                13..=16 => batch_chunk::<T, WRITE, 16>(r, big, lo, d),
                17..=24 => batch_chunk::<T, WRITE, 24>(r, big, lo, d),
                25..=32 => batch_chunk::<T, WRITE, 32>(r, big, lo, d),
                33..=48 => batch_chunk::<T, WRITE, 48>(r, big, lo, d),
                49..=64 => batch_chunk::<T, WRITE, 64>(r, big, lo, d),
                _ => batch_chunk::<T, WRITE, G>(r, big, lo, d),
            }
        };
        k += n;
        lo = next;
        s += used;
    }
    k
}

/// One chunk of [`gallop_batched`]: the first `min(G, rest.len())` values of `rest` (not
/// empty) searched from `lo`. Returns (matches, next `lo`).
///
/// # Safety
/// `lo <= big.len()`; when `WRITE`, `dst` valid for `min(G, rest.len())` writes.
#[inline(always)]
unsafe fn batch_chunk<T: SetElem, const WRITE: bool, const G: usize>(
    rest: &[T],
    big: &[T],
    lo: usize,
    dst: *mut T,
) -> (usize, usize, usize) {
    let nb = big.len();
    let cnt = G.min(rest.len());
    let chunk = &rest[..cnt];
    let last = chunk[cnt - 1];
    // Few values left: search them all to the end of `big` (no sequential bound search).
    let end = if rest.len() <= UNBOUNDED {
        nb
    } else {
        exp_lower_bound(big, lo, last)
    };
    let mut x = [last; G];
    x[..cnt].copy_from_slice(chunk);
    // SAFETY: lo <= end <= nb (exp_lower_bound returns a value in [lo, nb]).
    let pos = unsafe { batch_lower_bound(big, lo, end, &x) };
    let mut k = 0;
    for (&p, &xg) in pos[..cnt].iter().zip(chunk) {
        let hit = p < nb && big[p] == xg;
        if WRITE {
            // SAFETY: k counts matches of earlier values of the chunk: k < cnt.
            unsafe { dst.add(k).write(xg) };
        }
        k += usize::from(hit);
    }
    (k, pos[cnt - 1], cnt)
}

/// Galloping with the shorter of `a`, `b` probing the longer: in batches
/// ([`gallop_batched`]) from [`BATCH_MIN`] values, else one value with the SIMD finisher
/// this CPU has for `T` (AVX-512 or AVX2 for 32/64-bit) or the scalar one.
///
/// # Safety
/// `a`, `b` strictly increasing; when `WRITE`, `dst` valid for `min(a.len(), b.len())` writes.
pub(crate) unsafe fn gallop_auto<T: SetElem, const WRITE: bool>(
    a: &[T],
    b: &[T],
    dst: *mut T,
) -> usize {
    let (small, big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if small.len() >= BATCH_MIN {
        // SAFETY: the caller's promise.
        return unsafe { gallop_batched::<T, WRITE>(small, big, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::{avx2, avx512, features};
        let f = features();
        // SAFETY: the CPU feature each function needs was detected; the rest is
        // the caller's promise.
        unsafe {
            match T::BITS {
                32 if f.avx512f => return avx512::gallop32::<T, WRITE>(small, big, dst),
                64 if f.avx512f => return avx512::gallop64::<T, WRITE>(small, big, dst),
                32 if f.avx2 => return avx2::gallop32::<T, WRITE>(small, big, dst),
                64 if f.avx2 => return avx2::gallop64::<T, WRITE>(small, big, dst),
                _ => {}
            }
        }
    }
    // SAFETY: the caller's promise.
    unsafe { gallop_scalar::<T, WRITE>(small, big, dst) }
}

/// Whether block-kernel remainders of `ra` and `rb` values are skewed enough to gallop.
#[inline(always)]
pub(crate) fn skewed(ra: usize, rb: usize) -> bool {
    ra.max(rb) > TAIL_GALLOP_RATIO * ra.min(rb)
}

/// Remainder ratio above which block kernels gallop their tail.
const TAIL_GALLOP_RATIO: usize = 64;

/// Finish a block kernel: gallop when the remainders are skewed, else merge.
///
/// # Safety
/// As [`super::scalar::merge`].
#[inline]
pub(crate) unsafe fn tail<T: SetElem, const WRITE: bool>(a: &[T], b: &[T], dst: *mut T) -> usize {
    if skewed(a.len(), b.len()) {
        // SAFETY: the caller's promise (capacity min(len)).
        unsafe { gallop_auto::<T, WRITE>(a, b, dst) }
    } else {
        // SAFETY: the caller's promise.
        unsafe { super::scalar::merge::<T, WRITE>(a, b, dst) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn naive(a: &[i64], b: &[i64]) -> Vec<i64> {
        let s: BTreeSet<_> = a.iter().copied().collect();
        b.iter().copied().filter(|x| s.contains(x)).collect()
    }

    fn run(small: &[i64], big: &[i64]) -> Vec<i64> {
        let mut out = Vec::with_capacity(small.len());
        // SAFETY: capacity small.len().
        let n = unsafe { gallop_scalar::<i64, true>(small, big, out.as_mut_ptr()) };
        // SAFETY: n written.
        unsafe { out.set_len(n) };
        out
    }

    #[test]
    fn gallop_scalar_cases() {
        let big: Vec<i64> = (-500..500).map(|x| x * 3).collect();
        for small in [
            vec![],
            vec![-1500],
            vec![-1501, -1500, 0, 3, 4, 1497, 1498],
            vec![i64::MIN, i64::MAX],
            (-600..600).step_by(7).collect::<Vec<_>>(),
        ] {
            assert_eq!(run(&small, &big), naive(&small, &big), "{small:?}");
        }
        assert_eq!(run(&[1, 2], &[]), Vec::<i64>::new());
    }

    #[test]
    fn tail_cases() {
        let big: Vec<i64> = (0..1000).collect();
        let small = [5i64, 700, 999];
        let mut out = Vec::with_capacity(3);
        // SAFETY: capacity 3 = min len.
        let n = unsafe { tail::<i64, true>(&big, &small, out.as_mut_ptr()) };
        // SAFETY: n written.
        unsafe { out.set_len(n) };
        assert_eq!(out, small);
    }
}
