//! The SQL surface: every SQL entry point of the crate, one file per SQL name (the four
//! similarity measures share [`similarity`]), with the argument plumbing they share
//! ([`args`], [`common`]). The work itself is done by the engines below (`intersect`,
//! `join`, `search`).

pub mod args;
pub mod bm25_index;
pub mod common;
pub mod list_intersect;
pub mod list_intersect_agg;
pub mod list_intersect_count;
pub mod similarity;
pub mod similarity_join;
pub mod tokenize;
pub mod topk_bm25;

use std::sync::Arc;

use datafusion::logical_expr::{AggregateUDF, ScalarUDF};

/// Every scalar function of the crate.
pub fn all_scalar_functions() -> Vec<Arc<ScalarUDF>> {
    vec![
        list_intersect::list_intersect_udf(),
        list_intersect_count::list_intersect_count_udf(),
        similarity::jaccard_udf(),
        similarity::cosine_udf(),
        similarity::dice_udf(),
        similarity::overlap_udf(),
        tokenize::tokenize_udf(),
    ]
}

/// Every aggregate function of the crate.
pub fn all_aggregate_functions() -> Vec<Arc<AggregateUDF>> {
    vec![list_intersect_agg::list_intersect_agg_udaf()]
}

/// `Expr` builders, as DataFusion's `expr_fn` modules offer them.
pub mod expr_fn {
    pub use super::list_intersect::list_intersect;
    pub use super::list_intersect_agg::list_intersect_agg;
    pub use super::list_intersect_count::list_intersect_count;
    pub use super::similarity::{cosine, dice, jaccard, overlap};
    pub use super::tokenize::tokenize;
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
        let name = similarity_join::SIMILARITY_JOIN;
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
