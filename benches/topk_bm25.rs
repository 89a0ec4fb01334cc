//! BM25 top-k against tantivy, in one process, on one core (criterion, `harness = false`).
//!
//! Run everything (a few minutes; needs `bench-data/`, see `benches/data/build.sh`):
//!                                   cargo bench --bench topk_bm25
//! One engine or mode:               cargo bench --bench topk_bm25 -- topk_bm25/or/
//! Fewer queries:                    SETS_BENCH_QUERIES=1000 cargo bench --bench topk_bm25
//! Latency passes only (no criterion): SETS_BENCH_LATENCY_ONLY=1 cargo bench --bench topk_bm25
//!
//! Data: the gcide dictionary's 126,240 articles (`bench-data/gcide/docs.parquet`, or under
//! `$SETS_BENCH_DATA`) and the first 10,000 queries of the TREC 2005 Terabyte efficiency log
//! (`source = 'terabyte05-eff'` of `bench-data/queries/queries.parquet`, file order). Every
//! article is tokenized once by our tokenizer (lowercase `[a-z0-9]+`); the same tokens go to
//! both engines: ours through `IndexBuilder::add_terms`, tantivy as the tokens joined by
//! spaces in a text field with a whitespace tokenizer (term frequencies and field norms, no
//! positions), so both hold exactly the same terms. Queries are tokenized the same way and
//! deduplicated; both engines get the same distinct tokens. BM25 k1 = 1.2, b = 0.75, top-10.
//!
//! Groups (ids are `topk_bm25/{and,or}/variant`; one iteration runs every query once):
//! - `ours`: `query_terms()` then `top()` on one thread, with a prebuilt `InvertedIndex` and
//!   `Scored`;
//! - `tantivy`: a `BooleanQuery` of `TermQuery` clauses (`Occur::Must` for AND,
//!   `Occur::Should` for OR) searched with `TopDocs::with_limit(10).order_by_score()` by a
//!   searcher of a one-segment in-RAM index with tantivy's default single-thread executor;
//! - `ours_sql`: `SELECT qid, topk_bm25('idx', text, 10, mode) FROM queries` over a MemTable of
//!   the query texts (raw text: tokenization and the Arrow result included), the index table
//!   built by `bm25_index` and loaded once (cached, as for any repeated query); one core:
//!   `target_partitions = 1`, a current-thread tokio runtime and a 1-thread rayon pool.
//!
//! After criterion, per-query latencies: every query timed alone, in 5 passes alternating
//! between the engines; per query the median of its 5 times; then the median and the 99th
//! percentile over the queries, and queries/s from the sum of the per-query medians.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, measurement::WallTime};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, UInt32Type};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::bm25::{Bm25Params, Scored};
use datafusion_sets::bm25::{Hit, Mode, query_terms, top};
use datafusion_sets::bm25::{IndexBuilder, InvertedIndex};
use datafusion_sets::bm25::{Tokenizer, TokenizerOptions};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query as TantivyQuery, TermQuery};
use tantivy::schema::{FAST, IndexRecordOption, Schema, TextFieldIndexing, TextOptions};
use tantivy::tokenizer::{TextAnalyzer, WhitespaceTokenizer};
use tantivy::{
    DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term,
};

const K: usize = 10;
const DEFAULT_QUERIES: usize = 10_000;
const LATENCY_PASSES: usize = 5;

// ---------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------

fn bench_data_dir() -> PathBuf {
    std::env::var_os("SETS_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-data"))
}

/// One core: target_partitions = 1, current-thread tokio, a 1-thread rayon pool.
struct OneCore {
    rt: tokio::runtime::Runtime,
    ctx: SessionContext,
    pool: rayon::ThreadPool,
}

impl OneCore {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(1))
            .with_default_features()
            .with_sets()
            .build();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        Self {
            rt,
            ctx: SessionContext::new_with_state(state),
            pool,
        }
    }

    fn run(&self, sql: &str) -> Vec<RecordBatch> {
        self.pool.install(|| {
            self.rt
                .block_on(async { self.ctx.sql(sql).await.unwrap().collect().await.unwrap() })
        })
    }
}

fn strings(a: &dyn Array) -> Vec<String> {
    let s = cast(a, &DataType::Utf8).unwrap();
    let s = s.as_string::<i32>();
    (0..s.len()).map(|i| s.value(i).to_string()).collect()
}

struct Query {
    qid: u32,
    /// Distinct tokens, in query order.
    tokens: Vec<String>,
}

struct Tantivy {
    reader: IndexReader,
    field: tantivy::schema::Field,
    /// doc_id of each tantivy document, by (segment, doc) — one segment, checked.
    ids: Vec<u32>,
}

impl Tantivy {
    fn query(&self, tokens: &[String], mode: Mode) -> BooleanQuery {
        let occur = if mode == Mode::And {
            Occur::Must
        } else {
            Occur::Should
        };
        let clauses: Vec<(Occur, Box<dyn TantivyQuery>)> = tokens
            .iter()
            .map(|t| {
                let q: Box<dyn TantivyQuery> = Box::new(TermQuery::new(
                    Term::from_field_text(self.field, t),
                    IndexRecordOption::WithFreqs,
                ));
                (occur, q)
            })
            .collect();
        BooleanQuery::new(clauses)
    }

    fn search(&self, searcher: &Searcher, tokens: &[String], mode: Mode) -> Vec<(f32, DocAddress)> {
        let q = self.query(tokens, mode);
        searcher
            .search(&q, &TopDocs::with_limit(K).order_by_score())
            .unwrap()
    }
}

struct Data {
    oc: OneCore,
    index: InvertedIndex,
    scored: Scored,
    queries: Vec<Query>,
    tantivy: Tantivy,
}

fn load(n_queries: usize) -> Data {
    let dir = bench_data_dir();
    let oc = OneCore::new();
    let docs_path = dir.join("gcide/docs.parquet");
    let queries_path = dir.join("queries/queries.parquet");
    let t = Instant::now();
    oc.rt.block_on(async {
        let opts = ParquetReadOptions::default();
        oc.ctx
            .register_parquet("docs", docs_path.to_str().unwrap(), opts.clone())
            .await
            .unwrap();
        oc.ctx
            .register_parquet("all_queries", queries_path.to_str().unwrap(), opts)
            .await
            .unwrap();
    });
    // The query table of the SQL variant: the first n, in file order (one partition).
    oc.run(&format!(
        "CREATE TABLE queries AS SELECT CAST(qid AS INT) AS qid, text FROM all_queries \
         WHERE source = 'terabyte05-eff' LIMIT {n_queries}"
    ));
    let mut tok = Tokenizer::new(TokenizerOptions::default());
    let mut queries = Vec::with_capacity(n_queries);
    for b in oc.run("SELECT qid, text FROM queries") {
        let qids = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        for (i, text) in strings(b.column(1)).iter().enumerate() {
            let mut tokens: Vec<String> = Vec::new();
            for t in tok.terms(text) {
                if !tokens.contains(&t) {
                    tokens.push(t);
                }
            }
            queries.push(Query {
                qid: qids.value(i) as u32,
                tokens,
            });
        }
    }
    assert_eq!(
        queries.len(),
        n_queries,
        "not enough terabyte05-eff queries"
    );

    // Both engines from the same tokens.
    let mut schema = Schema::builder();
    let indexing = TextFieldIndexing::default()
        .set_tokenizer("ws")
        .set_index_option(IndexRecordOption::WithFreqs);
    let field = schema.add_text_field(
        "text",
        TextOptions::default().set_indexing_options(indexing),
    );
    let id_field = schema.add_u64_field("id", FAST);
    let tindex = Index::create_in_ram(schema.build());
    tindex
        .tokenizers()
        .register("ws", TextAnalyzer::from(WhitespaceTokenizer::default()));
    let mut writer: IndexWriter = tindex.writer_with_num_threads(1, 1 << 30).unwrap();
    let mut builder = IndexBuilder::new(TokenizerOptions::default(), false);
    let mut n_docs = 0usize;
    for b in oc.run("SELECT doc_id, text FROM docs") {
        let ids = cast(b.column(0), &DataType::UInt32).unwrap();
        let ids = ids.as_primitive::<UInt32Type>();
        for (i, text) in strings(b.column(1)).iter().enumerate() {
            let terms = tok.terms(text);
            builder.add_terms(ids.value(i), terms.iter().map(String::as_str), None);
            let mut doc = TantivyDocument::default();
            doc.add_text(field, terms.join(" "));
            doc.add_u64(id_field, ids.value(i) as u64);
            writer.add_document(doc).unwrap();
            n_docs += 1;
        }
    }
    writer.commit().unwrap();
    let segments = tindex.searchable_segment_ids().unwrap();
    if segments.len() > 1 {
        writer.merge(&segments).wait().unwrap();
    }
    writer.wait_merging_threads().unwrap();
    let index = builder.finish();
    let scored = Scored::new(&index, Bm25Params::default());
    let reader = tindex
        .reader_builder()
        .reload_policy(ReloadPolicy::Manual)
        .try_into()
        .unwrap();
    let searcher = reader.searcher();
    assert_eq!(searcher.segment_readers().len(), 1, "tantivy: one segment");
    assert_eq!(searcher.num_docs() as usize, n_docs);
    let col = searcher.segment_reader(0).fast_fields().u64("id").unwrap();
    let ids: Vec<u32> = (0..n_docs as u32)
        .map(|d| col.first(d).unwrap() as u32)
        .collect();
    drop(searcher);

    // The SQL variant's index table.
    oc.run("CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text')");
    let terms: usize = queries.iter().map(|q| q.tokens.len()).sum();
    eprintln!(
        "[topk_bm25] {} docs, {} terms, {} postings; {} queries ({} distinct tokens in all, {} \
         without tokens); both engines built in {:.1?}",
        index.n_docs(),
        index.terms(),
        index.docs().len(),
        queries.len(),
        terms,
        queries.iter().filter(|q| q.tokens.is_empty()).count(),
        t.elapsed()
    );
    Data {
        oc,
        index,
        scored,
        queries,
        tantivy: Tantivy { reader, field, ids },
    }
}

fn data() -> Option<&'static Data> {
    static DATA: OnceLock<Option<Data>> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = bench_data_dir();
        for f in ["gcide/docs.parquet", "queries/queries.parquet"] {
            if !dir.join(f).exists() {
                eprintln!(
                    "[topk_bm25] skipped: {} is missing; build it with benches/data/build.sh",
                    dir.join(f).display()
                );
                return None;
            }
        }
        let n = std::env::var("SETS_BENCH_QUERIES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(DEFAULT_QUERIES);
        Some(load(n))
    })
    .as_ref()
}

// ---------------------------------------------------------------------------------------------
// The engines, one query at a time
// ---------------------------------------------------------------------------------------------

#[inline]
fn ours(d: &Data, q: &Query, mode: Mode) -> Vec<Hit> {
    let (ids, unknown) = query_terms(&d.index, q.tokens.iter().map(String::as_str));
    top(&d.index, &d.scored, &ids, unknown, K, mode)
}

fn sql(mode: Mode) -> String {
    let m = if mode == Mode::And { "and" } else { "or" };
    format!("SELECT qid, topk_bm25('idx', text, {K}, '{m}') FROM queries")
}

/// qid -> doc ids of the SQL variant's result.
fn sql_docs(batches: &[RecordBatch]) -> Vec<(u32, Vec<u32>)> {
    let mut out = Vec::new();
    for b in batches {
        let qids = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        let lists = b.column(1).as_list::<i32>();
        for r in 0..b.num_rows() {
            let hits = lists.value(r);
            let docs = hits
                .as_struct()
                .column(0)
                .as_primitive::<UInt32Type>()
                .clone();
            out.push((qids.value(r) as u32, docs.values().to_vec()));
        }
    }
    out.sort_by_key(|e| e.0);
    out
}

/// Checks (once, untimed): the SQL variant returns what `top()` returns; how often tantivy's
/// top-10 holds the same documents as ours (tantivy quantizes document lengths to one byte
/// and scores in f32, so scores differ slightly and near-ties may rank differently).
fn check(d: &Data, mode: Mode) {
    let mut want: Vec<(u32, Vec<u32>)> = d
        .queries
        .iter()
        .map(|q| (q.qid, ours(d, q, mode).iter().map(|h| h.doc).collect()))
        .collect();
    want.sort_by_key(|e| e.0);
    let got = sql_docs(&d.oc.run(&sql(mode)));
    assert!(
        got == want,
        "{mode:?}: topk_bm25 through SQL differs from top()"
    );
    let searcher = d.tantivy.reader.searcher();
    let (mut same_list, mut same_set, mut hits) = (0, 0, 0);
    for q in &d.queries {
        let ours: Vec<u32> = ours(d, q, mode).iter().map(|h| h.doc).collect();
        let theirs: Vec<u32> = d
            .tantivy
            .search(&searcher, &q.tokens, mode)
            .iter()
            .map(|(_, a)| d.tantivy.ids[a.doc_id as usize])
            .collect();
        hits += ours.len();
        same_list += (ours == theirs) as usize;
        let (mut a, mut b) = (ours, theirs);
        a.sort_unstable();
        b.sort_unstable();
        same_set += (a == b) as usize;
    }
    eprintln!(
        "[topk_bm25] {mode:?}: SQL = top() for all {} queries ({hits} hits); tantivy's top-{K} \
         equals ours for {same_list} queries, as a set for {same_set}",
        d.queries.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Criterion: throughput
// ---------------------------------------------------------------------------------------------

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
}

fn bench_throughput(c: &mut Criterion, d: &'static Data) {
    for (name, mode) in [("and", Mode::And), ("or", Mode::Or)] {
        check(d, mode);
        let mut g = c.benchmark_group(format!("topk_bm25/{name}"));
        configure(&mut g);
        g.throughput(criterion::Throughput::Elements(d.queries.len() as u64));
        g.bench_function("ours", |b| {
            b.iter(|| {
                let mut n = 0;
                for q in &d.queries {
                    n += black_box(ours(d, q, mode)).len();
                }
                n
            })
        });
        g.bench_function("tantivy", |b| {
            let searcher = d.tantivy.reader.searcher();
            b.iter(|| {
                let mut n = 0;
                for q in &d.queries {
                    n += black_box(d.tantivy.search(&searcher, &q.tokens, mode)).len();
                }
                n
            })
        });
        let query = sql(mode);
        g.bench_function("ours_sql", |b| b.iter(|| black_box(d.oc.run(&query))));
        g.finish();
    }
}

// ---------------------------------------------------------------------------------------------
// Latency per query
// ---------------------------------------------------------------------------------------------

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn latency(d: &Data) {
    let searcher = d.tantivy.reader.searcher();
    let n = d.queries.len();
    eprintln!(
        "\n[topk_bm25] per-query latency, {n} queries, top-{K}, one core: median of \
         {LATENCY_PASSES} passes per query (engines alternating), then over the queries"
    );
    eprintln!("| mode | engine | queries/s | median | p99 |\n| --- | --- | --- | --- | --- |");
    let mut breakdowns = Vec::new();
    for (name, mode) in [("AND", Mode::And), ("OR", Mode::Or)] {
        // times[engine][pass][query]
        let mut times: [Vec<Vec<f64>>; 2] = Default::default();
        let timed = |f: &dyn Fn(&Query)| -> Vec<f64> {
            d.queries
                .iter()
                .map(|q| {
                    let t = Instant::now();
                    f(q);
                    t.elapsed().as_secs_f64()
                })
                .collect()
        };
        for _ in 0..LATENCY_PASSES {
            times[0].push(timed(&|q| {
                black_box(ours(d, q, mode));
            }));
            times[1].push(timed(&|q| {
                black_box(d.tantivy.search(&searcher, &q.tokens, mode));
            }));
        }
        let medians: Vec<Vec<f64>> = (0..2)
            .map(|e| {
                (0..n)
                    .map(|i| {
                        let mut v: Vec<f64> = (0..LATENCY_PASSES).map(|p| times[e][p][i]).collect();
                        v.sort_by(f64::total_cmp);
                        v[LATENCY_PASSES / 2]
                    })
                    .collect()
            })
            .collect();
        let mut qps = [0f64; 2];
        for (e, engine) in ["ours", "tantivy"].iter().enumerate() {
            qps[e] = n as f64 / medians[e].iter().sum::<f64>();
            let mut sorted = medians[e].clone();
            sorted.sort_by(f64::total_cmp);
            eprintln!(
                "| {name} | {engine} | {:.0} | {:.2} µs | {:.1} µs |",
                qps[e],
                percentile(&sorted, 0.5) * 1e6,
                percentile(&sorted, 0.99) * 1e6
            );
        }
        eprintln!("| {name} | ours / tantivy | {:.2}x | | |", qps[0] / qps[1]);
        breakdowns.push(breakdown(d, name, &medians));
    }
    for b in breakdowns {
        eprintln!("{b}");
    }
}

/// Where the time goes: the per-query medians summed by the length of the query's longest
/// posting list.
fn breakdown(d: &Data, mode: &str, medians: &[Vec<f64>]) -> String {
    const EDGES: [usize; 5] = [1, 1_000, 10_000, 50_000, usize::MAX];
    let mut rows = [(0usize, 0f64, 0f64); 5];
    for (i, q) in d.queries.iter().enumerate() {
        let longest = q
            .tokens
            .iter()
            .filter_map(|t| d.index.term_id(t))
            .map(|t| d.index.postings_len(t))
            .max()
            .unwrap_or(0);
        let b = EDGES.iter().position(|&e| longest < e).unwrap();
        rows[b].0 += 1;
        rows[b].1 += medians[0][i];
        rows[b].2 += medians[1][i];
    }
    let names = ["none", "1..1k", "1k..10k", "10k..50k", ">= 50k"];
    let mut out = format!(
        "\n[topk_bm25] {mode}: time by the query's longest posting list (sum of per-query medians)\n\
         | longest list | queries | ours | tantivy | ours / tantivy time |\n| --- | --- | --- | --- | --- |"
    );
    for (name, (count, a, b)) in names.iter().zip(rows) {
        out += &format!(
            "\n| {name} | {count} | {:.1} ms | {:.1} ms | {:.2} |",
            a * 1e3,
            b * 1e3,
            a / b
        );
    }
    out
}

fn main() {
    let Some(d) = data() else {
        return;
    };
    if std::env::var_os("SETS_BENCH_LATENCY_ONLY").is_none() {
        let mut c = Criterion::default()
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3))
            .configure_from_args();
        bench_throughput(&mut c, d);
        c.final_summary();
    }
    latency(d);
}
