//! BM25 top-k on real data: the gcide dictionary (126,240 articles) indexed through our
//! tokenizer and `IndexBuilder`, queried with the TREC 2005 Terabyte efficiency log
//! (`terabyte05-eff`). For every query, the pruned evaluators (`top()`: block-max AND,
//! MaxScore OR, AND-then-OR) must return exactly what the exhaustive oracle returns for
//! top-10: the same documents with the same scores (bit for bit), in the same order.
//!
//! Before that, the index itself is checked against the shared dataset builders' own postings
//! (`gcide/postings.parquet`, built in Python with the same `[a-z0-9]+` tokenizer): every
//! term, every document id and every term frequency.
//!
//! Data: `bench-data/` (or `$SETS_BENCH_DATA`), built by `benches/data/build.sh`. Without it
//! the test prints why and passes, unless `SETS_REQUIRE_DATA=1` (`.ci/run` builds the data
//! and sets it): then a missing data set fails.
//!
//! Environment:
//! - `SETS_BENCH_DATA=dir`: where the data is (default `bench-data` at the repository root);
//! - `SETS_BM25_QUERIES=n`: how many queries (default 2,000, the first of the log; the whole
//!   first 10,000 take about five times as long, the exhaustive oracle dominating);
//! - `SETS_BM25_DUMP=file`: also write our OR top-10 of every query as TSV
//!   (`qid  rank  doc_id  score`, a query without results as one line `qid  0  -  -`), the
//!   input of `benches/data/check_bm25s.py`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, UInt32Type};
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion_sets::bm25::{Bm25Params, Scored};
use datafusion_sets::bm25::{Hit, Mode, exhaustive, query_terms, top};
use datafusion_sets::bm25::{IndexBuilder, InvertedIndex};
use datafusion_sets::bm25::{Tokenizer, TokenizerOptions};

const K: usize = 10;
const DEFAULT_QUERIES: usize = 2_000;

/// Unbuffered, uncaptured notes (libtest captures `println!`, not direct writes).
macro_rules! note {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

fn data_dir() -> PathBuf {
    common::bench_data()
}

/// Named columns of a Parquet file, every row group, as Utf8 / UInt32 arrays per batch.
fn read_parquet(path: &Path, columns: &[&str]) -> Vec<RecordBatch> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let schema = builder.parquet_schema();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&i| {
            let path = schema.column(i).path().parts()[0].clone();
            columns.contains(&path.as_str())
        })
        .collect();
    let mask = ProjectionMask::leaves(schema, leaves);
    builder
        .with_projection(mask)
        .with_batch_size(16_384)
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> &'a dyn Array {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_ref()
}

fn strings(a: &dyn Array) -> Vec<Option<String>> {
    let s = cast(a, &DataType::Utf8).unwrap();
    let s = s.as_string::<i32>();
    (0..s.len())
        .map(|i| s.is_valid(i).then(|| s.value(i).to_string()))
        .collect()
}

/// gcide's articles indexed with the default tokenizer (no stop words, no stemming).
fn build_index(docs: &Path) -> InvertedIndex {
    let mut builder = IndexBuilder::new(TokenizerOptions::default(), false);
    let mut tok = Tokenizer::new(TokenizerOptions::default());
    for b in read_parquet(docs, &["doc_id", "text"]) {
        let ids = cast(column(&b, "doc_id"), &DataType::UInt32).unwrap();
        let ids = ids.as_primitive::<UInt32Type>();
        let texts = strings(column(&b, "text"));
        for (i, text) in texts.iter().enumerate() {
            builder.add_text(&mut tok, ids.value(i), text.as_deref(), None);
        }
    }
    builder.finish()
}

/// The index equals the builders' postings table: same terms, doc ids and tfs.
fn check_against_postings(index: &InvertedIndex, postings: &Path) -> usize {
    let mut terms = 0;
    for b in read_parquet(postings, &["term", "doc_ids", "tfs"]) {
        let term = strings(column(&b, "term"));
        let docs = column(&b, "doc_ids").as_list::<i32>();
        let tfs = column(&b, "tfs").as_list::<i32>();
        for (r, term) in term.iter().enumerate() {
            let term = term.as_deref().unwrap();
            let t = index
                .term_id(term)
                .unwrap_or_else(|| panic!("term '{term}' of postings.parquet is not in our index"));
            let range = index.range(t);
            let want_docs = docs.value(r);
            let want_tfs = tfs.value(r);
            assert_eq!(
                &index.docs()[range.clone()],
                want_docs.as_primitive::<UInt32Type>().values().as_ref(),
                "doc ids of '{term}'"
            );
            assert_eq!(
                &index.tfs()[range],
                want_tfs.as_primitive::<UInt32Type>().values().as_ref(),
                "tfs of '{term}'"
            );
            terms += 1;
        }
    }
    assert_eq!(terms, index.terms(), "number of terms");
    terms
}

/// (qid, text) of the first `n` `terabyte05-eff` queries, in file order.
fn read_queries(path: &Path, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(n);
    for b in read_parquet(path, &["source", "qid", "text"]) {
        let source = strings(column(&b, "source"));
        let qid = strings(column(&b, "qid"));
        let text = strings(column(&b, "text"));
        for i in 0..b.num_rows() {
            if source[i].as_deref() == Some("terabyte05-eff") && out.len() < n {
                out.push((qid[i].clone().unwrap(), text[i].clone().unwrap_or_default()));
            }
        }
    }
    out
}

#[test]
fn topk_equals_exhaustive_on_gcide() {
    let dir = data_dir();
    let docs = dir.join("gcide/docs.parquet");
    let postings = dir.join("gcide/postings.parquet");
    let queries = dir.join("queries/queries.parquet");
    if !common::data_present("bm25_real_data", &[&docs, &postings, &queries]) {
        return;
    }
    let n_queries: usize = match std::env::var("SETS_BM25_QUERIES") {
        Ok(s) => s.parse().expect("SETS_BM25_QUERIES: a number"),
        Err(_) => DEFAULT_QUERIES,
    };

    let t = Instant::now();
    let index = build_index(&docs);
    note!(
        "bm25_real_data: indexed {} docs, {} terms, {} postings, {} tokens in {:.1?}",
        index.n_docs(),
        index.terms(),
        index.docs().len(),
        index.total_len(),
        t.elapsed()
    );
    let t = Instant::now();
    let terms = check_against_postings(&index, &postings);
    note!(
        "bm25_real_data: all {terms} terms' doc ids and tfs equal postings.parquet's ({:.1?})",
        t.elapsed()
    );

    let queries = read_queries(&queries, n_queries);
    assert_eq!(
        queries.len(),
        n_queries,
        "not enough terabyte05-eff queries"
    );
    let scored = Scored::new(&index, Bm25Params::default());
    let mut tok = Tokenizer::new(index.tokenizer());
    let modes = [Mode::And, Mode::Or, Mode::AndOr];
    let mut dump: Vec<(&str, Vec<Hit>)> = Vec::new();
    let mut failures = Vec::new();
    let mut non_empty = [0usize; 3];
    let mut full = [0usize; 3];
    let (mut t_top, mut t_exh) = ([0f64; 3], [0f64; 3]);
    let t = Instant::now();
    for (qid, text) in &queries {
        let words = tok.terms(text);
        let (ids, unknown) = query_terms(&index, words.iter().map(String::as_str));
        for (m, &mode) in modes.iter().enumerate() {
            let t0 = Instant::now();
            let got = top(&index, &scored, &ids, unknown, K, mode);
            let t1 = Instant::now();
            let want = exhaustive(&index, &scored, &ids, unknown, K, mode);
            t_top[m] += (t1 - t0).as_secs_f64();
            t_exh[m] += t1.elapsed().as_secs_f64();
            non_empty[m] += !want.is_empty() as usize;
            full[m] += (want.len() == K) as usize;
            if got != want {
                failures.push(format!(
                    "qid {qid} {text:?} {mode:?}:\n  top()        {got:?}\n  exhaustive() {want:?}"
                ));
            }
            if mode == Mode::Or {
                dump.push((qid, want));
            }
        }
    }
    note!(
        "bm25_real_data: {} queries x (AND, OR, AND_OR) top-{K} in {:.1?}; queries with hits \
         {non_empty:?}, with {K} hits {full:?}; time in top() {:.2?} s, in exhaustive() {:.2?} s",
        queries.len(),
        t.elapsed(),
        t_top,
        t_exh
    );
    if let Some(path) = std::env::var_os("SETS_BM25_DUMP") {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for (qid, hits) in &dump {
            if hits.is_empty() {
                writeln!(f, "{qid}\t0\t-\t-").unwrap();
            }
            for (r, h) in hits.iter().enumerate() {
                writeln!(f, "{qid}\t{}\t{}\t{}", r + 1, h.doc, h.score).unwrap();
            }
        }
        f.flush().unwrap();
        note!("bm25_real_data: OR top-{K} written to {:?}", path);
    }
    assert!(
        failures.is_empty(),
        "{} of {} (query, mode) results differ from the exhaustive oracle; first ones:\n{}",
        failures.len(),
        queries.len() * modes.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}
