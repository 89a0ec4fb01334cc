//! `dice(a, b)`: the Dice similarity `2|a ∩ b| / (|a| + |b|)`, on integer lists treated as sets.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::set_similarity::{self, Measure};

/// The `dice` UDF singleton.
pub fn dice_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(Dice::new())));
    Arc::clone(&UDF)
}

/// `dice(a, b)` as an [`Expr`].
pub fn dice(a: Expr, b: Expr) -> Expr {
    dice_udf().call(vec![a, b])
}

#[user_doc(
    doc_section(label = "Array Functions"),
    description = r#"Returns the Dice (Sørensen) similarity of two sets, `2 * |a ∩ b| / (|a| + |b|)`, as Float64 in [0, 1].

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0.0 (also for two empty sets). Elements must be integers (any width); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'dice', t)` returns exactly the pairs with `dice(a, b) >= t`."#,
    syntax_example = "dice(list1, list2)",
    sql_example = r#"```sql
> select dice([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| dice(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 0.8                                                                                |
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
pub struct Dice {
    signature: Signature,
}

impl Default for Dice {
    fn default() -> Self {
        Self::new()
    }
}

impl Dice {
    /// A new instance (prefer [`dice_udf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Dice {
    fn name(&self) -> &str {
        "dice"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        set_similarity::coerce_pair(self.name(), arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(Measure::Dice.return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        set_similarity::invoke(Measure::Dice, args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}
