//! Plumbing shared by the SQL scalar functions: scalar/array wrapping.

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::concat;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;

/// The most list values a constant list argument is expanded to at once: a constant of L
/// values over R rows is run in chunks of `BROADCAST_VALUES / L` rows, so a large constant
/// (`list_intersect_count(x, (SELECT range(20000)))` over 100,000 rows: 2·10^9 values) never
/// becomes one copy per row in memory.
const BROADCAST_VALUES: usize = 1 << 20;

/// Values in a constant list (0 for anything else).
fn scalar_list_values(s: &ScalarValue) -> usize {
    match s {
        ScalarValue::List(a) => a.values().len(),
        ScalarValue::LargeList(a) => a.values().len(),
        ScalarValue::FixedSizeList(a) => a.values().len(),
        _ => 0,
    }
}

/// Run an array kernel over `ColumnarValue`s: scalars are expanded to the batch length (in
/// row chunks when a constant list is large, see [`BROADCAST_VALUES`]), and a call whose
/// arguments are all scalars returns a scalar (as DataFusion's array functions do). The
/// kernel works row by row, so chunking never changes an answer.
pub fn apply_to_columns(
    args: &[ColumnarValue],
    inner: impl Fn(&[ArrayRef]) -> Result<ArrayRef>,
) -> Result<ColumnarValue> {
    let all_scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let rows = args.iter().find_map(|a| match a {
        ColumnarValue::Array(a) => Some(a.len()),
        ColumnarValue::Scalar(_) => None,
    });
    let widest = args
        .iter()
        .map(|a| match a {
            ColumnarValue::Scalar(s) => scalar_list_values(s),
            ColumnarValue::Array(_) => 0,
        })
        .max()
        .unwrap_or(0);
    if let Some(rows) = rows
        && widest > 0
        && rows.saturating_mul(widest) > BROADCAST_VALUES
    {
        let chunk = (BROADCAST_VALUES / widest).max(1);
        let mut parts = Vec::with_capacity(rows.div_ceil(chunk));
        for start in (0..rows).step_by(chunk) {
            let len = chunk.min(rows - start);
            let arrays = args
                .iter()
                .map(|a| match a {
                    ColumnarValue::Array(a) => Ok(a.slice(start, len)),
                    ColumnarValue::Scalar(s) => s.to_array_of_size(len),
                })
                .collect::<Result<Vec<_>>>()?;
            parts.push(inner(&arrays)?);
        }
        let parts: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
        return Ok(ColumnarValue::Array(concat(&parts)?));
    }
    let arrays = ColumnarValue::values_to_arrays(args)?;
    let result = inner(&arrays)?;
    if all_scalar {
        Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
            &result, 0,
        )?))
    } else {
        Ok(ColumnarValue::Array(result))
    }
}

/// An argument meant to be a constant, as one value: a scalar, or an array whose rows all
/// hold the same value (behind datafusion-ffi, as in datafusion-python, every argument
/// arrives as an array: the host expands literals to the batch's rows; natively, a column of
/// equal options). An array of several values stays an array, which the caller refuses; an
/// empty one (no rows) is NULL.
pub fn one_value(arg: &ColumnarValue) -> Result<ColumnarValue> {
    let ColumnarValue::Array(a) = arg else {
        return Ok(arg.clone());
    };
    if a.is_empty() {
        // No rows: nothing to compute, and no value to check.
        return Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)));
    }
    let first = ScalarValue::try_from_array(a, 0)?;
    for i in 1..a.len() {
        if ScalarValue::try_from_array(a, i)? != first {
            return Ok(arg.clone());
        }
    }
    Ok(ColumnarValue::Scalar(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array, ListArray};
    use datafusion::arrow::datatypes::Int64Type;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A large constant list is expanded a chunk at a time, and the answer is the one of a
    /// full expansion.
    #[test]
    fn large_constant_lists_run_in_row_chunks_with_the_same_answer() {
        let rows = 3_000;
        let column: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
            (0..rows as i64).map(|i| Some(vec![Some(i), Some(i + 1)])),
        ));
        let constant =
            ScalarValue::List(Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
                [Some((0..2_000).map(Some).collect::<Vec<_>>())],
            )));
        let widest_seen = AtomicUsize::new(0);
        let calls = AtomicUsize::new(0);
        // Per row: how many of the row's values are in the constant.
        let kernel = |arrays: &[ArrayRef]| -> Result<ArrayRef> {
            calls.fetch_add(1, Ordering::Relaxed);
            let (a, b) = (arrays[0].as_list::<i32>(), arrays[1].as_list::<i32>());
            widest_seen.fetch_max(b.values().len(), Ordering::Relaxed);
            Ok(Arc::new(Int64Array::from_iter_values((0..a.len()).map(
                |r| {
                    let (x, y) = (a.value(r), b.value(r));
                    let y = y.as_primitive::<Int64Type>();
                    x.as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .filter(|v| y.values().contains(v))
                        .count() as i64
                },
            ))))
        };
        let args = [
            ColumnarValue::Array(Arc::clone(&column)),
            ColumnarValue::Scalar(constant.clone()),
        ];
        let ColumnarValue::Array(got) = apply_to_columns(&args, kernel).unwrap() else {
            panic!("an array argument gives an array")
        };
        assert!(calls.load(Ordering::Relaxed) > 1, "run in chunks");
        assert!(widest_seen.load(Ordering::Relaxed) <= BROADCAST_VALUES);
        let full = [column, constant.to_array_of_size(rows).unwrap()];
        assert_eq!(got.as_ref(), kernel(&full).unwrap().as_ref());
        let got = got.as_primitive::<Int64Type>();
        assert_eq!(got.value(0), 2);
        assert_eq!(got.value(1_999), 1);
        assert_eq!(got.value(2_500), 0);
    }
}
