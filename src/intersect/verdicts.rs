//! Per-row verdicts of a list column — strictly increasing, sorted with duplicates, or
//! neither (unsorted, or holding a NULL element) — computed once per Arrow buffer and cached.
//!
//! Sortedness is checked, never trusted, and checking reads every value. A skewed
//! intersection (a 20-value list galloping through a 20,000-value one) otherwise reads a few
//! hundred of those values, so the check would dominate every query over the same table.
//! Arrow buffers are immutable, so the verdicts of one `(values, offsets, validity)` triple
//! stay true as long as the buffers live. An entry keeps clones of those buffers, which pins
//! their memory and makes the addresses in its key unique; an entry whose buffers nobody but
//! the cache holds any more is dropped at the next sweep (every lookup while the cache is
//! small, every `SWEEP_EVERY` lookups once it is large, and before an eviction), so the
//! cache never keeps a table alive for long. Slices of one batch
//! (DataFusion hands a large batch on in slices) share their buffers: the sweep counts the
//! cache's own references to each allocation, so a dropped table's slices go too.
//!
//! Entries are many and small (one verdict byte per row): a table of `n` batches of `k` list
//! columns takes `n * k` of them, so the cache holds up to `CACHE_ENTRIES` (a scan of more
//! columns than fit would evict each entry before its next use and never hit).

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::array::OffsetSizeTrait;
use datafusion::arrow::buffer::Buffer;

use super::lists::IntLists;
use crate::backend::cpu::{self, SetElem, Sortedness};

/// What one row of one list column is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Strictly increasing, no NULL element.
    Strict,
    /// Sorted ascending with duplicates, no NULL element.
    NonDecreasing,
    /// Unsorted or holding a NULL element: the exact general path.
    General,
}

/// Columns with fewer values are checked per call, not cached.
const CACHE_MIN_VALUES: usize = 1 << 16;
/// Most entries kept (least recently used are dropped first): 8,192-row batches of two list
/// columns up to 33 M rows, at one byte a row.
const CACHE_ENTRIES: usize = 8192;
/// Lookups between two sweeps for entries of dropped data, once the cache holds more than
/// [`SWEEP_ALWAYS_UP_TO`] entries (up to that, every lookup sweeps: a few microseconds).
const SWEEP_EVERY: u64 = 32;
const SWEEP_ALWAYS_UP_TO: usize = 256;
/// Rows checked per rayon task when filling an entry.
#[cfg(test)]
const ROWS_PER_TASK: usize = 256;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    element: TypeId,
    offset_width: usize,
    values: (usize, usize),
    offsets: (usize, usize),
    nulls: (usize, usize),
}

struct Entry {
    pins: Vec<Buffer>,
    verdicts: Arc<[Verdict]>,
    last_used: u64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Entry>,
    /// References the entries hold to each allocation (by `Buffer::data_ptr`).
    pinned: HashMap<usize, usize>,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl Cache {
    fn insert(&mut self, key: Key, entry: Entry) {
        for b in &entry.pins {
            *self
                .pinned
                .entry(b.data_ptr().as_ptr() as usize)
                .or_default() += 1;
        }
        if let Some(old) = self.entries.insert(key, entry) {
            self.unpin(&old);
        }
    }

    fn unpin(&mut self, entry: &Entry) {
        for b in &entry.pins {
            let at = b.data_ptr().as_ptr() as usize;
            if let Some(n) = self.pinned.get_mut(&at) {
                *n -= 1;
                if *n == 0 {
                    self.pinned.remove(&at);
                }
            }
        }
    }

    /// Drop the entries whose buffers are held by nothing but the cache.
    fn sweep(&mut self) {
        let pinned = &self.pinned;
        let dead: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.pins.iter().all(|b| {
                    let ours = pinned.get(&(b.data_ptr().as_ptr() as usize)).copied();
                    b.strong_count() <= ours.unwrap_or(0)
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            if let Some(e) = self.entries.remove(&k) {
                self.unpin(&e);
            }
        }
    }
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// The verdict of row `i` of `list`, checked now.
pub fn verdict_of<O: OffsetSizeTrait, T: SetElem>(list: &IntLists<'_, O, T>, i: usize) -> Verdict {
    if list.row_has_null_element(i) {
        return Verdict::General;
    }
    match cpu::sortedness(list.row(i)) {
        Sortedness::Strict => Verdict::Strict,
        Sortedness::NonDecreasing => Verdict::NonDecreasing,
        Sortedness::Unsorted => Verdict::General,
    }
}

/// What the cache holds for a column.
pub enum Lookup {
    /// Every row's verdict, computed by an earlier query over the same buffers.
    Hit(Arc<[Verdict]>),
    /// Not cached yet, but large enough to be: the caller checks the rows as it reads them
    /// (while they are in cache for its kernel) and hands the verdicts to [`store_verdicts`].
    Miss,
    /// Too small to be worth caching: check rows as they come.
    Small,
}

/// Look `list`'s verdicts up.
pub fn lookup_verdicts<O: OffsetSizeTrait, T: SetElem>(list: &IntLists<'_, O, T>) -> Lookup {
    if list.total_values() < CACHE_MIN_VALUES {
        return Lookup::Small;
    }
    let (_, key) = key_of(list);
    let Ok(mut cache) = CACHE.lock() else {
        return Lookup::Small;
    };
    cache.clock += 1;
    let now = cache.clock;
    // Entries whose buffers only the cache still holds belong to dropped data.
    if cache.entries.len() <= SWEEP_ALWAYS_UP_TO || now % SWEEP_EVERY == 0 {
        cache.sweep();
    }
    if let Some(e) = cache.entries.get_mut(&key) {
        e.last_used = now;
        let verdicts = Arc::clone(&e.verdicts);
        cache.hits += 1;
        return Lookup::Hit(verdicts);
    }
    cache.misses += 1;
    Lookup::Miss
}

/// Cache the verdicts of every row of `list` (one per row, in row order), computed by the
/// caller after a [`Lookup::Miss`]. A concurrent query that stored them first wins.
pub fn store_verdicts<O: OffsetSizeTrait, T: SetElem>(
    list: &IntLists<'_, O, T>,
    verdicts: Vec<Verdict>,
) -> Arc<[Verdict]> {
    debug_assert_eq!(verdicts.len(), list.len());
    let verdicts: Arc<[Verdict]> = verdicts.into();
    let (pins, key) = key_of(list);
    if let Ok(mut cache) = CACHE.lock() {
        if let Some(e) = cache.entries.get(&key) {
            return Arc::clone(&e.verdicts);
        }
        if cache.entries.len() >= CACHE_ENTRIES {
            cache.sweep();
        }
        if cache.entries.len() >= CACHE_ENTRIES
            && let Some(oldest) = cache
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            && let Some(e) = cache.entries.remove(&oldest)
        {
            cache.unpin(&e);
        }
        let last_used = cache.clock;
        cache.insert(
            key,
            Entry {
                pins,
                verdicts: Arc::clone(&verdicts),
                last_used,
            },
        );
    }
    verdicts
}

/// Verdicts of every row of `list`, from the cache when the column is large enough to be
/// worth it (computed in parallel and stored on a miss); `None` for small columns.
#[cfg(test)]
pub fn cached_verdicts<O: OffsetSizeTrait, T: SetElem>(
    list: &IntLists<'_, O, T>,
) -> Option<Arc<[Verdict]>> {
    use rayon::prelude::*;
    match lookup_verdicts(list) {
        Lookup::Hit(v) => Some(v),
        Lookup::Small => None,
        Lookup::Miss => {
            let verdicts = (0..list.len())
                .into_par_iter()
                .with_min_len(ROWS_PER_TASK)
                .map(|i| verdict_of(list, i))
                .collect::<Vec<_>>();
            Some(store_verdicts(list, verdicts))
        }
    }
}

fn key_of<O: OffsetSizeTrait, T: SetElem>(list: &IntLists<'_, O, T>) -> (Vec<Buffer>, Key) {
    let (values, offsets, nulls) = list.buffers();
    let span = |b: Option<&Buffer>| b.map_or((0, 0), |b| (b.as_ptr() as usize, b.len()));
    let key = Key {
        element: TypeId::of::<T>(),
        offset_width: O::IS_LARGE as usize,
        values: span(Some(values)),
        offsets: span(Some(offsets)),
        nulls: span(nulls),
    };
    let mut pins = vec![values.clone(), offsets.clone()];
    pins.extend(nulls.cloned());
    (pins, key)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int32Array, ListArray};
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type};

    use super::*;

    fn column(rows: usize) -> ListArray {
        // Row r: 300 values; sorted (r % 3 == 0), with duplicates (1), unsorted (2).
        let mut values = Vec::new();
        let mut offsets = vec![0i32];
        for r in 0..rows {
            let base: Vec<i32> = (0..300).map(|k| k * 2).collect();
            match r % 3 {
                0 => values.extend(base),
                1 => values.extend(base.iter().map(|v| v / 4)),
                _ => values.extend(base.iter().rev()),
            }
            offsets.push(values.len() as i32);
        }
        let field = Arc::new(Field::new_list_field(DataType::Int32, true));
        ListArray::new(
            field,
            OffsetBuffer::new(offsets.into()),
            Arc::new(Int32Array::from(values)),
            None,
        )
    }

    #[test]
    fn cached_verdicts_are_the_checked_ones_and_are_reused() {
        let list = column(400);
        let view = IntLists::<i32, i32>::new::<Int32Type>(&list);
        let first = cached_verdicts(&view).expect("large enough to cache");
        for (i, v) in first.iter().enumerate() {
            assert_eq!(*v, verdict_of(&view, i));
            let expected = [Verdict::Strict, Verdict::NonDecreasing, Verdict::General][i % 3];
            assert_eq!(*v, expected, "row {i}");
        }
        let again = cached_verdicts(&view).expect("cached");
        assert!(
            Arc::ptr_eq(&first, &again),
            "second lookup must hit the cache"
        );

        // A slice is another view: its own entry, rows renumbered.
        let sliced = list.slice(1, 300);
        let view = IntLists::<i32, i32>::new::<Int32Type>(&sliced);
        let verdicts = cached_verdicts(&view).expect("large enough");
        assert_eq!(verdicts[0], Verdict::NonDecreasing);
        assert_eq!(verdicts.len(), 300);
    }

    /// A table of more list columns than the old 64-entry cache held, scanned twice in the
    /// same order (DataFusion's slices of one large batch): the second scan hits every entry
    /// (with too small a cache, least-recently-used eviction in scan order never hits), and
    /// once the table is dropped the sweep lets its shared buffers go.
    #[test]
    fn a_scan_of_many_slices_hits_and_is_released() {
        let list = column(300 * 100);
        let slices: Vec<ListArray> = (0..100).map(|i| list.slice(i * 300, 300)).collect();
        let scan = || -> Vec<Arc<[Verdict]>> {
            slices
                .iter()
                .map(|s| {
                    let view = IntLists::<i32, i32>::new::<Int32Type>(s);
                    cached_verdicts(&view).expect("large enough to cache")
                })
                .collect()
        };
        let (first, second) = (scan(), scan());
        for (i, (a, b)) in first.iter().zip(&second).enumerate() {
            assert!(Arc::ptr_eq(a, b), "slice {i}: the second scan missed");
        }
        let keys: Vec<Key> = slices
            .iter()
            .map(|s| key_of(&IntLists::<i32, i32>::new::<Int32Type>(s)).1)
            .collect();
        drop((slices, list));
        let mut cache = CACHE.lock().unwrap();
        cache.sweep();
        for k in &keys {
            assert!(
                !cache.entries.contains_key(k),
                "an entry of the dropped table stayed"
            );
        }
    }

    #[test]
    fn small_columns_are_not_cached() {
        let list = column(3);
        let view = IntLists::<i32, i32>::new::<Int32Type>(&list);
        assert!(cached_verdicts(&view).is_none());
    }
}
