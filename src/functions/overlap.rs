//! `overlap(a, b)`: the overlap `|a ∩ b|`, on integer lists treated as sets.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::set_similarity::{self, Measure};

/// The `overlap` UDF singleton.
pub fn overlap_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(Overlap::new())));
    Arc::clone(&UDF)
}

/// `overlap(a, b)` as an [`Expr`].
pub fn overlap(a: Expr, b: Expr) -> Expr {
    overlap_udf().call(vec![a, b])
}

#[user_doc(
    doc_section(label = "Array Functions"),
    description = r#"Returns the overlap of two sets, the number of distinct common elements `|a ∩ b|`, as UInt64. Unlike `list_intersect_count`, NULL elements are ignored rather than matched with each other.

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0. Elements must be integers (any width); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'overlap', t)` returns exactly the pairs with `overlap(a, b) >= t`."#,
    syntax_example = "overlap(list1, list2)",
    sql_example = r#"```sql
> select overlap([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| overlap(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 4                                                                                |
+----------------------------------------------------------------------------------------+
```"#,
    argument(
        name = "list1",
        description = "List of integers (List, LargeList or FixedSizeList)."
    ),
    argument(
        name = "list2",
        description = "List of integers; its element type is unified with list1's."
    )
)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Overlap {
    signature: Signature,
}

impl Default for Overlap {
    fn default() -> Self {
        Self::new()
    }
}

impl Overlap {
    /// A new instance (prefer [`overlap_udf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Overlap {
    fn name(&self) -> &str {
        "overlap"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        set_similarity::coerce_pair(self.name(), arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(Measure::Overlap.return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        set_similarity::invoke(Measure::Overlap, args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}
