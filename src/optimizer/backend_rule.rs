//! The rule that chooses, at planning time, the device of every `list_intersect` and
//! `list_intersect_count` call in a projection, binds the call to it and wraps the projection
//! in a [`SetsBackendExec`] so `EXPLAIN` shows the choice and why.
//!
//! In order:
//! 1. `sets.backend = 'cpu'` → CPU.
//! 2. Element types the GPU kernels do not take (only 32- and 64-bit integers) → CPU.
//! 3. No usable GPU (no driver, no device, NVRTC failure, or built without `cuda`) → CPU,
//!    with the reason — decided here, not at run time.
//! 4. `sets.backend = 'gpu'` → GPU.
//! 5. `auto`: a cost model over the input's statistics. Calibrated on the H200 machine
//!    (kernels/NOTES.md, "Re-run after integration"): through the SQL function on ordinary
//!    Arrow arrays the GPU takes about [`GPU_NS_PER_VALUE`] per input value end to end
//!    (pageable staging, copies, kernels; 2 lists), the CPU about [`CPU_NS_PER_VALUE`] per
//!    value on one thread, divided by the threads it has; with 3 or more lists the CPU's
//!    shortest-first galloping skips most values and the GPU lost every measurement (81 vs
//!    22 ms), so `auto` sends only 2-list calls to the GPU, when the input's size is known
//!    from statistics and the model predicts the GPU faster. Unknown size → CPU.
//!
//! `topk_bm25` calls (evaluated by DataFusion's `AsyncFuncExec`) are bound the same way
//! ([`choose_topk`]: steps 1, 3 and 4 above; under `auto` an AND call stays on the CPU and
//! any other mode is decided per batch by its size, `search::rank::wants_gpu`), and their
//! `AsyncFuncExec` is wrapped in a [`SetsBackendExec`] too. That needs the session's catalog
//! handle (a `topk_bm25` call is rebuilt around it), which the rule gets when the crate is
//! installed (`with_sets`, `register`).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::Result;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::ScalarUDF;
use datafusion::logical_expr::async_udf::AsyncScalarUDF;
use datafusion::physical_expr::async_scalar_function::AsyncFuncExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::async_func::AsyncFuncExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use super::backend_exec::{BoundCall, SetsBackendExec};
use crate::backend::gpu;
use crate::config::{BackendChoice, SetsConfig};
use crate::functions::backend_plan::BackendPlan;
use crate::functions::common::list_element_type;
use crate::functions::list_intersect::ListIntersect;
use crate::functions::list_intersect_count::ListIntersectCount;
use crate::functions::topk_bm25::{SessionHandle, TopkBm25};
use crate::search::rank::AUTO_MIN_QUERIES;
use crate::search::topk::Mode;
use crate::search::topk_function::{TOPK_BM25, check_mode};

/// The rule's name.
pub const SETS_BACKEND_RULE: &str = "sets_backend";

/// GPU, end to end through the SQL function, ns per input value (H200, 2 lists).
pub const GPU_NS_PER_VALUE: f64 = 0.2;
/// GPU fixed cost per call (launches, synchronization), ns.
pub const GPU_FIXED_NS: f64 = 1.0e6;
/// CPU, ns per input value on one thread (the H200 machine's Xeon, 16 threads measured).
pub const CPU_NS_PER_VALUE: f64 = 3.2;

/// See the module docs. Without a session handle, `topk_bm25` calls are left unbound.
#[derive(Debug, Default)]
pub struct SetsBackendRule {
    session: Option<SessionHandle>,
}

impl SetsBackendRule {
    /// The rule for the session whose catalog and runtime `session` names (the handle its
    /// `topk_bm25` holds).
    pub fn new(session: SessionHandle) -> Self {
        Self {
            session: Some(session),
        }
    }
}

impl PhysicalOptimizerRule for SetsBackendRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let cfg = SetsConfig::from_options(config);
        plan.transform_up(|node| {
            if let (Some(a), Some(session)) = (node.downcast_ref::<AsyncFuncExec>(), &self.session)
            {
                return bind_topk(a, session, &cfg).map(|bound| match bound {
                    Some(b) => Transformed::yes(b),
                    None => Transformed::no(node),
                });
            }
            let Some(p) = node.downcast_ref::<ProjectionExec>() else {
                return Ok(Transformed::no(node));
            };
            let input = p.input();
            let schema = input.schema();
            let values = estimated_bytes(input);
            let mut calls = Vec::new();
            let mut exprs = Vec::with_capacity(p.expr().len());
            for pe in p.expr() {
                let expr = bind(&pe.expr, &schema, &cfg, values, &mut calls)?;
                exprs.push(ProjectionExpr {
                    expr,
                    alias: pe.alias.clone(),
                });
            }
            if calls.is_empty() {
                return Ok(Transformed::no(node));
            }
            let proj = Arc::new(ProjectionExec::try_new(exprs, Arc::clone(input))?);
            Ok(Transformed::yes(
                Arc::new(SetsBackendExec::new(proj, calls)) as Arc<dyn ExecutionPlan>,
            ))
        })
        .data()
    }

    fn name(&self) -> &str {
        SETS_BACKEND_RULE
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` with every unbound `topk_bm25` call bound to a backend, wrapped in a
/// [`SetsBackendExec`]; `None` when it has none.
fn bind_topk(
    node: &AsyncFuncExec,
    session: &SessionHandle,
    cfg: &SetsConfig,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let input = node.input();
    let schema = input.schema();
    let mut calls = Vec::new();
    let mut exprs = Vec::new();
    // `async_exprs` is the only way to read the expressions back (deprecated in 55 for lack
    // of another user; still public and the field the node is made of).
    #[allow(deprecated)]
    let async_exprs = node.async_exprs();
    // The session's `topk_bm25` as registered: equal to a call not bound yet (a bound one
    // has its plan in its equality; another session's has another handle).
    let unbound = ScalarUDF::from(AsyncScalarUDF::new(Arc::new(TopkBm25::new(
        session.clone(),
    ))));
    for ae in async_exprs {
        let topk = ae
            .func
            .downcast_ref::<ScalarFunctionExpr>()
            .filter(|sf| sf.fun() == &unbound);
        let Some(sf) = topk else {
            exprs.push(Arc::clone(ae));
            continue;
        };
        // The mode, when it is known at planning time (a literal, or the default).
        let mode = match sf.args().get(3) {
            None => Some(Mode::Or),
            Some(m) => m
                .downcast_ref::<Literal>()
                .and_then(|l| l.value().try_as_str().flatten())
                .and_then(|m| check_mode(m, 4).ok()),
        };
        let plan = Arc::new(choose_topk(cfg, mode));
        let udf = AsyncScalarUDF::new(Arc::new(TopkBm25::with_plan(
            session.clone(),
            Arc::clone(&plan),
        )))
        .into_scalar_udf();
        calls.push(BoundCall {
            function: TOPK_BM25.to_string(),
            plan,
        });
        let func = ScalarFunctionExpr::new(
            sf.name(),
            Arc::new(udf),
            sf.args().to_vec(),
            sf.return_field(&schema)?,
            Arc::new(sf.config_options().clone()),
        );
        exprs.push(Arc::new(AsyncFuncExpr::try_new(
            ae.name(),
            Arc::new(func),
            &schema,
        )?));
    }
    if calls.is_empty() {
        return Ok(None);
    }
    let exec = Arc::new(AsyncFuncExec::try_new(exprs, Arc::clone(input))?);
    Ok(Some(Arc::new(SetsBackendExec::new(exec, calls))))
}

/// The choice for one `topk_bm25` call in `mode` (`None`: not known at planning time).
pub fn choose_topk(cfg: &SetsConfig, mode: Option<Mode>) -> BackendPlan {
    use BackendChoice::{Auto, Cpu, Gpu};
    if cfg.backend == Cpu {
        return BackendPlan::new(Cpu, "sets.backend = 'cpu'");
    }
    if let Err(e) = gpu::device() {
        return BackendPlan::new(Cpu, format!("no GPU: {e}"));
    }
    if cfg.backend == Gpu {
        return BackendPlan::new(Gpu, "sets.backend = 'gpu'");
    }
    if mode == Some(Mode::And) {
        return BackendPlan::new(
            Cpu,
            "auto: AND ranks on the CPU (block-max pruning; the GPU measured at most 1.4x faster)",
        );
    }
    BackendPlan::new(
        Auto,
        format!(
            "auto: batches of at least {AUTO_MIN_QUERIES} queries on the GPU, smaller ones on the CPU"
        ),
    )
}

/// The input's size in bytes from its statistics, when known (exactly or estimated).
fn estimated_bytes(input: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let stats = StatisticsContext::new()
        .compute(input.as_ref(), &StatisticsArgs::new())
        .ok()?;
    match stats.total_byte_size {
        Precision::Exact(b) | Precision::Inexact(b) => Some(b),
        Precision::Absent => None,
    }
}

/// Rebind every unbound call of ours in `expr`.
fn bind(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    cfg: &SetsConfig,
    input_bytes: Option<usize>,
    calls: &mut Vec<BoundCall>,
) -> Result<Arc<dyn PhysicalExpr>> {
    Arc::clone(expr)
        .transform_up(|e| {
            let Some(sf) = e.downcast_ref::<ScalarFunctionExpr>() else {
                return Ok(Transformed::no(e));
            };
            let inner = sf.fun().inner();
            let count = if let Some(f) = inner.downcast_ref::<ListIntersect>() {
                if f.plan().is_some() {
                    return Ok(Transformed::no(e));
                }
                false
            } else if let Some(f) = inner.downcast_ref::<ListIntersectCount>() {
                if f.plan().is_some() {
                    return Ok(Transformed::no(e));
                }
                true
            } else {
                return Ok(Transformed::no(e));
            };
            let element = match sf.args().first() {
                Some(a) => list_element_type(&a.data_type(schema)?).cloned(),
                None => None,
            };
            let plan = Arc::new(choose(cfg, element.as_ref(), sf.args().len(), input_bytes));
            let udf = if count {
                ScalarUDF::new_from_impl(ListIntersectCount::with_plan(Arc::clone(&plan)))
            } else {
                ScalarUDF::new_from_impl(ListIntersect::with_plan(Arc::clone(&plan)))
            };
            calls.push(BoundCall {
                function: sf.name().to_string(),
                plan,
            });
            let return_field = e.return_field(schema)?;
            let new = ScalarFunctionExpr::new(
                sf.name(),
                Arc::new(udf),
                sf.args().to_vec(),
                return_field,
                Arc::new(sf.config_options().clone()),
            );
            Ok(Transformed::yes(Arc::new(new) as Arc<dyn PhysicalExpr>))
        })
        .data()
}

/// The choice for one call (see the module docs).
pub fn choose(
    cfg: &SetsConfig,
    element: Option<&DataType>,
    lists: usize,
    input_bytes: Option<usize>,
) -> BackendPlan {
    use BackendChoice::{Auto, Cpu, Gpu};
    if cfg.backend == Cpu {
        return BackendPlan::new(Cpu, "sets.backend = 'cpu'");
    }
    let width = match element {
        Some(t) if t.is_integer() => t.primitive_width().unwrap_or(0) * 8,
        _ => 0,
    };
    if !matches!(width, 32 | 64) {
        let t = element.map_or("unknown".to_string(), |t| t.to_string());
        return BackendPlan::new(
            Cpu,
            format!("element type {t}: the GPU kernels take 32/64-bit integers"),
        );
    }
    if let Err(e) = gpu::device() {
        return BackendPlan::new(Cpu, format!("no GPU: {e}"));
    }
    if cfg.backend == Gpu {
        return BackendPlan::new(Gpu, "sets.backend = 'gpu'");
    }
    debug_assert_eq!(cfg.backend, Auto);
    if lists > 2 {
        return BackendPlan::new(
            Cpu,
            format!("auto: {lists} lists (the CPU's shortest-first galloping wins measured k > 2)"),
        );
    }
    let Some(bytes) = input_bytes else {
        return BackendPlan::new(Cpu, "auto: input size unknown");
    };
    let values = (bytes / (width / 8)) as f64;
    let threads = rayon::current_num_threads().max(1) as f64;
    let cpu_ms = values * CPU_NS_PER_VALUE / threads / 1e6;
    let gpu_ms = (GPU_FIXED_NS + values * GPU_NS_PER_VALUE) / 1e6;
    let why = format!(
        "auto: ~{values:.0} values, est. CPU {cpu_ms:.2} ms on {threads} threads vs GPU {gpu_ms:.2} ms"
    );
    if gpu_ms < cpu_ms {
        BackendPlan::new(Gpu, why)
    } else {
        BackendPlan::new(Cpu, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(backend: BackendChoice) -> SetsConfig {
        SetsConfig {
            backend,
            ..SetsConfig::default()
        }
    }

    #[test]
    fn choices_and_reasons() {
        use BackendChoice::{Auto, Cpu, Gpu};
        let i32t = DataType::Int32;
        let p = choose(&cfg(Cpu), Some(&i32t), 2, Some(1 << 30));
        assert_eq!(
            (p.backend, p.reason.as_str()),
            (Cpu, "sets.backend = 'cpu'")
        );
        for backend in [Auto, Gpu] {
            let p = choose(&cfg(backend), Some(&DataType::Int16), 2, Some(1 << 30));
            assert_eq!(p.backend, Cpu);
            assert!(p.reason.contains("element type Int16"), "{}", p.reason);
            let p = choose(&cfg(backend), Some(&i32t), 2, Some(1 << 30));
            match gpu::device() {
                Err(e) => {
                    assert_eq!(p.backend, Cpu);
                    assert_eq!(p.reason, format!("no GPU: {e}"));
                }
                Ok(_) if backend == Gpu => assert_eq!(p.backend, Gpu),
                Ok(_) => {
                    // The cost model, with the constants of the module docs.
                    let values = (1u64 << 28) as f64;
                    let threads = rayon::current_num_threads() as f64;
                    let gpu_wins = GPU_FIXED_NS + values * GPU_NS_PER_VALUE
                        < values * CPU_NS_PER_VALUE / threads;
                    assert_eq!(p.backend == Gpu, gpu_wins, "{}", p.reason);
                    let p = choose(&cfg(Auto), Some(&i32t), 3, Some(1 << 30));
                    assert_eq!(p.backend, Cpu);
                    let p = choose(&cfg(Auto), Some(&i32t), 2, None);
                    assert_eq!(
                        (p.backend, p.reason.as_str()),
                        (Cpu, "auto: input size unknown")
                    );
                }
            }
        }
    }
}
