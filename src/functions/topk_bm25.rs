//! `topk_bm25(index, query, k [, mode])`: BM25 top-k of a column of queries, a whole batch
//! of queries evaluated together (in parallel on the CPU).
//!
//! An async scalar function: the index table is read (once, then cached; see
//! `search::loaded`) through the session's catalog, which a plain scalar function cannot
//! reach. The function therefore carries a handle to the session's catalog and runtime,
//! given when it is installed with `register(&ctx)` or `SessionStateBuilder::with_sets()`.
//!
//! The backend rule (`optimizer::backend_rule`) binds each planned call to a backend choice
//! ([`TopkBm25::with_plan`]): `EXPLAIN` shows it, and the call counts its batches, queries,
//! device time and bytes for `EXPLAIN ANALYZE`.

pub mod queries;
pub mod table;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion::catalog::CatalogProviderList;
use datafusion::common::types::{NativeType, logical_int64, logical_string};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, plan_err};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    Coercion, ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, TypeSignature, TypeSignatureClass, Volatility,
};
use datafusion::physical_expr::async_scalar_function::AsyncFuncExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::prelude::SessionConfig;
use datafusion_macros::user_doc;

use crate::placement::plan::{BackendMetrics, BackendPlan, PlanSlot, holder};
use crate::search::loaded::load_index;
use crate::search::rank::{RankStats, rank_batch, wants_gpu};
use crate::search::scoring::params_of;
use crate::search::topk::Mode;
use table::{TOPK_BM25, check_k, check_mode};

/// Where `topk_bm25` finds index tables: the session's catalog and runtime.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    pub catalogs: Arc<dyn CatalogProviderList>,
    pub runtime: Arc<RuntimeEnv>,
}

/// The `topk_bm25` scalar UDF over the given session's catalog, as a session registers it: a
/// [`TopkBm25Entry`], which the analyzer's function rewrite
/// ([`crate::optimizer::async_calls`]) turns into the async function before planning.
pub fn topk_bm25_udf(handle: SessionHandle) -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(TopkBm25Entry::new(handle)))
}

/// `topk_bm25` as the session's function registry holds it: the name, signature, return
/// type and documentation of the async function it carries. DataFusion 55's
/// `AsyncScalarUDF` wrapper does not forward `documentation()`, so registering the async
/// function itself would leave `SHOW FUNCTIONS` / `information_schema.routines` without this
/// function's text; the planner, in turn, only runs a call asynchronously when its function
/// is an `AsyncScalarUDF`. The function rewrite [`crate::optimizer::async_calls`] replaces
/// each call of this entry by a call of [`TopkBm25Entry::async_udf`] (same name, arguments
/// and type) before the plan is optimized.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TopkBm25Entry {
    topk: Arc<TopkBm25>,
    async_udf: Arc<ScalarUDF>,
}

impl TopkBm25Entry {
    pub fn new(handle: SessionHandle) -> Self {
        let topk = Arc::new(TopkBm25::new(handle));
        let async_udf = Arc::new(AsyncScalarUDF::new(Arc::clone(&topk) as _).into_scalar_udf());
        Self { topk, async_udf }
    }

    /// The async function a call of this entry is planned as.
    pub fn async_udf(&self) -> &Arc<ScalarUDF> {
        &self.async_udf
    }
}

impl ScalarUDFImpl for TopkBm25Entry {
    fn name(&self) -> &str {
        TOPK_BM25
    }
    fn signature(&self) -> &Signature {
        self.async_udf.signature()
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.async_udf.return_type(arg_types)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.topk.return_field_from_args(args)
    }
    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!(
            "{TOPK_BM25}: the call was not rewritten into its async form; install \
             datafusion-sets with `register(&ctx)` or `SessionStateBuilder::with_sets()`"
        )
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.topk.doc()
    }
}

pub use crate::search::rank::hit_fields;

#[user_doc(
    doc_section(label = "Other Functions"),
    description = "Ranks each row's query text against a BM25 index table (built by the `bm25_index` table function, possibly stored as Parquet and loaded again) and returns its top-k documents as a list of `{doc_id, score}` structs, best first, ties by increasing doc_id. BM25 with `sets.bm25_k1` (1.2) and `sets.bm25_b` (0.75), idf = ln(1 + (N - n + 0.5) / (n + 0.5)); with static scores in the index, score = alpha * static + (1 - alpha) * BM25 (`sets.bm25_alpha`, 0.3). Query terms are tokenized as the index's documents were; repeated terms count once. Mode 'or' (default): documents holding any term; 'and': every term; 'and_or': AND, or the OR result when AND finds fewer than k documents. NULL query -> NULL; a query with no known term -> empty list. A whole batch of queries is ranked together, in parallel.",
    syntax_example = "topk_bm25(index_table, query, k[, mode])",
    sql_example = r#"```sql
> CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text');
> SELECT qid, topk_bm25('idx', text, 10, 'and') FROM queries;
```"#,
    argument(
        name = "index_table",
        description = "Name of the index table (a string literal; `schema.table` allowed)."
    ),
    argument(name = "query", description = "Query text (string expression)."),
    argument(
        name = "k",
        description = "Number of documents to return, a positive integer literal."
    ),
    argument(name = "mode", description = "'or' (default), 'and' or 'and_or'.")
)]
#[derive(Debug)]
pub struct TopkBm25 {
    signature: Signature,
    handle: SessionHandle,
    plan: PlanSlot,
}

/// The async expression `name` calling `topk` with the arguments and options of the call
/// `call` (a `topk_bm25` call planned or decoded with another function object) over an
/// input of `schema`.
pub fn async_call(
    name: &str,
    call: &ScalarFunctionExpr,
    topk: TopkBm25,
    schema: &Schema,
) -> Result<Arc<AsyncFuncExpr>> {
    let udf = AsyncScalarUDF::new(Arc::new(topk)).into_scalar_udf();
    let func = ScalarFunctionExpr::new(
        call.name(),
        Arc::new(udf),
        call.args().to_vec(),
        call.return_field(schema)?,
        Arc::new(call.config_options().clone()),
    );
    Ok(Arc::new(AsyncFuncExpr::try_new(
        name,
        Arc::new(func),
        schema,
    )?))
}

impl PartialEq for TopkBm25 {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.handle.catalogs, &o.handle.catalogs) && self.plan == o.plan
    }
}
impl Eq for TopkBm25 {}
impl Hash for TopkBm25 {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.handle.catalogs) as *const () as usize).hash(state);
        self.plan.hash(state);
    }
}

/// (string, string, integer [, string]): `AsyncScalarUDF` does not forward `coerce_types`,
/// so the signature itself coerces (any string flavour, any integer width to Int64).
fn signature() -> Signature {
    let string = Coercion::new_exact(TypeSignatureClass::Native(logical_string()));
    let int = Coercion::new_implicit(
        TypeSignatureClass::Native(logical_int64()),
        vec![TypeSignatureClass::Integer],
        NativeType::Int64,
    );
    Signature::one_of(
        vec![
            TypeSignature::Coercible(vec![string.clone(), string.clone(), int.clone()]),
            TypeSignature::Coercible(vec![string.clone(), string.clone(), int, string]),
        ],
        Volatility::Stable,
    )
}

impl TopkBm25 {
    pub fn new(handle: SessionHandle) -> Self {
        Self {
            signature: signature(),
            handle,
            plan: PlanSlot::default(),
        }
    }

    /// This function bound to a planning-time backend choice (`Auto`: each batch by its
    /// size and mode, as `search::rank::wants_gpu` says).
    pub fn with_plan(handle: SessionHandle, plan: Arc<BackendPlan>) -> Self {
        Self {
            plan: PlanSlot(Some(plan)),
            ..Self::new(handle)
        }
    }

    /// The planning-time choice, if any.
    pub fn plan(&self) -> Option<&Arc<BackendPlan>> {
        self.plan.0.as_ref()
    }
}

/// Counts one ranked batch of `rows` queries into the call's metrics: a batch the GPU took
/// part in (its copies, kernel and whole-call time; the index upload counts as bytes to the
/// device), or a CPU batch and its time.
fn record(m: &BackendMetrics, rows: usize, stats: &RankStats, started: Instant) {
    BackendMetrics::add(&m.rows, rows as u64);
    match &stats.timings {
        Some(t) => {
            BackendMetrics::add(&m.gpu_batches, 1);
            BackendMetrics::add(&m.gpu_launches, 1);
            BackendMetrics::add(&m.h2d_bytes, t.h2d_bytes + t.uploaded_bytes);
            BackendMetrics::add(&m.d2h_bytes, t.d2h_bytes);
            BackendMetrics::add(&m.kernel_ns, (t.kernel_ms * 1e6) as u64);
            BackendMetrics::add(&m.gpu_ns, (t.total_ms * 1e6) as u64);
        }
        None => {
            BackendMetrics::add(&m.cpu_batches, 1);
            BackendMetrics::add(&m.cpu_ns, started.elapsed().as_nanos() as u64);
        }
    }
}

impl ScalarUDFImpl for TopkBm25 {
    fn name(&self) -> &str {
        TOPK_BM25
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(hit_fields()),
            true,
        ))))
    }
    /// Checks the constant arguments while the query is planned, so a bad `k` or mode is an
    /// error even when no row reaches the function.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let constant = |i: usize| args.scalar_arguments.get(i).copied().flatten();
        if let Some(k) = constant(2) {
            match k.cast_to(&DataType::Int64)? {
                ScalarValue::Int64(Some(k)) => {
                    check_k(k, 3)?;
                }
                _ => return plan_err!("{TOPK_BM25}: argument 3 (k) must not be NULL"),
            }
        }
        if let Some(mode) = constant(3) {
            match mode.try_as_str() {
                Some(Some(m)) => {
                    check_mode(m, 4)?;
                }
                _ => return plan_err!("{TOPK_BM25}: argument 4 (mode) must not be NULL"),
            }
        }
        let arg_types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        Ok(Arc::new(Field::new(
            self.name(),
            self.return_type(&arg_types)?,
            true,
        )))
    }
    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!(
            "{TOPK_BM25}: runs asynchronously (AsyncFuncExec), not as a plain scalar function"
        )
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}

/// A constant argument's string, or a clear error.
fn scalar_string(v: &ColumnarValue, arg: usize, what: &str) -> Result<String> {
    match v {
        ColumnarValue::Scalar(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Ok(s.clone()),
        ColumnarValue::Scalar(s) if s.is_null() => {
            plan_err!("{TOPK_BM25}: argument {arg} ({what}) must not be NULL")
        }
        _ => plan_err!("{TOPK_BM25}: argument {arg} ({what}) must be a constant string"),
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for TopkBm25 {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let table = scalar_string(&args.args[0], 1, "index_table")?;
        let k = match &args.args[2] {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(k))) => check_k(*k, 3)?,
            ColumnarValue::Scalar(s) if s.is_null() => {
                return plan_err!("{TOPK_BM25}: argument 3 (k) must not be NULL");
            }
            _ => return plan_err!("{TOPK_BM25}: argument 3 (k) must be a constant integer"),
        };
        let mode = match args.args.get(3) {
            Some(m) => check_mode(&scalar_string(m, 4, "mode")?, 4)?,
            None => Mode::Or,
        };
        let options = Arc::clone(&args.config_options);
        // A state only to scan the index table with: the session's catalog and runtime, and
        // no default catalog of its own (building one would replace the session's).
        let config = SessionConfig::from(options.as_ref().clone())
            .with_create_default_catalog_and_schema(false);
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(Arc::clone(&self.handle.runtime))
            .with_catalog_list(Arc::clone(&self.handle.catalogs))
            .build();
        let loaded = load_index(&state, &table, TOPK_BM25, 1).await?;
        let scored = loaded.scored(params_of(&options)?)?;
        let (texts, scalar) = match &args.args[1] {
            ColumnarValue::Array(a) => (Arc::clone(a), false),
            ColumnarValue::Scalar(s) => (s.to_array_of_size(1)?, true),
        };
        let texts: ArrayRef = cast(&texts, &DataType::Utf8)?;
        let (rows, nulls) = (texts.len(), texts.nulls().cloned());
        // Rayon spreads the queries (or the GPU ranks them, with `sets.backend`).
        let config = crate::config::SetsConfig::from_options(&options)?;
        let budget = (config.gpu_index_budget > 0).then_some(config.gpu_index_budget);
        let backend = self.plan().map_or(config.backend, |p| p.backend);
        let on_gpu = wants_gpu(backend, mode, rows - texts.null_count());
        let started = Instant::now();
        let pool = Arc::clone(&self.handle.runtime.memory_pool);
        // Set when this call is dropped (its query cancelled) or done: a batch still on
        // rayon then skips its remaining rows instead of holding the cores for nobody.
        let abandoned = AbandonOnDrop(Arc::new(AtomicBool::new(false)));
        let stop = Arc::clone(&abandoned.0);
        let rank = move || {
            // The GPU's host staging reserved in the session's pool while the batch runs.
            let reservation =
                Some(MemoryConsumer::new(format!("{TOPK_BM25}[gpu]")).register(&pool));
            rank_batch(
                &loaded,
                &scored,
                texts.as_string::<i32>(),
                k,
                mode,
                backend,
                budget,
                &mut holder(&reservation),
                &stop,
            )
        };
        // The batch is ranked off the runtime's workers, which stay free to poll: a query
        // dropped meanwhile returns at once (the batch finishes in the background and its
        // result is dropped). On the CPU the batch is rayon's work anyway; a GPU batch waits
        // on the device, and the process's first one compiles the kernels (seconds), so it
        // waits on tokio's blocking pool.
        let (ranked, stats) = match (on_gpu, tokio::runtime::Handle::try_current()) {
            (true, Ok(runtime)) => runtime
                .spawn_blocking(rank)
                .await
                .map_err(|e| DataFusionError::Execution(format!("{TOPK_BM25}: {e}")))?,
            (true, Err(_)) => rank(),
            (false, _) => {
                let (done, result) = tokio::sync::oneshot::channel();
                rayon::spawn(move || {
                    let ranked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(rank));
                    let _ = done.send(ranked);
                });
                match result.await {
                    Ok(Ok(ranked)) => ranked,
                    Ok(Err(panic)) => std::panic::resume_unwind(panic),
                    Err(_) => {
                        return exec_err!("{TOPK_BM25}: the ranking task ended without a result");
                    }
                }
            }
        };
        if let Some(p) = self.plan() {
            record(&p.metrics, rows, &stats, started);
        }
        let list = ranked.into_list(nulls)?;
        let out: ArrayRef = Arc::new(list);
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

/// Sets its flag when dropped: the ranking of a batch whose call is gone stops early.
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
