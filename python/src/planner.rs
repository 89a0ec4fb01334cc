//! The crate's query planner for a datafusion-python session: the physical rules of the Rust
//! crate (the similarity join rewrite, its distribution, the backend rule) for queries
//! planned by the host.
//!
//! datafusion-python 55 lets an extension replace a session's query planner
//! (`SessionContext.with_extensions`, whose bundle hooks are `__datafusion_session_components__`
//! and `__datafusion_session_planner__`). The host then hands every query's logical plan over
//! as bytes, encoded with the session's codecs, and decodes the physical plan it gets back the
//! same way. [`SetsPlanner`] plans it here, with DataFusion's physical planner and optimizer
//! rules plus the crate's, so `JOIN ... ON jaccard(a, b) >= t` runs on `SimilarityJoinExec` as
//! in Rust.
//!
//! Nothing crosses by copy:
//! - **Tables.** A table the host's codecs cannot write as bytes (an in-memory table, a Python
//!   table) crosses by reference: [`ByReference`] holds it here under a number, which is what
//!   the bytes carry, and hands it back when the bytes are read. So the planner scans it through
//!   datafusion-ffi, and its scan is the host's own operator (a foreign leaf of our plan). File
//!   tables (`register_parquet`, `CREATE EXTERNAL TABLE`) are written out by DataFusion itself
//!   and planned here as files.
//! - **Plans.** The physical plan goes back as bytes too: DataFusion's own operators are written
//!   out and rebuilt by the host; a foreign leaf (the host's scan) goes by reference again and
//!   the host gets its own operator back.
//! - **The crate's operators** cannot be rebuilt by the host, and must not be: they would then
//!   read the host's operators from our threads, and a host scan that spawns (a file scan)
//!   aborts the process there (see `host.rs`). So each subtree rooted at one of the crate's
//!   operators is sealed ([`SealedExec`]: a leaf to the host, which runs it through
//!   datafusion-ffi) and crosses by reference. Inside, file scans are our own; the host's
//!   leaves there are its in-memory scans, which do not spawn.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, TableReference, exec_err, not_impl_err};
use datafusion::execution::TaskContext;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{Extension, LogicalPlan, PlanType, ToStringifiedPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::ForeignExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{
    DefaultPhysicalProtoConverter, PhysicalExtensionCodec, PhysicalProtoConverterExtension,
};
use datafusion_sets::distributed::SetsCodec;
use datafusion_sets::udf::SessionHandle;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use crate::capsule_clone;
use crate::host::SealedExec;

/// What the bytes of a table or plan crossing by reference start with (then one byte for the
/// kind, then the number it is held under).
const MAGIC: &[u8] = b"datafusion_sets:ref";
const TABLE: u8 = b't';
const PLAN: u8 = b'p';
/// At most this many things are held between their writing and their reading (a plan written
/// and never read, after an error, lets go of its things as newer ones come).
const HELD_MAX: usize = 1024;

enum Held {
    Table(Arc<dyn TableProvider>),
    Plan(Arc<dyn ExecutionPlan>),
}

/// Tables and plans crossing by reference, by number.
static HELD: Mutex<(u64, BTreeMap<u64, Held>)> = Mutex::new((0, BTreeMap::new()));

fn held() -> std::sync::MutexGuard<'static, (u64, BTreeMap<u64, Held>)> {
    HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Hold `item` and write the bytes that name it.
fn hold(kind: u8, item: Held, buf: &mut Vec<u8>) {
    let mut held = held();
    held.0 += 1;
    let id = held.0;
    held.1.insert(id, item);
    while held.1.len() > HELD_MAX {
        held.1.pop_first();
    }
    buf.extend_from_slice(MAGIC);
    buf.push(kind);
    buf.extend_from_slice(&id.to_le_bytes());
}

/// The thing `buf` names, let go of (each is read once: the host reads a plan once, and the
/// planner a logical plan once).
fn take(kind: u8, buf: &[u8]) -> Result<Held> {
    let id = buf
        .strip_prefix(MAGIC)
        .and_then(|rest| rest.split_first())
        .filter(|(k, _)| **k == kind)
        .and_then(|(_, id)| <[u8; 8]>::try_from(id).ok())
        .map(u64::from_le_bytes);
    let Some(id) = id else {
        return exec_err!("datafusion_sets: these bytes name no table or plan of its planner");
    };
    match held().1.remove(&id) {
        Some(item) => Ok(item),
        None => exec_err!(
            "datafusion_sets: the planner no longer holds {} {id} (more than {HELD_MAX} were written and not read since)",
            if kind == TABLE { "table" } else { "plan" }
        ),
    }
}

/// The logical codec the planner adds to the session: tables by reference.
#[derive(Debug)]
pub struct ByReference;

impl LogicalExtensionCodec for ByReference {
    fn try_decode(&self, _: &[u8], _: &[LogicalPlan], _: &TaskContext) -> Result<Extension> {
        not_impl_err!("datafusion_sets has no logical extension nodes")
    }
    fn try_encode(&self, _: &Extension, _: &mut Vec<u8>) -> Result<()> {
        not_impl_err!("datafusion_sets has no logical extension nodes")
    }
    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        _table_ref: &TableReference,
        _schema: SchemaRef,
        _ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        match take(TABLE, buf)? {
            Held::Table(table) => Ok(table),
            Held::Plan(_) => exec_err!("datafusion_sets: a plan where a table was expected"),
        }
    }
    fn try_encode_table_provider(
        &self,
        _table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        hold(TABLE, Held::Table(node), buf);
        Ok(())
    }
}

/// The physical codec the planner adds to the session: the host's leaves and our sealed
/// subtrees by reference.
#[derive(Debug)]
pub struct PlansByReference;

impl PhysicalExtensionCodec for PlansByReference {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match take(PLAN, buf)? {
            Held::Plan(plan) => Ok(plan),
            Held::Table(_) => exec_err!("datafusion_sets: a table where a plan was expected"),
        }
    }
    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if !(node.is::<ForeignExecutionPlan>() || node.is::<SealedExec>()) {
            return exec_err!(
                "datafusion_sets: its planner cannot hand {} to the host",
                node.name()
            );
        }
        hold(PLAN, Held::Plan(node), buf);
        Ok(())
    }
}

/// The query planner (see the module docs).
#[derive(Debug)]
pub struct SetsPlanner {
    handle: SessionHandle,
}

impl SetsPlanner {
    pub fn new(handle: SessionHandle) -> Self {
        Self { handle }
    }

    /// `plan` with every subtree rooted at one of the crate's operators sealed.
    fn seal(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let codec = SetsCodec::new(self.handle.clone());
        let converter = DefaultPhysicalProtoConverter {};
        plan.transform_down(|node| {
            if node.is::<ForeignExecutionPlan>() || node.is::<SealedExec>() {
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            // The crate's operators are what its codec writes (it writes the node alone).
            let ours = codec
                .try_encode(Arc::clone(&node), &mut Vec::new(), &converter)
                .is_ok();
            Ok(match ours {
                true => {
                    let sealed = Arc::new(SealedExec::new(node)) as Arc<dyn ExecutionPlan>;
                    Transformed::new(sealed, true, TreeNodeRecursion::Jump)
                }
                false => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }
}

#[async_trait]
impl QueryPlanner for SetsPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The host's options (the `sets.*` ones included) and catalog (our table functions'
        // scans read it), and DataFusion's rules with ours.
        let state = SessionStateBuilder::new()
            .with_config(session.config().clone())
            .with_catalog_list(session.catalog_list())
            .with_runtime_env(Arc::clone(session.runtime_env()))
            .with_default_features()
            .with_physical_optimizer_rules(datafusion_sets::physical_optimizer_rules(&self.handle))
            .build();
        let explain;
        let logical_plan = match logical_plan {
            // The bytes of an EXPLAIN carry its input, not what the host's optimizer made of
            // it, nor that it succeeded: so DataFusion's planner would show the input alone.
            // The input is the optimized plan; say so, and the physical plans follow it.
            LogicalPlan::Explain(e) if !e.logical_optimization_succeeded => {
                let mut e = e.clone();
                e.stringified_plans = vec![e.plan.to_stringified(PlanType::FinalLogicalPlan)];
                e.logical_optimization_succeeded = true;
                explain = LogicalPlan::Explain(e);
                &explain
            }
            plan => plan,
        };
        let plan = DefaultPhysicalPlanner::default()
            .create_physical_plan(logical_plan, &state)
            .await?;
        self.seal(plan)
    }
}

/// The planner as a datafusion-python extension bundle, for
/// `SessionContext.with_extensions(datafusion_sets.extension())`: the codecs above (phase one)
/// and the planner (phase two).
#[pyclass(frozen, module = "datafusion_sets._internal")]
pub struct SetsExtension;

#[pymethods]
impl SetsExtension {
    #[new]
    fn new() -> Self {
        SetsExtension
    }

    fn __datafusion_session_components__<'py>(
        &self,
        py: Python<'py>,
        ctx: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tasks = ctx.call_method0("__datafusion_task_context_provider__")?;
        let codecs = Py::new(py, Codecs(tasks.unbind()))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("logical_extension_codecs", (codecs.clone_ref(py),))?;
        kwargs.set_item("physical_extension_codecs", (codecs,))?;
        py.import("datafusion")?
            .getattr("SessionExtensionComponents")?
            .call((), Some(&kwargs))
    }

    /// Our planner, replacing `fallback` (it plans every query itself).
    fn __datafusion_session_planner__<'py>(
        &self,
        py: Python<'py>,
        ctx: Bound<'py, PyAny>,
        fallback: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = fallback;
        // The host binds the planner to the session's codec chains as it installs it; these
        // are the chains it has now (ours included: phase one has run).
        let logical = crate::host_logical_codec(&ctx)?;
        let physical: FFI_PhysicalExtensionCodec = capsule_clone(
            &ctx.call_method0("__datafusion_physical_extension_codec__")?,
            c"datafusion_physical_extension_codec",
        )?;
        let planner = FFI_QueryPlanner::new_with_ffi_codecs(
            Arc::new(SetsPlanner::new(crate::detached_handle())),
            logical,
            physical,
        );
        PyCapsule::new_with_value(py, planner, c"datafusion_query_planner")
    }
}

/// The codecs of [`SetsExtension`], as the host takes them: an object with an id and a getter
/// per kind.
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct Codecs(Py<PyAny>);

#[pymethods]
impl Codecs {
    /// The id the host files our payloads under.
    #[classattr]
    #[pyo3(name = "__datafusion_codec_id__")]
    const CODEC_ID: &'static str = "datafusion_sets.by_reference.v1";

    #[pyo3(signature = (session=None))]
    fn __datafusion_logical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = session;
        let codec = FFI_LogicalExtensionCodec::new(
            Arc::new(ByReference),
            Some(crate::runtime().handle().clone()),
            self.tasks(py)?,
        );
        PyCapsule::new_with_value(py, codec, c"datafusion_logical_extension_codec")
    }

    #[pyo3(signature = (session=None))]
    fn __datafusion_physical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = session;
        let codec = FFI_PhysicalExtensionCodec::new(
            Arc::new(PlansByReference),
            Some(crate::runtime().handle().clone()),
            self.tasks(py)?,
        );
        PyCapsule::new_with_value(py, codec, c"datafusion_physical_extension_codec")
    }
}

impl Codecs {
    /// The host session's task context provider, which a datafusion-ffi codec carries.
    fn tasks(&self, py: Python<'_>) -> PyResult<FFI_TaskContextProvider> {
        capsule_clone(self.0.bind(py), c"datafusion_task_context_provider")
    }
}
