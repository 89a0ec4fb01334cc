//! The Unicode tokenizer on real text: Debian's package descriptions translated into German,
//! French, Spanish, Russian, Japanese and Simplified Chinese, and Unicode's own word boundary
//! tests.
//!
//! 1. For each language, `bm25_index` (through SQL, with the language's options) and the
//!    `topk_bm25` scalar function answer 600 queries drawn from the corpus's own text (a few
//!    consecutive words; a few characters of the CJK texts), OR and AND, top-10; every answer
//!    equals an exhaustive BM25 scorer written here, over terms from the same tokenizer:
//!    the same number of hits, each hit's score the scorer's score of that document, the i-th
//!    score the scorer's i-th best (to 1e-9: the scorer adds in another order).
//! 2. The words the tokenizer finds (`uax29_words`: its byte loop for ASCII pieces,
//!    `unicode-segmentation` for the rest, cut at punctuation) equal those of every line of
//!    `WordBreakTest.txt`, its segments cut at punctuation by the rule written out here.
//! 3. The tokenizer's shortcuts (pieces at whitespace, the ASCII byte loop, NFKC skipped for
//!    ASCII) change no term: every translated description and every gcide article gives the
//!    same terms with and without them; and on every all-ASCII text the Unicode tokenizer's
//!    terms are the ASCII tokenizer's.
//!
//! Data: `bench-data/` (or `$SETS_BENCH_DATA`), built by `benches/data/build.sh`
//! (`translations/<xx>.parquet`, `unicode/WordBreakTest.txt`, `gcide/docs.parquet`). A test
//! whose data is missing prints why and passes (CI has no bench-data).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, StringArray, UInt32Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type};
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_sets::bm25::{Tokenizer, TokenizerKind, TokenizerOptions, uax29_words};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

const K: usize = 10;
const QUERIES: usize = 600;
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Each corpus with the options it is indexed with, and whether its words are space-separated.
const LANGUAGES: [(&str, &str, bool); 6] = [
    ("de", "stopwords=german, stem=german, fold=ascii", true),
    ("fr", "stopwords=french, stem=french, fold=ascii", true),
    ("es", "stopwords=spanish, stem=spanish", true),
    ("ru", "stopwords=russian, stem=russian", true),
    ("ja", "", false),
    ("zh_CN", "", false),
];

macro_rules! note {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

fn data_dir() -> PathBuf {
    match std::env::var_os("SETS_BENCH_DATA") {
        Some(d) => PathBuf::from(d),
        None => common::manifest_dir().join("bench-data"),
    }
}

fn missing(test: &str, path: &std::path::Path) -> bool {
    if path.exists() {
        return false;
    }
    note!(
        "{test}: SKIPPED: {} is missing (set SETS_BENCH_DATA or build it with \
         benches/data/build.sh)",
        path.display()
    );
    true
}

/// (doc_id, text) of a Parquet file with those columns.
async fn read_docs(path: &std::path::Path) -> Vec<(u32, String)> {
    let ctx = SessionContext::new();
    let df = ctx
        .read_parquet(path.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    let batches = df
        .select_columns(&["doc_id", "text"])
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut out = Vec::new();
    for b in batches {
        let ids = cast(b.column(0), &DataType::UInt32).unwrap();
        let ids = ids.as_primitive::<UInt32Type>();
        let texts = cast(b.column(1), &DataType::Utf8).unwrap();
        let texts = texts.as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), texts.value(i).to_string()));
        }
    }
    out
}

/// The test's own BM25: postings from the tokenizer's terms, scored document by document.
struct Oracle {
    /// term -> (doc, tf)
    postings: HashMap<String, Vec<(u32, u32)>>,
    lens: HashMap<u32, u32>,
    n: f64,
    avgdl: f64,
}

impl Oracle {
    fn new(docs: &[(u32, String)], tok: &mut Tokenizer) -> Self {
        let mut postings: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        let mut lens = HashMap::new();
        let mut total = 0u64;
        for (id, text) in docs {
            let terms = tok.terms(text);
            total += terms.len() as u64;
            lens.insert(*id, terms.len() as u32);
            let mut tf: HashMap<String, u32> = HashMap::new();
            for t in terms {
                *tf.entry(t).or_default() += 1;
            }
            for (t, f) in tf {
                postings.entry(t).or_default().push((*id, f));
            }
        }
        let n = docs.len() as f64;
        Self {
            postings,
            lens,
            n,
            avgdl: if docs.is_empty() {
                1.0
            } else {
                total as f64 / n
            },
        }
    }

    /// Every matching document with its score, best first (ties by doc id).
    fn rank(&self, terms: &BTreeSet<String>, and: bool) -> Vec<(u32, f64)> {
        let mut score: HashMap<u32, (f64, usize)> = HashMap::new();
        let mut known = 0;
        for t in terms {
            let Some(list) = self.postings.get(t) else {
                continue;
            };
            known += 1;
            let df = list.len() as f64;
            let idf = (1.0 + (self.n - df + 0.5) / (df + 0.5)).ln();
            for &(d, tf) in list {
                let tf = tf as f64;
                let dl = self.lens[&d] as f64;
                let s = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / self.avgdl));
                let e = score.entry(d).or_default();
                e.0 += s;
                e.1 += 1;
            }
        }
        let mut hits: Vec<(u32, f64)> = score
            .into_iter()
            .filter(|(_, (_, c))| !and || (known == terms.len() && *c == terms.len()))
            .map(|(d, (s, _))| (d, s))
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hits
    }
}

/// Queries from the corpus: 1 to 3 consecutive whitespace-separated words of a random
/// document, or (CJK) 2 to 6 consecutive characters; each with at least one term.
fn draw_queries(docs: &[(u32, String)], spaced: bool, tok: &mut Tokenizer) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(0x5e75);
    let mut out = Vec::with_capacity(QUERIES);
    while out.len() < QUERIES {
        let text = &docs[rng.random_range(0..docs.len())].1;
        let q = if spaced {
            let words: Vec<&str> = text.split_whitespace().collect();
            if words.is_empty() {
                continue;
            }
            let start = rng.random_range(0..words.len());
            let len = rng.random_range(1..=3usize).min(words.len() - start);
            words[start..start + len].join(" ")
        } else {
            let chars: Vec<char> = text.chars().collect();
            if chars.is_empty() {
                continue;
            }
            let start = rng.random_range(0..chars.len());
            let len = rng.random_range(2..=6usize).min(chars.len() - start);
            chars[start..start + len].iter().collect()
        };
        if !tok.terms(&q).is_empty() {
            out.push(q);
        }
    }
    out
}

/// `topk_bm25('idx', q, K, mode)` of every query, as (doc, score) lists.
async fn sql_topk(ctx: &SessionContext, mode: &str) -> Vec<Vec<(u32, f64)>> {
    let batches = ctx
        .sql(&format!(
            "SELECT qid, topk_bm25('idx', q, {K}, '{mode}') AS hits FROM queries ORDER BY qid"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut out = Vec::new();
    for b in batches {
        let lists = b.column(1).as_list::<i32>();
        for r in 0..b.num_rows() {
            let hits = lists.value(r);
            let hits = hits.as_struct();
            let docs = cast(hits.column_by_name("doc_id").unwrap(), &DataType::UInt32).unwrap();
            let docs = docs.as_primitive::<UInt32Type>();
            let scores = hits.column_by_name("score").unwrap();
            let scores = scores.as_primitive::<Float64Type>();
            out.push(
                (0..hits.len())
                    .map(|i| (docs.value(i), scores.value(i)))
                    .collect(),
            );
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Whether `got` is a correct top-K of the oracle's full ranking `want`.
fn agrees(got: &[(u32, f64)], want: &[(u32, f64)], oracle_score: &HashMap<u32, f64>) -> bool {
    got.len() == want.len().min(K)
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| close(g.1, w.1) && oracle_score.get(&g.0).is_some_and(|&s| close(s, g.1)))
        && got.iter().map(|g| g.0).collect::<BTreeSet<_>>().len() == got.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topk_equals_an_exhaustive_scorer_in_six_languages() {
    let dir = data_dir().join("translations");
    for (lang, spec, spaced) in LANGUAGES {
        let path = dir.join(format!("{lang}.parquet"));
        if missing("tokenizer_real_data", &path) {
            return;
        }
        let t = Instant::now();
        let docs = read_docs(&path).await;
        let options = TokenizerOptions::parse_options(spec, "test").unwrap();
        let mut tok = Tokenizer::new(options);
        let oracle = Oracle::new(&docs, &mut tok);
        let queries = draw_queries(&docs, spaced, &mut tok);

        let ctx = datafusion_sets::new_context();
        let schema = Arc::new(Schema::new(vec![
            Field::new("doc_id", DataType::UInt32, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(UInt32Array::from_iter_values(docs.iter().map(|d| d.0))),
                Arc::new(StringArray::from_iter_values(docs.iter().map(|d| &d.1))),
            ],
        )
        .unwrap();
        ctx.register_table(
            "docs",
            Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
        )
        .unwrap();
        ctx.sql(&format!(
            "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', '{spec}')"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        // The index records the options in full.
        let recorded = ctx
            .sql("SELECT DISTINCT tokenizer FROM idx")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let recorded = recorded[0]
            .column(0)
            .as_string::<i32>()
            .value(0)
            .to_string();
        assert_eq!(recorded, options.to_string(), "{lang}: recorded tokenizer");
        let qschema = Arc::new(Schema::new(vec![
            Field::new("qid", DataType::UInt32, false),
            Field::new("q", DataType::Utf8, false),
        ]));
        let qbatch = RecordBatch::try_new(
            Arc::clone(&qschema),
            vec![
                Arc::new(UInt32Array::from_iter_values(0..queries.len() as u32)),
                Arc::new(StringArray::from_iter_values(&queries)),
            ],
        )
        .unwrap();
        ctx.register_table(
            "queries",
            Arc::new(MemTable::try_new(qschema, vec![vec![qbatch]]).unwrap()),
        )
        .unwrap();

        let mut failures = Vec::new();
        let mut with_hits = [0usize; 2];
        for (m, mode) in ["or", "and"].into_iter().enumerate() {
            let got = sql_topk(&ctx, mode).await;
            assert_eq!(
                got.len(),
                queries.len(),
                "{lang} {mode}: one answer per query"
            );
            for (q, got) in queries.iter().zip(&got) {
                let terms: BTreeSet<String> = tok.terms(q).into_iter().collect();
                let want = oracle.rank(&terms, mode == "and");
                let scores: HashMap<u32, f64> = want.iter().copied().collect();
                with_hits[m] += !want.is_empty() as usize;
                if !agrees(got, &want, &scores) {
                    failures.push(format!(
                        "{lang} {mode} {q:?} (terms {terms:?}):\n  topk_bm25 {got:?}\n  oracle    {:?}",
                        &want[..want.len().min(K)]
                    ));
                }
            }
        }
        note!(
            "tokenizer_real_data: {lang}: {} docs, {} terms, {} queries ({spec:?}), with hits \
             OR {} AND {}, in {:.1?}",
            docs.len(),
            oracle.postings.len(),
            queries.len(),
            with_hits[0],
            with_hits[1],
            t.elapsed()
        );
        // A query of whole words drawn from a document finds it. A CJK query may not: a
        // character cut from a run is a unigram the run's bigrams do not hold (as with
        // Lucene's CJKBigramFilter), but most queries hold a bigram of their document.
        if spaced {
            assert_eq!(
                with_hits[0],
                queries.len(),
                "{lang}: OR finds every query's document"
            );
        } else {
            assert!(
                with_hits[0] * 10 >= queries.len() * 8,
                "{lang}: OR hits {with_hits:?}"
            );
        }
        assert!(
            failures.is_empty(),
            "{} of {} answers differ from the exhaustive scorer; first ones:\n{}",
            failures.len(),
            2 * queries.len(),
            failures[..failures.len().min(5)].join("\n")
        );
    }
}

/// The code points of a `WordBreakTest.txt` line and the words its boundaries give.
fn parse_break_test(line: &str) -> Option<(String, Vec<String>)> {
    let body = line.split('#').next()?.trim();
    if body.is_empty() {
        return None;
    }
    let mut text = String::new();
    let mut segments = vec![String::new()];
    for tok in body.split_whitespace() {
        match tok {
            "÷" => segments.push(String::new()),
            "×" => {}
            hex => {
                let c = char::from_u32(u32::from_str_radix(hex, 16).ok()?)?;
                text.push(c);
                segments.last_mut()?.push(c);
            }
        }
    }
    // The tokenizer's rule: each segment cut at what is not a letter, digit, mark or format
    // character; the pieces holding a letter or digit.
    let keeps = |c: char| {
        c.is_alphanumeric()
            || matches!(c.general_category_group(), GeneralCategoryGroup::Mark)
            || c.general_category() == GeneralCategory::Format
    };
    let words = segments
        .iter()
        .flat_map(|s| s.split(|c: char| !keeps(c)))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(str::to_string)
        .collect();
    Some((text, words))
}

#[test]
fn word_boundaries_agree_with_word_break_test() {
    let path = data_dir().join("unicode/WordBreakTest.txt");
    if missing("tokenizer_real_data", &path) {
        return;
    }
    let file = std::fs::read_to_string(&path).unwrap();
    let version = file.lines().next().unwrap_or_default().to_string();
    let (mut lines, mut ascii) = (0, 0);
    let mut failures = Vec::new();
    for (n, line) in file.lines().enumerate() {
        let Some((text, want)) = parse_break_test(line) else {
            continue;
        };
        lines += 1;
        ascii += text.is_ascii() as usize;
        let got: Vec<&str> = uax29_words(&text);
        if got != want {
            failures.push(format!(
                "line {}: {text:?}: got {got:?}, want {want:?}",
                n + 1
            ));
        }
    }
    note!(
        "tokenizer_real_data: {version}: {lines} lines ({ascii} all ASCII), {} differ",
        failures.len()
    );
    assert!(lines > 1000, "{lines} test lines: not WordBreakTest.txt?");
    assert!(
        failures.is_empty(),
        "{} of {lines} lines differ:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shortcuts_change_no_term_on_real_text() {
    let mut corpora: Vec<PathBuf> = LANGUAGES
        .iter()
        .map(|(l, _, _)| data_dir().join(format!("translations/{l}.parquet")))
        .collect();
    corpora.push(data_dir().join("gcide/docs.parquet"));
    for path in corpora {
        if missing("tokenizer_real_data", &path) {
            continue;
        }
        let docs = read_docs(&path).await;
        for spec in ["", "fold=ascii, stopwords=english, stem=english"] {
            let options = TokenizerOptions::parse_options(spec, "test").unwrap();
            let mut fast = Tokenizer::new(options);
            let mut slow = Tokenizer::new(options).without_shortcuts();
            let mut ascii = Tokenizer::new(TokenizerOptions {
                kind: TokenizerKind::Ascii,
                ..options
            });
            let (mut terms, mut ascii_docs) = (0usize, 0usize);
            let (mut t_fast, mut t_slow) = (0f64, 0f64);
            for (id, text) in &docs {
                let t0 = Instant::now();
                let a = fast.terms(text);
                let t1 = Instant::now();
                let b = slow.terms(text);
                t_fast += (t1 - t0).as_secs_f64();
                t_slow += t1.elapsed().as_secs_f64();
                assert_eq!(a, b, "{}: doc {id} ({spec:?}): {text:?}", path.display());
                if text.is_ascii() {
                    assert_eq!(
                        a,
                        ascii.terms(text),
                        "{}: doc {id} ({spec:?}): the ASCII tokenizer differs on {text:?}",
                        path.display()
                    );
                }
                terms += a.len();
                ascii_docs += text.is_ascii() as usize;
            }
            note!(
                "tokenizer_real_data: {}: {} docs ({ascii_docs} all ASCII), {terms} terms \
                 ({spec:?}) equal with and without shortcuts; {t_fast:.2} s with, {t_slow:.2} s \
                 without",
                path.display(),
                docs.len()
            );
        }
    }
}
