//! Branch-free scalar merges: the test oracle of every SIMD kernel and the kernel for tiny inputs.

use super::SetElem;

/// Merge-intersect strictly increasing `a` and `b`; returns the match count and, when
/// `WRITE`, stores the matches ascending at `dst`.
///
/// Branch-free: every step stores `a[i]` at `dst[k]` unconditionally, then advances `k`, `i`
/// and `j` by the comparison results (`setcc`/`adc`, no data-dependent branch).
///
/// # Safety
/// When `WRITE`, `dst` must be valid for writes of `min(a.len(), b.len())` elements.
#[inline]
pub(crate) unsafe fn merge<T: SetElem, const WRITE: bool>(a: &[T], b: &[T], dst: *mut T) -> usize {
    let (na, nb) = (a.len(), b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut i, mut j, mut k) = (0usize, 0usize, 0usize);
    while i < na && j < nb {
        // SAFETY: i < na and j < nb.
        let (x, y) = unsafe { (*pa.add(i), *pb.add(j)) };
        if WRITE {
            // SAFETY: every match advances both i and j, so k <= min(i, j) < min(na, nb).
            unsafe { dst.add(k).write(x) };
        }
        k += usize::from(x == y);
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    k
}

/// Merge-intersect non-decreasing `a` and `b` (duplicates allowed); returns the number of
/// distinct common values and, when `WRITE`, stores them ascending at `dst`.
///
/// # Safety
/// When `WRITE`, `dst` must be valid for writes of `min(a.len(), b.len())` elements.
pub(crate) unsafe fn merge_dedup<T: SetElem, const WRITE: bool>(
    a: &[T],
    b: &[T],
    dst: *mut T,
) -> usize {
    let (na, nb) = (a.len(), b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut i, mut j, mut k) = (0usize, 0usize, 0usize);
    // The last value emitted; `have` says whether there is one.
    let (mut last, mut have) = (T::default(), false);
    while i < na && j < nb {
        // SAFETY: i < na and j < nb.
        let (x, y) = unsafe { (*pa.add(i), *pb.add(j)) };
        let emit = x == y && !(have && last == x);
        if WRITE {
            // SAFETY: each emitted value advances i and j, so k <= min(i, j) < min(na, nb).
            unsafe { dst.add(k).write(x) };
        }
        k += usize::from(emit);
        if x == y {
            last = x;
            have = true;
        }
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(a: &[i32], b: &[i32]) -> Vec<i32> {
        let mut out = Vec::with_capacity(a.len().min(b.len()));
        // SAFETY: capacity min(len) reserved.
        let n = unsafe { merge::<i32, true>(a, b, out.as_mut_ptr()) };
        // SAFETY: n elements written.
        unsafe { out.set_len(n) };
        // SAFETY: WRITE = false.
        assert_eq!(n, unsafe {
            merge::<i32, false>(a, b, std::ptr::null_mut())
        });
        out
    }

    fn run_dedup(a: &[i8], b: &[i8]) -> Vec<i8> {
        let mut out = Vec::with_capacity(a.len().min(b.len()));
        // SAFETY: capacity min(len) reserved.
        let n = unsafe { merge_dedup::<i8, true>(a, b, out.as_mut_ptr()) };
        // SAFETY: n elements written.
        unsafe { out.set_len(n) };
        // SAFETY: WRITE = false.
        assert_eq!(n, unsafe {
            merge_dedup::<i8, false>(a, b, std::ptr::null_mut())
        });
        out
    }

    #[test]
    fn merge_basic() {
        assert_eq!(run(&[], &[1, 2]), Vec::<i32>::new());
        assert_eq!(run(&[1, 2], &[]), Vec::<i32>::new());
        assert_eq!(run(&[-5, -1, 0, 3, 9], &[-5, 0, 2, 9, 10]), vec![-5, 0, 9]);
        assert_eq!(
            run(&[i32::MIN, i32::MAX], &[i32::MIN, 0, i32::MAX]),
            vec![i32::MIN, i32::MAX]
        );
        assert_eq!(run(&[1, 3, 5], &[2, 4, 6]), Vec::<i32>::new());
    }

    #[test]
    fn dedup_basic() {
        assert_eq!(run_dedup(&[1, 1, 2, 2, 2, 3], &[1, 2, 2, 4]), vec![1, 2]);
        assert_eq!(
            run_dedup(&[-128, -128, 127], &[-128, 127, 127]),
            vec![-128, 127]
        );
        assert_eq!(run_dedup(&[0, 0, 0], &[0]), vec![0]);
        assert_eq!(run_dedup(&[5], &[]), Vec::<i8>::new());
    }
}
