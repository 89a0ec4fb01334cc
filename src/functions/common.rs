//! Plumbing shared by the SQL scalar functions: scalar/array wrapping.

use datafusion::arrow::array::ArrayRef;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;

/// Run an array kernel over `ColumnarValue`s: scalars are expanded to the batch length, and a
/// call whose arguments are all scalars returns a scalar (as DataFusion's array functions do).
pub fn apply_to_columns(
    args: &[ColumnarValue],
    inner: impl FnOnce(&[ArrayRef]) -> Result<ArrayRef>,
) -> Result<ColumnarValue> {
    let all_scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
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
