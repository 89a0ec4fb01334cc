//! One call installs the crate into a session: functions, the `similarity_join` table
//! function, the `similarity_join_rewrite` physical optimizer rule and configuration.

use std::sync::Arc;

use datafusion::catalog::TableFunction;
use datafusion::common::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::registry::FunctionRegistry;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::config::SetsConfig;
use crate::functions::{all_aggregate_functions, all_scalar_functions};
use crate::join::{
    SIMILARITY_JOIN, SIMILARITY_JOIN_REWRITE, SimilarityJoinFunction, SimilarityJoinRewrite,
};

/// Installs datafusion-sets into a [`SessionStateBuilder`].
pub trait SessionStateBuilderExt {
    /// Register every function of the crate (replacing DataFusion's `list_intersect` alias),
    /// the `similarity_join` table function, the `similarity_join_rewrite` physical optimizer
    /// rule (into the builder's rules, DataFusion's defaults when none were set) and the
    /// `sets.*` configuration extension. Call it after `with_default_features()`: functions
    /// registered later win a name.
    fn with_sets(self) -> Self;
}

impl SessionStateBuilderExt for SessionStateBuilder {
    fn with_sets(mut self) -> Self {
        let config = self.config().get_or_insert_with(SessionConfig::new);
        if config.options().extensions.get::<SetsConfig>().is_none() {
            config
                .options_mut()
                .extensions
                .insert(SetsConfig::default());
        }
        // Functions are registered after the defaults, so our `list_intersect` replaces the
        // built-in alias of `array_intersect`.
        if let Some(scalars) = self.scalar_functions() {
            scalars.extend(all_scalar_functions());
        } else {
            self = self.with_scalar_functions(all_scalar_functions());
        }
        if let Some(aggregates) = self.aggregate_functions() {
            aggregates.extend(all_aggregate_functions());
        } else {
            self = self.with_aggregate_functions(all_aggregate_functions());
        }
        let join = Arc::new(TableFunction::new(
            SIMILARITY_JOIN.into(),
            Arc::new(SimilarityJoinFunction),
        ));
        self.table_functions()
            .get_or_insert_with(Default::default)
            .insert(SIMILARITY_JOIN.into(), join);
        let rules = match self.physical_optimizers().take() {
            Some(optimizer) => optimizer.rules,
            None => PhysicalOptimizer::new().rules,
        };
        let rules = match with_rewrite_rule(&rules) {
            Some(with_rule) => with_rule,
            None => rules,
        };
        self.with_physical_optimizer_rules(rules)
    }
}

type PhysicalRule = Arc<dyn PhysicalOptimizerRule + Send + Sync>;

/// `rules` with the similarity join rewrite inserted before `EnsureRequirements` (so
/// distribution and ordering are enforced around the operator it plans; before
/// `SanityCheckPlan`, or last, when there is no such rule); `None` when it is there already.
fn with_rewrite_rule(rules: &[PhysicalRule]) -> Option<Vec<PhysicalRule>> {
    if rules.iter().any(|r| r.name() == SIMILARITY_JOIN_REWRITE) {
        return None;
    }
    let at = ["EnsureRequirements", "SanityCheckPlan"]
        .iter()
        .find_map(|name| rules.iter().position(|r| r.name() == *name))
        .unwrap_or(rules.len());
    let mut rules = rules.to_vec();
    rules.insert(at, Arc::new(SimilarityJoinRewrite::new()));
    Some(rules)
}

/// Register every function of the crate into an existing registry (a `SessionContext` or a
/// `SessionState`). The `sets.*` options are not installed this way: use [`register`] or
/// [`SessionStateBuilderExt::with_sets`] for those.
pub fn register_all(registry: &mut dyn FunctionRegistry) -> Result<()> {
    for f in all_scalar_functions() {
        registry.register_udf(f)?;
    }
    for f in all_aggregate_functions() {
        registry.register_udaf(f)?;
    }
    Ok(())
}

/// Install datafusion-sets into a running [`SessionContext`]: functions, the
/// `similarity_join` table function, the `similarity_join_rewrite` optimizer rule and
/// configuration.
pub fn register(ctx: &SessionContext) -> Result<()> {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        // A session's physical optimizer rules can only be replaced by rebuilding its state;
        // this comes first, as rebuilding re-registers the functions (in no defined order).
        if let Some(rules) = with_rewrite_rule(state.physical_optimizers()) {
            let session_id = state.session_id().to_string();
            *state = SessionStateBuilder::new_from_existing(state.clone())
                .with_session_id(session_id)
                .with_physical_optimizer_rules(rules)
                .build();
        }
        if state
            .config()
            .options()
            .extensions
            .get::<SetsConfig>()
            .is_none()
        {
            state
                .config_mut()
                .options_mut()
                .extensions
                .insert(SetsConfig::default());
        }
    }
    for f in all_scalar_functions() {
        ctx.register_udf(f.as_ref().clone());
    }
    for f in all_aggregate_functions() {
        ctx.register_udaf(f.as_ref().clone());
    }
    ctx.register_udtf(SIMILARITY_JOIN, Arc::new(SimilarityJoinFunction));
    Ok(())
}

/// A new [`SessionContext`] with DataFusion's defaults and datafusion-sets installed.
pub fn new_context() -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_sets()
        .build();
    SessionContext::new_with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_names(rules: &[PhysicalRule]) -> Vec<String> {
        rules.iter().map(|r| r.name().to_string()).collect()
    }

    /// The rewrite runs once, right before `EnsureRequirements`.
    fn assert_installed(names: &[String]) {
        let at: Vec<usize> = names
            .iter()
            .enumerate()
            .filter(|(_, n)| *n == SIMILARITY_JOIN_REWRITE)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(at.len(), 1, "{names:?}");
        assert_eq!(names[at[0] + 1], "EnsureRequirements", "{names:?}");
    }

    #[test]
    fn with_sets_installs_the_rule_once() {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_sets()
            .with_sets()
            .build();
        assert_installed(&rule_names(state.physical_optimizers()));
    }

    #[test]
    fn register_installs_the_rule_once_and_keeps_our_functions() -> Result<()> {
        let ctx = SessionContext::new();
        let session_id = ctx.session_id();
        register(&ctx)?;
        register(&ctx)?;
        assert_installed(&rule_names(ctx.state().physical_optimizers()));
        assert_eq!(ctx.session_id(), session_id);
        // Rebuilding the state re-registers DataFusion's array_intersect (alias
        // list_intersect): ours must still win the name.
        let udf = ctx.udf("list_intersect")?;
        assert!(
            udf.inner()
                .is::<crate::functions::list_intersect::ListIntersect>(),
            "list_intersect is {}",
            udf.name()
        );
        assert!(ctx.table_function(SIMILARITY_JOIN).is_ok());
        Ok(())
    }
}
