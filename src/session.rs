//! One call installs the crate into a session: functions, configuration (and, as they land,
//! optimizer rules and table functions).

use std::sync::Arc;

use datafusion::catalog::{MemoryCatalogProviderList, TableFunction, TableFunctionImpl};
use datafusion::common::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::registry::FunctionRegistry;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::config::SetsConfig;
use crate::functions::topk_bm25::{SessionHandle, topk_bm25_udf};
use crate::functions::{all_aggregate_functions, all_scalar_functions};
use crate::join::{SIMILARITY_JOIN, SimilarityJoinFunction};
use crate::search::index_function::{BM25_INDEX, Bm25IndexFunction};
use crate::search::topk_function::{TOPK_BM25, TopkBm25Function};

/// The crate's table functions, by SQL name.
fn table_functions() -> Vec<(&'static str, Arc<dyn TableFunctionImpl>)> {
    vec![
        (SIMILARITY_JOIN, Arc::new(SimilarityJoinFunction)),
        (BM25_INDEX, Arc::new(Bm25IndexFunction)),
        (TOPK_BM25, Arc::new(TopkBm25Function)),
    ]
}

/// Installs datafusion-sets into a [`SessionStateBuilder`].
pub trait SessionStateBuilderExt {
    /// Register every function of the crate (replacing DataFusion's `list_intersect` alias)
    /// and the `sets.*` configuration extension. Call it after `with_default_features()`:
    /// functions registered later win a name.
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
        for (name, f) in table_functions() {
            self.table_functions()
                .get_or_insert_with(Default::default)
                .insert(name.into(), Arc::new(TableFunction::new(name.into(), f)));
        }
        // `topk_bm25` reads index tables through the catalog and runtime the state will be
        // built with: fix them now (the defaults `build()` would create otherwise).
        let catalogs = self
            .catalog_list()
            .get_or_insert_with(|| Arc::new(MemoryCatalogProviderList::new()))
            .clone();
        let runtime = self
            .runtime_env()
            .get_or_insert_with(|| Arc::new(RuntimeEnv::default()))
            .clone();
        let topk = topk_bm25_udf(SessionHandle { catalogs, runtime });
        if let Some(scalars) = self.scalar_functions() {
            scalars.push(topk);
        } else {
            self = self.with_scalar_functions(vec![topk]);
        }
        self
    }
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
/// `bm25_index`, `topk_bm25`) and configuration.
pub fn register(ctx: &SessionContext) -> Result<()> {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
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
    for (name, f) in table_functions() {
        ctx.register_udtf(name, f);
    }
    let state = ctx.state();
    let topk = topk_bm25_udf(SessionHandle {
        catalogs: Arc::clone(state.catalog_list()),
        runtime: Arc::clone(state.runtime_env()),
    });
    ctx.register_udf(topk.as_ref().clone());
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
