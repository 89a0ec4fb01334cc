//! `similarity_join_rewrite`: the physical optimizer rule that plans a similarity join written
//! in SQL as [`SimilarityJoinExec`].
//!
//! ```sql
//! SELECT r.id, s.id FROM r JOIN s ON jaccard(r.tokens, s.tokens) >= 0.8;
//! SELECT * FROM r, s WHERE 0.5 < cosine(s.tokens, r.tokens) AND r.lang = s.lang;
//! SELECT a.id, b.id FROM t a JOIN t b ON overlap(a.tokens, b.tokens) >= 3 AND a.id < b.id;
//! ```
//!
//! DataFusion plans these as a `NestedLoopJoinExec` (inner, with a `JoinFilter`), or, when the
//! condition stayed in a `WHERE` above a cross join (the logical optimizer off), as
//! `FilterExec` over `CrossJoinExec` (possibly through the column-reordering projection of a
//! swapped cross join).
//! The rule finds, among the conjuncts of that condition, one of the form
//! `measure(<left expr>, <right expr>) >= t` (or `>`, either operand order, either argument
//! order) where `measure` is this crate's `jaccard`, `cosine`, `dice` or `overlap` (the UDF
//! itself, not merely a function of that name), each argument depends on one input only and
//! `t` is a literal, and replaces the join by
//!
//! ```text
//! [FilterExec: the other conjuncts, projection = the join's output columns]
//!   SimilarityJoinExec: mode=r-s, output = the columns of both rows the plan above needs
//!     left input  [+ ProjectionExec adding the argument when it is not a plain column]
//!     right input [+ the same]
//! ```
//!
//! with exactly the join's schema. The rows are those of the nested loop, as a multiset: the
//! join finds exactly the pairs whose `f64` score passes the literal, computed by the same
//! function on the same (coerced) lists, every pair once per pair of input rows.
//!
//! Self-joins (`FROM t a JOIN t b ON jaccard(a.tokens, b.tokens) >= t AND a.id < b.id`) run
//! in the exec's self-join mode (one collection, each pair once, oriented by id; the id
//! conjunct is dropped; the data is read and indexed once) only when both inputs provably
//! produce the same rows: the very same in-memory batches (buffer pointers), or the same
//! versions of the same files (path, size, modification time, e-tag) scanned alike, with the
//! same projection and pushed-down predicate and no limit, possibly under equal deterministic
//! projections and filters (two scans that differ only in their columns are read as the one
//! with every column of the other); the measure compares one column, or one deterministic
//! expression of the columns (`jaccard(tokenize(a.title), tokenize(b.title))`, then computed
//! once below the join), with itself; the id is an integer column (SQL's `<` is then the
//! exec's order, and NULL or equal ids are paired by neither). Any other self-join is an R-S join with `a.id < b.id` as a filter, which is
//! always correct.
//!
//! Left alone (the plan stays as DataFusion made it, which is always correct):
//! - joins other than INNER; equi-joins with a similarity filter (a hash join);
//! - a threshold that is not a literal, is NULL, or lets an empty set pass (`>= t` with
//!   `t <= 0`, `> t` with `t < 0`: the join drops empty and all-NULL lists, the nested loop
//!   would pair them), or that no pair can meet (`> 1`, `>= 1.5` for the normalized
//!   measures): the nested loop already gives the right (full or empty) answer. SQL never
//!   gets the table function's threshold errors;
//! - comparisons made in another type than the function's (decimals, `Float32`), volatile
//!   arguments, arguments mixing both inputs;
//! - unbounded (streaming) inputs: the join reads both inputs to the end first;
//! - anything `SimilarityJoinExec` refuses to build (e.g. lists of floats).
//!
//! The rule runs before `EnsureRequirements`, so distribution and ordering are enforced around
//! the new operator as for any other; it reads `sets.similarity_join_rewrite` when the query
//! is planned.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinSide, JoinType, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr, conjunction, split_conjunction};
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::joins::utils::{JoinFilter, build_join_schema};
use datafusion::physical_plan::joins::{CrossJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::config::{BackendChoice, SetsConfig};
use crate::functions::similarity::Cosine;
use crate::functions::similarity::Dice;
use crate::functions::similarity::Jaccard;
use crate::functions::similarity::Overlap;
use crate::intersect::similarity::Measure;
use crate::io::same_data::{same_batches, same_data, same_files};
use crate::join::exec::{JoinColumn, JoinInput, SimilarityJoinExec};
use crate::join::threshold::{Comparison, Threshold};

/// The rule's name (as `EXPLAIN VERBOSE` shows it).
pub const SIMILARITY_JOIN_REWRITE: &str = "similarity_join_rewrite";

/// Name of the column a side's input gets when the measure's argument is an expression.
const TOKENS_COLUMN: &str = "__similarity_join_tokens";

/// The physical optimizer rule (see the module docs).
#[derive(Debug, Default)]
pub struct SimilarityJoinRewrite;

impl SimilarityJoinRewrite {
    /// A new instance.
    pub fn new() -> Self {
        Self
    }
}

impl PhysicalOptimizerRule for SimilarityJoinRewrite {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let sets = SetsConfig::from_options(config)?;
        if !sets.similarity_join_rewrite {
            return Ok(plan);
        }
        let partitions = config.execution.target_partitions;
        let backend = sets.backend;
        plan.transform_up(|node| {
            Ok(match rewrite(&node, partitions, backend) {
                Some(new) => Transformed::yes(new),
                None => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        SIMILARITY_JOIN_REWRITE
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` rewritten, or `None` when it is not a join the rule can prove it may replace.
fn rewrite(
    node: &Arc<dyn ExecutionPlan>,
    partitions: usize,
    backend: BackendChoice,
) -> Option<Arc<dyn ExecutionPlan>> {
    let (left, right, predicate, projection) =
        if let Some(join) = node.downcast_ref::<NestedLoopJoinExec>() {
            if *join.join_type() != JoinType::Inner {
                return None;
            }
            let nl = join.left().schema().fields().len();
            let predicate = on_join_schema(join.filter()?, nl)?;
            let projection = join.projection().as_ref().map(|p| p.to_vec());
            (join.left(), join.right(), predicate, projection)
        } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
            if filter.fetch().is_some() {
                return None;
            }
            let (cross, predicate, columns) = under_filter(filter)?;
            let projection = match filter.projection() {
                Some(p) => p.iter().map(|&i| columns[i]).collect(),
                None => columns,
            };
            (cross.left(), cross.right(), predicate, Some(projection))
        } else {
            return None;
        };
    // The exec reads both inputs to the end before emitting anything.
    if left.boundedness().is_unbounded() || right.boundedness().is_unbounded() {
        return None;
    }
    let planned = plan(
        left,
        right,
        &predicate,
        projection,
        node.schema(),
        partitions,
        backend,
    );
    match planned {
        Ok(Some(new)) => {
            log::debug!("{SIMILARITY_JOIN_REWRITE}: {} replaced", node.name());
            Some(new)
        }
        Ok(None) => None,
        Err(e) => {
            log::debug!("{SIMILARITY_JOIN_REWRITE}: {} left alone: {e}", node.name());
            None
        }
    }
}

/// The cross join under `filter` (directly, or under a projection of plain columns, as
/// `JoinSelection` leaves a swapped one), the filter's predicate over the cross join's schema
/// and the cross join column of each of the filter's input columns.
fn under_filter(
    filter: &FilterExec,
) -> Option<(&CrossJoinExec, Arc<dyn PhysicalExpr>, Vec<usize>)> {
    let input = filter.input();
    if let Some(cross) = input.downcast_ref::<CrossJoinExec>() {
        let columns = (0..input.schema().fields().len()).collect();
        return Some((cross, Arc::clone(filter.predicate()), columns));
    }
    let projection = input.downcast_ref::<ProjectionExec>()?;
    let cross = projection.input().downcast_ref::<CrossJoinExec>()?;
    let mut columns = Vec::with_capacity(projection.expr().len());
    for e in projection.expr() {
        columns.push(e.expr.downcast_ref::<Column>()?.index());
    }
    let cross_schema = cross.schema();
    let predicate = Arc::clone(filter.predicate())
        .transform(|e| {
            Ok(match e.downcast_ref::<Column>() {
                Some(c) => match columns.get(c.index()) {
                    Some(&i) => {
                        Transformed::yes(Arc::new(Column::new(cross_schema.field(i).name(), i))
                            as Arc<dyn PhysicalExpr>)
                    }
                    None => Transformed::no(e),
                },
                None => Transformed::no(e),
            })
        })
        .data()
        .ok()?;
    Some((cross, predicate, columns))
}

/// The join filter's expression over the join's full schema (left columns, then right).
fn on_join_schema(filter: &JoinFilter, nl: usize) -> Option<Arc<dyn PhysicalExpr>> {
    let indices = filter.column_indices();
    let mut ok = true;
    let expr = Arc::clone(filter.expression())
        .transform(|e| {
            let Some(c) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            let index = match indices.get(c.index()) {
                Some(ci) if ci.side == JoinSide::Left => ci.index,
                Some(ci) if ci.side == JoinSide::Right => nl + ci.index,
                _ => {
                    ok = false;
                    return Ok(Transformed::no(e));
                }
            };
            Ok(Transformed::yes(
                Arc::new(Column::new(c.name(), index)) as Arc<dyn PhysicalExpr>
            ))
        })
        .data()
        .ok()?;
    ok.then_some(expr)
}

/// A conjunct `measure(args[0], args[1]) <cmp> t`, `args[0]` over the left input's columns
/// and `args[1]` over the right's (indices of the join schema).
struct SimilarityPredicate {
    threshold: Threshold,
    args: [Arc<dyn PhysicalExpr>; 2],
}

/// The plan replacing an inner join of `left` and `right` on `predicate` (over the join
/// schema) whose output is `projection` of the join schema (all columns when `None`) with
/// schema `target`; `Ok(None)` when no conjunct is a similarity predicate the join can take.
fn plan(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    predicate: &Arc<dyn PhysicalExpr>,
    projection: Option<Vec<usize>>,
    target: SchemaRef,
    partitions: usize,
    backend: BackendChoice,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let (left_schema, right_schema) = (left.schema(), right.schema());
    let nl = left_schema.fields().len();
    let (join_schema, _) = build_join_schema(&left_schema, &right_schema, &JoinType::Inner);
    let conjuncts = split_conjunction(predicate);
    let Some((k, similarity)) = conjuncts
        .iter()
        .enumerate()
        .find_map(|(k, c)| similarity_predicate(c, nl).map(|s| (k, s)))
    else {
        return Ok(None);
    };
    let mut residual: Vec<Arc<dyn PhysicalExpr>> = conjuncts
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != k)
        .map(|(_, c)| Arc::clone(c))
        .collect();
    let output = projection.unwrap_or_else(|| (0..join_schema.fields().len()).collect());
    // Where each join input's columns are in the exec's input(s): themselves, unless a
    // self-join reads one input that has the columns of both.
    let (mut left_at, mut right_at): (Vec<usize>, Vec<usize>) = (
        (0..nl).collect(),
        (0..right_schema.fields().len()).collect(),
    );
    let (left_input, right_input, flipped) =
        match self_join(left, right, &similarity, &residual, nl) {
            Some(s) => {
                // The exec orients each pair by id, which is what the id conjunct asked for.
                residual.remove(s.conjunct);
                (left_at, right_at) = (s.input.left, s.input.right);
                (
                    JoinInput::new(s.input.plan, s.id, s.tokens),
                    None,
                    s.flipped,
                )
            }
            None => {
                let Some(l) = side_input(left, &similarity.args[0], 0)? else {
                    return Ok(None);
                };
                let Some(r) = side_input(right, &similarity.args[1], nl)? else {
                    return Ok(None);
                };
                (l, Some(r), false)
            }
        };
    // In a self-join whose id conjunct is `left.id > right.id`, the join's left row is the
    // exec's right one (the larger id).
    let column = |c: usize| match (c < nl, flipped) {
        (true, false) => JoinColumn::Left(left_at[c]),
        (true, true) => JoinColumn::Right(left_at[c]),
        (false, false) => JoinColumn::Right(right_at[c - nl]),
        (false, true) => JoinColumn::Left(right_at[c - nl]),
    };
    let new: Arc<dyn ExecutionPlan> = if residual.is_empty() {
        Arc::new(
            SimilarityJoinExec::try_with_columns(
                left_input,
                right_input,
                similarity.threshold,
                output.iter().map(|&c| column(c)).collect(),
                Arc::clone(&target),
                partitions,
            )?
            .with_backend(backend),
        )
    } else {
        // The join emits the columns the other conjuncts and the output need; a filter with
        // the join's projection does the rest.
        let residual = conjunction(residual);
        let mut needed: Vec<usize> = collect_columns(&residual)
            .iter()
            .map(|c| c.index())
            .chain(output.iter().copied())
            .collect();
        needed.sort_unstable();
        needed.dedup();
        let fields: Vec<FieldRef> = needed
            .iter()
            .map(|&c| Arc::clone(&join_schema.fields()[c]))
            .collect();
        let schema = Arc::new(Schema::new_with_metadata(
            fields,
            join_schema.metadata().clone(),
        ));
        let join = SimilarityJoinExec::try_with_columns(
            left_input,
            right_input,
            similarity.threshold,
            needed.iter().map(|&c| column(c)).collect(),
            schema,
            partitions,
        )?
        .with_backend(backend);
        let position = |c: usize| needed.binary_search(&c).unwrap_or(usize::MAX);
        let residual = residual
            .transform(|e| {
                Ok(match e.downcast_ref::<Column>() {
                    Some(c) => {
                        Transformed::yes(Arc::new(Column::new(c.name(), position(c.index())))
                            as Arc<dyn PhysicalExpr>)
                    }
                    None => Transformed::no(e),
                })
            })
            .data()?;
        Arc::new(
            FilterExecBuilder::new(residual, Arc::new(join))
                .apply_projection(Some(output.iter().map(|&c| position(c)).collect()))?
                .build()?,
        )
    };
    if new.schema().as_ref() != target.as_ref() {
        log::debug!(
            "{SIMILARITY_JOIN_REWRITE}: schema {} differs from the join's {target}",
            new.schema()
        );
        return Ok(None);
    }
    Ok(Some(new))
}

/// A self-join the exec can run in its self-join mode: both inputs scan the same data, the
/// measure compares a column with itself, and a conjunct orders the pair by an integer column
/// (`left.id < right.id`, or `>`: `flipped`).
struct SelfJoin {
    /// The one input, with the columns of both join inputs.
    input: SharedInput,
    /// The id and tokens columns, in `input.plan`.
    id: usize,
    tokens: usize,
    flipped: bool,
    /// Index of the id conjunct in the residual conjuncts.
    conjunct: usize,
}

fn self_join(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    similarity: &SimilarityPredicate,
    residual: &[Arc<dyn PhysicalExpr>],
    nl: usize,
) -> Option<SelfJoin> {
    let mut input = shared_input(left, right)?;
    // The measure compares one column, or one expression, with itself.
    let tokens = shared_tokens(&mut input, &similarity.args, nl)?;
    let schema = input.plan.schema();
    residual.iter().enumerate().find_map(|(k, conjunct)| {
        let b = conjunct.downcast_ref::<BinaryExpr>()?;
        let x = b.left().downcast_ref::<Column>()?.index();
        let y = b.right().downcast_ref::<Column>()?.index();
        let (id_left, id_right, op) = if x < nl && y >= nl {
            (x, y - nl, *b.op())
        } else if y < nl && x >= nl {
            (y, x - nl, b.op().swap()?)
        } else {
            return None;
        };
        // Integers: SQL's `<` is the order the exec orients pairs by (NULLs never paired).
        let id = input.left[id_left];
        if input.right[id_right] != id || !schema.field(id).data_type().is_integer() {
            return None;
        }
        let flipped = match op {
            Operator::Lt => false,
            Operator::Gt => true,
            _ => return None,
        };
        Some(SelfJoin {
            input: input.clone(),
            id,
            tokens,
            flipped,
            conjunct: k,
        })
    })
}

/// The column of `input.plan` that both of the measure's arguments are: the same column of
/// the shared input, or the same deterministic expression over it (`jaccard(tokenize(a.t),
/// tokenize(b.t))`), then appended to `input.plan` as a column, so it is computed once for
/// both sides.
fn shared_tokens(
    input: &mut SharedInput,
    args: &[Arc<dyn PhysicalExpr>; 2],
    nl: usize,
) -> Option<usize> {
    let schema = input.plan.schema();
    // An argument over one side's columns, rewritten over the shared input's.
    let on_input = |arg: &Arc<dyn PhysicalExpr>, offset: usize, at: &[usize]| {
        let mut foreign = false;
        let expr = Arc::clone(arg)
            .transform(|e| {
                Ok(match e.downcast_ref::<Column>() {
                    Some(c) => match c.index().checked_sub(offset).and_then(|i| at.get(i)) {
                        Some(&i) => {
                            Transformed::yes(Arc::new(Column::new(schema.field(i).name(), i))
                                as Arc<dyn PhysicalExpr>)
                        }
                        None => {
                            foreign = true;
                            Transformed::no(e)
                        }
                    },
                    None => Transformed::no(e),
                })
            })
            .data()
            .ok()?;
        (!foreign).then_some(expr)
    };
    let l = on_input(&args[0], 0, &input.left)?;
    let r = on_input(&args[1], nl, &input.right)?;
    if !l.eq(&r) {
        return None;
    }
    if let Some(c) = l.downcast_ref::<Column>() {
        return Some(c.index());
    }
    if is_volatile(&l) {
        return None;
    }
    let (plan, tokens) = with_column(&input.plan, l).ok()?;
    input.plan = plan;
    Some(tokens)
}

/// A self-join's one input: `plan` produces the rows of both join inputs and has the columns
/// of each: the left input's column `i` is `plan`'s column `left[i]`, the right's `j` is
/// `right[j]`.
#[derive(Clone)]
struct SharedInput {
    plan: Arc<dyn ExecutionPlan>,
    left: Vec<usize>,
    right: Vec<usize>,
}

/// The input both `a` and `b` can be read from: either, when they produce the same rows with
/// the same columns ([`same_data`]); else the one whose scan has every column of the other's,
/// when the two scans differ only in the columns they read ([`covered`]).
fn shared_input(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> Option<SharedInput> {
    let all = |p: &Arc<dyn ExecutionPlan>| (0..p.schema().fields().len()).collect::<Vec<_>>();
    if same_data(a, b) {
        return Some(SharedInput {
            plan: Arc::clone(a),
            left: all(a),
            right: all(b),
        });
    }
    if let Some(at) = covered(a, b) {
        return Some(SharedInput {
            plan: Arc::clone(a),
            left: all(a),
            right: at,
        });
    }
    let at = covered(b, a)?;
    Some(SharedInput {
        plan: Arc::clone(b),
        left: at,
        right: all(b),
    })
}

/// When `wide` and `narrow` are scans alike but for the columns they read (the same
/// in-memory batches, or the same files: [`same_batches`], [`same_files`]) and each of
/// `narrow`'s columns is one of `wide`'s (the same field, read by an equal deterministic
/// expression): the position in `wide` of each of `narrow`'s columns.
fn covered(wide: &Arc<dyn ExecutionPlan>, narrow: &Arc<dyn ExecutionPlan>) -> Option<Vec<usize>> {
    let (sw, sn) = (
        wide.downcast_ref::<DataSourceExec>()?.data_source(),
        narrow.downcast_ref::<DataSourceExec>()?.data_source(),
    );
    let at: Vec<usize> = if let (Some(mw), Some(mn)) = (
        sw.downcast_ref::<MemorySourceConfig>(),
        sn.downcast_ref::<MemorySourceConfig>(),
    ) {
        if !same_batches(mw, mn, false) {
            return None;
        }
        let read = |m: &MemorySourceConfig, p: &Arc<dyn ExecutionPlan>| {
            m.projection()
                .clone()
                .unwrap_or_else(|| (0..p.schema().fields().len()).collect())
        };
        let (rw, rn) = (read(mw, wide), read(mn, narrow));
        rn.iter()
            .map(|c| rw.iter().position(|w| w == c))
            .collect::<Option<_>>()?
    } else if let (Some(fw), Some(fnarrow)) = (
        sw.downcast_ref::<FileScanConfig>(),
        sn.downcast_ref::<FileScanConfig>(),
    ) {
        if !same_files(fw, fnarrow, false) {
            return None;
        }
        let read = |f: &FileScanConfig| -> Vec<Arc<dyn PhysicalExpr>> {
            match f.file_source.projection() {
                Some(p) => p.expr_iter().collect(),
                None => {
                    let table = f.file_source.table_schema().table_schema();
                    (0..table.fields().len())
                        .map(|i| Arc::new(Column::new(table.field(i).name(), i)) as _)
                        .collect()
                }
            }
        };
        let (rw, rn) = (read(fw), read(fnarrow));
        if rw.iter().chain(&rn).any(is_volatile) {
            return None;
        }
        rn.iter()
            .map(|e| rw.iter().position(|w| w.eq(e)))
            .collect::<Option<_>>()?
    } else {
        return None;
    };
    let (schema_w, schema_n) = (wide.schema(), narrow.schema());
    at.iter()
        .enumerate()
        .all(|(j, &k)| schema_w.field(k) == schema_n.field(j))
        .then_some(at)
}

/// The input of one side: `plan` itself when the measure's argument is one of its columns,
/// else `plan` with the argument appended as a column. `offset`: the side's first index in
/// the join schema.
fn side_input(
    plan: &Arc<dyn ExecutionPlan>,
    arg: &Arc<dyn PhysicalExpr>,
    offset: usize,
) -> Result<Option<JoinInput>> {
    if let Some(c) = arg.downcast_ref::<Column>() {
        return Ok(Some(JoinInput::without_id(
            Arc::clone(plan),
            c.index() - offset,
        )));
    }
    if is_volatile(arg) {
        return Ok(None);
    }
    let arg = Arc::clone(arg)
        .transform(|e| {
            Ok(match e.downcast_ref::<Column>() {
                Some(c) => {
                    Transformed::yes(Arc::new(Column::new(c.name(), c.index() - offset))
                        as Arc<dyn PhysicalExpr>)
                }
                None => Transformed::no(e),
            })
        })
        .data()?;
    let (plan, tokens) = with_column(plan, arg)?;
    Ok(Some(JoinInput::without_id(plan, tokens)))
}

/// `plan` with `expr` appended as a column, and that column's index.
fn with_column(
    plan: &Arc<dyn ExecutionPlan>,
    expr: Arc<dyn PhysicalExpr>,
) -> Result<(Arc<dyn ExecutionPlan>, usize)> {
    let schema = plan.schema();
    let mut exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>,
                f.name().clone(),
            )
        })
        .collect();
    exprs.push((expr, TOKENS_COLUMN.to_string()));
    let tokens = exprs.len() - 1;
    let projected = ProjectionExec::try_new(exprs, Arc::clone(plan))?;
    Ok((Arc::new(projected), tokens))
}

/// `conjunct` as a similarity predicate the join computes exactly, if it is one.
fn similarity_predicate(
    conjunct: &Arc<dyn PhysicalExpr>,
    nl: usize,
) -> Option<SimilarityPredicate> {
    let b = conjunct.downcast_ref::<BinaryExpr>()?;
    let (measured, literal, op) = if b.right().downcast_ref::<Literal>().is_some() {
        (b.left(), b.right(), *b.op())
    } else if b.left().downcast_ref::<Literal>().is_some() {
        (b.right(), b.left(), b.op().swap()?)
    } else {
        return None;
    };
    let cmp = match op {
        Operator::GtEq => Comparison::GtEq,
        Operator::Gt => Comparison::Gt,
        _ => return None,
    };
    // The measure, possibly cast to the comparison's type.
    let (call, compared_as) = if let Some(c) = measured.downcast_ref::<CastExpr>() {
        (c.expr(), Some(c.cast_type().clone()))
    } else if let Some(c) = measured.downcast_ref::<TryCastExpr>() {
        (c.expr(), Some(c.cast_type().clone()))
    } else {
        (measured, None)
    };
    let call = call.downcast_ref::<ScalarFunctionExpr>()?;
    let measure = measure_of(call)?;
    let returns = measure.return_type();
    let compared_as = compared_as.unwrap_or_else(|| returns.clone());
    // Comparisons whose outcome is exactly that of `score <cmp> t` in f64, as the join
    // decides it: Float64 scores compared as Float64; overlap counts compared as UInt64,
    // Int64 (exact for any count) or Float64 (the join's own `o as f64`).
    let exact = matches!(
        (&returns, &compared_as),
        (DataType::Float64, DataType::Float64)
            | (
                DataType::UInt64,
                DataType::UInt64 | DataType::Int64 | DataType::Float64
            )
    );
    if !exact {
        return None;
    }
    let value = literal_value(literal.downcast_ref::<Literal>()?.value(), &compared_as)?;
    let threshold = Threshold::try_new(measure, value, cmp, SIMILARITY_JOIN_REWRITE).ok()?;
    let [a, b] = call.args() else {
        return None;
    };
    let args = match (side_of(a, nl)?, side_of(b, nl)?) {
        (JoinSide::Left, JoinSide::Right) => [Arc::clone(a), Arc::clone(b)],
        // Every measure is symmetric (and so is the arguments' coercion).
        (JoinSide::Right, JoinSide::Left) => [Arc::clone(b), Arc::clone(a)],
        _ => return None,
    };
    Some(SimilarityPredicate { threshold, args })
}

/// Which of our measures `call` computes (`None` for any other function, including a
/// different UDF of the same name).
fn measure_of(call: &ScalarFunctionExpr) -> Option<Measure> {
    let f = call.fun().inner();
    if f.is::<Jaccard>() {
        Some(Measure::Jaccard)
    } else if f.is::<Cosine>() {
        Some(Measure::Cosine)
    } else if f.is::<Dice>() {
        Some(Measure::Dice)
    } else if f.is::<Overlap>() {
        Some(Measure::Overlap)
    } else {
        None
    }
}

/// The literal as the `f64` the join compares scores with, when that comparison is the
/// literal's own: a non-NULL value of the compared type; integers up to 2^53 (exact in f64).
fn literal_value(value: &ScalarValue, compared_as: &DataType) -> Option<f64> {
    const EXACT: u64 = 1 << 53;
    if &value.data_type() != compared_as {
        return None;
    }
    match value {
        ScalarValue::Float64(Some(v)) => Some(*v),
        ScalarValue::UInt64(Some(v)) if *v <= EXACT => Some(*v as f64),
        ScalarValue::Int64(Some(v)) if v.unsigned_abs() <= EXACT => Some(*v as f64),
        _ => None,
    }
}

/// The input an expression reads (`None`: both, or none).
fn side_of(expr: &Arc<dyn PhysicalExpr>, nl: usize) -> Option<JoinSide> {
    let columns = collect_columns(expr);
    if columns.is_empty() {
        None
    } else if columns.iter().all(|c| c.index() < nl) {
        Some(JoinSide::Left)
    } else if columns.iter().all(|c| c.index() >= nl) {
        Some(JoinSide::Right)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field};
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::FileScanConfigBuilder;
    use datafusion::datasource::physical_plan::ParquetSource;
    use datafusion::datasource::physical_plan::parquet::{
        DefaultParquetFileReaderFactory, ParquetAccessPlan, ParquetFileReaderFactory,
    };
    use datafusion::physical_plan::repartition::RepartitionExec;

    use crate::io::parquet_split::tests::CustomFactory;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::physical_expr::expressions::lit;
    use datafusion::physical_plan::expressions::BinaryExpr;

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new(
                "tokens",
                DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
                true,
            ),
            Field::new("extra", DataType::Utf8, true),
        ]))
    }

    /// What a scan is built from; each test changes one thing.
    #[derive(Clone)]
    struct Scan {
        files: Vec<(&'static str, u64, u64)>,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
        factory: Option<Arc<dyn ParquetFileReaderFactory>>,
        /// Whether the first file carries an access plan (which rows of it to read).
        access_plan: bool,
    }

    fn base() -> Scan {
        Scan {
            files: vec![("data/a.parquet", 1000, 10), ("data/b.parquet", 2000, 20)],
            projection: Some(vec![0, 1]),
            limit: None,
            predicate: None,
            factory: None,
            access_plan: false,
        }
    }

    fn exec(scan: &Scan) -> Arc<dyn ExecutionPlan> {
        let mut source = ParquetSource::new(schema());
        if let Some(p) = &scan.predicate {
            source = source.with_predicate(Arc::clone(p));
        }
        if let Some(f) = &scan.factory {
            source = source.with_parquet_file_reader_factory(Arc::clone(f));
        }
        let mut builder =
            FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
                .with_limit(scan.limit)
                .with_projection_indices(scan.projection.clone())
                .expect("a projection");
        for (i, &(path, size, seconds)) in scan.files.iter().enumerate() {
            let mut file = PartitionedFile::new(path, size);
            file.object_meta.last_modified += std::time::Duration::from_secs(seconds);
            if scan.access_plan && i == 0 {
                file = file.with_extension(ParquetAccessPlan::new_all(1));
            }
            builder = builder.with_file(file);
        }
        DataSourceExec::from_data_source(builder.build())
    }

    fn id_below(n: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(
            Arc::new(Column::new("id", 0)),
            Operator::Lt,
            lit(n),
        ))
    }

    #[test]
    fn file_scans_are_the_same_data_only_when_every_part_matches() {
        let same = |a: &Scan, b: &Scan| same_data(&exec(a), &exec(b));
        let b = base();
        assert!(same(&b, &b), "two scans built alike");
        let with_predicate = Scan {
            predicate: Some(id_below(5)),
            ..base()
        };
        assert!(same(&with_predicate, &with_predicate), "equal predicates");

        let mut other_mtime = base();
        other_mtime.files[1].2 = 21;
        let mut other_size = base();
        other_size.files[0].1 = 1001;
        let mut other_path = base();
        other_path.files[0].0 = "data/c.parquet";
        let mut fewer_files = base();
        fewer_files.files.pop();
        let differing = [
            ("another modification time", other_mtime),
            ("another size", other_size),
            ("another file", other_path),
            ("fewer files", fewer_files),
            (
                "another projection",
                Scan {
                    projection: Some(vec![0, 2]),
                    ..base()
                },
            ),
            (
                "a limit",
                Scan {
                    limit: Some(10),
                    ..base()
                },
            ),
            ("a predicate", with_predicate.clone()),
        ];
        for (what, other) in &differing {
            assert!(!same(&b, other), "{what}");
            assert!(!same(other, &b), "{what}, reversed");
        }
        let other_predicate = Scan {
            predicate: Some(id_below(6)),
            ..base()
        };
        assert!(!same(&with_predicate, &other_predicate), "other predicates");
        let limited = Scan {
            limit: Some(10),
            ..base()
        };
        assert!(!same(&limited, &limited), "a limit on both sides");
        let volatile = Scan {
            predicate: Some(random_below_half()),
            ..base()
        };
        assert!(!same(&volatile, &volatile), "a volatile predicate");

        // Reader factories: DataFusion's own or the same one on both sides.
        let store = Arc::new(datafusion::object_store::local::LocalFileSystem::new());
        let own = || -> Arc<dyn ParquetFileReaderFactory> {
            Arc::new(DefaultParquetFileReaderFactory::new(store.clone()))
        };
        let custom = || -> Arc<dyn ParquetFileReaderFactory> {
            Arc::new(CustomFactory(DefaultParquetFileReaderFactory::new(
                store.clone(),
            )))
        };
        let with = |f: Option<Arc<dyn ParquetFileReaderFactory>>| Scan {
            factory: f,
            ..base()
        };
        assert!(same(&with(Some(own())), &b), "DataFusion's factory or none");
        assert!(same(&with(Some(own())), &with(Some(own()))));
        let one = custom();
        assert!(
            same(&with(Some(Arc::clone(&one))), &with(Some(one))),
            "one custom factory"
        );
        assert!(
            !same(&with(Some(custom())), &with(Some(custom()))),
            "two custom factories"
        );
        assert!(
            !same(&with(Some(custom())), &b),
            "a custom factory on one side"
        );
        assert!(!same(&b, &with(Some(custom()))), "the same, reversed");
        // A file read through an access plan (some of its rows).
        let planned = Scan {
            access_plan: true,
            ..base()
        };
        assert!(!same(&planned, &planned), "an access plan");
        assert!(!same(&b, &planned), "an access plan on one side");
        assert!(!same(&planned, &b), "the same, reversed");
    }

    /// `random() < 0.5`: each scan keeps other rows.
    fn random_below_half() -> Arc<dyn PhysicalExpr> {
        let random = ScalarFunctionExpr::try_new(
            datafusion::functions::math::random(),
            vec![],
            &schema(),
            Arc::new(ConfigOptions::default()),
        )
        .expect("random()");
        Arc::new(BinaryExpr::new(Arc::new(random), Operator::Lt, lit(0.5)))
    }

    #[test]
    fn a_scan_reading_more_columns_covers_the_other() {
        let cols = |p: Vec<usize>| Scan {
            projection: Some(p),
            ..base()
        };
        let (wide, narrow) = (exec(&cols(vec![2, 0, 1])), exec(&cols(vec![1, 0])));
        // narrow's tokens (table column 1) and id (0) are wide's columns 2 and 1.
        assert_eq!(covered(&wide, &narrow), Some(vec![2, 1]));
        assert_eq!(covered(&narrow, &wide), None, "extra is not read by narrow");
        let all = exec(&Scan {
            projection: None,
            ..base()
        });
        assert_eq!(covered(&all, &narrow), Some(vec![1, 0]));
        let shared = shared_input(&narrow, &wide).expect("one scan serves both");
        assert!(Arc::ptr_eq(&shared.plan, &wide));
        assert_eq!((shared.left, shared.right), (vec![2, 1], vec![0, 1, 2]));
        // Other files, or a predicate on one side: not the same rows.
        let mut other = cols(vec![1, 0]);
        other.files[0].2 = 11;
        assert_eq!(covered(&wide, &exec(&other)), None);
        let filtered = Scan {
            predicate: Some(id_below(5)),
            ..cols(vec![1, 0])
        };
        assert_eq!(covered(&wide, &exec(&filtered)), None);
        assert!(shared_input(&wide, &exec(&filtered)).is_none());
    }

    #[test]
    fn projections_and_filters_over_the_same_data() {
        let scan = exec(&base());
        let other = exec(&Scan {
            files: vec![("data/a.parquet", 1000, 10)],
            ..base()
        });
        let filter = |input: &Arc<dyn ExecutionPlan>, n: i64| -> Arc<dyn ExecutionPlan> {
            Arc::new(FilterExec::try_new(id_below(n), Arc::clone(input)).expect("a filter"))
        };
        let project = |input: &Arc<dyn ExecutionPlan>, e: Arc<dyn PhysicalExpr>| {
            let exprs = vec![
                (
                    Arc::new(Column::new("tokens", 1)) as Arc<dyn PhysicalExpr>,
                    "t".into(),
                ),
                (e, "x".to_string()),
            ];
            Arc::new(ProjectionExec::try_new(exprs, Arc::clone(input)).expect("a projection"))
                as Arc<dyn ExecutionPlan>
        };
        assert!(same_data(&filter(&scan, 5), &filter(&exec(&base()), 5)));
        let spread = |input: &Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                RepartitionExec::try_new(
                    Arc::clone(input),
                    datafusion::physical_plan::Partitioning::RoundRobinBatch(4),
                )
                .expect("a repartition"),
            )
        };
        assert!(same_data(
            &filter(&spread(&scan), 5),
            &filter(&spread(&exec(&base())), 5)
        ));
        assert!(!same_data(&spread(&scan), &spread(&other)));
        assert!(!same_data(&spread(&scan), &exec(&base())));
        assert!(!same_data(&filter(&scan, 5), &filter(&scan, 6)));
        assert!(!same_data(&filter(&scan, 5), &filter(&other, 5)));
        assert!(!same_data(&filter(&scan, 5), &scan));
        let id: Arc<dyn PhysicalExpr> = Arc::new(Column::new("id", 0));
        assert!(same_data(
            &project(&scan, Arc::clone(&id)),
            &project(&exec(&base()), Arc::clone(&id))
        ));
        assert!(!same_data(
            &project(&scan, Arc::clone(&id)),
            &project(&scan, lit(1i64))
        ));
        assert!(!same_data(
            &project(&scan, Arc::clone(&id)),
            &project(&other, Arc::clone(&id))
        ));
        let random = random_below_half();
        assert!(!same_data(
            &project(&scan, Arc::clone(&random)),
            &project(&scan, Arc::clone(&random))
        ));
        // One node shared by both sides: the same rows unless something below it is volatile
        // or limited (then each side's execution may keep other rows).
        let shared = project(&filter(&spread(&scan), 5), Arc::clone(&id));
        assert!(same_data(&shared, &shared));
        let shared = project(&filter(&scan, 5), Arc::clone(&random));
        assert!(!same_data(&shared, &shared), "a volatile expression");
        let shared = spread(&project(&scan, random));
        assert!(!same_data(&shared, &shared), "a volatile expression below");
        let limited = exec(&Scan {
            limit: Some(10),
            ..base()
        });
        let shared = filter(&spread(&limited), 5);
        assert!(!same_data(&shared, &shared), "a limit below");
    }
}
