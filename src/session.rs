//! One call installs the crate into a session: functions, the `similarity_join` table
//! function, the `similarity_join_rewrite` physical optimizer rule and configuration.

use std::sync::Arc;

use datafusion::catalog::{MemoryCatalogProviderList, TableFunction, TableFunctionImpl};

use datafusion::common::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::registry::FunctionRegistry;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::optimizer::{Analyzer, OptimizerRule};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::functions::bm25_index::{BM25_INDEX, Bm25IndexFunction};
use crate::functions::topk_bm25::table::{TOPK_BM25, TopkBm25Function};
use crate::functions::topk_bm25::{SessionHandle, topk_bm25_udf};
use crate::functions::{all_aggregate_functions, all_scalar_functions};
use crate::optimizer::async_calls::{AsyncCallPlaces, AsyncCallRewrite, SETS_ASYNC_CALLS};
use crate::optimizer::backend_rule::{SETS_BACKEND_RULE, SetsBackendRule};
use crate::optimizer::intersect_count::{IntersectCountRewrite, SETS_INTERSECT_COUNT};
use crate::optimizer::join_deal::{SIMILARITY_JOIN_DEAL, SimilarityJoinDeal};
use crate::optimizer::join_distribution::{
    SIMILARITY_JOIN_DISTRIBUTION, SimilarityJoinDistribution,
};
use crate::optimizer::topk_queries::{TOPK_QUERIES_BY_SHARD, TopkQueriesByShard};
use crate::search::catalog_watch::watch_catalogs;

/// The crate's table functions, by SQL name (for hosts that register them one by one, such
/// as the Python package).
pub fn table_functions() -> Vec<(&'static str, Arc<dyn TableFunctionImpl>)> {
    vec![
        (SIMILARITY_JOIN, Arc::new(SimilarityJoinFunction)),
        (BM25_INDEX, Arc::new(Bm25IndexFunction)),
        (TOPK_BM25, Arc::new(TopkBm25Function)),
    ]
}
use crate::functions::similarity_join::{SIMILARITY_JOIN, SimilarityJoinFunction};
use crate::optimizer::similarity_join_rewrite::{SIMILARITY_JOIN_REWRITE, SimilarityJoinRewrite};

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
    fn with_sets(self) -> Self {
        install(self).0
    }
}

/// [`SessionStateBuilderExt::with_sets`], and the handle of the catalog and runtime the
/// session will be built with (the codecs of plans that cross processes need it).
pub(crate) fn install(mut builder: SessionStateBuilder) -> (SessionStateBuilder, SessionHandle) {
    let config = builder.config().get_or_insert_with(SessionConfig::new);
    crate::config::install(config.options_mut());
    // Functions are registered after the defaults, so our `list_intersect` replaces the
    // built-in alias of `array_intersect`.
    if let Some(scalars) = builder.scalar_functions() {
        scalars.extend(all_scalar_functions());
    } else {
        builder = builder.with_scalar_functions(all_scalar_functions());
    }
    if let Some(aggregates) = builder.aggregate_functions() {
        aggregates.extend(all_aggregate_functions());
    } else {
        builder = builder.with_aggregate_functions(all_aggregate_functions());
    }
    for (name, f) in table_functions() {
        builder
            .table_functions()
            .get_or_insert_with(Default::default)
            .insert(name.into(), Arc::new(TableFunction::new(name.into(), f)));
    }
    // `topk_bm25` reads index tables through the catalog and runtime the state will be
    // built with: fix them now (the defaults `build()` would create otherwise).
    // Watched, so a dropped or replaced index table releases its loaded index at once.
    let catalogs = watch_catalogs(
        builder
            .catalog_list()
            .take()
            .unwrap_or_else(|| Arc::new(MemoryCatalogProviderList::new())),
    );
    *builder.catalog_list() = Some(Arc::clone(&catalogs));
    let runtime = builder
        .runtime_env()
        .get_or_insert_with(|| Arc::new(RuntimeEnv::default()))
        .clone();
    let session = SessionHandle { catalogs, runtime };
    let topk = topk_bm25_udf(session.clone());
    if let Some(scalars) = builder.scalar_functions() {
        scalars.push(topk);
    } else {
        builder = builder.with_scalar_functions(vec![topk]);
    }
    let analyzer = builder.analyzer().get_or_insert_with(Analyzer::new);
    if !has_async_calls(analyzer) {
        analyzer.add_function_rewrite(Arc::new(AsyncCallRewrite));
        analyzer.rules.push(Arc::new(AsyncCallPlaces));
    }
    if !has_rewrite(analyzer, SETS_INTERSECT_COUNT) {
        analyzer.add_function_rewrite(Arc::new(IntersectCountRewrite));
    }
    let has_rule = |rules: &[Arc<dyn OptimizerRule + Send + Sync>]| {
        rules.iter().any(|r| r.name() == TOPK_QUERIES_BY_SHARD)
    };
    let in_optimizer = builder
        .optimizer()
        .as_ref()
        .is_some_and(|o| has_rule(&o.rules));
    if !in_optimizer && !builder.optimizer_rules().as_deref().is_some_and(has_rule) {
        builder
            .optimizer_rules()
            .get_or_insert_with(Vec::new)
            .push(Arc::new(TopkQueriesByShard));
    }
    let rules = match builder.physical_optimizers().take() {
        Some(optimizer) => optimizer.rules,
        None => PhysicalOptimizer::new().rules,
    };
    let rules = match with_sets_rules(&rules, &session) {
        Some(with_rules) => with_rules,
        None => rules,
    };
    (builder.with_physical_optimizer_rules(rules), session)
}

type PhysicalRule = Arc<dyn PhysicalOptimizerRule + Send + Sync>;

/// `rules` with the crate's rules: the similarity join rewrite inserted before
/// `EnsureRequirements` (so distribution and ordering are enforced around the operator it
/// plans; before `SanityCheckPlan`, or last, when there is no such rule), the deal of a spread
/// join's input right after `EnsureRequirements`, and the backend rule
/// last (it binds the final plan's calls to a device and wraps their projections); `None` when
/// both are there already. `session` is the handle the session's `topk_bm25` holds (the
/// backend rule rebuilds its calls around it).
fn with_sets_rules(rules: &[PhysicalRule], session: &SessionHandle) -> Option<Vec<PhysicalRule>> {
    let has = |name: &str| rules.iter().any(|r| r.name() == name);
    if [
        SIMILARITY_JOIN_REWRITE,
        SIMILARITY_JOIN_DISTRIBUTION,
        SIMILARITY_JOIN_DEAL,
        SETS_BACKEND_RULE,
    ]
    .iter()
    .all(|name| has(name))
    {
        return None;
    }
    let mut rules = rules.to_vec();
    let before_requirements = |rules: &[PhysicalRule]| {
        ["EnsureRequirements", "SanityCheckPlan"]
            .iter()
            .find_map(|name| rules.iter().position(|r| r.name() == *name))
            .unwrap_or(rules.len())
    };
    if !has(SIMILARITY_JOIN_REWRITE) {
        let at = before_requirements(&rules);
        rules.insert(at, Arc::new(SimilarityJoinRewrite::new()));
    }
    if !has(SIMILARITY_JOIN_DISTRIBUTION) {
        // After the rewrite (it plans the joins this rule spreads).
        let at = before_requirements(&rules);
        rules.insert(at, Arc::new(SimilarityJoinDistribution::new()));
    }
    if !has(SIMILARITY_JOIN_DEAL) {
        // After the exchanges are in place (`EnsureRequirements` removes a round-robin it
        // did not add), before the sanity check.
        let at = match rules.iter().position(|r| r.name() == "EnsureRequirements") {
            Some(i) => i + 1,
            None => before_requirements(&rules),
        };
        rules.insert(at, Arc::new(SimilarityJoinDeal::new()));
    }
    if !has(SETS_BACKEND_RULE) {
        rules.push(Arc::new(SetsBackendRule::new(session.clone())));
    }
    Some(rules)
}

/// DataFusion's physical optimizer rules with the crate's (the similarity join rewrite and
/// its distribution, the backend rule), for a planner that builds its own session state
/// (the Python package's query planner). `session` is the handle the backend rule rebuilds
/// `topk_bm25` calls around.
pub fn physical_optimizer_rules(
    session: &SessionHandle,
) -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let rules = PhysicalOptimizer::new().rules;
    with_sets_rules(&rules, session).unwrap_or(rules)
}

/// Register every function of the crate into an existing registry (a `SessionContext` or a
/// `SessionState`). The `sets.*` options, the table functions and `topk_bm25` (which reads
/// tables through the session's catalog) are not installed this way: use [`register`] or
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

/// Install datafusion-sets into a running [`SessionContext`]: functions (including
/// `topk_bm25`, which needs the session's catalog), the table functions (`similarity_join`,
/// `bm25_index`, `topk_bm25`), the physical optimizer rules (`similarity_join_rewrite`,
/// `sets_backend`) and configuration.
pub fn register(ctx: &SessionContext) -> Result<()> {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        // A session's physical optimizer rules can only be replaced by rebuilding its state;
        // this comes first, as rebuilding re-registers the functions (in no defined order).
        // The rebuilt state keeps the catalog list and runtime, which `topk_bm25` reads.
        let catalogs = watch_catalogs(Arc::clone(state.catalog_list()));
        let session = SessionHandle {
            catalogs: Arc::clone(&catalogs),
            runtime: Arc::clone(state.runtime_env()),
        };
        let rules = with_sets_rules(state.physical_optimizers(), &session);
        let has_rule = state
            .optimizer()
            .rules
            .iter()
            .any(|r| r.name() == TOPK_QUERIES_BY_SHARD);
        if rules.is_some() || !has_rule || !Arc::ptr_eq(&catalogs, state.catalog_list()) {
            let session_id = state.session_id().to_string();
            let mut builder = SessionStateBuilder::new_from_existing(state.clone())
                .with_session_id(session_id)
                .with_catalog_list(catalogs);
            if let Some(rules) = rules {
                builder = builder.with_physical_optimizer_rules(rules);
            }
            if !has_rule {
                builder = builder.with_optimizer_rule(Arc::new(TopkQueriesByShard));
            }
            *state = builder.build();
        }
        crate::config::install(state.config_mut().options_mut());
    }
    for f in all_scalar_functions() {
        ctx.register_udf(f.as_ref().clone());
    }
    for f in all_aggregate_functions() {
        ctx.register_udaf(f.as_ref().clone());
    }
    for (name, f) in table_functions() {
        ctx.register_udtf(name, f);
    }
    let state = ctx.state();
    let topk = topk_bm25_udf(SessionHandle {
        catalogs: Arc::clone(state.catalog_list()),
        runtime: Arc::clone(state.runtime_env()),
    });
    ctx.register_udf(topk.as_ref().clone());
    let state = ctx.state_ref();
    let mut state = state.write();
    if !has_async_calls(state.analyzer()) {
        state.register_function_rewrite(Arc::new(AsyncCallRewrite))?;
        state.add_analyzer_rule(Arc::new(AsyncCallPlaces));
    }
    if !has_rewrite(state.analyzer(), SETS_INTERSECT_COUNT) {
        state.register_function_rewrite(Arc::new(IntersectCountRewrite))?;
    }
    Ok(())
}

/// Whether `analyzer` holds the rewrite that plans `topk_bm25` asynchronously.
fn has_async_calls(analyzer: &Analyzer) -> bool {
    has_rewrite(analyzer, SETS_ASYNC_CALLS)
}

/// Whether `analyzer` holds the function rewrite named `name`.
fn has_rewrite(analyzer: &Analyzer, name: &str) -> bool {
    analyzer
        .function_rewrites()
        .iter()
        .any(|r| r.name() == name)
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
    use crate::functions::topk_bm25::TopkBm25Entry;

    fn rule_names(rules: &[PhysicalRule]) -> Vec<String> {
        rules.iter().map(|r| r.name().to_string()).collect()
    }

    /// The rewrite and then the distribution rule run once each, right before
    /// `EnsureRequirements` (which adds the exchanges the distribution asks for), the deal
    /// right after it.
    fn assert_installed(names: &[String]) {
        let at = |rule: &str| -> Vec<usize> {
            let found = names.iter().enumerate().filter(|(_, n)| *n == rule);
            found.map(|(i, _)| i).collect()
        };
        let rewrite = at(SIMILARITY_JOIN_REWRITE);
        assert_eq!(rewrite.len(), 1, "{names:?}");
        assert_eq!(
            at(SIMILARITY_JOIN_DISTRIBUTION),
            [rewrite[0] + 1],
            "{names:?}"
        );
        assert_eq!(names[rewrite[0] + 2], "EnsureRequirements", "{names:?}");
        assert_eq!(at(SIMILARITY_JOIN_DEAL), [rewrite[0] + 3], "{names:?}");
        assert_eq!(at(SETS_BACKEND_RULE).len(), 1, "{names:?}");
    }

    #[test]
    fn physical_optimizer_rules_are_datafusions_with_ours() {
        let session = SessionHandle {
            catalogs: Arc::new(MemoryCatalogProviderList::new()),
            runtime: Arc::new(RuntimeEnv::default()),
        };
        let names = rule_names(&physical_optimizer_rules(&session));
        assert_installed(&names);
        let defaults = rule_names(&PhysicalOptimizer::new().rules);
        let ours = [
            SIMILARITY_JOIN_REWRITE,
            SIMILARITY_JOIN_DISTRIBUTION,
            SIMILARITY_JOIN_DEAL,
            SETS_BACKEND_RULE,
        ];
        let others: Vec<_> = names
            .iter()
            .filter(|n| !ours.contains(&n.as_str()))
            .collect();
        assert_eq!(others, defaults.iter().collect::<Vec<_>>());
    }

    #[test]
    fn with_sets_installs_the_rule_once() {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_sets()
            .with_sets()
            .build();
        assert_installed(&rule_names(state.physical_optimizers()));
        assert_eq!(async_rewrites(state.analyzer()), 1);
        assert_eq!(topk_rules(state.optimizers()), 1);
    }

    /// How many times the logical rule of the shard-by-shard search is installed.
    fn topk_rules(rules: &[Arc<dyn OptimizerRule + Send + Sync>]) -> usize {
        let names = rules.iter().map(|r| r.name());
        names.filter(|n| *n == TOPK_QUERIES_BY_SHARD).count()
    }

    /// How many times the `topk_bm25` rewrite is installed.
    fn async_rewrites(analyzer: &Analyzer) -> usize {
        let names = analyzer.function_rewrites().iter().map(|r| r.name());
        names.filter(|n| *n == SETS_ASYNC_CALLS).count()
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
        assert_eq!(async_rewrites(ctx.state().analyzer()), 1);
        assert_eq!(topk_rules(ctx.state().optimizers()), 1);
        // `topk_bm25` is registered as its documented entry.
        let topk = ctx.udf(TOPK_BM25)?;
        assert!(topk.inner().is::<TopkBm25Entry>(), "{}", topk.name());
        assert!(topk.documentation().is_some());
        Ok(())
    }
}
