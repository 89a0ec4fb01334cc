//! `jaccard`, `cosine`, `dice` and `overlap`: set similarity of two lists of integers or strings. The four
//! UDFs differ only in their [`Measure`]; one macro writes them, as DataFusion's `set_ops.rs`
//! writes its set functions. The measures' arithmetic and the per-row engine are in
//! [`crate::intersect::similarity`], shared with the similarity join so the two never disagree.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::common::apply_to_columns;
use super::list_intersect::engine_options;
use crate::intersect::similarity::{Measure, coerce_pair, similarity_arrays};

/// `invoke_with_args` of every measure's UDF.
fn invoke(measure: Measure, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
    let opts = engine_options(&args.config_options, None)?;
    apply_to_columns(&args.args, |arrays| {
        similarity_arrays(measure, arrays, &opts)
    })
}

/// One similarity UDF: its struct, singleton, `Expr` builder and `ScalarUDFImpl`.
macro_rules! similarity_udf {
    ($Udf:ident, $name:ident, $udf_fn:ident, $measure:expr, $syntax:literal, $desc:literal, $example:literal) => {
        #[doc = concat!("The `", stringify!($name), "` UDF singleton.")]
        pub fn $udf_fn() -> Arc<ScalarUDF> {
            static UDF: LazyLock<Arc<ScalarUDF>> =
                LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl($Udf::new())));
            Arc::clone(&UDF)
        }

        #[doc = concat!("`", stringify!($name), "(a, b)` as an [`Expr`].")]
        pub fn $name(a: Expr, b: Expr) -> Expr {
            $udf_fn().call(vec![a, b])
        }

        #[user_doc(
                    doc_section(label = "Array Functions"),
                    description = $desc,
                    syntax_example = $syntax,
                    sql_example = $example,
                    argument(
                        name = "list1",
                        description = "List of integers or strings (List, LargeList or FixedSizeList)."
                    ),
                    argument(
                        name = "list2",
                        description = "List of integers or strings; its element type is unified with list1's."
                    )
                )]
        #[derive(Debug, PartialEq, Eq, Hash)]
        pub struct $Udf {
            signature: Signature,
        }

        impl Default for $Udf {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $Udf {
            #[doc = concat!("A new instance (prefer [`", stringify!($udf_fn), "`]).")]
            pub fn new() -> Self {
                Self {
                    signature: Signature::user_defined(Volatility::Immutable),
                }
            }
        }

        impl ScalarUDFImpl for $Udf {
            fn name(&self) -> &str {
                stringify!($name)
            }

            fn signature(&self) -> &Signature {
                &self.signature
            }

            fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
                coerce_pair(self.name(), arg_types)
            }

            fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
                Ok($measure.return_type())
            }

            fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
                invoke($measure, args)
            }

            fn documentation(&self) -> Option<&Documentation> {
                self.doc()
            }
        }
    };
}

similarity_udf!(
    Jaccard,
    jaccard,
    jaccard_udf,
    Measure::Jaccard,
    "jaccard(list1, list2)",
    r#"Returns the Jaccard similarity of two sets, `|a ∩ b| / |a ∪ b|`, as Float64 in [0, 1].

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0.0 (also for two empty sets). Elements are integers (any width) or strings (Utf8, LargeUtf8, Utf8View: equal strings, byte for byte, are equal elements); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'jaccard', t)` returns exactly the pairs with `jaccard(a, b) >= t`."#,
    r#"```sql
> select jaccard([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| jaccard(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 0.6666666666666666                                                                                |
+----------------------------------------------------------------------------------------+
```"#
);

similarity_udf!(
    Cosine,
    cosine,
    cosine_udf,
    Measure::Cosine,
    "cosine(list1, list2)",
    r#"Returns the set cosine similarity (Ochiai coefficient) of two sets, `|a ∩ b| / sqrt(|a| * |b|)`, as Float64 in [0, 1]. Not to be confused with DataFusion's `cosine_distance` on numeric vectors.

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0.0. Elements are integers (any width) or strings (Utf8, LargeUtf8, Utf8View: equal strings, byte for byte, are equal elements); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'cosine', t)` returns exactly the pairs with `cosine(a, b) >= t`."#,
    r#"```sql
> select cosine([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| cosine(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 0.8                                                                                |
+----------------------------------------------------------------------------------------+
```"#
);

similarity_udf!(
    Dice,
    dice,
    dice_udf,
    Measure::Dice,
    "dice(list1, list2)",
    r#"Returns the Dice (Sørensen) similarity of two sets, `2 * |a ∩ b| / (|a| + |b|)`, as Float64 in [0, 1].

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0.0 (also for two empty sets). Elements are integers (any width) or strings (Utf8, LargeUtf8, Utf8View: equal strings, byte for byte, are equal elements); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'dice', t)` returns exactly the pairs with `dice(a, b) >= t`."#,
    r#"```sql
> select dice([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| dice(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 0.8                                                                                |
+----------------------------------------------------------------------------------------+
```"#
);

similarity_udf!(
    Overlap,
    overlap,
    overlap_udf,
    Measure::Overlap,
    "overlap(list1, list2)",
    r#"Returns the overlap of two sets, the number of distinct common elements `|a ∩ b|`, as UInt64. Unlike `list_intersect_count`, NULL elements are ignored rather than matched with each other.

The lists are sets: duplicates are ignored, order does not matter, NULL elements are ignored. A NULL list gives NULL. If a set is empty the result is 0. Elements are integers (any width) or strings (Utf8, LargeUtf8, Utf8View: equal strings, byte for byte, are equal elements); List, LargeList and FixedSizeList arguments are accepted and unified as in `list_intersect`. `similarity_join(..., 'overlap', t)` returns exactly the pairs with `overlap(a, b) >= t`."#,
    r#"```sql
> select overlap([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]);
+----------------------------------------------------------------------------------------+
| overlap(make_array(Int64(1),Int64(2),Int64(3),Int64(4),Int64(5)),make_array(Int64(1),...  |
+----------------------------------------------------------------------------------------+
| 4                                                                                |
+----------------------------------------------------------------------------------------+
```"#
);
