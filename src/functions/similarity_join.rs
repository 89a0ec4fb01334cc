//! `similarity_join(...)`: the set similarity join as a table function.
//!
//! ```sql
//! -- R-S join: every (r, s) with jaccard(r.tokens, s.tokens) >= 0.8
//! SELECT * FROM similarity_join('r', 'id', 'tokens', 's', 'id', 'tokens', 'jaccard', 0.8);
//! -- self-join: every pair of rows x, y of r with x.id < y.id and cosine >= 0.9
//! SELECT * FROM similarity_join('r', 'id', 'tokens', 'cosine', 0.9);
//! -- strict comparison: an optional last argument, '>=' (default) or '>'
//! SELECT * FROM similarity_join('r', 'id', 'tokens', 'dice', 0.5, '>');
//! ```
//!
//! Arguments: table names (resolved in the session's catalog, `schema.table` allowed), id
//! and token column names (string literals; a token column is a list of integers of any
//! width or of strings, and equal strings are equal tokens), the function (`jaccard`, `cosine`, `dice`,
//! `overlap`, case-insensitive) and the threshold (a numeric literal: in `(0, 1]` for the
//! normalized measures, `> 0` for `overlap`; `0` too with `'>'`). Result columns: `left_id`,
//! `right_id` (the id columns' types) and `similarity` (`Float64`; `UInt64` for `overlap`),
//! exactly the value of the SQL function of the same name.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

use crate::catalog::resolve_table;
use crate::config::SetsConfig;
use crate::functions::args::{literal, string_arg};
use crate::intersect::lists::list_element_type;
use crate::intersect::similarity::Measure;
use crate::intersect::strings::is_string_type;
use crate::join::exec::{JoinInput, SimilarityJoinExec, output_schema};
use crate::join::threshold::{Comparison, Threshold};

/// The table function's SQL name.
pub const SIMILARITY_JOIN: &str = "similarity_join";

const USAGE: &str = "similarity_join('r', 'r_id', 'r_tokens', 's', 's_id', 's_tokens', 'jaccard', 0.8 [, '>=' | '>']) or similarity_join('r', 'id', 'tokens', 'jaccard', 0.8 [, '>=' | '>'])";

/// The `similarity_join` table function (see the module docs).
#[derive(Debug, Default)]
pub struct SimilarityJoinFunction;

impl TableFunctionImpl for SimilarityJoinFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let session = args.session();
        let (right_at, measure_at) = match exprs.len() {
            5 | 6 => (None, 3),
            8 | 9 => (Some(3), 6),
            n => {
                return plan_err!(
                    "{SIMILARITY_JOIN}: expected 5, 6, 8 or 9 arguments, got {n}; usage: {USAGE}"
                );
            }
        };
        let left = side(session, exprs, 0)?;
        let right = right_at.map(|at| side(session, exprs, at)).transpose()?;
        let name = string_arg(SIMILARITY_JOIN, exprs, measure_at, "function")?;
        let Some(measure) = Measure::from_name(&name) else {
            return plan_err!(
                "{SIMILARITY_JOIN}: argument {} (function): unknown similarity function '{name}', expected one of jaccard, cosine, dice, overlap",
                measure_at + 1
            );
        };
        let value = threshold_arg(exprs, measure_at + 1)?;
        let cmp = match exprs.get(measure_at + 2) {
            None => Comparison::GtEq,
            Some(_) => {
                let op = string_arg(SIMILARITY_JOIN, exprs, measure_at + 2, "comparison")?;
                Comparison::from_op(&op).ok_or_else(|| {
                    plan_datafusion_err!(
                        "{SIMILARITY_JOIN}: argument {} (comparison): expected '>=' or '>', got '{op}'",
                        measure_at + 3
                    )
                })?
            }
        };
        let threshold = Threshold::try_new(
            measure,
            value,
            cmp,
            &format!("{SIMILARITY_JOIN}: argument {} (threshold)", measure_at + 2),
        )?;
        let right_id = right.as_ref().unwrap_or(&left).id_type();
        let schema = Arc::new(output_schema(&left.id_type(), &right_id, measure));
        Ok(Arc::new(SimilarityJoinTable {
            left,
            right,
            threshold,
            schema,
        }))
    }
}

/// One input: a resolved table and its two columns.
#[derive(Debug, Clone)]
struct Side {
    table: Arc<dyn TableProvider>,
    id: usize,
    tokens: usize,
}

impl Side {
    fn id_type(&self) -> DataType {
        self.table.schema().field(self.id).data_type().clone()
    }

    /// The side's scan: its id and token columns, or (`with_id` false) its token column only.
    async fn plan(&self, state: &dyn Session, with_id: bool) -> Result<JoinInput> {
        let projection = match with_id && self.id != self.tokens {
            true => vec![self.id, self.tokens],
            false => vec![self.tokens],
        };
        let plan = self.table.scan(state, Some(&projection), &[], None).await?;
        let tokens = projection.len() - 1;
        Ok(match with_id {
            true => JoinInput::new(plan, 0, tokens),
            false => JoinInput::without_id(plan, tokens),
        })
    }
}

/// Arguments `at`, `at + 1`, `at + 2`: table, id column, token column.
fn side(session: &dyn Session, exprs: &[Expr], at: usize) -> Result<Side> {
    let table_name = string_arg(SIMILARITY_JOIN, exprs, at, "table")?;
    let table = resolve_table(SIMILARITY_JOIN, session, &table_name, at + 1)?;
    let schema = table.schema();
    let column = |k: usize, what: &str| -> Result<usize> {
        let name = string_arg(SIMILARITY_JOIN, exprs, k, what)?;
        schema.index_of(&name).map_err(|_| {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            plan_datafusion_err!(
                "{SIMILARITY_JOIN}: argument {} ({what}): column '{name}' not found in table '{table_name}' (columns: {})",
                k + 1,
                names.join(", ")
            )
        })
    };
    let id = column(at + 1, "id column")?;
    let tokens = column(at + 2, "tokens column")?;
    let field = schema.field(tokens);
    match list_element_type(field.data_type()) {
        Some(e) if e.is_integer() || e.is_null() || is_string_type(e) => {}
        _ => {
            return plan_err!(
                "{SIMILARITY_JOIN}: argument {} (tokens column): column '{}' of '{table_name}' must be a list of integers or strings (List, LargeList or FixedSizeList), got {}",
                at + 3,
                field.name(),
                field.data_type()
            );
        }
    }
    Ok(Side { table, id, tokens })
}

fn threshold_arg(exprs: &[Expr], k: usize) -> Result<f64> {
    let n = k + 1;
    let shown = exprs.get(k).map(|e| e.to_string()).unwrap_or_default();
    match exprs.get(k).and_then(literal) {
        Some(v) if v.is_null() => {
            plan_err!("{SIMILARITY_JOIN}: argument {n} (threshold) must not be NULL")
        }
        Some(v) if v.data_type().is_numeric() => match v.cast_to(&DataType::Float64) {
            Ok(ScalarValue::Float64(Some(f))) => Ok(f),
            _ => plan_err!(
                "{SIMILARITY_JOIN}: argument {n} (threshold): cannot read {shown} as a number"
            ),
        },
        _ => plan_err!(
            "{SIMILARITY_JOIN}: argument {n} (threshold) must be a numeric literal, got {shown}"
        ),
    }
}

/// The table a `similarity_join(...)` call stands for.
#[derive(Debug)]
struct SimilarityJoinTable {
    left: Side,
    right: Option<Side>,
    threshold: Threshold,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for SimilarityJoinTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // An R-S join reads a side's id column only when the output keeps it (`count(*)`
        // reads the token columns alone); a self-join orients its pairs by id.
        let kept = |i: usize| projection.is_none_or(|p| p.contains(&i));
        let self_join = self.right.is_none();
        let left = self.left.plan(state, self_join || kept(0)).await?;
        let right = match &self.right {
            Some(r) => Some(r.plan(state, kept(1)).await?),
            None => None,
        };
        let partitions = state.config().target_partitions();
        let backend = SetsConfig::from_options(state.config_options())?.backend;
        Ok(Arc::new(
            SimilarityJoinExec::try_new(
                left,
                right,
                self.threshold,
                projection.cloned(),
                partitions,
            )?
            .with_backend(backend),
        ))
    }
}
