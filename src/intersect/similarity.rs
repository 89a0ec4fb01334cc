//! The engine shared by `jaccard`, `cosine`, `dice` and `overlap`: the [`Measure`]s, their
//! one scoring formula (also used by the similarity join, so the join and the functions can
//! never disagree), argument coercion, and the per-row kernel over Arrow buffers.
//!
//! Semantics, for every measure:
//! - the lists are **sets**: duplicates are ignored and order does not matter;
//! - a NULL list gives NULL; NULL *elements* are ignored (a NULL is not a member of the set);
//! - a measure whose denominator would be 0 (an empty set is involved) is 0.0, so
//!   `jaccard([], []) = 0.0`, `cosine([], [1]) = 0.0` and `overlap([], []) = 0`: empty sets
//!   are similar to nothing, which is also what a join with a threshold `t > 0` finds.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, Float64Array, GenericListArray, OffsetSizeTrait,
    UInt64Array, new_null_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, internal_err, plan_err};
use rayon::prelude::*;

use super::lists::{IntLists, coerce_list_args, list_element_type};
use super::rows::EngineOptions;
use super::strings::{StringIds, is_string_list, is_string_type};
use crate::backend::cpu::CpuKernelChoice;
use crate::backend::cpu::{self, SetElem, Sortedness};
use crate::intersect::lists::dispatch_integer;

/// A set similarity measure of two sets `a`, `b` with `o = |a ∩ b|`, `n = |a|`, `m = |b|`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Measure {
    /// `o / (n + m - o)`.
    Jaccard,
    /// Set cosine, `o / sqrt(n * m)`.
    Cosine,
    /// `2o / (n + m)`.
    Dice,
    /// `o`, the size of the intersection.
    Overlap,
}

impl Measure {
    /// Every measure.
    pub const ALL: [Measure; 4] = [
        Measure::Jaccard,
        Measure::Cosine,
        Measure::Dice,
        Measure::Overlap,
    ];

    /// The SQL name.
    pub fn name(self) -> &'static str {
        match self {
            Measure::Jaccard => "jaccard",
            Measure::Cosine => "cosine",
            Measure::Dice => "dice",
            Measure::Overlap => "overlap",
        }
    }

    /// The measure called `name` (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<Measure> {
        Measure::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether the measure lies in `[0, 1]` (all but `overlap`).
    pub fn is_normalized(self) -> bool {
        !matches!(self, Measure::Overlap)
    }

    /// The SQL result type: `UInt64` for `overlap`, `Float64` otherwise.
    pub fn return_type(self) -> DataType {
        match self {
            Measure::Overlap => DataType::UInt64,
            _ => DataType::Float64,
        }
    }

    /// The score of two sets of sizes `n` and `m` sharing `o` elements (`o <= min(n, m)`),
    /// exactly as the SQL function returns it (`overlap` as `f64`). This is the only place the
    /// formulas are evaluated: the join's thresholds are derived from this very function.
    /// A zero denominator gives 0.0.
    #[inline]
    pub fn score(self, o: u64, n: u64, m: u64) -> f64 {
        match self {
            Measure::Jaccard => {
                let union = n + m - o;
                if union == 0 {
                    0.0
                } else {
                    o as f64 / union as f64
                }
            }
            Measure::Cosine => {
                if n == 0 || m == 0 {
                    0.0
                } else {
                    o as f64 / ((n as f64) * (m as f64)).sqrt()
                }
            }
            Measure::Dice => {
                let sum = n + m;
                if sum == 0 {
                    0.0
                } else {
                    (2 * o) as f64 / sum as f64
                }
            }
            Measure::Overlap => o as f64,
        }
    }
}

/// Coercion for `name(a, b)`: exactly two lists, unified as `list_intersect` does, whose
/// elements must be integers or strings (`Utf8`, `LargeUtf8`, `Utf8View`), or NULL.
pub fn coerce_pair(name: &str, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    if arg_types.len() != 2 {
        return plan_err!(
            "{name} expects exactly 2 list arguments, got {}",
            arg_types.len()
        );
    }
    // DataFusion would unify strings with integers by casting the strings (and fail on the
    // first one that is no number): refuse the mix by name instead.
    let kinds: Vec<bool> = arg_types
        .iter()
        .filter_map(|t| match t {
            DataType::ListView(f) | DataType::LargeListView(f) => Some(f.data_type()),
            t => list_element_type(t),
        })
        .filter(|e| !e.is_null())
        .map(is_string_type)
        .collect();
    if kinds.contains(&true) && kinds.contains(&false) {
        return plan_err!(
            "{name}: strings and integers are not comparable ({} and {}); cast one of them",
            arg_types[0],
            arg_types[1]
        );
    }
    let coerced = coerce_list_args(name, arg_types, 2)?;
    if let Some(element) = coerced.iter().find_map(list_element_type)
        && !(element.is_integer() || element.is_null() || is_string_type(element))
    {
        let integer_list = |t: &DataType| match t {
            DataType::ListView(f) | DataType::LargeListView(f) => f.data_type().is_integer(),
            t => list_element_type(t).is_some_and(|e| e.is_integer()),
        };
        if arg_types.iter().all(integer_list) {
            // Only a signed type with UInt64 lands here: DataFusion unifies them as a decimal.
            return plan_err!(
                "{name}: no integer type holds the elements of both arguments ({} and {}); \
                 cast one of them, e.g. arrow_cast(x, 'List(Int64)')",
                arg_types[0],
                arg_types[1]
            );
        }
        return plan_err!("{name}: list elements must be integers or strings, got {element}");
    }
    Ok(coerced)
}
pub(crate) fn similarity_arrays(
    measure: Measure,
    arrays: &[ArrayRef],
    opts: &EngineOptions,
) -> Result<ArrayRef> {
    let [a, b] = arrays else {
        return internal_err!(
            "{}: expected 2 arguments, got {}",
            measure.name(),
            arrays.len()
        );
    };
    if a.data_type().is_null() || b.data_type().is_null() {
        return Ok(new_null_array(&measure.return_type(), a.len()));
    }
    if is_string_list(a.data_type()) {
        // Equal strings, equal ids: the measure of the id lists is the strings'.
        let ids = StringIds::new(1);
        let (a, _) = ids.map_list(a, measure.name())?;
        let (b, _) = ids.map_list(b, measure.name())?;
        return similarity_arrays(measure, &[a, b], opts);
    }
    let triples = match (a.data_type(), b.data_type()) {
        (DataType::List(_), DataType::List(_)) => triples_generic::<i32>(measure, a, b, opts)?,
        (DataType::LargeList(_), DataType::LargeList(_)) => {
            triples_generic::<i64>(measure, a, b, opts)?
        }
        (x, y) => return internal_err!("{}: unexpected argument types {x}, {y}", measure.name()),
    };
    let (triples, nulls) = triples;
    Ok(match measure {
        Measure::Overlap => Arc::new(UInt64Array::new(
            triples.iter().map(|t| t[0]).collect(),
            nulls,
        )),
        _ => Arc::new(Float64Array::new(
            triples
                .iter()
                .map(|&[o, n, m]| measure.score(o, n, m))
                .collect(),
            nulls,
        )),
    })
}

/// `[|a ∩ b|, |a|, |b|]` of every row (as sets), and the result validity.
type Triples = (Vec<[u64; 3]>, Option<NullBuffer>);

fn triples_generic<O: OffsetSizeTrait>(
    measure: Measure,
    a: &ArrayRef,
    b: &ArrayRef,
    opts: &EngineOptions,
) -> Result<Triples> {
    let (a, b) = (a.as_list::<O>(), b.as_list::<O>());
    let element = a.value_type();
    if b.value_type() != element {
        return internal_err!(
            "{}: element types differ after coercion: {element}, {}",
            measure.name(),
            b.value_type()
        );
    }
    let nulls = NullBuffer::union(a.nulls(), b.nulls());
    if element.is_null() {
        // Every element is NULL, so every set is empty.
        return Ok((vec![[0, 0, 0]; a.len()], nulls));
    }
    let triples = dispatch_integer!(&element, P => row_triples::<O, P>(a, b, opts),
        _ => return internal_err!("{}: {element} is not an integer type", measure.name()));
    Ok((triples, nulls))
}

fn row_triples<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
    a: &GenericListArray<O>,
    b: &GenericListArray<O>,
    opts: &EngineOptions,
) -> Vec<[u64; 3]>
where
    P::Native: SetElem,
{
    let (va, vb) = (IntLists::new::<P>(a), IntLists::new::<P>(b));
    let row = |i: usize, bufs: &mut (Vec<P::Native>, Vec<P::Native>)| -> [u64; 3] {
        if va.is_null(i) || vb.is_null(i) {
            return [0, 0, 0];
        }
        let sa = set_of(&va, i, &mut bufs.0);
        let sb = set_of(&vb, i, &mut bufs.1);
        let o = if sa.is_empty() || sb.is_empty() {
            0
        } else {
            match opts.kernel {
                CpuKernelChoice::Auto => cpu::intersect_count_auto(sa, sb),
                CpuKernelChoice::Fixed(k) => cpu::intersect_count(k, sa, sb),
            }
        };
        [o as u64, sa.len() as u64, sb.len() as u64]
    };
    let total = va.total_values() + vb.total_values();
    let parallel = opts.parallel_min_values > 0
        && total >= opts.parallel_min_values
        && rayon::current_num_threads() > 1;
    if parallel {
        (0..va.len())
            .into_par_iter()
            .with_min_len(256)
            .map_init(Default::default, |b, i| row(i, b))
            .collect()
    } else {
        let mut bufs = Default::default();
        (0..va.len()).map(|i| row(i, &mut bufs)).collect()
    }
}

/// Row `i` as a strictly increasing slice: the row itself when it already is one (the fast
/// path, no copy), else a sorted, deduplicated copy without NULL elements in `buf`.
pub(crate) fn set_of<'r, O: OffsetSizeTrait, T: SetElem>(
    lists: &IntLists<'r, O, T>,
    i: usize,
    buf: &'r mut Vec<T>,
) -> &'r [T] {
    let row = lists.row(i);
    let has_null = lists.row_has_null_element(i);
    if !has_null && cpu::sortedness(row) == Sortedness::Strict {
        return row;
    }
    buf.clear();
    if has_null {
        buf.extend(lists.row_options(i).flatten());
    } else {
        buf.extend_from_slice(row);
    }
    buf.sort_unstable();
    buf.dedup();
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores() {
        assert_eq!(Measure::Jaccard.score(4, 5, 4), 0.8);
        assert_eq!(Measure::Jaccard.score(0, 0, 0), 0.0);
        assert_eq!(Measure::Cosine.score(3, 3, 3), 1.0);
        assert_eq!(Measure::Cosine.score(0, 0, 3), 0.0);
        assert_eq!(Measure::Dice.score(2, 2, 3), 0.8);
        assert_eq!(Measure::Dice.score(0, 0, 0), 0.0);
        assert_eq!(Measure::Overlap.score(7, 9, 8), 7.0);
        // Identical sets score exactly 1 for every normalized measure.
        for n in 1..2000u64 {
            for m in [Measure::Jaccard, Measure::Cosine, Measure::Dice] {
                assert_eq!(m.score(n, n, n), 1.0, "{m:?} {n}");
            }
        }
    }

    #[test]
    fn names() {
        for m in Measure::ALL {
            assert_eq!(Measure::from_name(&m.name().to_uppercase()), Some(m));
        }
        assert_eq!(Measure::from_name("cosine_distance"), None);
    }
}
