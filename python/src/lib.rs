//! `datafusion_sets._internal`: the crate's functions for datafusion-python, each handed over
//! as a datafusion-ffi capsule (`__datafusion_scalar_udf__`, `__datafusion_aggregate_udf__`,
//! `__datafusion_table_function__`, `__datafusion_extension_options__`). The Python package
//! (`datafusion_sets/__init__.py`) registers them into a `SessionContext`.
//!
//! Across FFI the host (datafusion-python) keeps its own session: our functions see its
//! options as text (read by `SetsConfig::from_options`), its tables through a foreign catalog,
//! and run with a task context of their own (datafusion-ffi builds it with an unbounded
//! memory pool: see `docs/python.md`).

mod host;
mod planner;

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{RecordBatchReader, new_empty_array};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemTable, MemoryCatalogProvider,
    MemoryCatalogProviderList, MemorySchemaProvider, SchemaProvider, TableFunctionImpl,
};
use datafusion::common::Result;
use datafusion::config::ExtensionOptions;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::async_udf::AsyncScalarUDFImpl;
use datafusion::logical_expr::{
    AggregateUDF, ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use datafusion_sets::SetsConfig;
use datafusion_sets::udf::{SessionHandle, TopkBm25, one_value};
use pyo3::exceptions::{PyImportError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The tokio runtime our side of FFI runs its async work on (table functions resolving
/// tables, scans): the host's runtime lives in another library and is not reachable.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("datafusion-sets")
            .enable_all()
            .build()
            .expect("datafusion-sets: cannot start its tokio runtime")
    })
}

/// A scalar function of the crate (`list_intersect`, `jaccard`, `tokenize`, ...).
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct ScalarFunction(Arc<ScalarUDF>);

#[pymethods]
impl ScalarFunction {
    /// The function's SQL name.
    #[getter]
    fn name(&self) -> String {
        self.0.name().to_string()
    }

    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = FFI_ScalarUDF::from(Arc::clone(&self.0));
        PyCapsule::new_with_value(py, ffi, c"datafusion_scalar_udf")
    }
}

/// An aggregate function of the crate (`list_intersect_agg`).
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct AggregateFunction(Arc<AggregateUDF>);

#[pymethods]
impl AggregateFunction {
    #[getter]
    fn name(&self) -> String {
        self.0.name().to_string()
    }

    fn __datafusion_aggregate_udf__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = FFI_AggregateUDF::from(Arc::clone(&self.0));
        PyCapsule::new_with_value(py, ffi, c"datafusion_aggregate_udf")
    }
}

/// A table function of the crate (`similarity_join`, `bm25_index`, `topk_bm25`).
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct TableFunction {
    name: &'static str,
    function: Arc<dyn TableFunctionImpl>,
}

#[pymethods]
impl TableFunction {
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    /// The capsule for `session` (a `datafusion.SessionContext`): the function's argument
    /// expressions are decoded, and its tables found, through that session.
    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = host_logical_codec(&session)?;
        // Our operators spawn on this runtime. datafusion-ffi also passes the handle on to
        // the host's table providers, whose streams would enter it with the host's build of
        // tokio: fatal for a file scan, which spawns. So no host scan is ever polled from our
        // side: the function reads its tables through the Python session (`host`).
        let handle = Some(runtime().handle().clone());
        let ffi = FFI_TableFunction::new_with_ffi_codec(Arc::clone(&self.function), handle, codec);
        PyCapsule::new_with_value(py, ffi, c"datafusion_table_function")
    }
}

const CODEC_CAPSULE: &CStr = c"datafusion_logical_extension_codec";

/// The logical extension codec of a datafusion-python session (its wrapper class or the
/// internal one), through which a table function's arguments cross.
pub(crate) fn host_logical_codec(
    session: &Bound<'_, PyAny>,
) -> PyResult<FFI_LogicalExtensionCodec> {
    let getter = "__datafusion_logical_extension_codec__";
    let owner = match session.hasattr(getter)? {
        true => session.clone(),
        false => session.getattr("ctx")?,
    };
    let codec: FFI_LogicalExtensionCodec =
        capsule_clone(&owner.call_method0(getter)?, CODEC_CAPSULE)?;
    // SAFETY: `version` is a plain function of the host's datafusion-ffi, taking nothing.
    let host = unsafe { (codec.version)() };
    if host != datafusion_ffi::version() {
        return Err(PyImportError::new_err(format!(
            "datafusion_sets: built for DataFusion {} but the datafusion package is DataFusion {host}; install datafusion=={}.*",
            datafusion_ffi::version(),
            datafusion_ffi::version()
        )));
    }
    Ok(codec)
}

/// A clone of the datafusion-ffi value in `capsule`, whose name is checked to be `name`.
pub(crate) fn capsule_clone<T: Clone>(capsule: &Bound<'_, PyAny>, name: &CStr) -> PyResult<T> {
    let capsule = capsule.cast::<PyCapsule>()?;
    let pointer: NonNull<T> = capsule.pointer_checked(Some(name))?.cast();
    // SAFETY: datafusion-ffi hosts give a capsule of each name used here only to a boxed value
    // of the matching type (`T` at every call), which lives as long as the capsule; `capsule`
    // holds it while the reference is cloned.
    Ok(unsafe { pointer.as_ref() }.clone())
}

/// The `sets.*` options, for `SessionConfig().with_extension(SetsConfig())`: then `SET
/// sets.backend = 'gpu'` and the rest work in that session.
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct SetsOptions;

#[pymethods]
impl SetsOptions {
    #[new]
    fn new() -> Self {
        SetsOptions
    }

    fn __datafusion_extension_options__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // Our entries carry their full names (`sets.backend`), which is how the host stores
        // them (`FFI_ExtensionOptions::add_config` would prefix them a second time).
        let mut options = FFI_ExtensionOptions::default();
        for entry in SetsConfig::default().entries() {
            if let Some(value) = entry.value {
                options
                    .set(&entry.key, &value)
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            }
        }
        PyCapsule::new_with_value(py, options, c"datafusion_extension_options")
    }
}

/// `topk_bm25(index, query, k [, mode])` over a column of queries, for a Python host. FFI
/// gives a scalar function no session to find index tables in, so the function reads them
/// from a catalog of its own, which [`Bm25Indexes::add`] fills with copies of the host's
/// index tables (`datafusion_sets.register_index`). The index is loaded once per copy and
/// cached as in Rust.
#[pyclass(frozen, module = "datafusion_sets._internal")]
struct Bm25Indexes {
    schema: Arc<MemorySchemaProvider>,
    udf: Arc<ScalarUDF>,
}

#[pymethods]
impl Bm25Indexes {
    #[new]
    fn new() -> PyResult<Self> {
        let schema = Arc::new(MemorySchemaProvider::new());
        let catalog = MemoryCatalogProvider::new();
        let catalogs = MemoryCatalogProviderList::new();
        // The names an unqualified table resolves to under DataFusion's default options.
        catalog
            .register_schema("public", Arc::clone(&schema) as _)
            .map_err(py_err)?;
        catalogs.register_catalog("datafusion".to_string(), Arc::new(catalog));
        let handle = SessionHandle {
            catalogs: Arc::new(catalogs),
            runtime: Arc::new(RuntimeEnv::default()),
        };
        let topk = BlockingTopk(Arc::new(TopkBm25::new(handle)));
        Ok(Self {
            schema,
            udf: Arc::new(ScalarUDF::new_from_impl(topk)),
        })
    }

    /// Make `rows` (anything with `__arrow_c_stream__`: a DataFrame, a pyarrow table) the
    /// index table `name`, replacing an earlier copy of that name.
    fn add(&self, name: &str, rows: &Bound<'_, PyAny>) -> PyResult<()> {
        let reader = host::arrow_stream(rows)
            .map_err(|e| PyValueError::new_err(format!("register_index('{name}'): {e}")))?;
        let schema = reader.schema();
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(format!("register_index('{name}'): {e}")))?;
        let table = MemTable::try_new(schema, vec![batches]).map_err(py_err)?;
        self.schema.deregister_table(name).map_err(py_err)?;
        self.schema
            .register_table(name.to_string(), Arc::new(table))
            .map_err(py_err)?;
        Ok(())
    }

    /// The index tables copied so far.
    fn names(&self) -> Vec<String> {
        self.schema.table_names()
    }

    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = FFI_ScalarUDF::from(Arc::clone(&self.udf));
        PyCapsule::new_with_value(py, ffi, c"datafusion_scalar_udf")
    }
}

/// A session handle of no tables, for what needs one and reads none here: the planner's backend
/// rule (which rebuilds the Rust `topk_bm25` calls around it; a Python session has none) and
/// the codec it recognizes the crate's operators with.
pub(crate) fn detached_handle() -> SessionHandle {
    SessionHandle {
        catalogs: Arc::new(MemoryCatalogProviderList::new()),
        runtime: Arc::new(RuntimeEnv::default()),
    }
}

fn py_err(e: datafusion::error::DataFusionError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The async `topk_bm25` as a plain scalar function (FFI has no async ones): each batch is
/// ranked on our runtime while the host's thread waits. Behind FFI every argument arrives as
/// an array, so the constant ones (index, k, mode) are taken back to one value first.
#[derive(Debug, PartialEq, Eq, Hash)]
struct BlockingTopk(Arc<TopkBm25>);

impl ScalarUDFImpl for BlockingTopk {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn signature(&self) -> &Signature {
        self.0.signature()
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.0.return_type(arg_types)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.0.return_field_from_args(args)
    }
    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if args.number_rows == 0 {
            return Ok(ColumnarValue::Array(new_empty_array(
                args.return_field.data_type(),
            )));
        }
        for i in [0, 2, 3] {
            if let Some(arg) = args.args.get_mut(i) {
                *arg = one_value(arg)?;
            }
        }
        runtime().block_on(self.0.invoke_async_with_args(args))
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }
}

/// Every scalar function of the crate but `topk_bm25` (which reads index tables through a
/// session that FFI does not give a function).
#[pyfunction]
fn scalar_functions() -> Vec<ScalarFunction> {
    datafusion_sets::all_scalar_functions()
        .into_iter()
        .map(ScalarFunction)
        .collect()
}

#[pyfunction]
fn aggregate_functions() -> Vec<AggregateFunction> {
    datafusion_sets::all_aggregate_functions()
        .into_iter()
        .map(AggregateFunction)
        .collect()
}

/// The table functions, reading their tables through `ctx` (a `datafusion.SessionContext`,
/// held weakly): see [`host`].
#[pyfunction]
fn table_functions(ctx: &Bound<'_, PyAny>) -> PyResult<Vec<TableFunction>> {
    let host = host::HostContext::new(ctx)?;
    Ok(datafusion_sets::table_functions()
        .into_iter()
        .map(|(name, inner)| TableFunction {
            name,
            function: Arc::new(host::HostTableFunction {
                inner,
                host: host.clone(),
            }),
        })
        .collect())
}

/// The DataFusion major version the package was built for.
#[pyfunction]
fn datafusion_major() -> u64 {
    datafusion_ffi::version()
}

/// Index tables `topk_bm25` has read and built in this process (cached searches add none).
#[pyfunction]
fn index_loads() -> u64 {
    datafusion_sets::bm25::index_loads()
}

/// Whether a usable GPU was found (the CUDA driver is loaded at run time).
#[pyfunction]
fn gpu_available() -> bool {
    datafusion_sets::gpu::is_available()
}

/// Batches the GPU ran in this process: (list-function batches, `topk_bm25` batches).
#[pyfunction]
fn gpu_batches() -> (u64, u64) {
    (
        datafusion_sets::gpu::batches_run(),
        datafusion_sets::gpu::bm25_batches_run(),
    )
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ScalarFunction>()?;
    m.add_class::<AggregateFunction>()?;
    m.add_class::<TableFunction>()?;
    m.add_class::<SetsOptions>()?;
    m.add_class::<Bm25Indexes>()?;
    m.add_class::<planner::SetsExtension>()?;
    m.add_function(wrap_pyfunction!(scalar_functions, m)?)?;
    m.add_function(wrap_pyfunction!(aggregate_functions, m)?)?;
    m.add_function(wrap_pyfunction!(table_functions, m)?)?;
    m.add_function(wrap_pyfunction!(datafusion_major, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_available, m)?)?;
    m.add_function(wrap_pyfunction!(index_loads, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_batches, m)?)?;
    Ok(())
}
