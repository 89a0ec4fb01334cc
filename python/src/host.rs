//! The host's tables, read through the host.
//!
//! A table function finds its tables in the host's catalog (datafusion-ffi hands it the
//! host's session). Scanning such a table through datafusion-ffi would poll the host's
//! operators from our side, inside a tokio runtime handle that the host reads out of our
//! private data with its own build of tokio: a file scan, which spawns, then aborts the process.
//! So every table a table function resolves is replaced by a [`HostTable`] whose scan asks
//! the Python `SessionContext` for the rows (`ctx.table(name).select(columns)` and its Arrow C
//! stream, `datafusion_sets._host_table`). The host then runs its own scan on its own runtime,
//! and hands over batches; in-memory batches cross without a copy.
//!
//! [`HostTableFunction`] wraps each of the crate's table functions so that both the table
//! lookups of the call and those of the returned table's scan go through [`HostSession`].

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, SchemaProvider, Session, TableFunctionArgs,
    TableFunctionImpl, TableProvider,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, Result, TableReference, exec_datafusion_err, internal_err};
use datafusion::config::{ConfigOptions, TableOptions};
use datafusion::execution::config::SessionConfig;
use datafusion::execution::context::ExecutionProps;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::HigherOrderUDF;
use datafusion::logical_expr::registry::ExtensionTypeRegistryRef;
use datafusion::logical_expr::{
    AggregateUDF, Expr, LogicalPlan, ScalarUDF, TableProviderFilterPushDown, TableType, WindowUDF,
};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, displayable,
};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The Python `SessionContext` a table function was registered into, held weakly (the
/// context holds the function, so a strong reference would keep both alive for ever).
#[derive(Clone)]
pub struct HostContext(Arc<Py<PyAny>>);

impl fmt::Debug for HostContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HostContext")
    }
}

impl HostContext {
    pub fn new(ctx: &Bound<'_, PyAny>) -> PyResult<Self> {
        let weak = ctx.py().import("weakref")?.getattr("ref")?.call1((ctx,))?;
        Ok(Self(Arc::new(weak.unbind())))
    }

    /// Open a stream of `table`'s `columns` (all when None) on the host.
    fn open(
        &self,
        table: &TableReference,
        columns: Option<&[String]>,
    ) -> Result<ArrowArrayStreamReader> {
        Python::attach(|py| -> PyResult<ArrowArrayStreamReader> {
            let ctx = self.0.bind(py).call0()?;
            if ctx.is_none() {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "the SessionContext the function was registered into is gone (keep the context passed to datafusion_sets.register alive while its queries run)",
                ));
            }
            let (catalog, schema, name) = match table {
                TableReference::Full {
                    catalog,
                    schema,
                    table,
                } => (catalog, schema, table),
                _ => {
                    return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                        "table reference '{table}' is not fully qualified"
                    )));
                }
            };
            let df = py
                .import("datafusion_sets")?
                .getattr("_host_table")?
                .call1((
                    ctx,
                    catalog.as_ref(),
                    schema.as_ref(),
                    name.as_ref(),
                    columns.map(|c| c.to_vec()),
                ))?;
            arrow_stream(&df)
        })
        .map_err(|e| exec_datafusion_err!("reading table '{table}' from the Python session: {e}"))
    }
}

/// The rows of `obj` (anything with `__arrow_c_stream__`: a DataFrame, a pyarrow table).
pub fn arrow_stream(obj: &Bound<'_, PyAny>) -> PyResult<ArrowArrayStreamReader> {
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let pointer: NonNull<FFI_ArrowArrayStream> =
        capsule.pointer_checked(Some(c"arrow_array_stream"))?.cast();
    // SAFETY: a capsule named `arrow_array_stream` holds an `FFI_ArrowArrayStream` (the Arrow
    // PyCapsule interface), alive while `capsule` is. `from_raw` moves the stream out and
    // leaves a released one in its place, which the capsule's destructor skips.
    unsafe { ArrowArrayStreamReader::from_raw(pointer.as_ptr()) }
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// One of the crate's table functions, with its tables read through the host.
#[derive(Debug)]
pub struct HostTableFunction {
    pub inner: Arc<dyn TableFunctionImpl>,
    pub host: HostContext,
}

impl TableFunctionImpl for HostTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let session = HostSession::new(args.session(), &self.host);
        let table = self
            .inner
            .call_with_args(TableFunctionArgs::new(args.exprs(), &session))?;
        Ok(Arc::new(HostScanned {
            inner: table,
            host: self.host.clone(),
        }))
    }
}

/// A table function's result, whose scan (which may resolve more tables, as `topk_bm25`'s
/// index table) sees the host's tables as [`HostTable`]s too.
#[derive(Debug)]
struct HostScanned {
    inner: Arc<dyn TableProvider>,
    host: HostContext,
}

#[async_trait]
impl TableProvider for HostScanned {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let session = HostSession::new(state, &self.host);
        let plan = self
            .inner
            .scan(&session, projection, filters, limit)
            .await?;
        let config = state.config_options();
        let plan = PhysicalOptimizer::new()
            .rules
            .iter()
            .try_fold(plan, |plan, rule| rule.optimize(plan, config))?;
        Ok(Arc::new(SealedExec::new(plan)))
    }
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

/// The parts of [`ExecutionPlan`] both leaves here implement alike (no children, no
/// expressions, their `properties` field).
macro_rules! leaf_basics {
    ($name:literal) => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
        ) -> Result<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }
        fn properties(&self) -> &Arc<PlanProperties> {
            &self.properties
        }
        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![]
        }
        fn with_new_children(
            self: Arc<Self>,
            children: Vec<Arc<dyn ExecutionPlan>>,
        ) -> Result<Arc<dyn ExecutionPlan>> {
            match children.is_empty() {
                true => Ok(self),
                false => internal_err!("{} has no children", $name),
            }
        }
    };
}

/// A table function's plan, optimized here and shown to the host as a leaf.
///
/// The host's optimizer would otherwise rewrite inside it (a `RepartitionExec` of the host
/// above one of our scans), and our operators would then poll the host's operators, which
/// spawn on a runtime they cannot reach from our side (see the module docs).
#[derive(Debug)]
pub(crate) struct SealedExec {
    inner: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    /// The plan inside on one line. The host's EXPLAIN shows a foreign node by its name
    /// only, so this is the name: EXPLAIN then shows what runs.
    label: String,
}

impl SealedExec {
    pub(crate) fn new(inner: Arc<dyn ExecutionPlan>) -> Self {
        let partitions = inner.properties().partitioning.partition_count();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(inner.schema()),
            Partitioning::UnknownPartitioning(partitions),
            inner.properties().emission_type,
            inner.properties().boundedness,
        ));
        let label = format!("SealedExec: {}", one_line(&inner));
        Self {
            inner,
            properties,
            label,
        }
    }
}

impl DisplayAs for SealedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// `plan` on one line: each node as EXPLAIN shows it, its inputs after it in brackets.
fn one_line(plan: &Arc<dyn ExecutionPlan>) -> String {
    let node = displayable(plan.as_ref()).one_line().to_string();
    let children = plan.children();
    match children.is_empty() {
        true => node.trim_end().to_string(),
        false => {
            let inputs: Vec<String> = children.into_iter().map(one_line).collect();
            format!("{} <- [{}]", node.trim_end(), inputs.join("; "))
        }
    }
}

impl ExecutionPlan for SealedExec {
    fn name(&self) -> &str {
        &self.label
    }
    leaf_basics!("SealedExec");
    fn metrics(&self) -> Option<MetricsSet> {
        self.inner.metrics()
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.inner.execute(partition, context)
    }
}

/// The host's session with its catalog seen through [`HostCatalogs`]; everything else is the
/// host's.
struct HostSession<'a> {
    inner: &'a dyn Session,
    catalogs: Arc<dyn CatalogProviderList>,
    table_options: TableOptions,
}

impl<'a> HostSession<'a> {
    fn new(inner: &'a dyn Session, host: &HostContext) -> Self {
        Self {
            inner,
            catalogs: Arc::new(HostCatalogs {
                inner: inner.catalog_list(),
                host: host.clone(),
            }),
            table_options: inner.table_options().clone(),
        }
    }
}

#[async_trait]
impl Session for HostSession<'_> {
    fn session_id(&self) -> &str {
        self.inner.session_id()
    }
    fn config(&self) -> &SessionConfig {
        self.inner.config()
    }
    fn config_options(&self) -> &ConfigOptions {
        self.inner.config_options()
    }
    fn catalog_list(&self) -> Arc<dyn CatalogProviderList> {
        Arc::clone(&self.catalogs)
    }
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.create_physical_plan(logical_plan).await
    }
    fn create_physical_expr(
        &self,
        expr: Expr,
        df_schema: &DFSchema,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.create_physical_expr(expr, df_schema)
    }
    fn scalar_functions(&self) -> &HashMap<String, Arc<ScalarUDF>> {
        self.inner.scalar_functions()
    }
    fn higher_order_functions(&self) -> &HashMap<String, Arc<HigherOrderUDF>> {
        self.inner.higher_order_functions()
    }
    fn aggregate_functions(&self) -> &HashMap<String, Arc<AggregateUDF>> {
        self.inner.aggregate_functions()
    }
    fn window_functions(&self) -> &HashMap<String, Arc<WindowUDF>> {
        self.inner.window_functions()
    }
    fn extension_type_registry(&self) -> &ExtensionTypeRegistryRef {
        self.inner.extension_type_registry()
    }
    fn runtime_env(&self) -> &Arc<RuntimeEnv> {
        self.inner.runtime_env()
    }
    fn execution_props(&self) -> &ExecutionProps {
        self.inner.execution_props()
    }
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
    fn table_options(&self) -> &TableOptions {
        &self.table_options
    }
    fn table_options_mut(&mut self) -> &mut TableOptions {
        &mut self.table_options
    }
    fn task_ctx(&self) -> Arc<TaskContext> {
        self.inner.task_ctx()
    }
}

#[derive(Debug)]
struct HostCatalogs {
    inner: Arc<dyn CatalogProviderList>,
    host: HostContext,
}

impl CatalogProviderList for HostCatalogs {
    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.inner.register_catalog(name, catalog)
    }
    fn catalog_names(&self) -> Vec<String> {
        self.inner.catalog_names()
    }
    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let inner = self.inner.catalog(name)?;
        Some(Arc::new(HostCatalog {
            inner,
            name: name.to_string(),
            host: self.host.clone(),
        }))
    }
}

#[derive(Debug)]
struct HostCatalog {
    inner: Arc<dyn CatalogProvider>,
    name: String,
    host: HostContext,
}

impl CatalogProvider for HostCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.inner.schema_names()
    }
    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let inner = self.inner.schema(name)?;
        Some(Arc::new(HostSchema {
            inner,
            catalog: self.name.clone(),
            name: name.to_string(),
            host: self.host.clone(),
        }))
    }
}

#[derive(Debug)]
struct HostSchema {
    inner: Arc<dyn SchemaProvider>,
    catalog: String,
    name: String,
    host: HostContext,
}

#[async_trait]
impl SchemaProvider for HostSchema {
    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }
    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(table) = self.inner.table(name).await? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(HostTable {
            reference: TableReference::full(self.catalog.as_str(), self.name.as_str(), name),
            schema: table.schema(),
            table_type: table.table_type(),
            host: self.host.clone(),
        })))
    }
    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// A table of the host, scanned by asking the host for its rows ([`HostScanExec`]).
#[derive(Debug)]
struct HostTable {
    reference: TableReference,
    schema: SchemaRef,
    table_type: TableType,
    host: HostContext,
}

#[async_trait]
impl TableProvider for HostTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
    fn table_type(&self) -> TableType {
        self.table_type
    }
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        Ok(Arc::new(HostScanExec::new(
            self.reference.clone(),
            schema,
            self.host.clone(),
        )))
    }
}

/// The rows of a host table, read from the host's Arrow C stream on a blocking thread of our
/// runtime (the host runs its scan on its own runtime meanwhile) and handed over through a
/// channel of two batches.
#[derive(Debug)]
pub struct HostScanExec {
    reference: TableReference,
    schema: SchemaRef,
    host: HostContext,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl HostScanExec {
    fn new(reference: TableReference, schema: SchemaRef, host: HostContext) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            reference,
            schema,
            host,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for HostScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "HostScanExec: table={}, columns=[{}] (read through the Python session)",
            self.reference,
            columns.join(", ")
        )
    }
}

impl ExecutionPlan for HostScanExec {
    fn name(&self) -> &str {
        "HostScanExec"
    }
    leaf_basics!("HostScanExec");
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("HostScanExec has one partition, asked for {partition}");
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        let (host, reference, schema) = (
            self.host.clone(),
            self.reference.clone(),
            Arc::clone(&self.schema),
        );
        crate::runtime().spawn_blocking(move || {
            if let Err(e) = read_host(&host, &reference, &schema, &tx) {
                // The receiver may be gone (the query was dropped): nothing to tell then.
                let _ = tx.blocking_send(Err(e));
            }
        });
        let stream = futures::stream::unfold(rx, move |mut rx| {
            let baseline = baseline.clone();
            async move {
                let next = rx.recv().await?;
                if let Ok(batch) = &next {
                    baseline.record_output(batch.num_rows());
                }
                Some((next, rx))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// Read `reference`'s columns of `schema` from the host into `tx`, until the end or until the
/// receiver is dropped.
fn read_host(
    host: &HostContext,
    reference: &TableReference,
    schema: &SchemaRef,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<()> {
    // No column asked for (a count): read the first one for the row counts.
    let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let no_columns = columns.is_empty();
    let reader = host.open(reference, (!no_columns).then_some(columns.as_slice()))?;
    for batch in reader {
        let batch = batch.map_err(|e: ArrowError| {
            exec_datafusion_err!("reading table '{reference}' from the Python session: {e}")
        })?;
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let columns = match no_columns {
            true => vec![],
            false => batch.columns().to_vec(),
        };
        // Our schema (the table's, as the host's catalog gave it) names the batch's columns;
        // a host table that changed shape since planning fails here, not later.
        let batch = RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)
            .map_err(|e| {
                exec_datafusion_err!(
                    "reading table '{reference}' from the Python session: its rows do not match the planned schema ({e})"
                )
            })?;
        if tx.blocking_send(Ok(batch)).is_err() {
            break;
        }
    }
    Ok(())
}
