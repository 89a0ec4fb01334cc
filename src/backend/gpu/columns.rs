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

    /// The key of a values buffer kept on the device alone (its calls' offsets are staged).
    fn values_only(values: &Buffer, element_bytes: usize) -> Self {
        ColumnKey {
            element_bytes,
            offset_bytes: 0,
            values: (values.as_ptr() as usize, values.len()),
            offsets: (0, 0),
        }
    }

    /// Bytes of the values buffer.
    fn values_len(&self) -> usize {
        self.values.1
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
    /// Only the values buffer is kept (the key names it alone); the call's offsets are staged
    /// with the call. A slice of a large batch: its offsets are a buffer of their own.
    pub(crate) values_only: bool,
}

/// Where `l`'s rows lie in its column's buffers, and how many value bytes they hold, when the
/// column has an Arrow identity and the rows hold at least [`MIN_RESIDENT_BYTES`]; the key
/// names both buffers, or the values buffer alone for a slice (see [`placement_in`]).
fn locate<T>(l: &HostList<'_, T>) -> Option<(Placement, usize)> {
    let (vbuf, obuf) = l.column?;
    let esz = std::mem::size_of::<T>();
    let n = l.offsets.rows();
    let used = (l.offsets.at(n) - l.offsets.at(0)) * esz;
    if used < MIN_RESIDENT_BYTES {
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
    // Rows over half of the values or more: the column is kept whole. Fewer: a slice of a
    // larger batch, whose values buffer alone is named (every slice has offsets of its own).
    let p = if covers_half(used, vbuf.len()) {
        Placement {
            key: ColumnKey::new(vbuf, obuf, esz, osz),
            v_shift,
            o_shift,
            osz,
            values_only: false,
        }
    } else {
        Placement {
            key: ColumnKey::values_only(vbuf, esz),
            v_shift,
            o_shift: 0,
            osz,
            values_only: true,
        }
    };
    Some((p, used))
}

/// Whether a call over `used` value bytes of a column whose values buffer holds `whole`
/// bytes covers half of it.
fn covers_half(used: usize, whole: usize) -> bool {
    2 * used >= whole
}

/// The placement of `l` when its column is worth keeping on the device, the call recorded
/// as met in `seen`: it has an Arrow identity, the call's rows hold at least
/// [`MIN_RESIDENT_BYTES`], and either they cover at least half of its values buffer (the
/// column is kept whole: values, offsets and row order), or they are a slice of a larger
/// batch (DataFusion hands a large in-memory batch on in slices of `batch_size` rows, each
/// with offsets of its own over the same values) and the slices read so far, this one
/// included, cover half of the values: the values buffer is kept alone, each call's offsets
/// staged with it. `None`: stage it.
fn placement_in<T>(seen: &mut SeenColumns, l: &HostList<'_, T>) -> Option<Placement> {
    let (p, used) = locate(l)?;
    let before = seen.meet(&p.key, used);
    (!p.values_only || covers_half(before.saturating_add(used), p.key.values_len())).then_some(p)
}

/// [`placement_in`] with the process's record of the columns calls met.
pub(crate) fn placement<T>(l: &HostList<'_, T>) -> Option<Placement> {
    placement_in(&mut SEEN.lock().unwrap_or_else(|p| p.into_inner()), l)
}

/// How many columns [`SeenColumns`] remembers.
const SEEN_CAP: usize = 64;

/// The columns worth keeping that calls met, most recent last, with the value bytes the calls
/// read of each (keys only: nothing is pinned, so a key may outlive its data, and a new
/// column at the same addresses counts as met; the cost of that is one early copy, never a
/// wrong answer).
#[derive(Default)]
pub(crate) struct SeenColumns {
    keys: VecDeque<(ColumnKey, usize)>,
}

impl SeenColumns {
    /// Record a call over `used` value bytes of the column `key`; the bytes earlier calls
    /// read of it (0: not met before).
    pub(crate) fn meet(&mut self, key: &ColumnKey, used: usize) -> usize {
        let before = match self.keys.iter().position(|(k, _)| k == key) {
            Some(i) => self.keys.remove(i).map_or(0, |(_, b)| b),
            None => 0,
        };
        if self.keys.len() == SEEN_CAP {
            self.keys.pop_front();
        }
        self.keys
            .push_back((key.clone(), before.saturating_add(used.max(1))));
        before
    }
}

static SEEN: Mutex<SeenColumns> = Mutex::new(SeenColumns {
    keys: VecDeque::new(),
});

/// Whether every list of a call is worth keeping on the device and its column was met by
/// earlier calls (a table queried again): a column read in batches that cover half of it, by
/// an earlier call; a slice of a larger batch, when earlier slices covered all of its values
/// (a scan before this one). Every such column is recorded as met either way.
pub(crate) fn all_met_before<T>(lists: &[HostList<'_, T>]) -> bool {
    all_met_before_in(&mut SEEN.lock().unwrap_or_else(|p| p.into_inner()), lists)
}

fn all_met_before_in<T>(seen: &mut SeenColumns, lists: &[HostList<'_, T>]) -> bool {
    let mut all = true;
    for l in lists {
        all &= locate(l).is_some_and(|(p, used)| {
            let before = seen.meet(&p.key, used);
            if p.values_only {
                before >= p.key.values_len()
            } else {
                before > 0
            }
        });
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
        assert_eq!(seen.meet(&key(&cols[0]), 10), 0);
        assert_eq!(seen.meet(&key(&cols[0]), 5), 10);
        assert_eq!(seen.meet(&key(&cols[0]), 1), 15);
        // SEEN_CAP others push the first out, oldest first.
        for c in &cols[1..] {
            assert_eq!(seen.meet(&key(c), 1), 0);
        }
        assert_eq!(seen.meet(&key(&cols[0]), 1), 0);
        // Meeting a key again makes it the most recent: cols[2] survives SEEN_CAP - 1 more.
        assert_eq!(seen.meet(&key(&cols[2]), 1), 1);
        for c in &cols[3..] {
            assert_eq!(seen.meet(&key(c), 1), 1);
        }
        assert_eq!(seen.meet(&key(&cols[2]), 1), 2);
        assert_eq!(seen.keys.len(), SEEN_CAP);
    }

    /// A column of 4 * MIN_RESIDENT_BYTES bytes of u32 values in four rows of equal length.
    fn four_rows() -> (Buffer, Buffer) {
        let n = MIN_RESIDENT_BYTES;
        let values = Buffer::from_vec((0..n as u32).collect::<Vec<u32>>());
        let q = (n / 4) as i32;
        let offsets = Buffer::from_vec(vec![0i32, q, 2 * q, 3 * q, 4 * q]);
        (values, offsets)
    }

    /// Rows `rows` of the column as an Arrow list sliced to them hands them over: the whole
    /// values buffer, the rows' offsets as a buffer of their own (`Buffer::slice`).
    fn slice_of(c: &(Buffer, Buffer), rows: std::ops::Range<usize>) -> (Buffer, Buffer) {
        let offsets = c.1.slice_with_length(rows.start * 4, (rows.len() + 1) * 4);
        (c.0.clone(), offsets)
    }

    fn list_of(c: &(Buffer, Buffer), column: bool) -> HostList<'_, u32> {
        HostList {
            offsets: HostOffsets::I32(c.1.typed_data::<i32>()),
            values: c.0.typed_data(),
            column: column.then_some((&c.0, &c.1)),
        }
    }

    #[test]
    fn placement_takes_columns_whose_rows_cover_half_their_buffer() {
        let c = four_rows();
        let mut seen = SeenColumns::default();
        let whole = placement_in(&mut seen, &list_of(&c, true)).expect("whole column");
        assert_eq!((whole.v_shift, whole.o_shift, whole.osz), (0, 0, 4));
        assert_eq!(whole.key, ColumnKey::new(&c.0, &c.1, 4, 4));
        assert!(!whole.values_only);
        // Half of the values, the offsets buffer shared with the whole column (an offset 2
        // entries in): kept whole too.
        let (v, o) = (&c.0, &c.1);
        let l = HostList {
            offsets: HostOffsets::I32(&o.typed_data::<i32>()[2..]),
            values: v.typed_data::<u32>(),
            column: Some((v, o)),
        };
        let half = placement_in(&mut seen, &l).expect("second half");
        assert_eq!(
            (half.o_shift, &half.key, half.values_only),
            (8, &whole.key, false)
        );
        // No Arrow identity: staged.
        assert!(placement_in(&mut seen, &list_of(&c, false)).is_none());
        // Fewer than MIN_RESIDENT_BYTES: staged.
        let small = Buffer::from_vec((0..100u32).collect::<Vec<u32>>());
        let small_offs = Buffer::from_vec(vec![0i32, 100]);
        assert!(placement_in(&mut seen, &list_of(&(small, small_offs), true)).is_none());
    }

    /// Slices of one large batch: staged until the slices read cover half of the values,
    /// then the values buffer is kept alone (one key for every slice), offsets staged.
    #[test]
    fn slices_keep_their_values_once_half_of_them_was_read() {
        let c = four_rows();
        let mut seen = SeenColumns::default();
        let s0 = slice_of(&c, 0..1);
        assert!(placement_in(&mut seen, &list_of(&s0, true)).is_none());
        let s1 = slice_of(&c, 1..2);
        let p1 = placement_in(&mut seen, &list_of(&s1, true)).expect("half read");
        assert!(p1.values_only);
        assert_eq!((p1.v_shift, p1.o_shift), (0, 0));
        let s3 = slice_of(&c, 3..4);
        let p3 = placement_in(&mut seen, &list_of(&s3, true)).expect("later slice");
        assert_eq!(p3.key, p1.key);
        assert_ne!(p1.key, ColumnKey::new(&c.0, &c.1, 4, 4));
        // Another column's slices start over.
        let d = four_rows();
        assert!(placement_in(&mut seen, &list_of(&slice_of(&d, 3..4), true)).is_none());
    }

    /// `auto`'s test of a table queried again: met by an earlier call (a batch covering half
    /// of its column or more), or, for slices, earlier slices covering all of the values.
    #[test]
    fn met_before_for_batches_and_for_slices() {
        let (a, b) = (four_rows(), four_rows());
        let mut seen = SeenColumns::default();
        let both = [list_of(&a, true), list_of(&b, true)];
        assert!(!all_met_before_in(&mut seen, &both));
        assert!(all_met_before_in(&mut seen, &both));
        // In slices: the first scan's slices are all new; the next scan's are met.
        let (a, b) = (four_rows(), four_rows());
        let mut seen = SeenColumns::default();
        let slices = |r: usize| (slice_of(&a, r..r + 1), slice_of(&b, r..r + 1));
        for r in 0..4 {
            let (x, y) = slices(r);
            assert!(!all_met_before_in(
                &mut seen,
                &[list_of(&x, true), list_of(&y, true)]
            ));
        }
        for r in 0..4 {
            let (x, y) = slices(r);
            assert!(all_met_before_in(
                &mut seen,
                &[list_of(&x, true), list_of(&y, true)]
            ));
        }
        // A list without an Arrow identity is never met.
        let (x, y) = slices(0);
        assert!(!all_met_before_in(
            &mut seen,
            &[list_of(&x, true), list_of(&y, false)]
        ));
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
