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

/// Classify `s`. Each chunk of [`CHUNK`] neighbour pairs is reduced with `|` of the
/// comparisons (no branch inside, so the compiler vectorises it); an unsorted chunk ends the
/// scan early.
pub fn sortedness<T: SetElem>(s: &[T]) -> Sortedness {
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
