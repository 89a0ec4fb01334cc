//! `list_intersect_agg(list)`: the intersection of every list of a group — a search engine's
//! conjunctive query over a postings table (`WHERE term IN (...)`), evaluated shortest first.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, GenericListArray, OffsetSizeTrait, PrimitiveArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{Result, ScalarValue, internal_err, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Expr, GroupsAccumulator, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use crate::backend::cpu::{self, SetElem, Sortedness};
use crate::backend::gpu;
use crate::config::BackendChoice;
use crate::intersect::lists::IntLists;
use crate::intersect::lists::dispatch_integer;
use crate::placement::plan::{BackendMetrics, BackendPlan, PlanSlot, holder};

mod groups;

/// The `list_intersect_agg` UDAF singleton.
pub fn list_intersect_agg_udaf() -> Arc<AggregateUDF> {
    static UDAF: LazyLock<Arc<AggregateUDF>> =
        LazyLock::new(|| Arc::new(AggregateUDF::new_from_impl(ListIntersectAgg::new())));
    Arc::clone(&UDAF)
}

/// `list_intersect_agg(list)` as an [`Expr`].
pub fn list_intersect_agg(list: Expr) -> Expr {
    list_intersect_agg_udaf().call(vec![list])
}

#[user_doc(
    doc_section(label = "General Functions"),
    description = "Aggregate: the values present in every non-NULL list of the group, distinct and ascending (set semantics, so the result does not depend on row order or partitioning). NULL lists are skipped; a group with no non-NULL list gives NULL. NULL elements compare equal: the result ends with one NULL when every list holds a NULL. Lists are intersected shortest first with the SIMD kernels; each list's sortedness is checked, unsorted lists are sorted first. Integer lists (List, LargeList, FixedSizeList) only; the result is List (LargeList for LargeList input).",
    syntax_example = "list_intersect_agg(list)",
    sql_example = r#"```sql
> select list_intersect_agg(doc_ids) from postings where term in ('gpu', 'set');
+-----------------------------------------+
| list_intersect_agg(postings.doc_ids)    |
+-----------------------------------------+
| [3, 17, 42]                             |
+-----------------------------------------+
```"#,
    argument(name = "list", description = "Integer list column.")
)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ListIntersectAgg {
    signature: Signature,
    plan: PlanSlot,
}

impl Default for ListIntersectAgg {
    fn default() -> Self {
        Self::new()
    }
}

impl ListIntersectAgg {
    /// A new instance (prefer [`list_intersect_agg_udaf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            plan: PlanSlot::default(),
        }
    }

    /// This aggregate bound to a planning-time backend choice (`optimizer::backend_rule`):
    /// with `Gpu`, a `GROUP BY`'s groups are folded on the device, all groups together
    /// (`gpu::fold_groups`); the call counts its folds for `EXPLAIN ANALYZE`.
    pub fn with_plan(plan: Arc<BackendPlan>) -> Self {
        Self {
            plan: PlanSlot(Some(plan)),
            ..Self::new()
        }
    }

    /// The planning-time choice, if any.
    pub fn plan(&self) -> Option<&Arc<BackendPlan>> {
        self.plan.0.as_ref()
    }
}

impl AggregateUDFImpl for ListIntersectAgg {
    fn name(&self) -> &str {
        "list_intersect_agg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [arg] = arg_types else {
            return plan_err!(
                "list_intersect_agg expects 1 argument, got {}",
                arg_types.len()
            );
        };
        let (field, large) = match arg {
            DataType::List(f) | DataType::FixedSizeList(f, _) => (f, false),
            DataType::LargeList(f) => (f, true),
            other => {
                return plan_err!(
                    "list_intersect_agg: argument 1 must be a list of integers, got {other}"
                );
            }
        };
        if !field.data_type().is_integer() {
            return plan_err!(
                "list_intersect_agg: argument 1 must be a list of integers, got a list of {}",
                field.data_type()
            );
        }
        Ok(vec![if large {
            arg.clone()
        } else {
            DataType::List(Arc::clone(field))
        }])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::List(f)] | [DataType::FixedSizeList(f, _)] => {
                Ok(DataType::new_list(f.data_type().clone(), true))
            }
            [DataType::LargeList(f)] => Ok(DataType::new_large_list(f.data_type().clone(), true)),
            other => internal_err!("list_intersect_agg: unexpected argument types {other:?}"),
        }
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}[intersection]", args.name),
            args.return_field.data_type().clone(),
            true,
        ))])
    }

    fn accumulator(&self, acc_args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let ret = acc_args.return_field.data_type().clone();
        let (element, large) = match &ret {
            DataType::List(f) => (f.data_type().clone(), false),
            DataType::LargeList(f) => (f.data_type().clone(), true),
            other => return internal_err!("list_intersect_agg: unexpected return type {other}"),
        };
        dispatch_integer!(&element, P => Ok(Box::new(IntersectAccumulator::<P>::new(ret, large, self.plan.0.clone()))),
            _ => internal_err!("list_intersect_agg: {element} is not an integer type"))
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        let ret = args.return_field.data_type();
        let element = match ret {
            DataType::List(f) | DataType::LargeList(f) => f.data_type(),
            other => return internal_err!("list_intersect_agg: unexpected return type {other}"),
        };
        dispatch_integer!(element, P => Ok(Box::new(groups::IntersectGroups::<P>::new(ret, self.plan.0.clone())?)),
            _ => internal_err!("list_intersect_agg: {element} is not an integer type"))
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}

/// Lists held back before they are folded into the running result, so that a group's lists
/// are intersected shortest first. Rows are referenced (the input array is shared), not copied.
/// A fold runs inside one `update_batch`, where a cancel cannot land: 2^20 values keep it to
/// tens of milliseconds in a test build (2^22 took ~0.5 s there, ~1.6 s on the GPU path).
const FLUSH_VALUES: usize = 1 << 20;

/// Row `row` of `view` as a set: its non-NULL values strictly increasing, borrowed from the
/// Arrow buffer when the row already is (checked, never assumed), otherwise sorted and
/// deduplicated into `buf`. `has_null`: whether the row holds a NULL element.
fn row_as_set<'a, O: OffsetSizeTrait, T: SetElem>(
    view: &IntLists<'a, O, T>,
    row: usize,
    has_null: bool,
    buf: &'a mut Vec<T>,
) -> &'a [T] {
    if let Some(values) = strict_row(view, row, has_null) {
        return values;
    }
    buf.clear();
    append_as_set(view, row, buf);
    buf
}

/// Row `row` as it is in the Arrow buffer, when it is a set already: no NULL element
/// (`has_null`) and strictly increasing (checked).
fn strict_row<'a, O: OffsetSizeTrait, T: SetElem>(
    view: &IntLists<'a, O, T>,
    row: usize,
    has_null: bool,
) -> Option<&'a [T]> {
    let values = view.row(row);
    (!has_null && cpu::sortedness(values) == Sortedness::Strict).then_some(values)
}

/// Appends row `row`'s non-NULL values to `out`, sorted and deduplicated.
fn append_as_set<O: OffsetSizeTrait, T: SetElem>(
    view: &IntLists<'_, O, T>,
    row: usize,
    out: &mut Vec<T>,
) {
    let at = out.len();
    out.extend(view.row_options(row).flatten());
    out[at..].sort_unstable();
    let mut kept = at;
    for i in at..out.len() {
        if kept == at || out[i] != out[kept - 1] {
            out[kept] = out[i];
            kept += 1;
        }
    }
    out.truncate(kept);
}

/// The device's fold of many groups ([`gpu::fold_groups`]; tests pass an emulation).
type FoldFn<T> = fn(
    &[std::ops::Range<usize>],
    &[&[T]],
    &mut dyn FnMut(usize) -> bool,
) -> std::result::Result<gpu::FoldOutput<T>, gpu::GpuError>;

/// Groups' sets folded on the GPU when `plan` chose it (see [`gpu::fold_groups`] for the
/// layout), the call's counters updated; `None` when the CPU must fold them (not chosen, an
/// element width the kernels do not take, the query's memory pool refused the fold's host
/// memory, or the device failed: the reason goes to the debug log).
fn fold_on_gpu<T: SetElem>(
    plan: Option<&Arc<BackendPlan>>,
    groups: &[std::ops::Range<usize>],
    sets: &[&[T]],
    fold: FoldFn<T>,
) -> Option<gpu::FoldOutput<T>> {
    let plan = plan.filter(|p| p.backend == BackendChoice::Gpu)?;
    if !matches!(T::BITS, 32 | 64) {
        return None;
    }
    // The fold's host memory (operands, staging, results) reserved in the query's pool.
    let reservation = plan.reservation();
    match fold(groups, sets, &mut holder(&reservation)) {
        Ok(out) => {
            plan.metrics.record_gpu(
                sets.len() as u64,
                out.calls as u64,
                out.redone,
                &out.timings,
            );
            Some(out)
        }
        Err(e) => {
            log::debug!("datafusion-sets: list_intersect_agg folds on the CPU: {e}");
            None
        }
    }
}

/// Counts a fold of `lists` lists done on the CPU into `plan`'s counters.
fn record_cpu_fold(plan: Option<&Arc<BackendPlan>>, lists: usize, started: std::time::Instant) {
    if let Some(p) = plan {
        BackendMetrics::add(&p.metrics.rows, lists as u64);
        BackendMetrics::add(&p.metrics.cpu_batches, 1);
        BackendMetrics::add(&p.metrics.cpu_ns, started.elapsed().as_nanos() as u64);
    }
}

/// Accumulates the intersection of a group's lists.
struct IntersectAccumulator<P: ArrowPrimitiveType>
where
    P::Native: SetElem,
{
    return_type: DataType,
    large: bool,
    /// Running intersection, strictly increasing; `None` until a non-NULL list arrives.
    result: Option<Vec<P::Native>>,
    /// Whether every list so far held a NULL element.
    null_in_all: bool,
    /// Rows not yet folded in: (list array, row, length).
    pending: Vec<(ArrayRef, usize, usize)>,
    pending_values: usize,
    /// Memory of the arrays `pending` keeps alive.
    held_bytes: usize,
    tmp: Vec<P::Native>,
    row_buf: Vec<P::Native>,
    /// The planning-time choice (counters only: one group folds on the CPU).
    plan: Option<Arc<BackendPlan>>,
}

impl<P: ArrowPrimitiveType> IntersectAccumulator<P>
where
    P::Native: SetElem,
{
    fn new(return_type: DataType, large: bool, plan: Option<Arc<BackendPlan>>) -> Self {
        Self {
            plan,
            return_type,
            large,
            result: None,
            null_in_all: true,
            pending: Vec::new(),
            pending_values: 0,
            held_bytes: 0,
            tmp: Vec::new(),
            row_buf: Vec::new(),
        }
    }

    fn add_lists(&mut self, array: &ArrayRef) -> Result<()> {
        if self.large {
            self.hold::<i64>(array)
        } else {
            self.hold::<i32>(array)
        }
    }

    fn hold<O: OffsetSizeTrait>(&mut self, array: &ArrayRef) -> Result<()> {
        let Some(list) = array.as_list_opt::<O>() else {
            return internal_err!(
                "list_intersect_agg: unexpected input type {}",
                array.data_type()
            );
        };
        // An empty result with no NULL in every list is final: no list can change it.
        if !self.null_in_all && matches!(&self.result, Some(r) if r.is_empty()) {
            return Ok(());
        }
        let mut added = false;
        let offsets = list.value_offsets();
        for i in 0..list.len() {
            if list.is_null(i) {
                continue;
            }
            let len = (offsets[i + 1] - offsets[i]).as_usize();
            self.pending.push((Arc::clone(array), i, len));
            self.pending_values += len;
            added = true;
        }
        if added {
            self.held_bytes += array.get_array_memory_size();
        }
        // Rows count too: 20 million empty lists hold no value but 20 million entries.
        if self.pending_values + self.pending.len() >= FLUSH_VALUES {
            self.flush()?;
        }
        Ok(())
    }

    /// Fold the pending lists into the result, shortest first.
    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|(_, _, len)| *len);
        for (array, row, _) in &pending {
            if self.large {
                self.fold_row::<i64>(array, *row)?;
            } else {
                self.fold_row::<i32>(array, *row)?;
            }
        }
        record_cpu_fold(self.plan.as_ref(), pending.len(), started);
        pending.clear();
        self.pending = pending;
        self.pending_values = 0;
        self.held_bytes = 0;
        Ok(())
    }

    fn fold_row<O: OffsetSizeTrait>(&mut self, array: &ArrayRef, row: usize) -> Result<()> {
        let Some(list) = array.as_list_opt::<O>() else {
            return internal_err!(
                "list_intersect_agg: unexpected input type {}",
                array.data_type()
            );
        };
        let view = IntLists::<O, P::Native>::new::<P>(list);
        let has_null = view.row_has_null_element(row);
        self.null_in_all &= has_null;
        if matches!(&self.result, Some(r) if r.is_empty()) {
            return Ok(()); // nothing can come back; only the NULL flag still changes
        }
        let sorted = row_as_set(&view, row, has_null, &mut self.row_buf);
        match &mut self.result {
            None => self.result = Some(sorted.to_vec()),
            Some(cur) => {
                self.tmp.clear();
                cpu::intersect_auto(cur, sorted, &mut self.tmp);
                std::mem::swap(cur, &mut self.tmp);
            }
        }
        Ok(())
    }

    fn current_scalar(&mut self) -> Result<ScalarValue> {
        self.flush()?;
        let Some(result) = &self.result else {
            return ScalarValue::try_from(&self.return_type);
        };
        let mut values = result.clone();
        let nulls = if self.null_in_all {
            values.push(P::Native::default());
            let mut valid = vec![true; values.len()];
            valid[values.len() - 1] = false;
            Some(NullBuffer::from(valid))
        } else {
            None
        };
        let len = values.len();
        let element = Arc::new(PrimitiveArray::<P>::new(values.into(), nulls));
        let field = Arc::new(Field::new_list_field(P::DATA_TYPE, true));
        Ok(if self.large {
            let list = GenericListArray::<i64>::try_new(
                field,
                OffsetBuffer::from_lengths([len]),
                element,
                None,
            )?;
            ScalarValue::LargeList(Arc::new(list))
        } else {
            let list = GenericListArray::<i32>::try_new(
                field,
                OffsetBuffer::from_lengths([len]),
                element,
                None,
            )?;
            ScalarValue::List(Arc::new(list))
        })
    }
}

impl<P: ArrowPrimitiveType> std::fmt::Debug for IntersectAccumulator<P>
where
    P::Native: SetElem,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntersectAccumulator")
            .field("return_type", &self.return_type)
            .field("result_len", &self.result.as_ref().map(Vec::len))
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<P: ArrowPrimitiveType> Accumulator for IntersectAccumulator<P>
where
    P::Native: SetElem,
{
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        match values {
            [lists] => self.add_lists(lists),
            _ => internal_err!(
                "list_intersect_agg expects one input column, got {}",
                values.len()
            ),
        }
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        // A partial state is the intersection so far (NULL: nothing seen), a list like any
        // input list, so merging is folding it in.
        self.update_batch(states)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.current_scalar()?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.current_scalar()
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + self
                .result
                .as_ref()
                .map_or(0, |r| r.capacity() * size_of::<P::Native>())
            + (self.tmp.capacity() + self.row_buf.capacity()) * size_of::<P::Native>()
            + self.pending.capacity() * size_of::<(ArrayRef, usize, usize)>()
            + self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::ListArray;
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    /// Empty lists hold no value but one entry each: what is held stays bounded by rows too,
    /// and once the answer is `[]` (with no NULL in every list) later lists are not held.
    #[test]
    fn empty_lists_are_held_in_bounded_number() {
        let ret = DataType::new_list(DataType::Int32, true);
        let mut acc = IntersectAccumulator::<Int32Type>::new(ret.clone(), false, None);
        let empties: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..10_000).map(|_| Some(Vec::<Option<i32>>::new())),
        ));
        let mut peak = 0;
        for _ in 0..3 * FLUSH_VALUES / 10_000 {
            acc.update_batch(&[Arc::clone(&empties)]).unwrap();
            peak = peak.max(acc.pending.len());
        }
        assert!(peak <= FLUSH_VALUES, "held {peak} rows");
        let ScalarValue::List(out) = acc.evaluate().unwrap() else {
            panic!("a list")
        };
        assert_eq!(out.value(0).len(), 0);
        assert!(!out.is_null(0));

        // After an empty list, nothing more is held; with a NULL in every list it still is
        // (the NULL element can stay in the answer).
        let mut acc = IntersectAccumulator::<Int32Type>::new(ret.clone(), false, None);
        let one: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>([Some(
            vec![Some(1)],
        )]));
        acc.update_batch(&[Arc::clone(&empties)]).unwrap();
        acc.flush().unwrap();
        acc.update_batch(&[Arc::clone(&one)]).unwrap();
        assert!(acc.pending.is_empty());
        let mut acc = IntersectAccumulator::<Int32Type>::new(ret, false, None);
        let null_only: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>([Some(
                vec![None],
            )]));
        acc.update_batch(&[Arc::clone(&null_only)]).unwrap();
        acc.flush().unwrap();
        acc.update_batch(&[Arc::clone(&null_only)]).unwrap();
        assert_eq!(acc.pending.len(), 1);
        let ScalarValue::List(out) = acc.evaluate().unwrap() else {
            panic!("a list")
        };
        assert_eq!(out.value(0).len(), 1, "[NULL]");
    }
}
