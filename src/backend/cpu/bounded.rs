//! Bounded overlap: `|x ∩ y|` of two strictly increasing `u32` lists if it reaches `need`,
//! else `None`, stopping as soon as `need` is out of reach — the verification of the
//! similarity join (a candidate pair passes when its sets share at least `need` more
//! tokens). With `EXACT = false` a kernel also stops as soon as `need` is reached (the count
//! is then a lower bound, enough for counting pairs).
//!
//! Kernels ([`BoundedKernel`]): the branch-free scalar merge (the oracle of the others) and
//! block merges over AVX2 (8 lanes), AVX-512 (16 lanes, broadcast compares) and AVX-512
//! VP2INTERSECT. The block merges keep the scalar's stopping rule at block granularity:
//! `slack_x` is how many tokens of `x` may still go unmatched before `need` is out of reach;
//! when a block of `x` is left behind (its maximum is not above the other block's), its
//! tokens that matched nothing are spent from `slack_x` (likewise `y`), and a negative slack
//! ends the merge. A block left behind can match nothing later: every later token of the
//! other side is above its maximum. Partial blocks (the last < L tokens of a side) are read
//! with masked loads; nothing is read past a slice's end.

use super::features;
use super::{CpuKernelChoice, Kernel};

/// A bounded-overlap kernel that runs on this CPU (only [`BoundedKernel::resolve`] makes
/// one, after checking the CPU's features, which is what makes [`overlap_at_least`] safe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundedKernel(Kernel);

impl BoundedKernel {
    /// The kernel for `tuning.cpu_kernel = choice` on this CPU. `auto`: the AVX2 block merge
    /// where the CPU has AVX2 (measured fastest on the similarity join's verification, whose
    /// remainders are short: 8-lane blocks waste fewer lanes than 16-lane ones; see
    /// `benches/README.md`), else AVX-512, else scalar. A forced kernel without a bounded
    /// form (galloping, SSE4.2) runs the scalar merge; one the CPU lacks falls back to the
    /// next one down: VP2INTERSECT, AVX-512, AVX2, scalar.
    pub fn resolve(choice: CpuKernelChoice) -> BoundedKernel {
        let f = features();
        let wanted = match choice {
            CpuKernelChoice::Auto if f.avx2 => Kernel::Avx2,
            CpuKernelChoice::Auto => Kernel::Avx512,
            CpuKernelChoice::Fixed(Kernel::Galloping | Kernel::Sse42) => Kernel::Scalar,
            CpuKernelChoice::Fixed(k) => k,
        };
        const ORDER: [Kernel; 4] = [
            Kernel::Vp2intersect,
            Kernel::Avx512,
            Kernel::Avx2,
            Kernel::Scalar,
        ];
        let start = ORDER.iter().position(|&k| k == wanted).unwrap_or(0);
        let runs = |k: Kernel| match k {
            Kernel::Vp2intersect => f.vp2intersect,
            Kernel::Avx512 => f.avx512f,
            Kernel::Avx2 => f.avx2,
            _ => true,
        };
        BoundedKernel(
            ORDER[start..]
                .iter()
                .copied()
                .find(|&k| runs(k))
                .unwrap_or(Kernel::Scalar),
        )
    }

    /// The kernel that runs.
    #[cfg(test)]
    pub fn kernel(self) -> Kernel {
        self.0
    }
}

/// `|x ∩ y|` if it is at least `need`, else `None`; `x`, `y` strictly increasing. Stops as
/// soon as `need` is out of reach; with `EXACT = false` also once it is reached (the
/// returned count is then at least `need` and at most `|x ∩ y|`).
#[inline]
pub fn overlap_at_least<const EXACT: bool>(
    kernel: BoundedKernel,
    x: &[u32],
    y: &[u32],
    need: u64,
) -> Option<u64> {
    if !EXACT && need == 0 {
        return Some(0);
    }
    if (x.len() as u64) < need || (y.len() as u64) < need {
        return None;
    }
    let need = need as usize;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: a `BoundedKernel` names a SIMD kernel only when `resolve` found
        // the CPU features it needs; `need <= min(x.len(), y.len())` was checked above.
        unsafe {
            match kernel.0 {
                Kernel::Avx512 => return x86::avx512::<EXACT>(x, y, need),
                Kernel::Vp2intersect => return x86::vp2i::<EXACT>(x, y, need),
                Kernel::Avx2 => return x86::avx2::<EXACT>(x, y, need),
                _ => {}
            }
        }
    }
    let _ = kernel;
    scalar::<EXACT>(x, y, need)
}

/// The branch-free scalar merge: `slack_x` is how many more tokens of `x` may go unmatched
/// before `need` is out of reach (likewise `slack_y`); a step that advances `i` without a
/// match spends one. Requires `need <= min(x.len(), y.len())`.
#[inline]
fn scalar<const EXACT: bool>(x: &[u32], y: &[u32], need: usize) -> Option<u64> {
    let (mut slack_x, mut slack_y) = ((x.len() - need) as isize, (y.len() - need) as isize);
    let (mut i, mut j, mut o) = (0usize, 0usize, 0usize);
    while i < x.len() && j < y.len() {
        let (a, b) = (x[i], y[j]);
        slack_x -= isize::from(a < b);
        slack_y -= isize::from(b < a);
        o += usize::from(a == b);
        i += usize::from(a <= b);
        j += usize::from(b <= a);
        if (slack_x | slack_y) < 0 {
            return None;
        }
        if !EXACT && o >= need {
            return Some(o as u64);
        }
    }
    (o >= need).then_some(o as u64)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The bookkeeping of a block merge (see the module docs), shared by the SIMD kernels.
    struct Blocks {
        need: usize,
        /// Tokens of x (of y) that may still go unmatched before `need` is out of reach.
        slack_x: isize,
        slack_y: isize,
        /// Where the current blocks start.
        i: usize,
        j: usize,
        /// Matches so far.
        o: usize,
        /// Matches of the current block of x (of y) with the blocks it met so far.
        mx: usize,
        my: usize,
    }

    impl Blocks {
        #[inline(always)]
        fn new(nx: usize, ny: usize, need: usize) -> Self {
            Blocks {
                need,
                slack_x: (nx - need) as isize,
                slack_y: (ny - need) as isize,
                i: 0,
                j: 0,
                o: 0,
                mx: 0,
                my: 0,
            }
        }

        /// Count `c` matches between the current blocks (`ra` tokens of x up to `amax`, `rb`
        /// of y up to `bmax`) and move past the block(s) with the smaller maximum, branch-free;
        /// a block left behind spends its unmatched tokens from its side's slack.
        /// `Some(answer)` ends the merge.
        #[inline(always)]
        fn step<const EXACT: bool>(
            &mut self,
            c: usize,
            ra: usize,
            rb: usize,
            amax: u32,
            bmax: u32,
        ) -> Option<Option<u64>> {
            self.o += c;
            let (ax, ay) = (usize::from(amax <= bmax), usize::from(bmax <= amax));
            self.mx += c;
            self.my += c;
            self.slack_x -= (ax * (ra - self.mx)) as isize;
            self.slack_y -= (ay * (rb - self.my)) as isize;
            self.mx *= 1 - ax;
            self.my *= 1 - ay;
            self.i += ax * ra;
            self.j += ay * rb;
            if (self.slack_x | self.slack_y) < 0 {
                return Some(None);
            }
            if !EXACT && self.o >= self.need {
                return Some(Some(self.o as u64));
            }
            None
        }

        /// The answer once one side is exhausted.
        #[inline(always)]
        fn finish(&self) -> Option<u64> {
            (self.o >= self.need).then_some(self.o as u64)
        }
    }

    /// The block merge shared by the AVX-512 kernels: `$mask(va, fa, pb, rb)` is the mask of
    /// the `fa` lanes of `va` equal to one of the `rb` values at `pb`.
    macro_rules! bounded_512 {
        ($name:ident, $feat:literal, $mask:path) => {
            /// Bounded overlap with 16-lane blocks (see the module docs).
            ///
            /// # Safety
            /// The CPU has the enabled features; `need <= min(x.len(), y.len())`.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $name<const EXACT: bool>(
                x: &[u32],
                y: &[u32],
                need: usize,
            ) -> Option<u64> {
                const L: usize = 16;
                let (nx, ny) = (x.len(), y.len());
                let (px, py) = (x.as_ptr(), y.as_ptr());
                let mut b = Blocks::new(nx, ny, need);
                while b.i < nx && b.j < ny {
                    let (i, j) = (b.i, b.j);
                    let (ra, rb) = ((nx - i).min(L), (ny - j).min(L));
                    let fa = u16::MAX >> (L - ra);
                    // SAFETY: i + ra <= nx, j + rb <= ny: the maxima are inside the slices,
                    // the masked load reads only the `ra` lanes of x at i.
                    let (amax, bmax, va) = unsafe {
                        (
                            *px.add(i + ra - 1),
                            *py.add(j + rb - 1),
                            _mm512_maskz_loadu_epi32(fa, px.add(i).cast()),
                        )
                    };
                    // SAFETY: `rb` values at py + j are inside `y`; features as ours.
                    let m = unsafe { $mask(va, fa, py.add(j), rb) };
                    if let Some(answer) =
                        b.step::<EXACT>(m.count_ones() as usize, ra, rb, amax, bmax)
                    {
                        return answer;
                    }
                }
                b.finish()
            }
        };
    }

    /// Lanes `fa` of `va` equal to one of the `rb` values at `pb`: one broadcast compare per
    /// value.
    ///
    /// # Safety
    /// AVX-512F; `rb` values readable at `pb`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bcast_mask(va: __m512i, fa: u16, pb: *const u32, rb: usize) -> u16 {
        let mut m = 0u16;
        for t in 0..rb {
            // SAFETY: t < rb.
            let v = unsafe { pb.add(t).read() };
            m |= _mm512_mask_cmpeq_epi32_mask(fa, va, _mm512_set1_epi32(v as i32));
        }
        m
    }

    /// As [`bcast_mask`] with one `vp2intersectd` against the block of `y` padded with its
    /// maximum ([`padded_block`]).
    ///
    /// # Safety
    /// AVX-512F and VP2INTERSECT; `1 <= rb <= 16` values readable at `pb`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vp2intersect")]
    unsafe fn vp2i_mask(va: __m512i, fa: u16, pb: *const u32, rb: usize) -> u16 {
        // SAFETY: the caller's promise on `pb`, `rb`; the features are ours.
        unsafe { super::super::avx512::vp2intersect_d(va, padded_block(pb, rb)) & fa }
    }

    /// The `rb` values at `pb` in the low lanes, the other lanes holding the last of them (a
    /// value of the block: a pair compare against it finds no false match).
    ///
    /// # Safety
    /// AVX-512F; `1 <= rb <= 16` values readable at `pb`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn padded_block(pb: *const u32, rb: usize) -> __m512i {
        // SAFETY: only the `rb` lanes selected by the mask are read; pb + rb - 1 is inside.
        unsafe {
            let pad = _mm512_set1_epi32(pb.add(rb - 1).read() as i32);
            _mm512_mask_loadu_epi32(pad, u16::MAX >> (16 - rb), pb.cast())
        }
    }

    bounded_512!(avx512, "avx512f,popcnt", bcast_mask);
    bounded_512!(vp2i, "avx512f,avx512vp2intersect,popcnt", vp2i_mask);

    /// As [`vp2i_mask`] with the instruction emulated by AVX-512F rotations (tests only: checks
    /// the logic on CPUs without VP2INTERSECT).
    ///
    /// # Safety
    /// AVX-512F; `1 <= rb <= 16` values readable at `pb`.
    #[cfg(test)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn rot_mask(va: __m512i, fa: u16, pb: *const u32, rb: usize) -> u16 {
        // SAFETY: the caller's promise on `pb`, `rb`; AVX-512F is ours.
        unsafe { super::super::avx512::rot_mask_d(va, padded_block(pb, rb)) & fa }
    }

    #[cfg(test)]
    bounded_512!(rot, "avx512f,popcnt", rot_mask);

    /// Bounded overlap with 8-lane AVX2 blocks (see the module docs).
    ///
    /// # Safety
    /// AVX2 and POPCNT; `need <= min(x.len(), y.len())`.
    #[target_feature(enable = "avx2,popcnt")]
    pub(super) unsafe fn avx2<const EXACT: bool>(x: &[u32], y: &[u32], need: usize) -> Option<u64> {
        const L: usize = 8;
        let (nx, ny) = (x.len(), y.len());
        let (px, py) = (x.as_ptr(), y.as_ptr());
        let mut b = Blocks::new(nx, ny, need);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        while b.i < nx && b.j < ny {
            let (i, j) = (b.i, b.j);
            let (ra, rb) = ((nx - i).min(L), (ny - j).min(L));
            let fa = 0xffu32 >> (L - ra);
            let load = _mm256_cmpgt_epi32(_mm256_set1_epi32(ra as i32), lanes);
            // SAFETY: i + ra <= nx, j + rb <= ny; the masked load reads only the `ra`
            // lanes of x at i (masked-off lanes are not accessed and read as 0).
            let (amax, bmax, va) = unsafe {
                (
                    *px.add(i + ra - 1),
                    *py.add(j + rb - 1),
                    _mm256_maskload_epi32(px.add(i).cast(), load),
                )
            };
            let mut eq = _mm256_setzero_si256();
            for t in 0..rb {
                // SAFETY: j + t < ny.
                let v = unsafe { py.add(j + t).read() };
                eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(va, _mm256_set1_epi32(v as i32)));
            }
            let m = _mm256_movemask_ps(_mm256_castsi256_ps(eq)) as u32 & fa;
            if let Some(answer) = b.step::<EXACT>(m.count_ones() as usize, ra, rb, amax, bmax) {
                return answer;
            }
        }
        b.finish()
    }

    #[cfg(test)]
    pub(super) use rot as rot_for_tests;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn naive(x: &[u32], y: &[u32]) -> u64 {
        x.iter().filter(|v| y.binary_search(v).is_ok()).count() as u64
    }

    /// A bounded-overlap function: `(x, y, need, exact)`.
    type Bounded = Box<dyn Fn(&[u32], &[u32], u64, bool) -> Option<u64>>;

    /// `k` (exact and early-stopping forms) against the naive count for every `need`.
    fn check(x: &[u32], y: &[u32], k: &Bounded) {
        let o = naive(x, y);
        for need in 0..=x.len().min(y.len()) as u64 + 2 {
            assert_eq!(
                k(x, y, need, true),
                (o >= need).then_some(o),
                "{x:?} {y:?} {need}"
            );
            let s = k(x, y, need, false);
            assert_eq!(s.is_some(), o >= need, "{x:?} {y:?} {need}");
            assert!(s.is_none_or(|c| c >= need && c <= o), "{x:?} {y:?} {need}");
        }
    }

    fn set(rng: &mut StdRng, len: usize, span: u32) -> Vec<u32> {
        let mut s: Vec<u32> = (0..len).map(|_| rng.random_range(0..span)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Every kernel this CPU runs (and the VP2INTERSECT logic, emulated) equals the naive
    /// count: lengths 0..70 around the block sizes, dense and sparse overlaps, sub-slices at
    /// odd offsets, values at the top of the u32 range.
    #[test]
    fn kernels_equal_naive() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut kernels: Vec<Bounded> = Vec::new();
        for k in [
            Kernel::Scalar,
            Kernel::Avx2,
            Kernel::Avx512,
            Kernel::Vp2intersect,
        ] {
            let b = BoundedKernel::resolve(CpuKernelChoice::Fixed(k));
            if b.kernel() == k {
                kernels.push(Box::new(move |x, y, n, exact| {
                    if exact {
                        overlap_at_least::<true>(b, x, y, n)
                    } else {
                        overlap_at_least::<false>(b, x, y, n)
                    }
                }));
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("popcnt")
        {
            kernels.push(Box::new(|x, y, n, exact| {
                if !exact && n == 0 {
                    return Some(0);
                }
                if (x.len() as u64) < n || (y.len() as u64) < n {
                    return None;
                }
                // SAFETY: AVX-512F checked; need <= both lengths.
                unsafe {
                    if exact {
                        x86::rot_for_tests::<true>(x, y, n as usize)
                    } else {
                        x86::rot_for_tests::<false>(x, y, n as usize)
                    }
                }
            }));
        }
        assert!(!kernels.is_empty());
        for round in 0..3000 {
            let (lx, ly) = (rng.random_range(0..70usize), rng.random_range(0..70usize));
            let span = [(lx + ly) as u32 + 1, 4 * (lx + ly) as u32 + 1, u32::MAX][round % 3];
            let (mut x, mut y) = (set(&mut rng, lx, span), set(&mut rng, ly, span));
            if round % 7 == 0 {
                // Values at the top of the range (a padded lane must not match them).
                x.iter_mut().for_each(|v| *v += u32::MAX - (span - 1));
                y.iter_mut().for_each(|v| *v += u32::MAX - (span - 1));
            }
            // Sub-slices at an offset of one token (unaligned loads).
            let (bx, by) = ([&[0u32][..], &x].concat(), [&[0u32][..], &y].concat());
            for k in &kernels {
                check(&bx[1..], &by[1..], k);
                check(&by[1..], &bx[1..], k);
            }
        }
    }

    /// `auto` takes AVX2 where the CPU has it; a kernel without a bounded form
    /// falls back to scalar; a forced kernel the CPU lacks falls back downwards.
    #[test]
    fn resolve_follows_the_cpu() {
        let f = features();
        let auto = BoundedKernel::resolve(CpuKernelChoice::Auto).kernel();
        let expect = if f.avx2 {
            Kernel::Avx2
        } else if f.avx512f {
            Kernel::Avx512
        } else {
            Kernel::Scalar
        };
        assert_eq!(auto, expect);
        for k in [Kernel::Galloping, Kernel::Sse42, Kernel::Scalar] {
            assert_eq!(
                BoundedKernel::resolve(CpuKernelChoice::Fixed(k)).kernel(),
                Kernel::Scalar
            );
        }
        let avx2 = BoundedKernel::resolve(CpuKernelChoice::Fixed(Kernel::Avx2)).kernel();
        assert_eq!(avx2, if f.avx2 { Kernel::Avx2 } else { Kernel::Scalar });
    }
}
