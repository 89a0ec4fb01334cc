//! `cosine(a, b)`: the set cosine similarity `|a ∩ b| / sqrt(|a| · |b|)`, on integer lists treated as sets.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::set_similarity::{self, Measure};

/// The `cosine` UDF singleton.
pub fn cosine_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(Cosine::new())));
    Arc::clone(&UDF)
}

/// `cosine(a, b)` as an [`Expr`].
pub fn cosine(a: Expr, b: Expr) -> Expr {
    cosine_udf().call(vec![a, b])
}

#[user_doc(
    doc_section(label = "Array Functions"),
    description = r#"Returns the set cosine similarity (Ochiai coefficient) of two sets, `|a ∩ b| / sqrt(|a| * |b|)`, as Float64 in [0, 1]. Not to be confused with DataFusion's `cosine_distance` on numeric vectors.

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0.0. Elements must be integers (any width); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'cosine', t)` returns exactly the pairs with `cosine(a, b) >= t`."#,
    syntax_example = "cosine(list1, list2)",
    sql_example = r#"```sql
> select cosine([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| cosine(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
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
pub struct Cosine {
    signature: Signature,
}

impl Default for Cosine {
    fn default() -> Self {
        Self::new()
    }
}

impl Cosine {
    /// A new instance (prefer [`cosine_udf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Cosine {
    fn name(&self) -> &str {
        "cosine"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        set_similarity::coerce_pair(self.name(), arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(Measure::Cosine.return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        set_similarity::invoke(Measure::Cosine, args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}
