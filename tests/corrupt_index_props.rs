//! Corrupted and hand-edited index tables, generated: a real index (the bundled Debian
//! package descriptions, with static scores) with one column's values mutated: NULLs,
//! zeros, NaN, inf, negative and huge numbers, unsorted or shortened lists, a row twice,
//! a dropped or retyped column, no rows. Every search gives a clear error naming
//! `topk_bm25`, or the answer an independent BM25 over the mutated table gives: never a
//! panic, a NaN or a negative score.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, ListArray, RecordBatch, StringArray, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::compute::{cast, concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, UInt32Type, UInt64Type};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use proptest::prelude::*;

mod common;

const K: usize = 5;

/// The base index and the queries (terms of its own) every case runs.
struct Base {
    index: RecordBatch,
    queries: Vec<(String, &'static str)>,
}

fn base(rt: &tokio::runtime::Runtime) -> Base {
    rt.block_on(async {
        let ctx = datafusion_sets::new_context();
        let data = common::manifest_dir().join("examples/data/debian-packages.json");
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE packages STORED AS JSON LOCATION '{}'",
            data.display()
        ))
        .await
        .unwrap();
        let batches = ctx
            .sql(
                "SELECT * FROM bm25_index('packages', 'id', 'description', 'static=id') \
                 ORDER BY term",
            )
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let index = concat_batches(&batches[0].schema(), &batches).unwrap();
        let terms = index.column(0).as_string::<i32>();
        let df = index.column(1).as_list::<i32>();
        // Terms held by 3 to 40 documents, alone and in pairs, OR and AND.
        let picked: Vec<&str> = (0..index.num_rows())
            .filter(|&r| (3..=40).contains(&df.value(r).len()))
            .map(|r| terms.value(r))
            .step_by(7)
            .take(8)
            .collect();
        let mut queries = Vec::new();
        for w in picked.windows(2) {
            queries.push((w[0].to_string(), "or"));
            queries.push((format!("{} {}", w[0], w[1]), "or"));
            queries.push((format!("{} {}", w[0], w[1]), "and"));
        }
        Base { index, queries }
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Row `r` of column `c` NULL.
    Null(usize),
    /// `n_docs` or `total_len` (in every row, or row `r` only) set to a value.
    Stat(&'static str, u64, bool),
    /// The first element of row `r` of a list column set to a value.
    Elem(&'static str, f64),
    /// The first two documents of row `r` swapped.
    Unsorted,
    /// The last element of row `r` of a list column dropped.
    Shorter(&'static str),
    /// Row `r` twice.
    Twice,
    /// The tokenizer options of every row replaced.
    Tokenizer(&'static str),
    /// A column dropped.
    Drop(&'static str),
    /// A column cast to another type (where the cast exists).
    Retype(&'static str),
    /// No rows (the same schema).
    Empty,
    /// No rows, and not an index's schema.
    EmptyOther,
}

const LISTS: [&str; 4] = ["doc_ids", "tfs", "doc_lens", "static_scores"];
const COLUMNS: [&str; 8] = [
    "term",
    "doc_ids",
    "tfs",
    "doc_lens",
    "static_scores",
    "n_docs",
    "total_len",
    "tokenizer",
];
const STAT_VALUES: [u64; 7] = [0, 1, 2, 763, 765, 1 << 40, u64::MAX];
const ELEM_VALUES: [f64; 9] = [
    0.0,
    1.0,
    2.0,
    -1.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e308,
    u32::MAX as f64,
];
const TOKENIZERS: [&str; 5] = ["", "stopwords=none", "stem=klingon", "stem", "x=y"];

fn mutation() -> impl Strategy<Value = Mutation> {
    let list = prop::sample::select(LISTS.to_vec());
    let stat = prop::sample::select(vec!["n_docs", "total_len"]);
    let all = prop::sample::select(COLUMNS.to_vec());
    prop_oneof![
        (0usize..8).prop_map(Mutation::Null),
        (
            stat,
            prop::sample::select(STAT_VALUES.to_vec()),
            any::<bool>()
        )
            .prop_map(|(c, v, every)| Mutation::Stat(c, v, every)),
        (list.clone(), prop::sample::select(ELEM_VALUES.to_vec()))
            .prop_map(|(c, v)| Mutation::Elem(c, v)),
        Just(Mutation::Unsorted),
        list.prop_map(Mutation::Shorter),
        Just(Mutation::Twice),
        prop::sample::select(TOKENIZERS.to_vec()).prop_map(Mutation::Tokenizer),
        all.clone().prop_map(Mutation::Drop),
        all.prop_map(Mutation::Retype),
        Just(Mutation::Empty),
        Just(Mutation::EmptyOther),
    ]
}

/// A list column's rows as f64 vectors (u32 and f64 values are exact in f64).
fn rows_of(a: &ArrayRef) -> Vec<Vec<f64>> {
    let l = a.as_list::<i32>();
    (0..l.len())
        .map(|r| {
            let v = cast(&l.value(r), &DataType::Float64).unwrap();
            v.as_primitive::<Float64Type>().values().to_vec()
        })
        .collect()
}

/// Rows back into a list of the column's element type (values out of range become NULL,
/// which the index must reject too).
fn list_of(rows: &[Vec<f64>], like: &ArrayRef) -> ArrayRef {
    let DataType::List(f) = like.data_type() else {
        unreachable!()
    };
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    let values = cast(
        &(Arc::new(Float64Array::from(flat)) as ArrayRef),
        f.data_type(),
    )
    .unwrap();
    let offsets =
        datafusion::arrow::buffer::OffsetBuffer::from_lengths(rows.iter().map(|r| r.len()));
    Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(f.data_type().clone(), true)),
        offsets,
        values,
        None,
    ))
}

fn with_column(b: &RecordBatch, name: &str, col: ArrayRef) -> RecordBatch {
    let i = b.schema().index_of(name).unwrap();
    let mut cols = b.columns().to_vec();
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields[i] = Field::new(name, col.data_type().clone(), true);
    cols[i] = col;
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

fn nullable(b: &RecordBatch) -> RecordBatch {
    let fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), b.columns().to_vec()).unwrap()
}

fn apply(b: &RecordBatch, m: &Mutation, r: usize) -> RecordBatch {
    let b = nullable(b);
    let n = b.num_rows();
    let col = |name: &str| Arc::clone(b.column(b.schema().index_of(name).unwrap()));
    match m {
        Mutation::Null(c) => {
            let idx: UInt32Array = (0..n as u32)
                .map(|i| (i as usize != r).then_some(i))
                .collect();
            let name = b.schema().field(*c).name().clone();
            with_column(&b, &name, take(b.column(*c).as_ref(), &idx, None).unwrap())
        }
        Mutation::Stat(name, v, every) => {
            let old = col(name);
            let old = old.as_primitive::<UInt64Type>();
            let new: UInt64Array = (0..n)
                .map(|i| Some(if *every || i == r { *v } else { old.value(i) }))
                .collect();
            with_column(&b, name, Arc::new(new))
        }
        Mutation::Elem(name, v) => {
            let mut rows = rows_of(&col(name));
            rows[r][0] = *v;
            with_column(&b, name, list_of(&rows, &col(name)))
        }
        Mutation::Unsorted => {
            let mut rows = rows_of(&col("doc_ids"));
            if rows[r].len() >= 2 {
                rows[r].swap(0, 1);
            } else {
                let first = rows[r][0];
                rows[r].push(first);
            }
            with_column(&b, "doc_ids", list_of(&rows, &col("doc_ids")))
        }
        Mutation::Shorter(name) => {
            let mut rows = rows_of(&col(name));
            rows[r].pop();
            with_column(&b, name, list_of(&rows, &col(name)))
        }
        Mutation::Twice => {
            let idx: UInt32Array = (0..n as u32).chain([r as u32]).collect();
            let cols = b
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &idx, None).unwrap())
                .collect();
            RecordBatch::try_new(b.schema(), cols).unwrap()
        }
        Mutation::Tokenizer(t) => {
            with_column(&b, "tokenizer", Arc::new(StringArray::from(vec![*t; n])))
        }
        Mutation::Drop(name) => {
            let i = b.schema().index_of(name).unwrap();
            let keep: Vec<usize> = (0..b.num_columns()).filter(|&j| j != i).collect();
            b.project(&keep).unwrap()
        }
        Mutation::Retype(name) => {
            let c = col(name);
            let to = match c.data_type() {
                DataType::List(_) => DataType::new_list(DataType::Int64, true),
                DataType::UInt64 => DataType::Float64,
                _ => DataType::LargeBinary,
            };
            match cast(&c, &to) {
                Ok(c) => with_column(&b, name, c),
                Err(_) => b.clone(),
            }
        }
        Mutation::Empty => b.slice(0, 0),
        Mutation::EmptyOther => RecordBatch::new_empty(Arc::new(Schema::new(vec![Field::new(
            "a",
            DataType::Int32,
            true,
        )]))),
    }
}

/// An independent BM25 over the (mutated) table, or `None` where its values do not make
/// one (so a search that answers anyway is wrong). k1 = 1.2, b = 0.75, α = 0.3.
fn reference(b: &RecordBatch, query: &str, and: bool) -> Option<Vec<(u32, f64)>> {
    let col = |name: &str| b.column_by_name(name).cloned();
    let terms = col("term")?;
    let terms = terms.as_string_opt::<i32>()?;
    let (docs, tfs, lens) = (col("doc_ids")?, col("tfs")?, col("doc_lens")?);
    // Without static scores, score = BM25; with them, 0.3 * static + 0.7 * BM25.
    let statics = col("static_scores");
    let (alpha, weight) = if statics.is_some() {
        (0.3, 0.7)
    } else {
        (0.0, 1.0)
    };
    let n_docs = col("n_docs")?;
    let n_docs = n_docs.as_primitive_opt::<UInt64Type>()?;
    let total = col("total_len")?;
    let total = total.as_primitive_opt::<UInt64Type>()?;
    if b.num_rows() == 0 {
        return Some(Vec::new());
    }
    if n_docs.null_count() + total.null_count() > 0 {
        return None;
    }
    let (big_n, avgdl) = (
        n_docs.value(0) as f64,
        total.value(0) as f64 / n_docs.value(0) as f64,
    );
    let mut postings: HashMap<&str, Vec<(u32, f64, f64, f64)>> = HashMap::new();
    for r in 0..b.num_rows() {
        let get = |a: &ArrayRef| -> Option<Vec<f64>> {
            let l = a.as_list_opt::<i32>()?;
            if l.is_null(r) {
                return None;
            }
            let v = l.value(r);
            if v.null_count() > 0 {
                return None;
            }
            let v = cast(&v, &DataType::Float64).ok()?;
            Some(v.as_primitive::<Float64Type>().values().to_vec())
        };
        let (d, f, l) = (get(&docs)?, get(&tfs)?, get(&lens)?);
        let s = match &statics {
            Some(st) => get(st)?,
            None => vec![0.0; d.len()],
        };
        if terms.is_null(r) {
            return None;
        }
        let p = d
            .iter()
            .zip(&f)
            .zip(&l)
            .zip(&s)
            .map(|(((&d, &f), &l), &s)| (d as u32, f, l, s));
        postings.insert(terms.value(r), p.collect());
    }
    let words: Vec<&str> = query.split(' ').collect();
    let mut score: HashMap<u32, (f64, usize, f64)> = HashMap::new();
    let mut seen_terms = 0;
    let mut sorted = words.clone();
    sorted.sort_unstable();
    sorted.dedup();
    for w in sorted {
        let Some(p) = postings.get(w) else { continue };
        seen_terms += 1;
        let df = p.len() as f64;
        let idf = (1.0 + (big_n - df + 0.5) / (df + 0.5)).ln();
        for &(d, tf, len, st) in p {
            let s = idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len / avgdl));
            let e = score.entry(d).or_insert((0.0, 0, st));
            e.0 += s;
            e.1 += 1;
        }
    }
    let distinct = {
        let mut w = words.clone();
        w.sort_unstable();
        w.dedup();
        w.len()
    };
    let mut hits: Vec<(u32, f64)> = score
        .into_iter()
        .filter(|(_, (_, n, _))| !and || (*n == distinct && seen_terms == distinct))
        .map(|(d, (s, _, st))| (d, alpha * st + weight * s))
        .collect();
    hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    hits.truncate(K);
    Some(hits)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

async fn search(
    ctx: &SessionContext,
    q: &str,
    mode: &str,
) -> datafusion::common::Result<Vec<(u32, f64)>> {
    let batches = ctx
        .sql(&format!(
            "SELECT doc_id, score FROM topk_bm25('m', '{q}', {K}, '{mode}')"
        ))
        .await?
        .collect()
        .await?;
    let mut out = Vec::new();
    for b in batches {
        let d = b.column(0).as_primitive::<UInt32Type>();
        let s = b.column(1).as_primitive::<Float64Type>();
        out.extend(d.values().iter().copied().zip(s.values().iter().copied()));
    }
    Ok(out)
}

fn check(base: &Base, rt: &tokio::runtime::Runtime, m: &Mutation, r: usize) -> Result<(), String> {
    let table = apply(&base.index, m, r % base.index.num_rows());
    rt.block_on(async {
        let ctx = datafusion_sets::new_context();
        let mem = MemTable::try_new(table.schema(), vec![vec![table.clone()]]).unwrap();
        ctx.register_table("m", Arc::new(mem)).unwrap();
        for (q, mode) in &base.queries {
            match search(&ctx, q, mode).await {
                Err(e) => {
                    let e = e.to_string();
                    if !e.contains("topk_bm25") || e.contains("panic") {
                        return Err(format!("{m:?}: unclear error: {e}"));
                    }
                    return Ok(());
                }
                Ok(hits) => {
                    if let Some((d, s)) = hits.iter().find(|(_, s)| !s.is_finite() || *s < 0.0) {
                        return Err(format!("{m:?} '{q}': doc {d} scored {s}"));
                    }
                    let Some(want) = reference(&table, q, *mode == "and") else {
                        return Err(format!(
                            "{m:?} '{q}': answered {hits:?} from an index that makes no BM25"
                        ));
                    };
                    let same = hits.len() == want.len()
                        && hits.iter().zip(&want).all(|(h, w)| close(h.1, w.1));
                    if !same {
                        return Err(format!("{m:?} '{q}' {mode}: got {hits:?}, want {want:?}"));
                    }
                }
            }
        }
        Ok(())
    })
}

#[test]
fn unmutated_index_answers_like_the_reference() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = base(&rt);
    assert!(base.queries.len() >= 15, "{} queries", base.queries.len());
    // A no-op mutation: every row's tokenizer as it is.
    let tok = base
        .index
        .column_by_name("tokenizer")
        .unwrap()
        .as_string::<i32>()
        .value(0)
        .to_string();
    let tok: &'static str = Box::leak(tok.into_boxed_str());
    check(&base, &rt, &Mutation::Tokenizer(tok), 0).unwrap();
}

/// Every mutation, each value, at the first row and at one in the middle.
fn every_mutation() -> Vec<Mutation> {
    let mut all: Vec<Mutation> = (0..8).map(Mutation::Null).collect();
    for c in ["n_docs", "total_len"] {
        for v in STAT_VALUES {
            all.push(Mutation::Stat(c, v, true));
            all.push(Mutation::Stat(c, v, false));
        }
    }
    for c in LISTS {
        all.extend(ELEM_VALUES.iter().map(|&v| Mutation::Elem(c, v)));
        all.push(Mutation::Shorter(c));
    }
    all.extend(TOKENIZERS.iter().map(|&t| Mutation::Tokenizer(t)));
    all.extend(COLUMNS.iter().map(|&c| Mutation::Drop(c)));
    all.extend(COLUMNS.iter().map(|&c| Mutation::Retype(c)));
    all.extend([
        Mutation::Unsorted,
        Mutation::Twice,
        Mutation::Empty,
        Mutation::EmptyOther,
    ]);
    all
}

#[test]
fn every_mutation_gives_an_error_or_the_right_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = base(&rt);
    let mut failures = Vec::new();
    for m in every_mutation() {
        for r in [0, base.index.num_rows() / 2] {
            if let Err(e) = check(&base, &rt, &m, r) {
                failures.push(format!("row {r}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mutated_index_tables_give_an_error_or_the_right_answer(m in mutation(), r in 0usize..10_000) {
        static BASE: std::sync::OnceLock<(tokio::runtime::Runtime, Base)> = std::sync::OnceLock::new();
        let (rt, base) = BASE.get_or_init(|| {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let b = base(&rt);
            (rt, b)
        });
        if let Err(e) = check(base, rt, &m, r) {
            prop_assert!(false, "{}", e);
        }
    }
}
