//! Backends: the kernels that do the set work, behind one interface.
//!
//! `cpu` holds the scalar, galloping and SIMD kernels (chosen per row at run time).
//! `gpu` holds the CUDA backend (batched k-way intersection on the device).

pub mod cpu;
pub mod gpu;

/// `slice` cut into consecutive disjoint parts of the given lengths, in order (for filling
/// the parts on several threads at once); their sum must not exceed `slice.len()`.
pub(crate) fn split_lengths<T>(
    mut slice: &mut [T],
    lengths: impl IntoIterator<Item = usize>,
) -> Vec<&mut [T]> {
    let lengths = lengths.into_iter();
    let mut parts = Vec::with_capacity(lengths.size_hint().0);
    for len in lengths {
        let (part, tail) = std::mem::take(&mut slice).split_at_mut(len);
        parts.push(part);
        slice = tail;
    }
    parts
}
