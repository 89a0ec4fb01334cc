//! Embedding datafusion-sets in a Rust program: `cargo run --example embed`.
//!
//! Builds a session with the crate installed, registers an in-memory postings table of
//! `list<uint32>` and runs a conjunctive query through SQL and through the `Expr` API.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ListArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt32Type};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionContext, col, lit};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::expr_fn::list_intersect_agg;

#[tokio::main]
async fn main() -> Result<()> {
    // One call installs the functions and the `sets.*` options.
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_sets()
        .build();
    let ctx = SessionContext::new_with_state(state);

    let terms = StringArray::from(vec!["arrow", "gpu", "set", "simd"]);
    let doc_ids = ListArray::from_iter_primitive::<UInt32Type, _, _>(vec![
        Some(vec![Some(1), Some(4), Some(9), Some(12), Some(30)]),
        Some(vec![Some(4), Some(7), Some(12)]),
        Some(vec![Some(2), Some(4), Some(9), Some(12)]),
        Some(vec![Some(4), Some(12), Some(31)]),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("term", DataType::Utf8, false),
        Field::new("doc_ids", doc_ids.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(terms), Arc::new(doc_ids)])?;
    ctx.register_batch("postings", batch)?;

    // SQL: documents containing every query term.
    ctx.sql("SET sets.backend = 'auto'").await?;
    ctx.sql("SELECT list_intersect_agg(doc_ids) AS docs FROM postings WHERE term IN ('arrow', 'set', 'simd')")
        .await?
        .show()
        .await?;

    // The same through the DataFrame API.
    ctx.table("postings")
        .await?
        .filter(col("term").in_list(vec![lit("gpu"), lit("set")], false))?
        .aggregate(
            vec![],
            vec![list_intersect_agg(col("doc_ids")).alias("docs")],
        )?
        .show()
        .await?;
    Ok(())
}
