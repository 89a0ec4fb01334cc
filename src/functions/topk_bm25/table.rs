//! `topk_bm25(...)` as a table function: one ad hoc query, one row per ranked document.
//!
//! ```sql
//! SELECT * FROM topk_bm25('idx', 'white house', 10);           -- OR (default)
//! SELECT * FROM topk_bm25('idx', 'white house', 10, 'and');    -- 'and', 'or', 'and_or'
//! ```
//!
//! Columns: `rank` (UInt32, from 1), `doc_id` (UInt32), `score` (Float64), best first, ties
//! by increasing `doc_id`. The scalar function of the same name ranks a column of queries.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

use crate::config::SetsConfig;
use crate::functions::args::{int_arg, string_arg};
use crate::search::loaded::load_index;
use crate::search::rank::rank_one;
use crate::search::scoring::Bm25Params;
use crate::search::tokenize::Tokenizer;
use crate::search::topk::Mode;

/// The SQL name (of this table function and of the scalar function).
pub const TOPK_BM25: &str = "topk_bm25";

/// Check a `k` argument: 1 ..= 2^32 - 1.
pub fn check_k(k: i64, arg: usize) -> Result<usize> {
    if k < 1 || k > u32::MAX as i64 {
        return plan_err!(
            "{TOPK_BM25}: argument {arg} (k) must be between 1 and 4294967295, got {k}"
        );
    }
    Ok(k as usize)
}

/// Parse a mode argument.
pub fn check_mode(mode: &str, arg: usize) -> Result<Mode> {
    match Mode::from_name(mode) {
        Some(m) => Ok(m),
        None => plan_err!(
            "{TOPK_BM25}: argument {arg} (mode) must be 'and', 'or' or 'and_or', got '{mode}'"
        ),
    }
}

/// BM25 parameters from the session's `sets.bm25_*` options.
pub fn params_of(options: &datafusion::config::ConfigOptions) -> Bm25Params {
    let c = SetsConfig::from_options(options);
    Bm25Params {
        k1: c.bm25_k1,
        b: c.bm25_b,
        alpha: c.bm25_alpha,
    }
}

/// The `topk_bm25` table function.
#[derive(Debug, Default)]
pub struct TopkBm25Function;

impl TableFunctionImpl for TopkBm25Function {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if !(3..=4).contains(&exprs.len()) {
            return plan_err!(
                "{TOPK_BM25}: expected 3 or 4 arguments, got {}; usage: {TOPK_BM25}('index_table', 'query text', k [, 'and' | 'or' | 'and_or'])",
                exprs.len()
            );
        }
        let table = string_arg(TOPK_BM25, exprs, 0, "index table")?;
        let query = string_arg(TOPK_BM25, exprs, 1, "query")?;
        let k = check_k(int_arg(TOPK_BM25, exprs, 2, "k")?, 3)?;
        let mode = match exprs.len() {
            4 => check_mode(&string_arg(TOPK_BM25, exprs, 3, "mode")?, 4)?,
            _ => Mode::Or,
        };
        Ok(Arc::new(TopkTable {
            table,
            query,
            k,
            mode,
            schema: Arc::new(Schema::new(vec![
                Field::new("rank", DataType::UInt32, false),
                Field::new("doc_id", DataType::UInt32, false),
                Field::new("score", DataType::Float64, false),
            ])),
        }))
    }
}

#[derive(Debug)]
struct TopkTable {
    table: String,
    query: String,
    k: usize,
    mode: Mode,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for TopkTable {
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
        let loaded = load_index(state, &self.table, TOPK_BM25, 1).await?;
        let scored = loaded.scored(params_of(state.config_options()))?;
        let mut tok = Tokenizer::new(loaded.index.tokenizer());
        let hits = rank_one(&loaded, &scored, &mut tok, &self.query, self.k, self.mode);
        let batch = RecordBatch::try_new(
            Arc::clone(&self.schema),
            vec![
                Arc::new(UInt32Array::from_iter_values(1..=hits.len() as u32)),
                Arc::new(UInt32Array::from_iter_values(hits.iter().map(|h| h.doc))),
                Arc::new(Float64Array::from_iter_values(hits.iter().map(|h| h.score))),
            ],
        )?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Arc::clone(&self.schema),
            projection.cloned(),
        )?)
    }
}
