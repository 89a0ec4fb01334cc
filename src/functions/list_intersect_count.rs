//! `list_intersect_count(a, b, ...)`: the cardinality of `list_intersect(a, b, ...)`, computed
//! without building the intersected list.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, GenericListArray, OffsetSizeTrait, UInt64Array,
    new_null_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, internal_err};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::common::apply_to_columns;
use super::list_intersect::{engine_options, list_intersect_udf};
use crate::backend::cpu::SetElem;
use crate::intersect::lists::dispatch_integer;
use crate::intersect::lists::{IntLists, coerce_list_args, first_list_type, list_element_type};
use crate::intersect::rows::{EngineOptions, intersect_counts};
use crate::placement::plan::{BackendPlan, PlanSlot};

/// The `list_intersect_count` UDF singleton.
pub fn list_intersect_count_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(ListIntersectCount::new())));
    Arc::clone(&UDF)
}

/// `list_intersect_count(a, b, ...)` as an [`Expr`].
pub fn list_intersect_count(args: Vec<Expr>) -> Expr {
    list_intersect_count_udf().call(args)
}

#[user_doc(
    doc_section(label = "Array Functions"),
    description = "Returns the number of elements of `list_intersect(list1, list2, ...)` (distinct common elements) as UInt64, without building the list. NULL if any list is NULL. Same argument rules and coercion as `list_intersect`.",
    syntax_example = "list_intersect_count(list1, list2[, ..., listN])",
    sql_example = r#"```sql
> select list_intersect_count([1, 2, 3, 4], [2, 4, 6], [4, 2]);
+----------------------------------------------------------------------+
| list_intersect_count(make_array(Int64(1),Int64(2),Int64(3),Int64(4)),|
+----------------------------------------------------------------------+
| 2                                                                    |
+----------------------------------------------------------------------+
```"#,
    argument(
        name = "list1",
        description = "List expression (List, LargeList or FixedSizeList)."
    ),
    argument(name = "listN", description = "More list expressions.")
)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ListIntersectCount {
    signature: Signature,
    /// The backend the optimizer rule chose for this call (none: the session's option).
    plan: PlanSlot,
}

impl Default for ListIntersectCount {
    fn default() -> Self {
        Self::new()
    }
}

impl ListIntersectCount {
    /// A new instance (prefer [`list_intersect_count_udf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            plan: PlanSlot::default(),
        }
    }

    /// This function bound to a planning-time backend choice.
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

impl ScalarUDFImpl for ListIntersectCount {
    fn name(&self) -> &str {
        "list_intersect_count"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_list_args(self.name(), arg_types, 2)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        invoke(args, self.plan.0.as_ref())
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}

fn invoke(args: ScalarFunctionArgs, plan: Option<&Arc<BackendPlan>>) -> Result<ColumnarValue> {
    let arg_types: Vec<DataType> = args
        .arg_fields
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    let list_type = first_list_type(&arg_types);
    let element = list_element_type(&list_type)
        .cloned()
        .unwrap_or(DataType::Null);
    if !element.is_integer() {
        return count_via_list_intersect(args, list_type);
    }
    let opts = engine_options(&args.config_options, plan)?;
    apply_to_columns(&args.args, |arrays| count_arrays(arrays, &list_type, &opts))
}

/// Non-integer elements: the lengths of `list_intersect`'s result.
fn count_via_list_intersect(
    args: ScalarFunctionArgs,
    list_type: DataType,
) -> Result<ColumnarValue> {
    let udf = list_intersect_udf();
    let inner = ScalarFunctionArgs {
        return_field: Arc::new(datafusion::arrow::datatypes::Field::new(
            "list_intersect",
            list_type,
            true,
        )),
        ..args
    };
    let result = udf.invoke_with_args(inner)?;
    let as_scalar = matches!(result, ColumnarValue::Scalar(_));
    let array = result.into_array(1)?;
    let counts: ArrayRef = match array.data_type() {
        DataType::List(_) => Arc::new(lengths(array.as_list::<i32>())),
        DataType::LargeList(_) => Arc::new(lengths(array.as_list::<i64>())),
        _ => new_null_array(&DataType::UInt64, array.len()),
    };
    if as_scalar {
        Ok(ColumnarValue::Scalar(
            datafusion::common::ScalarValue::try_from_array(&counts, 0)?,
        ))
    } else {
        Ok(ColumnarValue::Array(counts))
    }
}

fn lengths<O: OffsetSizeTrait>(list: &GenericListArray<O>) -> UInt64Array {
    let offsets = list.value_offsets();
    let values: Vec<u64> = offsets
        .windows(2)
        .map(|w| (w[1] - w[0]).as_usize() as u64)
        .collect();
    UInt64Array::new(values.into(), list.nulls().cloned())
}

fn count_arrays(
    arrays: &[ArrayRef],
    list_type: &DataType,
    opts: &EngineOptions,
) -> Result<ArrayRef> {
    let len = arrays.first().map(|a| a.len()).unwrap_or(0);
    if arrays.iter().any(|a| a.data_type().is_null()) {
        return Ok(new_null_array(&DataType::UInt64, len));
    }
    match list_type {
        DataType::List(field) => count_generic::<i32>(arrays, field.data_type(), opts),
        DataType::LargeList(field) => count_generic::<i64>(arrays, field.data_type(), opts),
        other => internal_err!("list_intersect_count: unexpected argument type {other}"),
    }
}

fn count_generic<O: OffsetSizeTrait>(
    arrays: &[ArrayRef],
    element: &DataType,
    opts: &EngineOptions,
) -> Result<ArrayRef> {
    let mut lists = Vec::with_capacity(arrays.len());
    for (i, a) in arrays.iter().enumerate() {
        match a.as_list_opt::<O>() {
            Some(l) if l.value_type() == *element => lists.push(l),
            _ => {
                return internal_err!(
                    "list_intersect_count: argument {} is {}, expected a list of {element}",
                    i + 1,
                    a.data_type()
                );
            }
        }
    }
    dispatch_integer!(element, P => count_build::<O, P>(&lists, opts),
        _ => internal_err!("list_intersect_count: {element} is not an integer type"))
}

fn count_build<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
    lists: &[&GenericListArray<O>],
    opts: &EngineOptions,
) -> Result<ArrayRef>
where
    P::Native: SetElem,
{
    let views: Vec<IntLists<'_, O, P::Native>> =
        lists.iter().map(|l| IntLists::new::<P>(l)).collect();
    let counts = intersect_counts(&views, opts);
    let nulls = lists.iter().fold(None, |acc: Option<NullBuffer>, l| {
        NullBuffer::union(acc.as_ref(), l.nulls())
    });
    Ok(Arc::new(UInt64Array::new(counts.into(), nulls)))
}
