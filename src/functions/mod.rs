//! The SQL surface: one function per file, named after its SQL name.

pub mod backend_plan;
pub mod common;
pub mod cosine;
pub mod dice;
pub(crate) mod intersect_rows;
pub mod jaccard;
pub mod list_intersect;
pub mod list_intersect_agg;
pub mod list_intersect_count;
pub mod overlap;
pub mod row_verdicts;
pub mod set_similarity;
pub mod topk_bm25;

use std::sync::Arc;

use datafusion::logical_expr::{AggregateUDF, ScalarUDF};

/// Every scalar function of the crate.
pub fn all_scalar_functions() -> Vec<Arc<ScalarUDF>> {
    vec![
        list_intersect::list_intersect_udf(),
        list_intersect_count::list_intersect_count_udf(),
        jaccard::jaccard_udf(),
        cosine::cosine_udf(),
        dice::dice_udf(),
        overlap::overlap_udf(),
    ]
}

/// Every aggregate function of the crate.
pub fn all_aggregate_functions() -> Vec<Arc<AggregateUDF>> {
    vec![list_intersect_agg::list_intersect_agg_udaf()]
}

/// `Expr` builders, as DataFusion's `expr_fn` modules offer them.
pub mod expr_fn {
    pub use super::cosine::cosine;
    pub use super::dice::dice;
    pub use super::jaccard::jaccard;
    pub use super::list_intersect::list_intersect;
    pub use super::list_intersect_agg::list_intersect_agg;
    pub use super::list_intersect_count::list_intersect_count;
    pub use super::overlap::overlap;
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use datafusion::execution::SessionStateBuilder;

    use super::*;

    /// Our table function must not shadow one of DataFusion's.
    #[test]
    fn no_duplicate_table_function_names() {
        let state = SessionStateBuilder::new().with_default_features().build();
        let name = crate::join::SIMILARITY_JOIN;
        assert!(
            !state.table_functions().contains_key(name),
            "{name} would shadow a DataFusion table function"
        );
        assert!(!state.scalar_functions().contains_key(name));
    }

    /// Names we add must not shadow a DataFusion function by accident: the only one we
    /// replace, on purpose and as a drop-in, is `list_intersect`.
    #[test]
    fn no_duplicate_names() {
        let state = SessionStateBuilder::new().with_default_features().build();
        let builtin: HashSet<String> = state
            .scalar_functions()
            .keys()
            .chain(state.aggregate_functions().keys())
            .chain(state.window_functions().keys())
            .cloned()
            .collect();
        let mut ours = HashSet::new();
        for name in all_scalar_functions()
            .iter()
            .flat_map(|f| std::iter::once(f.name().to_string()).chain(f.aliases().iter().cloned()))
            .chain(all_aggregate_functions().iter().flat_map(|f| {
                std::iter::once(f.name().to_string()).chain(f.aliases().iter().cloned())
            }))
        {
            assert!(
                ours.insert(name.clone()),
                "{name} defined twice by datafusion-sets"
            );
            assert!(
                !state.table_functions().contains_key(&name),
                "{name} would shadow a DataFusion table function"
            );
            if name == "list_intersect" {
                assert!(
                    builtin.contains(&name),
                    "DataFusion no longer defines list_intersect"
                );
            } else {
                assert!(
                    !builtin.contains(&name),
                    "{name} would shadow a DataFusion function"
                );
            }
        }
    }
}
