//! The similarity join on sets of strings, on real data.
//!
//! 1. `gcide_words` as strings: each article's word set spelled out through the builder's own
//!    dictionary (`tokens.parquet`, id to word). `similarity_join` over the string lists
//!    (`Utf8`, and `Utf8View` through the SQL rewrite) must return exactly the pairs, and the
//!    bit-identical similarities, of the integer join over the builder's ids
//!    (`tests/similarity_join_real_data.rs` checks that one against an independent oracle).
//! 2. Near-duplicate text in one query: Debian's translated package descriptions (German and
//!    Japanese), `JOIN ... ON a.id < b.id AND jaccard(tokenize(a.text), tokenize(b.text)) >= t`
//!    must be planned as the exec's self-join with `tokenize` below it, and return the pairs
//!    of a nested loop written here over the same `tokenize` lists, similarity for similarity.
//!
//! Data: `bench-data/` (or `$SETS_BENCH_DATA`), built by `benches/data/build.sh`. Without it
//! the tests say why and pass, unless `SETS_REQUIRE_DATA=1` (as `.ci/run` sets).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListBuilder, RecordBatch, StringBuilder, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type};
use datafusion::datasource::MemTable;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

/// `(left id, right id) -> similarity bits`.
type Pairs = BTreeMap<(u32, u32), u64>;

fn read(path: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

fn context() -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(4);
    let ctx = common::sets_session(config);
    ctx.state_ref()
        .write()
        .config_mut()
        .options_mut()
        .set("sets.backend", "cpu")
        .unwrap();
    ctx
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn explain(ctx: &SessionContext, sql: &str) -> String {
    let batches = collect(ctx, &format!("EXPLAIN {sql}")).await;
    let mut out = String::new();
    for b in &batches {
        let plans = b.column(1).as_string::<i32>();
        for p in plans.iter().flatten() {
            out.push_str(p);
            out.push('\n');
        }
    }
    out
}

/// The pairs of `(left_id, right_id, similarity)` batches (ids of any integer type).
fn pairs_of(batches: &[RecordBatch]) -> Pairs {
    let mut out = Pairs::new();
    for b in batches {
        let cast =
            |i: usize| datafusion::arrow::compute::cast(b.column(i), &DataType::UInt32).unwrap();
        let (l, r) = (cast(0), cast(1));
        let (l, r) = (
            l.as_primitive::<UInt32Type>(),
            r.as_primitive::<UInt32Type>(),
        );
        let s = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let key = (l.value(i), r.value(i));
            assert!(
                out.insert(key, s.value(i).to_bits()).is_none(),
                "pair {key:?} twice"
            );
        }
    }
    out
}

#[test]
fn gcide_words_as_strings_join_as_their_ids() {
    let dir = common::bench_data().join("gcide_words");
    let (sets, tokens) = (dir.join("sets.parquet"), dir.join("tokens.parquet"));
    if !common::data_present(
        "gcide_words_as_strings_join_as_their_ids",
        &[&sets, &tokens],
    ) {
        return;
    }
    // The builder's dictionary, and each set spelled out with it.
    let mut words: Vec<String> = Vec::new();
    for b in read(&tokens) {
        let ids = b
            .column_by_name("token_id")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let text = b.column_by_name("token").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            let id = ids.value(i) as usize;
            if words.len() <= id {
                words.resize(id + 1, String::new());
            }
            words[id] = text.value(i).to_string();
        }
    }
    assert_eq!(
        words.iter().collect::<HashSet<_>>().len(),
        words.len(),
        "the dictionary spells every id differently"
    );
    let set_batches = read(&sets);
    let mut ids = Vec::new();
    let mut lists = ListBuilder::new(StringBuilder::new());
    for b in &set_batches {
        let id = b.column_by_name("id").unwrap().as_primitive::<UInt32Type>();
        let tokens = b.column_by_name("tokens").unwrap().as_list::<i32>();
        for i in 0..b.num_rows() {
            ids.push(id.value(i));
            for t in tokens.value(i).as_primitive::<UInt32Type>().values() {
                lists.values().append_value(&words[*t as usize]);
            }
            lists.append(true);
        }
    }
    let lists = lists.finish();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::UInt32, false),
        Field::new("tokens", lists.data_type().clone(), true),
    ]));
    let strings = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(UInt32Array::from(ids)) as ArrayRef,
            Arc::new(lists) as ArrayRef,
        ],
    )
    .unwrap();
    let rows = strings.num_rows();
    // Four partitions, so four read tasks fill the strings' map together.
    let parts: Vec<Vec<RecordBatch>> = (0..4)
        .map(|p| {
            let chunk = rows.div_ceil(4);
            let start = (p * chunk).min(rows);
            vec![strings.slice(start, chunk.min(rows - start))]
        })
        .collect();
    let ctx = context();
    ctx.register_table("words", Arc::new(MemTable::try_new(schema, parts).unwrap()))
        .unwrap();
    ctx.register_batch(
        "ids",
        datafusion::arrow::compute::concat_batches(&set_batches[0].schema(), &set_batches).unwrap(),
    )
    .unwrap();
    let rt = rt();
    rt.block_on(async {
        collect(
            &ctx,
            "CREATE TABLE views AS SELECT id, arrow_cast(tokens, 'List(Utf8View)') AS tokens FROM words",
        )
        .await;
        for (measure, t) in [("jaccard", 0.5), ("dice", 0.6), ("cosine", 0.7)] {
            let want = pairs_of(
                &collect(
                    &ctx,
                    &format!("SELECT * FROM similarity_join('ids', 'id', 'tokens', '{measure}', {t})"),
                )
                .await,
            );
            assert!(want.len() > 1_000, "{measure} {t}: only {} pairs", want.len());
            let strings = pairs_of(
                &collect(
                    &ctx,
                    &format!(
                        "SELECT * FROM similarity_join('words', 'id', 'tokens', '{measure}', {t})"
                    ),
                )
                .await,
            );
            assert_eq!(strings, want, "{measure} {t}: table function on strings");
            let sql = format!(
                "SELECT a.id, b.id, {measure}(a.tokens, b.tokens) FROM views a JOIN views b \
                 ON a.id < b.id AND {measure}(a.tokens, b.tokens) >= {t}"
            );
            let plan = explain(&ctx, &sql).await;
            assert!(plan.contains("SimilarityJoinExec: mode=self"), "{plan}");
            let rewritten = pairs_of(&collect(&ctx, &sql).await);
            assert_eq!(rewritten, want, "{measure} {t}: SQL rewrite on Utf8View");
            eprintln!("gcide_words {measure} >= {t}: {} pairs, strings = ids", want.len());
        }
    });
}

/// Sets of strings, sorted and deduplicated, with the Jaccard similarity of two.
fn jaccard(a: &[String], b: &[String]) -> f64 {
    let (mut i, mut j, mut o) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                o += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - o;
    if union == 0 {
        0.0
    } else {
        o as f64 / union as f64
    }
}

#[test]
fn near_duplicate_descriptions_in_one_query() {
    let dir = common::bench_data().join("translations");
    let files: Vec<_> = ["de", "ja"]
        .iter()
        .map(|l| (*l, dir.join(format!("{l}.parquet"))))
        .collect();
    let paths: Vec<&Path> = files.iter().map(|(_, p)| p.as_path()).collect();
    if !common::data_present("near_duplicate_descriptions_in_one_query", &paths) {
        return;
    }
    let rt = rt();
    for (lang, path) in &files {
        let ctx = context();
        rt.block_on(async {
            ctx.register_parquet("raw", path.to_str().unwrap(), Default::default())
                .await
                .unwrap();
            collect(
                &ctx,
                "CREATE TABLE docs AS SELECT doc_id AS id, text FROM raw",
            )
            .await;
            for (options, t) in [("", 0.8), ("qgrams=3", 0.7)] {
                let tok = |side: &str| match options {
                    "" => format!("tokenize({side}.text)"),
                    o => format!("tokenize({side}.text, '{o}')"),
                };
                let sql = format!(
                    "SELECT a.id, b.id, jaccard({}, {}) FROM docs a JOIN docs b \
                     ON a.id < b.id AND jaccard({}, {}) >= {t}",
                    tok("a"),
                    tok("b"),
                    tok("a"),
                    tok("b")
                );
                let plan = explain(&ctx, &sql).await;
                assert!(
                    plan.contains("SimilarityJoinExec: mode=self")
                        && plan.contains("tokenize(text@1")
                        && plan.contains("as __similarity_join_tokens"),
                    "{lang}: {plan}"
                );
                let ours = pairs_of(&collect(&ctx, &sql).await);
                // The nested loop, over the very lists tokenize gives.
                let lists = collect(
                    &ctx,
                    &format!("SELECT id, {} FROM docs a ORDER BY id", tok("a")),
                )
                .await;
                let mut sets: Vec<(u32, Option<Vec<String>>)> = Vec::new();
                for b in &lists {
                    let ids = b.column(0).as_primitive::<UInt32Type>();
                    let l = b.column(1).as_list::<i32>();
                    for i in 0..b.num_rows() {
                        let set = (!l.is_null(i)).then(|| {
                            let mut s: Vec<String> = l
                                .value(i)
                                .as_string::<i32>()
                                .iter()
                                .flatten()
                                .map(str::to_string)
                                .collect();
                            s.sort();
                            s.dedup();
                            s
                        });
                        sets.push((ids.value(i), set));
                    }
                }
                let mut want = Pairs::new();
                for (x, (ix, sx)) in sets.iter().enumerate() {
                    for (iy, sy) in &sets[x + 1..] {
                        let (Some(sx), Some(sy)) = (sx, sy) else {
                            continue;
                        };
                        // J <= min / max: pairs far apart in size cannot pass (with a
                        // margin, so rounding never skips a passing pair).
                        let (n, m) = (sx.len().min(sy.len()), sx.len().max(sy.len()));
                        if (n as f64) < t * (m as f64) * (1.0 - 1e-9) {
                            continue;
                        }
                        let j = jaccard(sx, sy);
                        if j >= t {
                            want.insert(((*ix).min(*iy), (*ix).max(*iy)), j.to_bits());
                        }
                    }
                }
                assert!(
                    want.len() >= 10,
                    "{lang} {options}: only {} near-duplicate pairs",
                    want.len()
                );
                assert_eq!(ours, want, "{lang} {options} >= {t}");
                eprintln!(
                    "{lang} tokenize({options}) jaccard >= {t}: {} pairs of {} descriptions",
                    want.len(),
                    sets.len()
                );
            }
        });
    }
}
