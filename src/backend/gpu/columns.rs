//! Device-resident list columns: the bookkeeping of the copies of list columns that stay in
//! device memory between batches and queries (`sets.gpu_resident_columns`), within a byte
//! budget (`sets.gpu_column_budget`), least recently used evicted first.
//!
//! A column is named by the Arrow buffers behind it (its values and its offsets, whole
//! buffers: a batch sliced differently by the next query still finds it). Arrow buffers are
//! immutable, so a device copy stays true as long as the buffers live; an entry keeps clones
//! of them, which pins their memory and keeps the addresses in its key unique, and an entry
//! whose buffers nobody else holds any more belongs to dropped data and is freed at the next
//! call. The device side is generic (`D`, the allocation) so the policy is tested without a GPU.

use std::collections::VecDeque;
use std::sync::Mutex;

use datafusion::arrow::buffer::Buffer;

use super::{HostList, HostOffsets};

/// Identity of a list column: element width, offset width and its two buffers' extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ColumnKey {
    element_bytes: usize,
    offset_bytes: usize,
    values: (usize, usize),
    offsets: (usize, usize),
}

impl ColumnKey {
    /// The key of the column whose child values are `values` (elements of `element_bytes`)
    /// and whose offsets are `offsets` (entries of `offset_bytes`).
    pub(crate) fn new(
        values: &Buffer,
        offsets: &Buffer,
        element_bytes: usize,
        offset_bytes: usize,
    ) -> Self {
        let span = |b: &Buffer| (b.as_ptr() as usize, b.len());
        ColumnKey {
            element_bytes,
            offset_bytes,
            values: span(values),
            offsets: span(offsets),
        }
    }
}

/// Columns whose rows in a call hold fewer value bytes are always staged: copying them is
/// cheaper than keeping them.
pub(crate) const MIN_RESIDENT_BYTES: usize = 64 << 10;

/// Where a call's list lies in its column's Arrow buffers.
pub(crate) struct Placement {
    pub(crate) key: ColumnKey,
    /// Byte offset of the call's first value in the values buffer.
    pub(crate) v_shift: usize,
    /// Byte offset of the call's first offset in the offsets buffer.
    pub(crate) o_shift: usize,
    /// Bytes per offset (4 or 8).
    pub(crate) osz: usize,
}

/// The placement of `l` in its column when the column is worth keeping on the device: it
/// has an Arrow identity, and the call's rows cover at least half of its values buffer and
/// [`MIN_RESIDENT_BYTES`]. `None`: stage it.
pub(crate) fn placement<T>(l: &HostList<'_, T>) -> Option<Placement> {
    let (vbuf, obuf) = l.column?;
    let esz = std::mem::size_of::<T>();
    let n = l.offsets.rows();
    let used = (l.offsets.at(n) - l.offsets.at(0)) * esz;
    if used < MIN_RESIDENT_BYTES || 2 * used < vbuf.len() {
        return None;
    }
    let (osz, offs_ptr, offs_len) = match l.offsets {
        HostOffsets::I32(o) => (4, o.as_ptr() as usize, o.len() * 4),
        HostOffsets::I64(o) => (8, o.as_ptr() as usize, o.len() * 8),
    };
    // Where the call's slices lie in the buffers (whole buffers are copied).
    let v_shift = (l.values.as_ptr() as usize).checked_sub(vbuf.as_ptr() as usize)?;
    let o_shift = offs_ptr.checked_sub(obuf.as_ptr() as usize)?;
    if v_shift + std::mem::size_of_val(l.values) > vbuf.len()
        || o_shift + offs_len > obuf.len()
        || v_shift % esz != 0
    {
        return None;
    }
    Some(Placement {
        key: ColumnKey::new(vbuf, obuf, esz, osz),
        v_shift,
        o_shift,
        osz,
    })
}

/// How many columns [`SeenColumns`] remembers.
const SEEN_CAP: usize = 64;

/// The columns worth keeping that calls met, most recent last (keys only: nothing is pinned,
/// so a key may outlive its data, and a new column at the same addresses counts as met; the
/// cost of that is one early copy, never a wrong answer).
#[derive(Default)]
pub(crate) struct SeenColumns {
    keys: VecDeque<ColumnKey>,
}

impl SeenColumns {
    /// Record `key` as met now; whether it had been met before.
    pub(crate) fn meet(&mut self, key: &ColumnKey) -> bool {
        let before = match self.keys.iter().position(|k| k == key) {
            Some(i) => {
                self.keys.remove(i);
                true
            }
            None => false,
        };
        if self.keys.len() == SEEN_CAP {
            self.keys.pop_front();
        }
        self.keys.push_back(key.clone());
        before
    }
}

static SEEN: Mutex<SeenColumns> = Mutex::new(SeenColumns {
    keys: VecDeque::new(),
});

/// Record the column of `key` as met by a call (every call that keeps or reads a column on
/// the device does).
pub(crate) fn meet(key: &ColumnKey) -> bool {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).meet(key)
}

/// Whether every list of a call is worth keeping on the device and its column was met by an
/// earlier call (a table queried again); every such column is recorded as met either way.
pub(crate) fn all_met_before<T>(lists: &[HostList<'_, T>]) -> bool {
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let mut all = true;
    for l in lists {
        match placement(l) {
            Some(p) => all &= seen.meet(&p.key),
            None => all = false,
        }
    }
    all
}

struct Entry<D> {
    key: ColumnKey,
    pins: [Buffer; 2],
    dev: D,
    bytes: usize,
    last_used: u64,
}

/// What [`ColumnCache::admit`] did.
pub(crate) enum Admitted<'c, D> {
    /// The column is now resident.
    Now(&'c D),
    /// It does not fit the budget next to the columns the current call uses: stage it.
    DoesNotFit,
}

/// The resident columns of one device.
pub(crate) struct ColumnCache<D> {
    entries: Vec<Entry<D>>,
    clock: u64,
    bytes: usize,
    /// Lookups that found their column resident.
    pub(crate) hits: u64,
    /// Columns copied to the device and kept.
    pub(crate) admitted: u64,
    /// Columns dropped to make room (not counting those whose data was dropped).
    pub(crate) evicted: u64,
}

impl<D> Default for ColumnCache<D> {
    fn default() -> Self {
        ColumnCache {
            entries: Vec::new(),
            clock: 0,
            bytes: 0,
            hits: 0,
            admitted: 0,
            evicted: 0,
        }
    }
}

impl<D> ColumnCache<D> {
    /// Start a call: drop the entries of dropped data and return the call's stamp. Columns
    /// looked up or admitted under this stamp are not evicted until the next call begins.
    pub(crate) fn begin_call(&mut self) -> u64 {
        self.clock += 1;
        let before = self.entries.len();
        self.entries
            .retain(|e| e.pins.iter().any(|b| b.strong_count() > 1));
        if self.entries.len() != before {
            self.bytes = self.entries.iter().map(|e| e.bytes).sum();
        }
        self.clock
    }

    /// The device copy of `key`, if resident (marked used by the call `stamp`).
    pub(crate) fn get(&mut self, key: &ColumnKey, stamp: u64) -> Option<&D> {
        let e = self.entries.iter_mut().find(|e| &e.key == key)?;
        e.last_used = stamp;
        self.hits += 1;
        Some(&e.dev)
    }

    /// Make `key` resident with a copy of `bytes` bytes made by `upload`, evicting the least
    /// recently used columns that the call `stamp` does not use until it fits `budget`.
    /// `pins` are the column's values and offsets buffers. An upload error is returned
    /// (nothing was evicted for nothing: the columns evicted stay evicted, their memory free).
    pub(crate) fn admit<E>(
        &mut self,
        key: ColumnKey,
        pins: [Buffer; 2],
        bytes: usize,
        budget: usize,
        stamp: u64,
        upload: impl FnOnce() -> Result<D, E>,
    ) -> Result<Admitted<'_, D>, E> {
        let in_use: usize = self
            .entries
            .iter()
            .filter(|e| e.last_used == stamp)
            .map(|e| e.bytes)
            .sum();
        if bytes > budget.saturating_sub(in_use) {
            return Ok(Admitted::DoesNotFit);
        }
        while self.bytes + bytes > budget {
            let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.last_used != stamp)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
            else {
                return Ok(Admitted::DoesNotFit);
            };
            let gone = self.entries.swap_remove(oldest);
            self.bytes -= gone.bytes;
            self.evicted += 1;
        }
        let dev = upload()?;
        self.bytes += bytes;
        self.admitted += 1;
        self.entries.push(Entry {
            key,
            pins,
            dev,
            bytes,
            last_used: stamp,
        });
        Ok(Admitted::Now(
            &self.entries.last().expect("just pushed").dev,
        ))
    }

    /// Bytes of the resident columns.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of resident columns.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drop every resident column (device memory short, or a fault).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A fake device allocation that counts the live ones.
    struct Fake {
        id: usize,
        live: Rc<Cell<usize>>,
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.live.set(self.live.get() - 1);
        }
    }

    fn column(n: usize) -> [Buffer; 2] {
        let values = Buffer::from_vec((0..n as u32).collect::<Vec<u32>>());
        let offsets = Buffer::from_vec(vec![0i32, n as i32]);
        [values, offsets]
    }

    fn key(c: &[Buffer; 2]) -> ColumnKey {
        ColumnKey::new(&c[0], &c[1], 4, 4)
    }

    struct Harness {
        cache: ColumnCache<Fake>,
        live: Rc<Cell<usize>>,
        next: usize,
    }

    impl Harness {
        fn new() -> Self {
            Harness {
                cache: ColumnCache::default(),
                live: Rc::new(Cell::new(0)),
                next: 0,
            }
        }

        /// Look `c` up and admit it on a miss; the id of its copy, or `None` if staged.
        fn use_column(&mut self, c: &[Buffer; 2], budget: usize, stamp: u64) -> Option<usize> {
            if let Some(d) = self.cache.get(&key(c), stamp) {
                return Some(d.id);
            }
            self.next += 1;
            let (id, live) = (self.next, Rc::clone(&self.live));
            let bytes = c[0].len() + c[1].len();
            let r = self
                .cache
                .admit(key(c), c.clone(), bytes, budget, stamp, || {
                    live.set(live.get() + 1);
                    Ok::<_, ()>(Fake { id, live })
                });
            match r.expect("fake upload") {
                Admitted::Now(d) => Some(d.id),
                Admitted::DoesNotFit => None,
            }
        }
    }

    #[test]
    fn seen_columns_remember_the_most_recent_keys() {
        let cols: Vec<[Buffer; 2]> = (1..=SEEN_CAP + 1).map(column).collect();
        let mut seen = SeenColumns::default();
        assert!(!seen.meet(&key(&cols[0])));
        assert!(seen.meet(&key(&cols[0])));
        // SEEN_CAP others push the first out, oldest first.
        for c in &cols[1..] {
            assert!(!seen.meet(&key(c)));
        }
        assert!(!seen.meet(&key(&cols[0])));
        // Meeting a key again makes it the most recent: cols[2] survives SEEN_CAP - 1 more.
        assert!(seen.meet(&key(&cols[2])));
        for c in &cols[3..] {
            assert!(seen.meet(&key(c)));
        }
        assert!(seen.meet(&key(&cols[2])));
        assert_eq!(seen.keys.len(), SEEN_CAP);
    }

    #[test]
    fn placement_takes_columns_whose_rows_cover_half_their_buffer() {
        let n = MIN_RESIDENT_BYTES; // values of 4 bytes: 4x the minimum
        let values = Buffer::from_vec((0..n as u32).collect::<Vec<u32>>());
        let offsets = Buffer::from_vec(vec![0i32, (n / 2) as i32, n as i32]);
        let vals: &[u32] = values.typed_data();
        let offs: &[i32] = offsets.typed_data();
        let list = |rows: std::ops::Range<usize>, column: bool| HostList {
            offsets: HostOffsets::I32(&offs[rows.start..=rows.end]),
            values: vals,
            column: column.then_some((&values, &offsets)),
        };
        let whole = placement(&list(0..2, true)).expect("whole column");
        assert_eq!((whole.v_shift, whole.o_shift, whole.osz), (0, 0, 4));
        assert_eq!(whole.key, ColumnKey::new(&values, &offsets, 4, 4));
        // Half of the values buffer: still kept; its offsets start one entry in.
        let half = placement(&list(1..2, true)).expect("second half");
        assert_eq!((half.o_shift, half.key), (4, whole.key));
        // No Arrow identity: staged.
        assert!(placement(&list(0..2, false)).is_none());
        // Fewer than MIN_RESIDENT_BYTES: staged.
        let small = Buffer::from_vec((0..100u32).collect::<Vec<u32>>());
        let small_offs = Buffer::from_vec(vec![0i32, 100]);
        let l = HostList {
            offsets: HostOffsets::I32(small_offs.typed_data()),
            values: small.typed_data::<u32>(),
            column: Some((&small, &small_offs)),
        };
        assert!(placement(&l).is_none());
        // Rows covering under half of the buffer: staged.
        let quarter = Buffer::from_vec(vec![0i32, (n / 4) as i32]);
        let l = HostList {
            offsets: HostOffsets::I32(quarter.typed_data()),
            values: vals,
            column: Some((&values, &quarter)),
        };
        assert!(placement(&l).is_none());
    }

    #[test]
    fn resident_columns_are_reused_and_evicted_least_recently_used() {
        let mut h = Harness::new();
        let (a, b, c) = (column(100), column(100), column(100));
        let each = 400 + 8;
        let budget = 2 * each;
        let s = h.cache.begin_call();
        let ida = h.use_column(&a, budget, s).expect("a fits");
        let idb = h.use_column(&b, budget, s).expect("b fits");
        assert_ne!(ida, idb);
        assert_eq!(h.cache.bytes(), 2 * each);
        // A later call finds both without copying again.
        let s = h.cache.begin_call();
        assert_eq!(h.use_column(&a, budget, s), Some(ida));
        assert_eq!(h.cache.hits, 1);
        // c needs room: b (used longest ago) goes, a (used by this call) stays.
        let s2 = h.cache.begin_call();
        assert_eq!(h.use_column(&a, budget, s2), Some(ida));
        let idc = h
            .use_column(&c, budget, s2)
            .expect("c fits after evicting b");
        assert_eq!((h.cache.evicted, h.cache.len(), h.live.get()), (1, 2, 2));
        assert_eq!(h.use_column(&a, budget, s2), Some(ida));
        assert_eq!(h.use_column(&c, budget, s2), Some(idc));
        // b comes back as a new copy, evicting a (c and b are used by this call).
        let s3 = h.cache.begin_call();
        assert_eq!(h.use_column(&c, budget, s3), Some(idc));
        let idb2 = h.use_column(&b, budget, s3).expect("b again");
        assert_ne!(idb2, idb);
        assert_eq!(h.cache.evicted, 2);
        assert_eq!(
            h.use_column(&a, budget, h.cache.clock),
            None,
            "a no longer fits"
        );
        assert_eq!(h.live.get(), 2);
    }

    #[test]
    fn columns_of_one_call_are_never_evicted_for_each_other() {
        let mut h = Harness::new();
        let (a, b) = (column(100), column(100));
        let budget = 408 + 100;
        let s = h.cache.begin_call();
        assert!(h.use_column(&a, budget, s).is_some());
        // b does not fit next to a, which the same call uses: b is staged, a stays.
        assert_eq!(h.use_column(&b, budget, s), None);
        assert_eq!((h.cache.len(), h.cache.evicted), (1, 0));
        // Larger than the whole budget: never resident.
        let big = column(1000);
        let s = h.cache.begin_call();
        assert_eq!(h.use_column(&big, budget, s), None);
        assert_eq!(h.cache.len(), 1);
    }

    #[test]
    fn copies_of_dropped_columns_are_freed_at_the_next_call() {
        let mut h = Harness::new();
        let a = column(100);
        let b = column(50);
        let s = h.cache.begin_call();
        h.use_column(&a, 1 << 20, s).expect("a");
        h.use_column(&b, 1 << 20, s).expect("b");
        assert_eq!(h.live.get(), 2);
        drop(a);
        h.cache.begin_call();
        assert_eq!((h.cache.len(), h.live.get()), (1, 1));
        assert_eq!(h.cache.bytes(), 200 + 8);
        h.cache.clear();
        assert_eq!((h.cache.len(), h.live.get(), h.cache.bytes()), (0, 0, 0));
    }

    #[test]
    fn a_failed_upload_leaves_nothing_behind() {
        let mut cache: ColumnCache<Fake> = ColumnCache::default();
        let a = column(10);
        let s = cache.begin_call();
        let r = cache.admit(key(&a), a.clone(), 48, 1 << 20, s, || Err("device full"));
        assert!(matches!(r, Err("device full")));
        assert_eq!((cache.len(), cache.bytes(), cache.admitted), (0, 0, 0));
    }

    #[test]
    fn the_key_tells_columns_and_widths_apart() {
        let a = column(10);
        let b = column(10);
        assert_eq!(key(&a), key(&a));
        assert_ne!(key(&a), key(&b));
        assert_ne!(
            ColumnKey::new(&a[0], &a[1], 4, 4),
            ColumnKey::new(&a[0], &a[1], 8, 4)
        );
    }
}
