//! [`PairBuffer`]: a fixed-capacity buffer of [`PairToVerify`] in page-locked host memory when
//! the GPU backend can allocate it (so [`super::verify_pairs`] copies it to the device
//! straight from where the join wrote it, with no staging copy), else in an ordinary vector.

use super::PairToVerify;

enum Storage {
    /// Never made without the `cuda` feature.
    #[cfg_attr(
        not(feature = "cuda"),
        expect(dead_code, reason = "no pinned memory without CUDA")
    )]
    Pinned(*mut PairToVerify),
    Heap(Vec<PairToVerify>),
}

/// Candidate pairs of one chunk (see the module docs).
pub struct PairBuffer {
    storage: Storage,
    len: usize,
    capacity: usize,
    /// Where each group (the pairs of one probe set) starts.
    groups: Vec<u32>,
}

// SAFETY: the pinned pointer is an allocation owned by the buffer alone.
unsafe impl Send for PairBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for PairBuffer {}

impl std::fmt::Debug for PairBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

impl PairBuffer {
    /// A buffer for `capacity` pairs: page-locked when `pinned` and the GPU backend can
    /// allocate it, else on the heap.
    pub fn new(capacity: usize, pinned: bool) -> Self {
        #[cfg(feature = "cuda")]
        if pinned
            && capacity > 0
            && let Some(ptr) = super::cuda::alloc_pinned(capacity * size_of::<PairToVerify>())
        {
            return Self {
                storage: Storage::Pinned(ptr.cast()),
                len: 0,
                capacity,
                groups: Vec::new(),
            };
        }
        let _ = pinned;
        Self {
            storage: Storage::Heap(Vec::with_capacity(capacity)),
            len: 0,
            capacity,
            groups: Vec::new(),
        }
    }

    /// Whether the pairs live in page-locked memory.
    pub fn is_pinned(&self) -> bool {
        !matches!(self.storage, Storage::Heap(_))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether no more pairs fit.
    pub fn is_full(&self) -> bool {
        self.len >= self.capacity
    }

    /// Start a group: the pairs pushed next (until the next group) share their probe set.
    pub fn start_group(&mut self) {
        if self.groups.last() != Some(&(self.len as u32)) {
            self.groups.push(self.len as u32);
        }
    }

    /// Where each group starts (for [`super::verify_pairs`]), when every pair is in one:
    /// pushed after a [`Self::start_group`], and no group empty.
    pub fn groups(&self) -> Option<&[u32]> {
        let valid = self.groups.first() == Some(&0)
            && self.groups.last().is_some_and(|&l| (l as usize) < self.len);
        valid.then_some(&self.groups[..])
    }

    pub fn clear(&mut self) {
        self.len = 0;
        self.groups.clear();
        if let Storage::Heap(v) = &mut self.storage {
            v.clear();
        }
    }

    /// Append `pair`; past the capacity the buffer grows (on the heap storage) or the pair
    /// goes to a heap copy of the whole buffer (pinned storage), so nothing is ever lost.
    #[inline]
    pub fn push(&mut self, pair: PairToVerify) {
        match &mut self.storage {
            Storage::Pinned(ptr) => {
                if self.len < self.capacity {
                    // SAFETY: `ptr` holds `capacity` pairs and `len < capacity`.
                    unsafe { ptr.add(self.len).write(pair) };
                } else {
                    let mut v = self.as_slice().to_vec();
                    v.push(pair);
                    self.unpin();
                    self.storage = Storage::Heap(v);
                }
            }
            Storage::Heap(v) => v.push(pair),
        }
        self.len += 1;
    }

    /// The pairs written so far.
    pub fn as_slice(&self) -> &[PairToVerify] {
        match &self.storage {
            // SAFETY: the first `len` pairs were written by `push`.
            Storage::Pinned(ptr) => unsafe { std::slice::from_raw_parts(*ptr, self.len) },
            Storage::Heap(v) => v,
        }
    }

    fn unpin(&mut self) {
        if let Storage::Pinned(ptr) = self.storage {
            #[cfg(feature = "cuda")]
            super::cuda::free_pinned(ptr.cast());
            #[cfg(not(feature = "cuda"))]
            let _ = ptr;
            self.storage = Storage::Heap(Vec::new());
        }
    }
}

impl Drop for PairBuffer {
    fn drop(&mut self) {
        self.unpin();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(i: u32) -> PairToVerify {
        PairToVerify {
            x: i,
            y: i + 1,
            alpha: 2,
            overlap: 1,
            from_x: 3,
            from_y: 4,
        }
    }

    #[test]
    fn keeps_every_pair_in_order_past_its_capacity() {
        // Pinned when a GPU is there, else on the heap: the same behaviour either way.
        for pinned in [false, true] {
            let mut b = PairBuffer::new(4, pinned);
            assert!(b.is_empty() && !b.is_full() && b.capacity() == 4);
            for i in 0..4 {
                b.push(pair(i));
            }
            assert!(b.is_full());
            b.push(pair(4));
            assert_eq!(b.len(), 5);
            let want: Vec<PairToVerify> = (0..5).map(pair).collect();
            assert_eq!(b.as_slice(), &want[..]);
            b.clear();
            assert!(b.is_empty() && b.as_slice().is_empty());
            b.push(pair(9));
            assert_eq!(b.as_slice(), &[pair(9)]);
        }
    }

    #[test]
    fn groups_mark_each_probe_sets_pairs() {
        let mut b = PairBuffer::new(8, false);
        assert_eq!(b.groups(), None);
        b.start_group();
        b.push(pair(0));
        b.push(pair(0));
        b.start_group();
        b.start_group();
        b.push(pair(1));
        assert_eq!(b.groups(), Some(&[0, 2][..]));
        // A trailing group with no pair yet is not a valid grouping.
        b.start_group();
        assert_eq!(b.groups(), None);
        b.clear();
        b.push(pair(2));
        assert_eq!(b.groups(), None, "pairs before any group");
    }
}
