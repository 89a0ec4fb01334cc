//! [`PairBuffer`]: a chunk of [`PairToVerify`] in page-locked host memory when the GPU backend
//! can allocate it (so [`super::verify_pairs`] copies it to the device straight from where
//! the join wrote it, with no staging copy: a copy from pageable memory goes through the
//! driver's own staging buffers, serialized across threads), else in an ordinary vector.
//!
//! A chunk is *full* at its nominal size, but the join pushes a whole probe's candidates at a
//! time, so it overshoots: the allocation has room for an eighth more, and grows (page-locked
//! again, doubled) when a probe overshoots further. It never falls back to pageable memory
//! while page-locked memory can be had.
//!
//! Page-locking is slow (the driver pins every page, under a lock all threads share), so a
//! dropped buffer's allocation goes to a process-wide pool, up to [`POOL_BYTES`], and the
//! next join's partitions take their chunks from there.
//!
//! Pairs go into page-locked memory with non-temporal stores (x86-64): the chunk is read
//! next by the device's copy, not by this core, so its lines need not be fetched first nor
//! displace the filter's own data from the caches. [`PairBuffer::as_slice`] fences them.
//! (Measured on the join's filter with gcide_words, Dice 0.5, 102 M candidates, 2 cores:
//! writing 24-byte pairs with plain stores cost 15-20% over the filter alone; 8-byte pairs
//! with non-temporal stores, within the run-to-run spread of it.)

use std::sync::Mutex;

use super::{PairGroups, PairToVerify};
use crate::backend::gpu::{Runtime, Selected};

/// Page-locked bytes kept for reuse after the buffers that held them are dropped (two chunks
/// of 2^18 pairs on each of 16 partitions take 72 MiB).
pub const POOL_BYTES: usize = 128 << 20;

/// Page-locked allocations not in use: (address, pairs it holds).
struct Pool(Vec<(usize, usize)>);

static POOL: Mutex<Pool> = Mutex::new(Pool(Vec::new()));

enum Storage {
    /// Never made without the `cuda` feature (no page-locked memory to be had).
    Pinned(*mut PairToVerify),
    Heap(Vec<PairToVerify>),
}

/// Candidate pairs of one chunk (see the module docs).
pub struct PairBuffer {
    storage: Storage,
    len: usize,
    /// The nominal size: full from here.
    capacity: usize,
    /// Pairs the page-locked allocation holds (`capacity` plus room to overshoot).
    allocated: usize,
    /// Where each group (the pairs of one probe set) starts.
    groups: Vec<u32>,
    /// Each group's probe set.
    probes: Vec<u32>,
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
        if pinned && let Some((ptr, allocated)) = Self::alloc(Self::allocation_for(capacity)) {
            return Self {
                storage: Storage::Pinned(ptr),
                len: 0,
                capacity,
                allocated,
                groups: Vec::new(),
                probes: Vec::new(),
            };
        }
        Self {
            storage: Storage::Heap(Vec::with_capacity(capacity)),
            len: 0,
            capacity,
            allocated: 0,
            groups: Vec::new(),
            probes: Vec::new(),
        }
    }

    /// Pairs allocated for a chunk of `capacity`: an eighth more, to overshoot into.
    pub fn allocation_for(capacity: usize) -> usize {
        capacity + capacity / 8
    }

    /// Page-locked room for at least `pairs` pairs (from the pool, else new), if the GPU
    /// backend can allocate it: the address and how many pairs it holds.
    fn alloc(pairs: usize) -> Option<(*mut PairToVerify, usize)> {
        if pairs == 0 {
            return None;
        }
        {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest pooled allocation that is large enough.
            let best = (pool.0.iter().enumerate())
                .filter(|&(_, &(_, n))| n >= pairs)
                .min_by_key(|&(_, &(_, n))| n)
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (addr, n) = pool.0.swap_remove(i);
                return Some((addr as *mut PairToVerify, n));
            }
        }
        <Selected as Runtime>::alloc_pinned(pairs * size_of::<PairToVerify>())
            .map(|p| (p.cast(), pairs))
    }

    /// Give a page-locked allocation of `pairs` pairs back: to the pool while it has room,
    /// else to the driver.
    fn release(ptr: *mut PairToVerify, pairs: usize) {
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let pooled: usize = pool.0.iter().map(|&(_, n)| n).sum();
        if (pooled + pairs) * size_of::<PairToVerify>() <= POOL_BYTES {
            pool.0.push((ptr as usize, pairs));
            return;
        }
        drop(pool);
        // SAFETY: `ptr` came from `alloc_pinned` (through the pool or not), and the buffer
        // that held it lets it go here, once.
        unsafe { <Selected as Runtime>::free_pinned(ptr.cast()) };
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

    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether no more pairs fit.
    pub fn is_full(&self) -> bool {
        self.len >= self.capacity
    }

    /// Start a group: the pairs pushed next (until the next group) are candidates of probe
    /// set `x`. A group left empty is replaced by the next one.
    pub fn start_group(&mut self, x: u32) {
        if self.groups.last() == Some(&(self.len as u32)) {
            self.groups.pop();
            self.probes.pop();
        }
        self.groups.push(self.len as u32);
        self.probes.push(x);
    }

    /// The pairs' groups (for [`super::verify_pairs`]), when every pair is in one: pushed
    /// after a [`Self::start_group`], and no group empty.
    pub fn groups(&self) -> Option<PairGroups<'_>> {
        let valid = self.groups.first() == Some(&0)
            && self.groups.last().is_some_and(|&l| (l as usize) < self.len);
        valid.then_some(PairGroups {
            starts: &self.groups,
            probes: &self.probes,
        })
    }

    pub fn clear(&mut self) {
        self.len = 0;
        self.groups.clear();
        self.probes.clear();
        if let Storage::Heap(v) = &mut self.storage {
            v.clear();
        }
    }

    /// Append `pair`; past the capacity the buffer grows (on the heap storage) or the pair
    /// goes to a heap copy of the whole buffer (pinned storage), so nothing is ever lost.
    #[inline]
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
    pub fn push(&mut self, pair: PairToVerify) {
        if let Storage::Pinned(_) = self.storage
            && self.len == self.allocated
        {
            self.grow();
        }
        match &mut self.storage {
            Storage::Pinned(ptr) => {
                // SAFETY: `ptr` holds `allocated` pairs and `len < allocated` (grown above).
                unsafe { write_streaming(ptr.add(self.len), pair) };
            }
            Storage::Heap(v) => v.push(pair),
        }
        self.len += 1;
    }

    /// Append `pairs` (all of them: past the capacity as [`Self::push`] does). The room is
    /// made once, then the pairs are written in a tight loop: into page-locked memory, with
    /// non-temporal stores of whole 64-byte lines (8-byte ones before the first line boundary
    /// and after the last).
    pub fn extend<I>(&mut self, pairs: I)
    where
        I: ExactSizeIterator<Item = PairToVerify>,
    {
        let n = pairs.len();
        if n == 0 {
            return;
        }
        if let Storage::Pinned(_) = self.storage {
            while self.len + n > self.allocated {
                self.grow();
                if !self.is_pinned() {
                    break;
                }
            }
        }
        match &mut self.storage {
            Storage::Pinned(ptr) => {
                // SAFETY: the allocation holds `allocated >= len + n` pairs (grown above,
                // and still page-locked), 8-byte aligned.
                let written = unsafe { write_pairs(ptr.add(self.len), pairs) };
                debug_assert_eq!(written, n);
                self.len += written;
            }
            Storage::Heap(v) => {
                v.extend(pairs);
                self.len = v.len();
            }
        }
    }

    /// Double the page-locked allocation (or, when none can be had, move to the heap).
    #[cold]
    fn grow(&mut self) {
        let want = (self.allocated * 2).max(16);
        match Self::alloc(want) {
            Some((ptr, allocated)) => {
                // SAFETY: both allocations hold at least `len` pairs and do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(self.as_slice().as_ptr(), ptr, self.len) };
                self.unpin();
                self.storage = Storage::Pinned(ptr);
                self.allocated = allocated;
            }
            None => {
                let v = self.as_slice().to_vec();
                self.unpin();
                self.storage = Storage::Heap(v);
            }
        }
    }

    /// The pairs written so far (their non-temporal stores fenced first, so that the
    /// device's copy and other threads see them).
    pub fn as_slice(&self) -> &[PairToVerify] {
        match &self.storage {
            Storage::Pinned(ptr) => {
                fence_streaming();
                // SAFETY: the first `len` pairs were written by `push`.
                unsafe { std::slice::from_raw_parts(*ptr, self.len) }
            }
            Storage::Heap(v) => v,
        }
    }

    fn unpin(&mut self) {
        if let Storage::Pinned(ptr) = self.storage {
            Self::release(ptr, self.allocated);
            self.storage = Storage::Heap(Vec::new());
            self.allocated = 0;
        }
    }
}

/// Write `pair` at `dst` with a non-temporal store where the CPU has one.
///
/// # Safety
/// `dst` is valid for writes and aligned for [`PairToVerify`] (8 bytes: every pair of an
/// allocation that starts on a page).
#[inline(always)]
unsafe fn write_streaming(dst: *mut PairToVerify, pair: PairToVerify) {
    #[cfg(target_arch = "x86_64")]
    {
        const { assert!(size_of::<PairToVerify>() == 8) };
        let bits = u64::from(pair.y) | (u64::from(pair.alpha) << 32);
        // SAFETY: SSE2 is part of x86-64; `dst` is valid and 8-byte aligned (the caller).
        unsafe { std::arch::x86_64::_mm_stream_si64(dst.cast::<i64>(), bits as i64) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller promises.
    unsafe {
        dst.write(pair)
    };
}

/// Write `pairs` from `dst` on, with non-temporal stores: 8-byte ones up to the first
/// 64-byte line boundary, whole lines of 8 pairs, 8-byte ones for the rest. Returns how many.
///
/// # Safety
/// `dst` is 8-byte aligned and valid for writes of `pairs.len()` pairs.
#[cfg(target_arch = "x86_64")]
unsafe fn write_pairs<I>(dst: *mut PairToVerify, mut pairs: I) -> usize
where
    I: ExactSizeIterator<Item = PairToVerify>,
{
    use std::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_stream_si128};
    let bits = |p: PairToVerify| (u64::from(p.y) | (u64::from(p.alpha) << 32)) as i64;
    let mut at = dst;
    while !(at as usize).is_multiple_of(64) && pairs.len() > 0 {
        if let Some(p) = pairs.next() {
            // SAFETY: within the caller's room.
            unsafe {
                write_streaming(at, p);
                at = at.add(1);
            }
        }
    }
    while pairs.len() >= 8 {
        let mut line = [0i64; 8];
        for (slot, p) in line.iter_mut().zip(&mut pairs) {
            *slot = bits(p);
        }
        let line_ptr = at.cast::<__m128i>();
        // SAFETY: `at` is 64-byte aligned and its 8 pairs lie within the caller's room; SSE2
        // is part of x86-64.
        unsafe {
            _mm_stream_si128(line_ptr, _mm_set_epi64x(line[1], line[0]));
            _mm_stream_si128(line_ptr.add(1), _mm_set_epi64x(line[3], line[2]));
            _mm_stream_si128(line_ptr.add(2), _mm_set_epi64x(line[5], line[4]));
            _mm_stream_si128(line_ptr.add(3), _mm_set_epi64x(line[7], line[6]));
            at = at.add(8);
        }
    }
    for p in pairs {
        // SAFETY: within the caller's room.
        unsafe {
            write_streaming(at, p);
            at = at.add(1);
        }
    }
    // SAFETY: both pointers lie in the caller's room.
    unsafe { at.offset_from(dst) as usize }
}

/// Write `pairs` from `dst` on (plain stores). Returns how many.
///
/// # Safety
/// `dst` is aligned and valid for writes of `pairs.len()` pairs.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn write_pairs<I>(dst: *mut PairToVerify, pairs: I) -> usize
where
    I: ExactSizeIterator<Item = PairToVerify>,
{
    let mut at = dst;
    for p in pairs {
        // SAFETY: within the caller's room.
        unsafe {
            at.write(p);
            at = at.add(1);
        }
    }
    // SAFETY: both pointers lie in the caller's room.
    unsafe { at.offset_from(dst) as usize }
}

/// Order the non-temporal stores made so far before any later store (and the device's
/// reading, which starts after a later driver call).
#[inline]
fn fence_streaming() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

impl Drop for PairBuffer {
    fn drop(&mut self) {
        self.unpin();
    }
}

/// Scratch for [`in_chunk_order`], kept with a lane and reused chunk after chunk.
#[derive(Default)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub struct PassOrder {
    /// Bit `i`: pair `i` passed.
    seen: Vec<u64>,
    /// The overlap of each passing pair, by index (other slots are stale).
    overlap: Vec<u32>,
}

/// The device's passing pairs of a chunk of `m` pairs (`index[j]` passed with overlap
/// `overlap[j]`, in the order the device's blocks wrote them) as (index, overlap) by
/// ascending index; `None` when an index is `>= m` or comes twice. Linear in `m / 64` plus
/// the passing pairs (it replaced a sort of them: ~0.3 ms for a chunk's 13 K pairs).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA driver only
pub fn in_chunk_order(
    index: &[u32],
    overlap: &[u32],
    m: usize,
    scratch: &mut PassOrder,
) -> Option<Vec<(u32, u32)>> {
    debug_assert_eq!(index.len(), overlap.len());
    let words = m.div_ceil(64);
    scratch.seen.clear();
    scratch.seen.resize(words, 0);
    if scratch.overlap.len() < m {
        scratch.overlap.resize(m, 0);
    }
    for (&i, &o) in index.iter().zip(overlap) {
        let i = i as usize;
        if i >= m {
            return None;
        }
        let (w, bit) = (i / 64, 1u64 << (i % 64));
        if scratch.seen[w] & bit != 0 {
            return None;
        }
        scratch.seen[w] |= bit;
        scratch.overlap[i] = o;
    }
    let mut out = Vec::with_capacity(index.len());
    for (w, &bits) in scratch.seen.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let i = w * 64 + b.trailing_zeros() as usize;
            out.push((i as u32, scratch.overlap[i]));
            b &= b - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(i: u32) -> PairToVerify {
        PairToVerify {
            y: i + 1,
            alpha: i ^ 0xdead_beef,
        }
    }

    #[test]
    fn every_way_of_writing_puts_each_pair_in_its_slot() {
        // Runs that start at each offset within a line and end anywhere, into a 64-byte
        // aligned room, with guards on both sides that must stay untouched.
        let guard = PairToVerify { y: 7, alpha: 7 };
        for start in 0..9 {
            for n in [0, 1, 5, 8, 9, 16, 23, 40] {
                let mut room = vec![guard; 80];
                let base = room.as_ptr().align_offset(64);
                let want: Vec<PairToVerify> = (0..n as u32).map(pair).collect();
                let from = base + start;
                // SAFETY: `from + n` lies within the room, which is 8-byte aligned.
                let written =
                    unsafe { write_pairs(room.as_mut_ptr().add(from), want.iter().copied()) };
                fence_streaming();
                assert_eq!(written, n, "from {start}, {n} pairs");
                assert_eq!(&room[from..from + n], &want[..], "from {start}, {n} pairs");
                assert!(room[..from].iter().all(|&p| p == guard));
                assert!(room[from + n..].iter().all(|&p| p == guard));
            }
        }
    }

    #[test]
    fn extend_keeps_every_pair_in_order_past_its_capacity() {
        for pinned in [false, true] {
            let mut b = PairBuffer::new(4, pinned);
            b.push(pair(0));
            b.extend((1..3).map(pair));
            b.extend(std::iter::empty());
            assert_eq!(b.len(), 3);
            // Past the capacity and past the eighth of room: grows, loses nothing.
            b.extend((3..40).map(pair));
            assert!(b.is_full());
            let want: Vec<PairToVerify> = (0..40).map(pair).collect();
            assert_eq!(b.as_slice(), &want[..]);
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

    /// Overshooting the nominal size, even far past the room allocated for it, keeps the
    /// pairs page-locked (when a GPU is there) and in order.
    #[test]
    fn stays_pinned_when_a_probe_overshoots() {
        let mut b = PairBuffer::new(64, true);
        let pinned = b.is_pinned();
        for i in 0..1000 {
            b.push(pair(i));
        }
        assert!(b.is_full());
        assert_eq!(b.is_pinned(), pinned);
        let want: Vec<PairToVerify> = (0..1000).map(pair).collect();
        assert_eq!(b.as_slice(), &want[..]);
        b.clear();
        assert_eq!(b.is_pinned(), pinned);
        b.push(pair(7));
        assert_eq!(b.as_slice(), &[pair(7)]);
    }

    #[test]
    fn groups_mark_each_probe_sets_pairs() {
        let mut b = PairBuffer::new(8, false);
        assert_eq!(b.groups(), None);
        b.start_group(7);
        b.push(pair(0));
        b.push(pair(0));
        b.start_group(3);
        b.start_group(5);
        b.push(pair(1));
        let g = b.groups().expect("grouped");
        assert_eq!((g.starts, g.probes), (&[0, 2][..], &[7, 5][..]));
        let mut seen = Vec::new();
        g.each_probe(&[(0, 'a'), (2, 'b')], |x, i, c| seen.push((x, i, c)));
        assert_eq!(seen, [(7, 0, 'a'), (5, 2, 'b')]);
        // A trailing group with no pair yet is not a valid grouping.
        b.start_group(1);
        assert_eq!(b.groups(), None);
        b.clear();
        b.push(pair(2));
        assert_eq!(b.groups(), None, "pairs before any group");
    }

    /// The passing pairs by index, against a sort; a repeated or out-of-range index refused.
    #[test]
    fn passes_come_back_in_chunk_order() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(31);
        let mut scratch = PassOrder::default();
        for round in 0..300 {
            let m = rng.random_range(1..=if round % 2 == 0 { 200 } else { 5000 });
            // A random subset of 0..m, shuffled, with overlaps.
            let mut index: Vec<u32> = (0..m as u32)
                .filter(|_| rng.random_range(0..3) == 0)
                .collect();
            for i in (1..index.len()).rev() {
                index.swap(i, rng.random_range(0..=i));
            }
            let overlap: Vec<u32> = index
                .iter()
                .map(|&i| i.wrapping_mul(2_654_435_761))
                .collect();
            let mut want: Vec<(u32, u32)> =
                index.iter().copied().zip(overlap.iter().copied()).collect();
            want.sort_unstable();
            assert_eq!(
                in_chunk_order(&index, &overlap, m, &mut scratch),
                Some(want)
            );
            let mut o = overlap.clone();
            o.push(0);
            if !index.is_empty() {
                let mut twice = index.clone();
                twice.push(index[rng.random_range(0..index.len())]);
                assert_eq!(in_chunk_order(&twice, &o, m, &mut scratch), None);
            }
            let mut out = index.clone();
            out.push(m as u32 + rng.random_range(0..3));
            assert_eq!(in_chunk_order(&out, &o, m, &mut scratch), None);
        }
    }
}
