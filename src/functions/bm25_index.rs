//! `bm25_index(...)`: build an inverted index from any table with an id and a text column.
//!
//! ```sql
//! CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text');
//! CREATE TABLE idx2 AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'stopwords=english, stem=english, static=rank');
//! COPY idx TO 'idx.parquet';   -- and later: CREATE EXTERNAL TABLE idx STORED AS PARQUET LOCATION 'idx.parquet';
//! ```
//!
//! Arguments: the table (`schema.table` allowed), the id column (any integer type, values in
//! `0..=4294967295`, distinct, not NULL), the text column (any string type; NULL text is an
//! empty document) and optional `key=value` options: the tokenizer's (`tokenizer=unicode|ascii`,
//! `fold=ascii|none`, `stopwords=<language>|none`, `stem=<language>|none`, `qgrams=N`,
//! `shingles=N`; see `search::tokenize`: the Unicode tokenizer unless `tokenizer=ascii`) and
//! `static=<column>` (a numeric column of static scores, e.g. PageRank; NULL counts as 0) and
//! `shards=N` (1 to 65,536: the documents split into N shards by a hash of their ids). The
//! result is the index table described in `index`, one row per term (per shard and term when
//! sharded, with the `shard` and `df` columns); its `tokenizer` column records the tokenizer
//! options in full, so `topk_bm25` tokenizes queries the same way.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

use crate::catalog::resolve_table;
use crate::config::{IndexDistributionChoice, SetsConfig, under_distributed};
use crate::functions::args::string_arg;
use crate::search::build::{Bm25IndexExec, Bm25MergeExec, Bm25PartsExec, by_term};
use crate::search::index::{index_schema, sharded_index_schema};
use crate::search::tokenize::TokenizerOptions;

/// The table function's SQL name.
pub const BM25_INDEX: &str = "bm25_index";

/// The `bm25_index` table function (see the module docs).
#[derive(Debug, Default)]
pub struct Bm25IndexFunction;

impl TableFunctionImpl for Bm25IndexFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let session = args.session();
        if !(3..=4).contains(&exprs.len()) {
            return plan_err!(
                "{BM25_INDEX}: expected 3 or 4 arguments, got {}; usage: {BM25_INDEX}('table', 'id_column', 'text_column' [, 'tokenizer=unicode, fold=ascii, stopwords=english, stem=english, static=column, shards=N'])",
                exprs.len()
            );
        }
        let name = string_arg(BM25_INDEX, exprs, 0, "table")?;
        let table = resolve_table(BM25_INDEX, session, &name, 1)?;
        let schema = table.schema();
        let column = |k: usize, what: &str| -> Result<(usize, DataType)> {
            let col = string_arg(BM25_INDEX, exprs, k, what)?;
            match schema.index_of(&col) {
                Ok(i) => Ok((i, schema.field(i).data_type().clone())),
                Err(_) => plan_err!(
                    "{BM25_INDEX}: argument {} ({what}): column '{col}' not found in table '{name}'",
                    k + 1
                ),
            }
        };
        let (id, id_type) = column(1, "id column")?;
        if !id_type.is_integer() {
            return plan_err!(
                "{BM25_INDEX}: argument 2 (id column): must be an integer column, got {id_type}"
            );
        }
        let (text, text_type) = column(2, "text column")?;
        if !matches!(
            text_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return plan_err!(
                "{BM25_INDEX}: argument 3 (text column): must be a string column, got {text_type}"
            );
        }
        let mut tokenizer_spec = Vec::new();
        let mut static_col = None;
        let mut shards = 0u32;
        let spec = match exprs.len() {
            4 => string_arg(BM25_INDEX, exprs, 3, "options")?,
            _ => String::new(),
        };
        {
            for part in spec
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
            {
                match part.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("static") => {
                        let v = v.trim();
                        let Ok(i) = schema.index_of(v) else {
                            return plan_err!(
                                "{BM25_INDEX}: argument 4 (options): static score column '{v}' not found in table '{name}'"
                            );
                        };
                        let t = schema.field(i).data_type();
                        if !t.is_numeric() {
                            return plan_err!(
                                "{BM25_INDEX}: argument 4 (options): static score column '{v}' must be numeric, got {t}"
                            );
                        }
                        static_col = Some(i);
                    }
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("shards") => {
                        shards = match v.trim().parse::<u32>() {
                            Ok(n @ 1..=65536) => n,
                            _ => {
                                return plan_err!(
                                    "{BM25_INDEX}: argument 4 (options): shards must be an integer from 1 to 65536, got '{}'",
                                    v.trim()
                                );
                            }
                        };
                    }
                    _ => tokenizer_spec.push(part),
                }
            }
        }
        let tokenizer = TokenizerOptions::parse_options(&tokenizer_spec.join(","), BM25_INDEX)?;
        Ok(Arc::new(Bm25IndexTable {
            source: table,
            columns: [Some(id), Some(text), static_col]
                .into_iter()
                .flatten()
                .collect(),
            tokenizer,
            shards,
            schema: match shards {
                0 => index_schema(static_col.is_some()),
                _ => sharded_index_schema(static_col.is_some()),
            },
        }))
    }
}

#[derive(Debug)]
struct Bm25IndexTable {
    source: Arc<dyn TableProvider>,
    /// id, text and (optional) static score columns of `source`.
    columns: Vec<usize>,
    tokenizer: TokenizerOptions,
    /// Shards of the index (0: unsharded).
    shards: u32,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for Bm25IndexTable {
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
        let input = self
            .source
            .scan(state, Some(&self.columns), &[], None)
            .await?;
        let with_static = self.columns.len() == 3;
        let options = state.config_options();
        let spread = match SetsConfig::from_options(options)?.bm25_index_distribution {
            // A sharded index is built in one task (the per-term merge writes unsharded rows).
            IndexDistributionChoice::Auto => under_distributed(options) && self.shards == 0,
            IndexDistributionChoice::Single => false,
            IndexDistributionChoice::Terms if self.shards > 0 => {
                return plan_err!(
                    "{BM25_INDEX}: a sharded index ('shards={}') is built in one task; set sets.bm25_index_distribution to 'single' or 'auto'",
                    self.shards
                );
            }
            IndexDistributionChoice::Terms => true,
        };
        let exec: Arc<dyn ExecutionPlan> = if spread {
            // Parts where the documents are read, merged per term after a hash exchange
            // (which EnsureRequirements adds), the merged partitions' sorted runs merged.
            let buckets =
                u32::try_from(options.execution.target_partitions.max(1)).unwrap_or(u32::MAX);
            let parts = Bm25PartsExec::try_new(input, self.tokenizer, with_static, buckets)?;
            let merge = Bm25MergeExec::try_new(Arc::new(parts), self.tokenizer, with_static)?;
            Arc::new(SortPreservingMergeExec::new(by_term(), Arc::new(merge)))
        } else {
            Arc::new(Bm25IndexExec::new(
                input,
                self.tokenizer,
                with_static,
                self.shards,
            ))
        };
        match projection {
            Some(p)
                if p.len() != self.schema.fields().len()
                    || p.iter().enumerate().any(|(i, &c)| i != c) =>
            {
                let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = p
                    .iter()
                    .map(|&i| {
                        let f = self.schema.field(i);
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(
                                f.name(),
                                i,
                            )) as _,
                            f.name().clone(),
                        )
                    })
                    .collect();
                Ok(Arc::new(ProjectionExec::try_new(exprs, exec)?))
            }
            _ => Ok(exec),
        }
    }
}
