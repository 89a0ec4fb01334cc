//! The rule that binds, at planning time, every `list_intersect`, `list_intersect_count`,
//! `list_intersect_agg` and `topk_bm25` call to the device the placement policy
//! ([`crate::placement`]) chooses for it, and wraps the projection, filter, aggregate or
//! `AsyncFuncExec` computing it in a [`SetsBackendExec`] so `EXPLAIN` shows the choice and
//! why; the node reads its input through a [`TimeSliceExec`], so the query stays
//! cancellable however much each batch costs. `topk_bm25` calls need the session's catalog handle (a call is rebuilt around it),
//! which the rule gets when the crate is installed (`with_sets`, `register`).

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::Result;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::async_udf::AsyncScalarUDF;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::async_func::AsyncFuncExec;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, replace_children_if_necessary};

use super::backend_exec::{BoundCall, SetsBackendExec};
use crate::config::SetsConfig;
use crate::functions::list_intersect::ListIntersect;
use crate::functions::list_intersect_agg::ListIntersectAgg;
use crate::functions::list_intersect_count::ListIntersectCount;
use crate::functions::topk_bm25::table::{TOPK_BM25, check_mode};
use crate::functions::topk_bm25::{SessionHandle, TopkBm25, async_call};
use crate::intersect::lists::list_element_type;
use crate::io::time_slice::TimeSliceExec;
use crate::placement::{InputSize, choose, choose_agg, choose_topk};
use crate::search::topk::Mode;

/// The rule's name.
pub const SETS_BACKEND_RULE: &str = "sets_backend";

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
        let cfg = SetsConfig::from_options(config)?;
        plan.transform_up(|node| {
            if let (Some(a), Some(session)) = (node.downcast_ref::<AsyncFuncExec>(), &self.session)
            {
                return bind_topk(a, session, &cfg).map(|bound| match bound {
                    Some(b) => Transformed::yes(b),
                    None => Transformed::no(node),
                });
            }
            if let Some(a) = node.downcast_ref::<AggregateExec>() {
                return bind_agg(a, &cfg, config.execution.batch_size.into()).map(
                    |bound| match bound {
                        Some(b) => Transformed::yes(b),
                        None => Transformed::no(node),
                    },
                );
            }
            if let Some(f) = node.downcast_ref::<FilterExec>() {
                return bind_filter(f, &cfg, config.execution.batch_size.into()).map(|bound| {
                    match bound {
                        Some(b) => Transformed::yes(b),
                        None => Transformed::no(node),
                    }
                });
            }
            let Some(p) = node.downcast_ref::<ProjectionExec>() else {
                return Ok(Transformed::no(node));
            };
            let input = p.input();
            let schema = input.schema();
            let size = input_size(input, config.execution.batch_size.into());
            let mut calls = Vec::new();
            let mut exprs = Vec::with_capacity(p.expr().len());
            for pe in p.expr() {
                let expr = bind(&pe.expr, &schema, &cfg, size, &mut calls)?;
                exprs.push(ProjectionExpr {
                    expr,
                    alias: pe.alias.clone(),
                });
            }
            if calls.is_empty() {
                return Ok(Transformed::no(node));
            }
            let proj = Arc::new(ProjectionExec::try_new(exprs, sliced(input))?);
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
        let plan = Arc::new(choose_topk(cfg, mode.map(|m| m == Mode::And)));
        let topk = TopkBm25::with_plan(session.clone(), Arc::clone(&plan));
        calls.push(BoundCall {
            function: TOPK_BM25.to_string(),
            plan,
        });
        exprs.push(async_call(ae.name(), sf, topk, &schema)?);
    }
    if calls.is_empty() {
        return Ok(None);
    }
    let exec = Arc::new(AsyncFuncExec::try_new(exprs, sliced(input))?);
    Ok(Some(Arc::new(SetsBackendExec::new(exec, calls))))
}

/// `node` with every unbound call in its predicate bound as in a projection, wrapped in a
/// [`SetsBackendExec`]; `None` when it has none.
fn bind_filter(
    node: &FilterExec,
    cfg: &SetsConfig,
    batch_rows: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let input = node.input();
    let size = input_size(input, batch_rows);
    let mut calls = Vec::new();
    let predicate = bind(node.predicate(), &input.schema(), cfg, size, &mut calls)?;
    if calls.is_empty() {
        return Ok(None);
    }
    let filter = FilterExecBuilder::from(node)
        .with_predicate(predicate)
        .with_input(sliced(input))
        .build()?;
    Ok(Some(Arc::new(SetsBackendExec::new(
        Arc::new(filter),
        calls,
    ))))
}

/// `node` with every unbound `list_intersect_agg` bound to a backend ([`choose_agg`]), and
/// every unbound scalar call in the arguments it evaluates (`sum(cardinality(list_intersect(a,
/// b)))`, the common analytic form) bound as in a projection, wrapped in a
/// [`SetsBackendExec`]; `None` when it has none.
fn bind_agg(
    node: &AggregateExec,
    cfg: &SetsConfig,
    batch_rows: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let grouped = !node.group_expr().expr().is_empty();
    // A final aggregate merges states: its arguments are not evaluated there.
    let evaluates_args = !matches!(
        node.mode(),
        AggregateMode::Final | AggregateMode::FinalPartitioned
    );
    let schema = node.input_schema();
    let size = input_size(node.input(), batch_rows);
    let mut calls = Vec::new();
    let mut exprs = Vec::with_capacity(node.aggr_expr().len());
    for e in node.aggr_expr() {
        let before = calls.len();
        let mut args = e.expressions();
        if evaluates_args {
            for a in &mut args {
                *a = bind(a, &schema, cfg, size, &mut calls)?;
            }
        }
        let unbound_agg = e
            .fun()
            .inner()
            .downcast_ref::<ListIntersectAgg>()
            .is_some_and(|f| f.plan().is_none());
        let fun = if unbound_agg {
            let element = list_element_type(e.field().data_type()).cloned();
            let plan = Arc::new(choose_agg(cfg, element.as_ref(), grouped));
            calls.push(BoundCall {
                function: e.fun().name().to_string(),
                plan: Arc::clone(&plan),
            });
            Arc::new(AggregateUDF::new_from_impl(ListIntersectAgg::with_plan(
                plan,
            )))
        } else if calls.len() > before {
            Arc::new(e.fun().clone())
        } else {
            exprs.push(Arc::clone(e));
            continue;
        };
        let mut b = AggregateExprBuilder::new(fun, args)
            .schema(Arc::clone(&schema))
            .alias(e.name())
            .order_by(e.order_bys().to_vec())
            .with_ignore_nulls(e.ignore_nulls())
            .with_distinct(e.is_distinct())
            .with_reversed(e.is_reversed());
        if let Some(h) = e.human_display() {
            b = b.human_display(h);
        }
        if let Some(a) = e.human_display_alias() {
            b = b.human_display_alias(a);
        }
        exprs.push(Arc::new(b.build()?));
    }
    if calls.is_empty() {
        return Ok(None);
    }
    let agg: Arc<dyn ExecutionPlan> = Arc::new(node.with_new_aggr_exprs(exprs));
    let agg = replace_children_if_necessary(agg, vec![sliced(node.input())])?;
    Ok(Some(Arc::new(SetsBackendExec::new(agg, calls))))
}

/// `input` read through a [`TimeSliceExec`]: the node the rule binds reads it so, and a
/// dropped query returns promptly whatever its calls cost per batch.
fn sliced(input: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    // A plan bound again (decoded on a worker) reads its input through one slicer still.
    if input.is::<TimeSliceExec>() {
        return Arc::clone(input);
    }
    Arc::new(TimeSliceExec::new(Arc::clone(input)))
}

/// The input's size from its statistics, as far as they know it (exactly or estimated).
fn input_size(input: &Arc<dyn ExecutionPlan>, batch_rows: usize) -> InputSize {
    let known = |p: &Precision<usize>| match p {
        Precision::Exact(v) | Precision::Inexact(v) => Some(*v),
        Precision::Absent => None,
    };
    let stats = StatisticsContext::new()
        .compute(input.as_ref(), &StatisticsArgs::new())
        .ok();
    InputSize {
        bytes: stats.as_ref().and_then(|s| known(&s.total_byte_size)),
        rows: stats.as_ref().and_then(|s| known(&s.num_rows)),
        batch_rows: batch_rows.max(1),
    }
}

/// Rebind every unbound call of ours in `expr`.
fn bind(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    cfg: &SetsConfig,
    size: InputSize,
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
            let plan = Arc::new(choose(cfg, element.as_ref(), sf.args().len(), size));
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
