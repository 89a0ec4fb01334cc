//! Lists of strings as lists of dense integer ids, so that every set engine (the similarity
//! functions, the join's filters and verification, on the CPU or the GPU) runs on strings
//! unchanged.
//!
//! [`StringIds`] gives each distinct string (its bytes, compared exactly: no hash stands in
//! for a string, so no two strings can collide) one `u32` id, `0, 1, 2, ...` in the order
//! they are first met, and maps a `List` / `LargeList` of `Utf8`, `LargeUtf8` or `Utf8View` to
//! the list of their ids: the same rows, the same row and element validity. Equal strings get
//! equal ids and different strings different ones, so every set measure of the id lists is
//! the measure of the string lists. The map is sharded, so the join's read tasks fill one map
//! together; a batch first finds its distinct strings on its own and then takes each shard's
//! lock once.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::array::{
    Array, ArrayAccessor, ArrayRef, AsArray, GenericListArray, OffsetSizeTrait, UInt32Array,
};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DataFusionError, Result, internal_err};
use foldhash::HashMap;

/// Whether `dt` is a string type a set of strings may hold.
pub fn is_string_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// Whether `dt` is a `List` or `LargeList` of strings.
pub fn is_string_list(dt: &DataType) -> bool {
    match dt {
        DataType::List(f) | DataType::LargeList(f) => is_string_type(f.data_type()),
        _ => false,
    }
}

/// Bytes one entry of the map costs besides its string: the boxed key's pointer and length,
/// the id, and the table's slot overhead (an estimate, for memory accounting).
const ENTRY_BYTES: usize = 40;

/// One shard of the map: strings (their bytes) to ids.
type Shard = Mutex<HashMap<Box<[u8]>, u32>>;

/// A map from strings to dense `u32` ids (see the module docs).
pub struct StringIds {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::FixedState,
    /// The next id to give.
    next: AtomicU64,
}

impl StringIds {
    /// An empty map of `shards` shards (1 for a map one thread fills).
    pub fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher: foldhash::fast::FixedState::default(),
            next: AtomicU64::new(0),
        }
    }

    /// How many distinct strings have ids.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.next.load(Ordering::Relaxed) as usize
    }

    /// `list` (a `List` or `LargeList` of `Utf8`, `LargeUtf8` or `Utf8View`) as the same list
    /// of `UInt32` ids, and the bytes the map grew by (the new strings and their entries).
    /// `who` names the caller in errors.
    pub fn map_list(&self, list: &ArrayRef, who: &str) -> Result<(ArrayRef, usize)> {
        match list.data_type() {
            DataType::List(_) => self.map_typed::<i32>(list.as_list::<i32>(), who),
            DataType::LargeList(_) => self.map_typed::<i64>(list.as_list::<i64>(), who),
            other => internal_err!("{who}: expected a list of strings, got {other}"),
        }
    }

    fn map_typed<O: OffsetSizeTrait>(
        &self,
        list: &GenericListArray<O>,
        who: &str,
    ) -> Result<(ArrayRef, usize)> {
        // Only the values the rows reach (a sliced list's child holds more).
        let offsets = list.value_offsets();
        let (first, last) = (offsets[0].as_usize(), offsets[list.len()].as_usize());
        let values = list.values().slice(first, last - first);
        let (ids, grown) = match values.data_type() {
            DataType::Utf8 => self.ids_of(values.as_string::<i32>(), who)?,
            DataType::LargeUtf8 => self.ids_of(values.as_string::<i64>(), who)?,
            DataType::Utf8View => self.ids_of(values.as_string_view(), who)?,
            other => return internal_err!("{who}: expected a list of strings, got {other}"),
        };
        let rebased: ScalarBuffer<O> = offsets
            .iter()
            .map(|&o| O::usize_as(o.as_usize() - first))
            .collect();
        let field = Arc::new(Field::new_list_field(DataType::UInt32, true));
        let ids = UInt32Array::new(ids.into(), values.logical_nulls());
        let mapped = GenericListArray::<O>::try_new(
            field,
            OffsetBuffer::new(rebased),
            Arc::new(ids),
            list.nulls().cloned(),
        )?;
        Ok((Arc::new(mapped), grown))
    }

    /// The id of every value of `strings` (NULL values get 0, under their NULL bit), giving
    /// new strings new ids.
    fn ids_of<'a, S: ArrayAccessor<Item = &'a str>>(
        &self,
        strings: S,
        who: &str,
    ) -> Result<(Vec<u32>, usize)> {
        let n = strings.len();
        // The batch's distinct strings first, with no lock held.
        let mut local: HashMap<&[u8], u32> = HashMap::default();
        let mut distinct: Vec<&[u8]> = Vec::new();
        let mut slots = Vec::with_capacity(n);
        for i in 0..n {
            if strings.is_null(i) {
                slots.push(u32::MAX);
                continue;
            }
            let s = strings.value(i).as_bytes();
            let slot = *local.entry(s).or_insert_with(|| {
                distinct.push(s);
                (distinct.len() - 1) as u32
            });
            slots.push(slot);
        }
        drop(local);
        // Then each shard's new strings under one lock.
        let shards = self.shards.len();
        let mut by_shard: Vec<Vec<u32>> = vec![Vec::new(); shards];
        for (k, s) in distinct.iter().enumerate() {
            let shard = (self.hasher.hash_one(s) % shards as u64) as usize;
            by_shard[shard].push(k as u32);
        }
        let mut global = vec![0u32; distinct.len()];
        let mut grown = 0;
        for (shard, members) in self.shards.iter().zip(by_shard) {
            if members.is_empty() {
                continue;
            }
            let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for k in members {
                let s = distinct[k as usize];
                let id = match map.get(s) {
                    Some(&id) => id,
                    None => {
                        let id = self.next.fetch_add(1, Ordering::Relaxed);
                        let Ok(id) = u32::try_from(id) else {
                            return Err(DataFusionError::NotImplemented(format!(
                                "{who}: more than 2^32 distinct strings"
                            )));
                        };
                        map.insert(s.into(), id);
                        grown += s.len() + ENTRY_BYTES;
                        id
                    }
                };
                global[k as usize] = id;
            }
        }
        let ids = slots
            .into_iter()
            .map(|slot| match slot {
                u32::MAX => 0,
                k => global[k as usize],
            })
            .collect();
        Ok((ids, grown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        LargeListArray, ListArray, ListBuilder, StringBuilder, StringViewBuilder,
    };
    use datafusion::arrow::datatypes::UInt32Type;

    fn strings(rows: &[Option<Vec<Option<&str>>>]) -> ListArray {
        let mut b = ListBuilder::new(StringBuilder::new());
        for row in rows {
            match row {
                Some(r) => {
                    for v in r {
                        b.values().append_option(*v);
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        b.finish()
    }

    fn ids(a: &ArrayRef) -> Vec<Option<Vec<Option<u32>>>> {
        a.as_list::<i32>()
            .iter()
            .map(|r| r.map(|r| r.as_primitive::<UInt32Type>().iter().collect()))
            .collect()
    }

    #[test]
    fn equal_strings_share_an_id_and_nulls_stay_null() {
        let map = StringIds::new(4);
        let list: ArrayRef = Arc::new(strings(&[
            Some(vec![Some("b"), Some("a"), None, Some("b")]),
            None,
            Some(vec![]),
            Some(vec![Some("a"), Some("é"), Some("")]),
        ]));
        let (mapped, grown) = map.map_list(&list, "t").unwrap();
        assert_eq!(map.len(), 4);
        assert!(grown >= 4 * ENTRY_BYTES);
        let got = ids(&mapped);
        let row0 = got[0].as_ref().unwrap();
        assert_eq!(row0[0], row0[3]);
        assert_ne!(row0[0], row0[1]);
        assert_eq!(row0[2], None);
        assert_eq!(got[1], None);
        assert_eq!(got[2], Some(vec![]));
        let row3 = got[3].as_ref().unwrap();
        assert_eq!(row3[0], row0[1]);
        let mut all: Vec<u32> = row3.iter().chain(row0).flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, vec![0, 1, 2, 3], "dense ids");
        // A second batch reuses the ids and grows nothing for known strings.
        let again: ArrayRef = Arc::new(strings(&[Some(vec![Some("é"), Some("b")])]));
        let (mapped, grown) = map.map_list(&again, "t").unwrap();
        assert_eq!(grown, 0);
        assert_eq!(ids(&mapped)[0].as_ref().unwrap(), &vec![row3[1], row0[0]]);
    }

    #[test]
    fn every_string_type_and_sliced_lists_map_alike() {
        let map = StringIds::new(2);
        let rows = [
            Some(vec![Some("x"), Some("y")]),
            Some(vec![Some("z"), None]),
            Some(vec![Some("y"), Some("w")]),
        ];
        let list = strings(&rows);
        let (plain, _) = map
            .map_list(&(Arc::new(list.clone()) as ArrayRef), "t")
            .unwrap();
        let sliced: ArrayRef = Arc::new(list.slice(1, 2));
        let (part, _) = map.map_list(&sliced, "t").unwrap();
        assert_eq!(ids(&part), ids(&plain)[1..].to_vec());
        let mut view = ListBuilder::new(StringViewBuilder::new());
        for row in rows.iter().flatten() {
            for v in row {
                view.values().append_option(*v);
            }
            view.append(true);
        }
        let (viewed, _) = map
            .map_list(&(Arc::new(view.finish()) as ArrayRef), "t")
            .unwrap();
        assert_eq!(ids(&viewed), ids(&plain));
        let large: ArrayRef = Arc::new(LargeListArray::from(
            datafusion::arrow::compute::cast(
                &(Arc::new(list) as ArrayRef),
                &DataType::LargeList(Arc::new(Field::new_list_field(DataType::LargeUtf8, true))),
            )
            .unwrap()
            .as_list::<i64>()
            .clone(),
        ));
        let (large_ids, _) = map.map_list(&large, "t").unwrap();
        let large_ids: Vec<_> = large_ids
            .as_list::<i64>()
            .iter()
            .map(|r| r.map(|r| r.as_primitive::<UInt32Type>().iter().collect::<Vec<_>>()))
            .collect();
        assert_eq!(large_ids, ids(&plain));
        assert_eq!(map.len(), 4);
    }

    /// Threads filling one map give each string one id.
    #[test]
    fn threads_filling_one_map_agree() {
        let map = StringIds::new(8);
        let words: Vec<String> = (0..2_000).map(|i| format!("w{}", i % 700)).collect();
        let results: Vec<Vec<Option<Vec<Option<u32>>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let (map, words) = (&map, &words);
                    s.spawn(move || {
                        let rows: Vec<Option<Vec<Option<&str>>>> = words
                            .chunks(7)
                            .skip(t)
                            .step_by(2)
                            .map(|c| Some(c.iter().map(|w| Some(w.as_str())).collect()))
                            .collect();
                        let list: ArrayRef = Arc::new(strings(&rows));
                        ids(&map.map_list(&list, "t").unwrap().0)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(map.len(), 700);
        let mut seen: HashMap<String, u32> = HashMap::default();
        for (t, rows) in results.iter().enumerate() {
            let chunks: Vec<&[String]> = words.chunks(7).skip(t).step_by(2).collect();
            for (row, chunk) in rows.iter().zip(chunks) {
                for (id, w) in row.as_ref().unwrap().iter().zip(chunk) {
                    let id = id.unwrap();
                    assert_eq!(*seen.entry(w.clone()).or_insert(id), id, "{w}");
                }
            }
        }
        let mut distinct: Vec<u32> = seen.values().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 700, "different strings, different ids");
    }
}
