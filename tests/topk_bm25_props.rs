//! Property tests of BM25 search through SQL: random corpora (a small vocabulary so terms
//! repeat and lists span several skipping blocks, mixed case and punctuation, NULL and empty
//! texts, ids of several integer types in random order, optional static scores), indexed by
//! `bm25_index` and queried by the `topk_bm25` scalar function (a column of queries, several
//! batches and partitions) and table function; every answer equals the exhaustive scorer run
//! on an index built directly from the same documents.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int32Array, RecordBatch, StringArray, UInt16Array,
    UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::bm25::{Bm25Params, Scored};
use datafusion_sets::bm25::{Hit, Mode, exhaustive, query_terms};
use datafusion_sets::bm25::{IndexedDoc, InvertedIndex};
use datafusion_sets::bm25::{Tokenizer, TokenizerOptions};
use proptest::prelude::*;

const WORDS: [&str; 12] = [
    "alpha", "Beta", "gamma", "DELTA", "eps", "zeta", "eta", "theta", "iota", "kappa", "the",
    "running",
];

/// A text of words drawn with a skewed distribution, joined by assorted separators.
fn text_strategy() -> impl Strategy<Value = Option<String>> {
    let word = (0u32..1000).prop_map(|r| {
        let f = r as f64 / 1000.0;
        WORDS[((f * f) * WORDS.len() as f64) as usize]
    });
    let sep = prop::sample::select(vec![" ", ", ", "-", "; ", "  "]);
    prop::option::weighted(
        0.93,
        prop::collection::vec((word, sep), 0..14).prop_map(|ws| {
            ws.into_iter()
                .map(|(w, s)| format!("{w}{s}"))
                .collect::<String>()
        }),
    )
}

#[derive(Debug, Clone)]
struct Case {
    docs: Vec<(u32, Option<String>, Option<f64>)>,
    queries: Vec<Option<String>>,
    id_type: usize,
    with_static: bool,
    stop_words: bool,
    k: usize,
    mode: Mode,
    batch_size: usize,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(
            (text_strategy(), prop::option::weighted(0.9, 0.0f64..1.0)),
            0..300,
        ),
        prop::collection::vec(text_strategy(), 1..25),
        0usize..3,
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![1usize, 2, 5, 10, 400]),
        prop::sample::select(vec![Mode::And, Mode::Or, Mode::AndOr]),
        prop::sample::select(vec![3usize, 64, 8192]),
        any::<u64>(),
    )
        .prop_map(
            |(docs, queries, id_type, with_static, stop_words, k, mode, batch_size, seed)| {
                // Distinct ids in a scrambled order.
                let n = docs.len() as u64;
                let docs = docs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (t, s))| {
                        let id = ((i as u64 * 7919 + seed % 101) % (n.max(1) * 7919 + 101)) as u32;
                        (id % 60_000, t, s)
                    })
                    .collect::<Vec<_>>();
                let mut seen = std::collections::HashSet::new();
                let docs = docs.into_iter().filter(|d| seen.insert(d.0)).collect();
                Case {
                    docs,
                    queries,
                    id_type,
                    with_static,
                    stop_words,
                    k,
                    mode,
                    batch_size,
                }
            },
        )
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::And => "and",
        Mode::Or => "or",
        Mode::AndOr => "and_or",
    }
}

async fn run_case(c: &Case) -> datafusion::common::Result<()> {
    let config = SessionConfig::new()
        .with_batch_size(c.batch_size)
        .with_target_partitions(3);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_sets()
        .build();
    let ctx = SessionContext::new_with_state(state);
    let ids: ArrayRef = match c.id_type {
        0 => Arc::new(UInt64Array::from_iter_values(
            c.docs.iter().map(|d| d.0 as u64),
        )),
        1 => Arc::new(Int32Array::from_iter_values(
            c.docs.iter().map(|d| d.0 as i32),
        )),
        _ => Arc::new(UInt16Array::from_iter_values(
            c.docs.iter().map(|d| d.0 as u16),
        )),
    };
    // Ids are below 60,000, so every id type holds them.
    let docs = &c.docs;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", ids.data_type().clone(), false),
        Field::new("body", DataType::Utf8, true),
        Field::new("pr", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            ids,
            Arc::new(StringArray::from_iter(docs.iter().map(|d| d.1.clone()))),
            Arc::new(Float64Array::from_iter(docs.iter().map(|d| d.2))),
        ],
    )?;
    // Two partitions of the docs, so the index build reads several streams.
    let half = batch.num_rows() / 2;
    let parts = vec![
        vec![batch.slice(0, half)],
        vec![batch.slice(half, batch.num_rows() - half)],
    ];
    ctx.register_table("docs", Arc::new(MemTable::try_new(schema, parts)?))?;
    let mut opts = Vec::new();
    if c.stop_words {
        opts.push("stopwords=english");
    }
    if c.with_static {
        opts.push("static=pr");
    }
    let opts_spec = opts.join(",");
    ctx.sql(&format!(
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body', '{opts_spec}')"
    ))
    .await?
    .collect()
    .await?;

    // The oracle: the same documents indexed directly, scored exhaustively.
    // The tokenizer options `bm25_index` was given (all but `static=`), parsed as it parses them.
    let tok_spec: Vec<&str> = opts
        .iter()
        .copied()
        .filter(|o| !o.starts_with("static="))
        .collect();
    let tok_opts = TokenizerOptions::parse_options(&tok_spec.join(","), "oracle")?;
    let mut tok = Tokenizer::new(tok_opts);
    let texts: Vec<Vec<String>> = docs
        .iter()
        .map(|d| d.1.as_deref().map(|t| tok.terms(t)).unwrap_or_default())
        .collect();
    let indexed: Vec<IndexedDoc> = docs
        .iter()
        .zip(&texts)
        .map(|(d, terms)| IndexedDoc {
            id: d.0,
            terms: terms.iter().map(String::as_str).collect(),
            static_score: d.2,
        })
        .collect();
    let oracle_index = InvertedIndex::build(&indexed, tok_opts, c.with_static);
    let scored = Scored::new(&oracle_index, Bm25Params::default());
    let expect = |q: &str, tok: &mut Tokenizer| -> Vec<Hit> {
        let terms = tok.terms(q);
        let (ids, unknown) = query_terms(&oracle_index, terms.iter().map(String::as_str));
        exhaustive(&oracle_index, &scored, &ids, unknown, c.k, c.mode)
    };

    // A column of queries through the scalar function.
    let qschema = Arc::new(Schema::new(vec![
        Field::new("qid", DataType::Int32, false),
        Field::new("text", DataType::Utf8, true),
    ]));
    let qbatch = RecordBatch::try_new(
        Arc::clone(&qschema),
        vec![
            Arc::new(Int32Array::from_iter_values(0..c.queries.len() as i32)),
            Arc::new(StringArray::from_iter(c.queries.iter().cloned())),
        ],
    )?;
    ctx.register_table(
        "q",
        Arc::new(MemTable::try_new(qschema, vec![vec![qbatch]])?),
    )?;
    let out = ctx
        .sql(&format!(
            "SELECT qid, topk_bm25('idx', text, {}, '{}') AS hits FROM q ORDER BY qid",
            c.k,
            mode_name(c.mode)
        ))
        .await?
        .collect()
        .await?;
    let mut seen = 0;
    for b in &out {
        let qids = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        let hits = b.column(1).as_list::<i32>();
        for r in 0..b.num_rows() {
            let q = &c.queries[qids.value(r) as usize];
            match q {
                None => assert!(hits.is_null(r), "NULL query must give NULL"),
                Some(q) => {
                    let v = hits.value(r);
                    let s = v.as_struct();
                    let docs = s.column(0).as_primitive::<UInt32Type>();
                    let scores = s.column(1).as_primitive::<Float64Type>();
                    let got: Vec<Hit> = (0..s.len())
                        .map(|i| Hit {
                            doc: docs.value(i),
                            score: scores.value(i),
                        })
                        .collect();
                    assert_eq!(got, expect(q, &mut tok), "query {q:?} case {c:?}");
                }
            }
            seen += 1;
        }
    }
    assert_eq!(seen, c.queries.len());

    // The table function, on the first non-NULL query.
    if let Some(q) = c.queries.iter().flatten().next() {
        let q = q.replace('\'', "''");
        let out = ctx
            .sql(&format!(
                "SELECT doc_id, score FROM topk_bm25('idx', '{q}', {}, '{}') ORDER BY rank",
                c.k,
                mode_name(c.mode)
            ))
            .await?
            .collect()
            .await?;
        let mut got = Vec::new();
        for b in &out {
            let d = b.column(0).as_primitive::<UInt32Type>();
            let s = b.column(1).as_primitive::<Float64Type>();
            got.extend((0..b.num_rows()).map(|i| Hit {
                doc: d.value(i),
                score: s.value(i),
            }));
        }
        assert_eq!(got, expect(&q, &mut tok));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn sql_top_k_equals_exhaustive(c in case_strategy()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run_case(&c)).unwrap();
    }
}
