//! `list_intersect(a, b, ...)`: k-way intersection of list columns, a drop-in for DataFusion's
//! built-in (`list_intersect` is an alias of `array_intersect` there), fast on integer lists.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, GenericListArray, OffsetSizeTrait,
    PrimitiveArray, new_null_array,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{Result, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::common::apply_to_columns;
use crate::backend::cpu::SetElem;
use crate::config::SetsConfig;
use crate::intersect::lists::dispatch_integer;
use crate::intersect::lists::{IntLists, coerce_list_args, first_list_type, list_element_type};
use crate::intersect::rows::{EngineOptions, intersect_values};
use crate::placement::plan::{BackendPlan, PlanSlot};

/// The `list_intersect` UDF singleton.
pub fn list_intersect_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(ListIntersect::new())));
    Arc::clone(&UDF)
}

/// `list_intersect(a, b, ...)` as an [`Expr`].
pub fn list_intersect(args: Vec<Expr>) -> Expr {
    list_intersect_udf().call(args)
}

#[user_doc(
    doc_section(label = "Array Functions"),
    description = r#"Returns the elements common to every list argument (two or more), a drop-in for DataFusion's `array_intersect` that is fast on integer lists.

Semantics are the built-in's, folded left over the arguments: duplicates are removed; elements come in the order of their first occurrence in the longer list (the left one when lengths tie); a NULL list gives NULL; NULL elements compare equal to each other; `FixedSizeList` arguments become `List`, any `LargeList` makes the result `LargeList`, and element types are widened to a common type. For sorted integer lists (posting lists, id sets) this is the sorted set intersection, computed with SIMD merge or galloping kernels shortest list first; every row's sortedness is checked, never assumed. Non-integer elements use the built-in implementation."#,
    syntax_example = "list_intersect(list1, list2[, ..., listN])",
    sql_example = r#"```sql
> select list_intersect([1, 3, 5, 7, 9], [3, 4, 5, 9], [9, 5, 1]);
+-------------------------------------------------------------------------------+
| list_intersect(make_array(Int64(1),Int64(3),Int64(5),Int64(7),Int64(9)),...   |
+-------------------------------------------------------------------------------+
| [5, 9]                                                                        |
+-------------------------------------------------------------------------------+
```"#,
    argument(
        name = "list1",
        description = "List expression (List, LargeList or FixedSizeList)."
    ),
    argument(
        name = "listN",
        description = "More list expressions; their element types are unified with list1's."
    )
)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ListIntersect {
    signature: Signature,
    /// The backend the optimizer rule chose for this call (none: the session's option).
    plan: PlanSlot,
}

impl Default for ListIntersect {
    fn default() -> Self {
        Self::new()
    }
}

impl ListIntersect {
    /// A new instance (prefer [`list_intersect_udf`], a shared singleton).
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

impl ScalarUDFImpl for ListIntersect {
    fn name(&self) -> &str {
        "list_intersect"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_list_args(self.name(), arg_types, 2)
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(first_list_type(arg_types))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        invoke(args, self.plan.0.as_ref())
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}

fn invoke(args: ScalarFunctionArgs, plan: Option<&Arc<BackendPlan>>) -> Result<ColumnarValue> {
    let ret = args.return_type().clone();
    let element = list_element_type(&ret).cloned().unwrap_or(DataType::Null);
    if !element.is_integer() {
        return delegate_to_builtin(args);
    }
    let opts = engine_options(&args.config_options, plan)?;
    apply_to_columns(&args.args, |arrays| intersect_arrays(arrays, &ret, &opts))
}

/// The engine options in force for this call: the session's, with the backend of the
/// planning-time choice when the optimizer rule made one.
pub(crate) fn engine_options(
    config: &ConfigOptions,
    plan: Option<&Arc<BackendPlan>>,
) -> Result<EngineOptions> {
    let cfg = SetsConfig::from_options(config)?;
    Ok(EngineOptions {
        kernel: crate::config::cpu_kernel(config),
        parallel_min_values: cfg.parallel_min_values,
        backend: plan.map_or(cfg.backend, |p| p.backend),
        plan: plan.cloned(),
        gpu_columns: cfg.gpu_resident_columns.then_some(cfg.gpu_column_budget),
    })
}

/// Non-integer elements: the built-in `array_intersect`, folded left for k > 2 arguments.
fn delegate_to_builtin(args: ScalarFunctionArgs) -> Result<ColumnarValue> {
    let builtin = datafusion::functions_nested::set_ops::array_intersect_udf();
    let ScalarFunctionArgs {
        args: values,
        arg_fields,
        number_rows,
        return_field,
        config_options,
    } = args;
    let mut values = values.into_iter();
    let mut fields = arg_fields.into_iter();
    let (Some(mut acc), Some(mut acc_field)) = (values.next(), fields.next()) else {
        return internal_err!("list_intersect called with no arguments");
    };
    for (value, field) in values.zip(fields) {
        let step_return: FieldRef =
            if acc_field.data_type().is_null() && field.data_type().is_null() {
                Arc::new(Field::new(
                    "list_intersect",
                    DataType::new_list(DataType::Null, true),
                    true,
                ))
            } else if acc_field.data_type().is_null() {
                Arc::clone(&field)
            } else {
                Arc::clone(&acc_field)
            };
        acc = builtin.invoke_with_args(ScalarFunctionArgs {
            args: vec![acc, value],
            arg_fields: vec![acc_field, field],
            number_rows,
            return_field: Arc::clone(&step_return),
            config_options: Arc::clone(&config_options),
        })?;
        acc_field = step_return;
    }
    let _ = return_field;
    Ok(acc)
}

/// Integer lists (all arguments coerced to one type, or NULL).
pub(crate) fn intersect_arrays(
    arrays: &[ArrayRef],
    ret: &DataType,
    opts: &EngineOptions,
) -> Result<ArrayRef> {
    let len = arrays.first().map(|a| a.len()).unwrap_or(0);
    if arrays.iter().any(|a| a.data_type().is_null()) {
        return Ok(new_null_array(ret, len));
    }
    match ret {
        DataType::List(field) => intersect_generic::<i32>(arrays, field, opts),
        DataType::LargeList(field) => intersect_generic::<i64>(arrays, field, opts),
        other => internal_err!("list_intersect: unexpected return type {other}"),
    }
}

fn intersect_generic<O: OffsetSizeTrait>(
    arrays: &[ArrayRef],
    field: &FieldRef,
    opts: &EngineOptions,
) -> Result<ArrayRef> {
    let mut lists = Vec::with_capacity(arrays.len());
    for (i, a) in arrays.iter().enumerate() {
        let Some(list) = a.as_list_opt::<O>() else {
            return internal_err!(
                "list_intersect: argument {} is {}, expected {}",
                i + 1,
                a.data_type(),
                field.data_type()
            );
        };
        if list.value_type() != *field.data_type() {
            return internal_err!(
                "list_intersect: argument {} has elements of type {}, expected {}",
                i + 1,
                list.value_type(),
                field.data_type()
            );
        }
        lists.push(list);
    }
    dispatch_integer!(field.data_type(), P => build::<O, P>(&lists, field, opts),
        _ => internal_err!("list_intersect: {} is not an integer type", field.data_type()))
}

fn build<O: OffsetSizeTrait, P: ArrowPrimitiveType>(
    lists: &[&GenericListArray<O>],
    field: &FieldRef,
    opts: &EngineOptions,
) -> Result<ArrayRef>
where
    P::Native: SetElem,
{
    let views: Vec<IntLists<'_, O, P::Native>> =
        lists.iter().map(|l| IntLists::new::<P>(l)).collect();
    let out = intersect_values(&views, opts);
    let nulls = lists.iter().fold(None, |acc: Option<NullBuffer>, l| {
        NullBuffer::union(acc.as_ref(), l.nulls())
    });
    let buffer: ScalarBuffer<P::Native> = match out.shared {
        Some(b) => {
            let len = b.len() / std::mem::size_of::<P::Native>();
            ScalarBuffer::new(b, 0, len)
        }
        None => out.values.into(),
    };
    let values = PrimitiveArray::<P>::new(buffer, out.validity.map(NullBuffer::from))
        .with_data_type(field.data_type().clone());
    let offsets = OffsetBuffer::<O>::from_lengths(out.lengths);
    Ok(Arc::new(GenericListArray::<O>::try_new(
        Arc::clone(field),
        offsets,
        Arc::new(values),
        nulls,
    )?))
}
