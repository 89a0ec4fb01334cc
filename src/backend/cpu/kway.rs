//! k-way intersection of strictly increasing lists: shortest first, pairwise with the hybrid
//! kernel choice, early exit as soon as the running result is empty.

use super::{SetElem, auto_raw, intersect_auto, intersect_count_auto, slack};

/// Intersect `lists[..]` (all strictly increasing; at least two) except the last into
/// `scratch` (cleared first), shortest first. Returns the running result's length.
fn fold_all_but_last<T: SetElem>(lists: &[&[T]], scratch: &mut Vec<T>) -> usize {
    scratch.clear();
    let mut r = intersect_auto(lists[0], lists[1], scratch);
    for &l in &lists[2..lists.len() - 1] {
        if r == 0 {
            break;
        }
        // Layout: scratch = [running result (r) | spare], the next result goes to the spare
        // part and is then moved to the front.
        scratch.reserve(r.min(l.len()) + slack::<T>());
        let p = scratch.as_mut_ptr();
        // SAFETY: the first r elements of `scratch` are initialised; `dst = p + r` has
        // min(r, l.len()) + slack elements of spare capacity (reserved above) and does not
        // overlap `cur` or `l` (another allocation); `cur` and `l` are strictly increasing
        // (a sub-result of strictly increasing lists is strictly increasing).
        let n = unsafe {
            let cur = std::slice::from_raw_parts(p, r);
            auto_raw::<T, true>(cur, l, p.add(r))
        };
        // SAFETY: the kernel initialised n <= r elements at p + r; copying them to the front
        // (ptr::copy allows overlap) leaves the first n elements initialised.
        unsafe {
            std::ptr::copy(p.add(r), p, n);
            scratch.set_len(n);
        }
        r = n;
    }
    r
}

/// Sort `lists` by length; `None` when the answer is trivially empty (no list, or an empty one).
fn prepare<T: SetElem>(lists: &mut [&[T]]) -> Option<()> {
    lists.sort_unstable_by_key(|l| l.len());
    match lists.first() {
        Some(l) if !l.is_empty() => Some(()),
        _ => None,
    }
}

/// k-way intersection of strictly increasing lists, shortest first, early exit on empty;
/// the result is appended to `out` (ascending). `scratch` is reused between calls to avoid
/// allocation. Returns the number of values appended. Reorders `lists` (by length).
///
/// No list: nothing is appended (0). One list: it is copied.
pub fn intersect_kway<T: SetElem>(
    lists: &mut [&[T]],
    out: &mut Vec<T>,
    scratch: &mut Vec<T>,
) -> usize {
    if prepare(lists).is_none() {
        return 0;
    }
    match lists {
        [only] => {
            out.extend_from_slice(only);
            only.len()
        }
        [a, b] => intersect_auto(a, b, out),
        _ => {
            if fold_all_but_last(lists, scratch) == 0 {
                return 0;
            }
            let last = lists[lists.len() - 1];
            intersect_auto(scratch, last, out)
        }
    }
}

/// Cardinality of the k-way intersection (see [`intersect_kway`]); writes no output.
pub fn intersect_kway_count<T: SetElem>(lists: &mut [&[T]], scratch: &mut Vec<T>) -> usize {
    if prepare(lists).is_none() {
        return 0;
    }
    match lists {
        [only] => only.len(),
        [a, b] => intersect_count_auto(a, b),
        _ => {
            if fold_all_but_last(lists, scratch) == 0 {
                return 0;
            }
            let last = lists[lists.len() - 1];
            intersect_count_auto(scratch, last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{naive, sorted_set};
    use super::*;
    use proptest::prelude::*;

    fn fold(lists: &[Vec<i32>]) -> Vec<i32> {
        let mut acc = lists[0].clone();
        for l in &lists[1..] {
            acc = naive(&acc, l);
        }
        acc
    }

    fn check(lists: &[Vec<i32>]) {
        let mut refs: Vec<&[i32]> = lists.iter().map(|v| v.as_slice()).collect();
        let (mut out, mut scratch) = (vec![-7], Vec::new());
        let n = intersect_kway(&mut refs, &mut out, &mut scratch);
        let expect = if lists.is_empty() {
            vec![]
        } else {
            fold(lists)
        };
        assert_eq!(out[0], -7, "prefix kept");
        assert_eq!(&out[1..], &expect[..]);
        assert_eq!(n, expect.len());
        let mut refs: Vec<&[i32]> = lists.iter().map(|v| v.as_slice()).collect();
        assert_eq!(intersect_kway_count(&mut refs, &mut scratch), expect.len());
    }

    #[test]
    fn crafted() {
        check(&[]);
        check(&[vec![1, 2, 3]]);
        check(&[vec![1, 2, 3], vec![]]);
        check(&[vec![1, 2, 3], vec![2, 3, 4], vec![3, 4, 5]]);
        check(&[
            vec![1, 2],
            vec![3, 4],
            (0..100).collect(),
            (0..200).collect(),
        ]);
        let big: Vec<i32> = (-5000..5000).collect();
        let evens: Vec<i32> = (-5000..5000).step_by(2).collect();
        let thirds: Vec<i32> = (-4998..5000).step_by(3).collect();
        check(&[big.clone(), evens.clone(), thirds.clone(), big.clone()]);
        check(&[thirds, evens, big, vec![-4998, 0, 6, 7, 4998]]);
    }

    proptest! {
        #[test]
        fn kway_matches_fold(
            lists in prop::collection::vec(sorted_set::<i32>(-300..300, 0..400), 0..6)
        ) {
            check(&lists);
        }
    }
}
