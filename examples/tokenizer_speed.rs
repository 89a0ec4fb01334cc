//! `bm25_index` with the ASCII and the Unicode tokenizer side by side, in one process, on
//! gcide (and, when built, Debian's translated descriptions):
//!
//! ```sh
//! cargo run --release --no-default-features --features cuda --example tokenizer_speed
//! ```
//!
//! For each options string, `CREATE OR REPLACE TABLE idx AS SELECT * FROM bm25_index('docs',
//! 'doc_id', 'text', options)` over the documents held in memory (a `MemTable`, so no Parquet
//! decoding is timed), on every core, alternating between the tokenizers run by run; then the
//! tokenizer alone on one core (`Tokenizer::for_each_term` over every document). Medians of
//! `SETS_SPEED_RUNS` runs (default 7). Data: `bench-data/` (or `$SETS_BENCH_DATA`), built by
//! `benches/data/build.sh`.

use std::path::PathBuf;
use std::time::Instant;

use datafusion::error::Result;
use datafusion::prelude::ParquetReadOptions;
use datafusion_sets::bm25::{Tokenizer, TokenizerOptions};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = std::env::var_os("SETS_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench-data"));
    let runs: usize = std::env::var("SETS_SPEED_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let corpora = [
        ("gcide", dir.join("gcide/docs.parquet")),
        ("de", dir.join("translations/de.parquet")),
        ("ja", dir.join("translations/ja.parquet")),
    ];
    let pairs = [
        ("tokenizer=ascii", "tokenizer=unicode"),
        (
            "tokenizer=ascii, stem=english",
            "tokenizer=unicode, stem=english",
        ),
    ];
    for (name, path) in corpora {
        if !path.exists() {
            println!(
                "{name}: {} is missing (benches/data/build.sh)",
                path.display()
            );
            continue;
        }
        let ctx = datafusion_sets::new_context();
        ctx.register_parquet("raw", path.to_str().unwrap(), ParquetReadOptions::default())
            .await?;
        ctx.sql("CREATE TABLE docs AS SELECT doc_id, text FROM raw")
            .await?
            .collect()
            .await?;
        let texts: Vec<String> = {
            let batches = ctx.sql("SELECT text FROM docs").await?.collect().await?;
            let mut out = Vec::new();
            for b in &batches {
                let col = datafusion::arrow::compute::cast(
                    b.column(0),
                    &datafusion::arrow::datatypes::DataType::Utf8,
                )?;
                let s = datafusion::arrow::array::AsArray::as_string::<i32>(&col);
                out.extend(s.iter().map(|t| t.unwrap_or_default().to_string()));
            }
            out
        };
        let bytes: usize = texts.iter().map(String::len).sum();
        let ascii = texts.iter().filter(|t| t.is_ascii()).count();
        println!(
            "{name}: {} documents ({ascii} all ASCII), {:.1} MB of text; {runs} runs, medians",
            texts.len(),
            bytes as f64 / 1e6
        );
        for (a, u) in pairs {
            let (mut ta, mut tu) = (Vec::new(), Vec::new());
            for r in 0..runs {
                let order = if r % 2 == 0 { [a, u] } else { [u, a] };
                for spec in order {
                    let t = Instant::now();
                    ctx.sql(&format!(
                        "CREATE OR REPLACE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', '{spec}')"
                    ))
                    .await?
                    .collect()
                    .await?;
                    let s = t.elapsed().as_secs_f64();
                    if spec == a { ta.push(s) } else { tu.push(s) }
                }
            }
            let (ma, mu) = (median(ta), median(tu));
            println!(
                "  bm25_index, every core: '{a}' {ma:.3} s, '{u}' {mu:.3} s: {:.2}x",
                mu / ma
            );
            let (mut ta, mut tu) = (Vec::new(), Vec::new());
            let mut counts = [0usize; 2];
            for r in 0..runs {
                for (i, spec) in [a, u].into_iter().enumerate() {
                    let spec = if r % 2 == 0 { spec } else { [u, a][i] };
                    let mut tok =
                        Tokenizer::new(TokenizerOptions::parse_options(spec, "tokenizer_speed")?);
                    let mut n = 0usize;
                    let t = Instant::now();
                    for text in &texts {
                        tok.for_each_term(text, |_| n += 1);
                    }
                    let s = t.elapsed().as_secs_f64();
                    if spec == a {
                        ta.push(s);
                        counts[0] = n;
                    } else {
                        tu.push(s);
                        counts[1] = n;
                    }
                }
            }
            let (ma, mu) = (median(ta), median(tu));
            println!(
                "  tokenizer alone, one core: '{a}' {ma:.3} s ({} terms, {:.0} MB/s), '{u}' {mu:.3} s ({} terms, {:.0} MB/s): {:.2}x",
                counts[0],
                bytes as f64 / 1e6 / ma,
                counts[1],
                bytes as f64 / 1e6 / mu,
                mu / ma
            );
        }
    }
    Ok(())
}
