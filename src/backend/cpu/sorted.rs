//! Sortedness detection: strictly increasing, non-decreasing or unsorted, in one
//! branch-free, auto-vectorised pass per chunk.

use super::SetElem;

/// How a slice is ordered (in `T`'s own order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sortedness {
    /// Strictly increasing: sorted, no duplicates (empty and one-element slices too).
    Strict,
    /// Sorted ascending with at least one duplicate.
    NonDecreasing,
    /// Some value is greater than its successor.
    Unsorted,
}

/// Values compared per chunk before checking for an early exit.
const CHUNK: usize = 512;

/// Classify `s`. Each chunk of `CHUNK` neighbour pairs is reduced with `|` of the
/// comparisons (no branch inside, so the compiler vectorises it); an unsorted chunk ends the
/// scan early.
///
/// The same loop is compiled three times, for AVX-512 (F + BW), for AVX2 and for the
/// baseline, and the widest one the CPU runs is called: the baseline (SSE2) has no unsigned
/// or 64-bit compares, so the vectorised loop there is several times slower than memory.
pub fn sortedness<T: SetElem>(s: &[T]) -> Sortedness {
    if s.len() < 2 {
        return Sortedness::Strict;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Short slices: the call through a feature check costs more than it saves.
        if s.len() >= 64 {
            if simd_level() >= 2 {
                // SAFETY: the CPU has AVX-512F and AVX-512BW (checked by `simd_level`).
                return unsafe { sortedness_avx512(s) };
            }
            if simd_level() == 1 {
                // SAFETY: the CPU has AVX2 (checked by `simd_level`).
                return unsafe { sortedness_avx2(s) };
            }
        }
    }
    sortedness_body(s)
}

/// 2: AVX-512F + BW, 1: AVX2, 0: neither. Detected once.
#[cfg(target_arch = "x86_64")]
fn simd_level() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
    let l = LEVEL.load(Ordering::Relaxed);
    if l != u8::MAX {
        return l;
    }
    use std::arch::is_x86_feature_detected as has;
    let l = if has!("avx512f") && has!("avx512bw") {
        2
    } else if has!("avx2") {
        1
    } else {
        0
    };
    LEVEL.store(l, Ordering::Relaxed);
    l
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sortedness_avx512<T: SetElem>(s: &[T]) -> Sortedness {
    sortedness_body(s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sortedness_avx2<T: SetElem>(s: &[T]) -> Sortedness {
    sortedness_body(s)
}

/// The loop itself, inlined into each feature-specific copy above.
#[inline(always)]
fn sortedness_body<T: SetElem>(s: &[T]) -> Sortedness {
    if s.len() < 2 {
        return Sortedness::Strict;
    }
    let (lhs, rhs) = (&s[..s.len() - 1], &s[1..]);
    let mut dup = false;
    for (x, y) in lhs.chunks(CHUNK).zip(rhs.chunks(CHUNK)) {
        let (mut desc, mut eq) = (false, false);
        for (&p, &q) in x.iter().zip(y) {
            desc |= p > q;
            eq |= p == q;
        }
        if desc {
            return Sortedness::Unsorted;
        }
        dup |= eq;
    }
    if dup {
        Sortedness::NonDecreasing
    } else {
        Sortedness::Strict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Sortedness::*;

    #[test]
    fn crafted() {
        assert_eq!(sortedness::<u8>(&[]), Strict);
        assert_eq!(sortedness(&[7u8]), Strict);
        assert_eq!(sortedness(&[1u8, 2, 255]), Strict);
        assert_eq!(sortedness(&[1u8, 1]), NonDecreasing);
        assert_eq!(sortedness(&[2u8, 1]), Unsorted);
        assert_eq!(sortedness(&[-128i8, -1, 0, 127]), Strict);
        // Signed order: -1 < 0 although its bits are larger.
        assert_eq!(sortedness(&[0i32, -1]), Unsorted);
        assert_eq!(sortedness(&[i64::MIN, i64::MIN, i64::MAX]), NonDecreasing);
        assert_eq!(sortedness(&[u64::MAX, 0]), Unsorted);
        assert_eq!(sortedness(&[i16::MIN, i16::MAX, i16::MAX]), NonDecreasing);
    }

    /// Every compiled copy of the loop the CPU can run agrees with the baseline, for every
    /// width and signedness, on sorted, duplicated and unsorted slices of many lengths.
    #[test]
    fn feature_copies_agree() {
        fn check<T: SetElem + TryFrom<i64>>(lo: i64) {
            let mk = |n: usize, step: i64| -> Vec<T> {
                // Truncated where the type runs out of values (8-bit types).
                (0..n as i64)
                    .map_while(|i| T::try_from(lo + i * step).ok())
                    .collect()
            };
            for n in [0, 1, 2, 63, 64, 65, 127, 200, 513, 1030] {
                let strict = mk(n, 1);
                let n = strict.len();
                let mut cases = vec![strict.clone()];
                for at in [1, n / 2, n.saturating_sub(1)] {
                    if at >= 1 && at < n {
                        let mut d = strict.clone();
                        d[at] = d[at - 1];
                        cases.push(d);
                        let mut u = strict.clone();
                        u.swap(at - 1, at);
                        cases.push(u);
                    }
                }
                for c in &cases {
                    let want = sortedness_body(c);
                    assert_eq!(sortedness(c), want, "dispatch, n={n}");
                    #[cfg(target_arch = "x86_64")]
                    {
                        if simd_level() >= 1 && n >= 2 {
                            // SAFETY: simd_level() >= 1: AVX2 was detected.
                            assert_eq!(unsafe { sortedness_avx2(c) }, want, "avx2, n={n}");
                        }
                        if simd_level() >= 2 && n >= 2 {
                            // SAFETY: simd_level() >= 2: AVX-512 was detected.
                            assert_eq!(unsafe { sortedness_avx512(c) }, want, "avx512, n={n}");
                        }
                    }
                }
            }
        }
        // Ranges that cross the sign boundary, so a signed/unsigned mix-up shows.
        check::<i8>(-60);
        check::<u8>(0);
        check::<i16>(-500);
        check::<u16>(65_000 - 1030);
        check::<i32>(-400);
        check::<u32>(u32::MAX as i64 - 1100);
        check::<i64>(-400);
        check::<u64>(1 << 40);
    }

    #[test]
    fn long_and_chunk_boundaries() {
        let v: Vec<u32> = (0..5000).collect();
        assert_eq!(sortedness(&v), Strict);
        for at in [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 4999] {
            let mut d = v.clone();
            d[at] = d[at - 1];
            assert_eq!(sortedness(&d), NonDecreasing, "dup at {at}");
            let mut u = v.clone();
            u.swap(at - 1, at);
            assert_eq!(sortedness(&u), Unsorted, "swap at {at}");
            // A duplicate early and a descent late: unsorted wins.
            let mut both = d.clone();
            both[4999] = 0;
            assert_eq!(sortedness(&both), Unsorted);
        }
        // Odd offsets of a larger slice.
        assert_eq!(sortedness(&v[3..4001]), Strict);
    }
}
