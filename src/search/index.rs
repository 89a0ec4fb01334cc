//! The inverted index: its Arrow form (one row per term, the table `bm25_index` returns and
//! users store as Parquet) and its in-memory form (CSR over all postings) that queries run on.
//!
//! Arrow schema, one row per term, rows sorted by term:
//!
//! | column | type | meaning |
//! | --- | --- | --- |
//! | `term` | Utf8 | the term (after tokenization) |
//! | `doc_ids` | `List<UInt32>` | documents holding it, strictly increasing |
//! | `tfs` | `List<UInt32>` | its count in each of those documents |
//! | `doc_lens` | `List<UInt32>` | each of those documents' length in terms |
//! | `static_scores` | `List<Float64>` | each document's static score (only when one was given) |
//! | `n_docs` | UInt64 | documents in the corpus (every row the same) |
//! | `total_len` | UInt64 | terms in the corpus (every row the same; avgdl = total_len / n_docs) |
//! | `tokenizer` | Utf8 | the tokenizer options the documents were indexed with |
//!
//! Document lengths (and static scores) ride along with each posting so one table holds
//! everything a ranking needs, and a postings list read from Parquet is scored without a join.
//!
//! A sharded index (`bm25_index(..., 'shards=N')`) splits the documents into N shards by a
//! hash of their ids and holds one row per (shard, term): the same columns, each row's lists
//! only that shard's postings, plus
//!
//! | column | type | meaning |
//! | --- | --- | --- |
//! | `shard` | UInt32 | the shard, `0..N` ([`shard_of`] its documents' ids) |
//! | `shards` | UInt32 | N (every row the same) |
//! | `df` | UInt64 | documents holding the term in the whole corpus (every row of the term the same) |
//!
//! rows sorted by shard, then term. `n_docs` and `total_len` stay the whole corpus's, so the
//! rows of any set of whole shards load as an index that ranks its documents with the global
//! statistics (N, avgdl and each term's document frequency, as Elasticsearch's DFS phase
//! gathers them): every document's score equals the unsharded index's bit for bit, and the
//! shards' top-k lists merge exactly into the whole index's. The whole sharded table loads as
//! the unsharded index.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, ListArray, RecordBatch, StringArray, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Schema, SchemaRef, UInt32Type, UInt64Type,
};
use datafusion::common::{Result, plan_err};
use rayon::prelude::*;

use super::tokenize::{Tokenizer, TokenizerOptions};

/// The in-memory index: postings of all terms in one CSR layout.
#[derive(Debug)]
pub struct InvertedIndex {
    term_ids: HashMap<String, u32>,
    /// Postings of term `t`: `offsets[t]..offsets[t + 1]`.
    offsets: Vec<usize>,
    docs: Vec<u32>,
    tfs: Vec<u32>,
    lens: Vec<u32>,
    statics: Option<Vec<f64>>,
    /// Each term's document frequency in the whole corpus, when the index was loaded from a
    /// sharded table (its `df` column); else a term's postings are all its documents.
    dfs: Option<Vec<u64>>,
    n_docs: u64,
    total_len: u64,
    tokenizer: TokenizerOptions,
}

/// A sharded load's postings of the rows after a term's first, by term id: (doc, tf, length,
/// static score).
type MorePostings = HashMap<u32, Vec<(u32, u32, u32, f64)>, foldhash::fast::RandomState>;

/// One document to index: its id, its terms (repeats count) and its static score.
pub struct IndexedDoc<'a> {
    pub id: u32,
    pub terms: Vec<&'a str>,
    pub static_score: Option<f64>,
}

/// The Arrow schema of an index table.
pub fn index_schema(with_static: bool) -> SchemaRef {
    let list = |t: DataType| DataType::List(Arc::new(Field::new_list_field(t, false)));
    let mut fields = vec![
        Field::new("term", DataType::Utf8, false),
        Field::new("doc_ids", list(DataType::UInt32), false),
        Field::new("tfs", list(DataType::UInt32), false),
        Field::new("doc_lens", list(DataType::UInt32), false),
    ];
    if with_static {
        fields.push(Field::new("static_scores", list(DataType::Float64), false));
    }
    fields.extend([
        Field::new("n_docs", DataType::UInt64, false),
        Field::new("total_len", DataType::UInt64, false),
        Field::new("tokenizer", DataType::Utf8, false),
    ]);
    Arc::new(Schema::new(fields))
}

/// The Arrow schema of a sharded index table: [`index_schema`] plus `shard`, `shards` and
/// `df`.
pub fn sharded_index_schema(with_static: bool) -> SchemaRef {
    let mut fields: Vec<Field> = index_schema(with_static)
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("shard", DataType::UInt32, false));
    fields.push(Field::new("shards", DataType::UInt32, false));
    fields.push(Field::new("df", DataType::UInt64, false));
    Arc::new(Schema::new(fields))
}

/// The shard of document `doc` among `shards`: a multiplicative hash of the id, so that
/// consecutive ids spread over every shard.
pub fn shard_of(doc: u32, shards: u32) -> u32 {
    (((doc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % shards.max(1) as u64) as u32
}

impl InvertedIndex {
    /// Index `docs` (ids must be distinct; the caller checks).
    pub fn build(docs: &[IndexedDoc<'_>], tokenizer: TokenizerOptions, with_static: bool) -> Self {
        let mut b = IndexBuilder::new(tokenizer, with_static);
        for d in docs {
            b.add_terms(d.id, d.terms.iter().copied(), d.static_score);
        }
        b.finish()
    }

    /// The index as one record batch of `index_schema`, one row per term in term-id order
    /// (the order of [`IndexBuilder::finish`]: by term), its postings moved into the Arrow
    /// arrays uncopied, so the batch costs no second copy of the index.
    pub fn into_batch(self) -> Result<RecordBatch> {
        self.check_whole()?;
        let Self {
            term_ids,
            offsets,
            docs,
            tfs,
            lens,
            statics,
            dfs: _,
            n_docs,
            total_len,
            tokenizer,
        } = self;
        index_batch(
            &term_names(&term_ids),
            &offsets,
            [docs, tfs, lens],
            statics,
            (n_docs, total_len),
            tokenizer,
        )
    }

    /// The index as the batch of a sharded index table (`sharded_index_schema`): one row per
    /// (shard, term) holding that shard's postings of the term, sorted by shard then term,
    /// each row with the term's document frequency over the whole index.
    pub fn into_sharded_batch(self, shards: u32) -> Result<RecordBatch> {
        let shards = shards.max(1);
        let names = term_names(&self.term_ids);
        // Per shard: its rows' terms, where each row's postings start, and the postings.
        #[derive(Default)]
        struct Shard {
            terms: Vec<u32>,
            starts: Vec<usize>,
            docs: Vec<u32>,
            tfs: Vec<u32>,
            lens: Vec<u32>,
            statics: Vec<f64>,
        }
        let mut parts: Vec<Shard> = (0..shards).map(|_| Shard::default()).collect();
        for t in 0..self.terms() as u32 {
            for p in self.range(t) {
                let part = &mut parts[shard_of(self.docs[p], shards) as usize];
                if part.terms.last() != Some(&t) {
                    part.terms.push(t);
                    part.starts.push(part.docs.len());
                }
                part.docs.push(self.docs[p]);
                part.tfs.push(self.tfs[p]);
                part.lens.push(self.lens[p]);
                if let Some(s) = &self.statics {
                    part.statics.push(s[p]);
                }
            }
        }
        let mut row_names = Vec::new();
        let mut offsets = vec![0usize];
        let (mut docs, mut tfs, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        let mut statics = self.statics.as_ref().map(|_| Vec::new());
        let (mut shard_col, mut df_col) = (Vec::new(), Vec::new());
        for (s, mut part) in parts.into_iter().enumerate() {
            let base = docs.len();
            for (i, &t) in part.terms.iter().enumerate() {
                let end = part.starts.get(i + 1).copied().unwrap_or(part.docs.len());
                row_names.push(names[t as usize]);
                offsets.push(base + end);
                shard_col.push(s as u32);
                df_col.push(self.df(t));
            }
            docs.append(&mut part.docs);
            tfs.append(&mut part.tfs);
            lens.append(&mut part.lens);
            if let Some(st) = &mut statics {
                st.append(&mut part.statics);
            }
        }
        let batch = index_batch(
            &row_names,
            &offsets,
            [docs, tfs, lens],
            statics,
            (self.n_docs, self.total_len),
            self.tokenizer,
        )?;
        let mut columns = batch.columns().to_vec();
        let rows = shard_col.len();
        columns.push(Arc::new(UInt32Array::from(shard_col)));
        columns.push(Arc::new(UInt32Array::from(vec![shards; rows])));
        columns.push(Arc::new(UInt64Array::from(df_col)));
        Ok(RecordBatch::try_new(
            sharded_index_schema(self.statics.is_some()),
            columns,
        )?)
    }

    /// An error unless every term's postings are all its documents: the unsharded table of
    /// some shards of an index would give their terms the wrong document frequencies.
    fn check_whole(&self) -> Result<()> {
        match (0..self.terms() as u32).find(|&t| self.df(t) != self.postings_len(t) as u64) {
            None => Ok(()),
            Some(_) => datafusion::common::internal_err!(
                "bm25_index: an index of some shards cannot be written as an unsharded table"
            ),
        }
    }

    /// [`into_batch`](Self::into_batch) of a copy.
    pub fn to_batch(&self) -> Result<RecordBatch> {
        self.check_whole()?;
        index_batch(
            &term_names(&self.term_ids),
            &self.offsets,
            [self.docs.clone(), self.tfs.clone(), self.lens.clone()],
            self.statics.clone(),
            (self.n_docs, self.total_len),
            self.tokenizer,
        )
    }

    /// Load an index from the batches of an index table of `schema` (any batch split, any
    /// row order). `who` and `table` name the caller and the table in errors. Every value is
    /// checked, so a corrupted or hand-edited table is rejected with the reason rather than
    /// ranked wrongly: each document has one length (and one static score, finite) in every
    /// term that holds it, a term's frequency in a document is at least 1 and at most the
    /// document's length, `n_docs` covers every document and `total_len` their lengths.
    /// Deleting whole term rows keeps an index valid.
    ///
    /// A table with a `df` column is a sharded index (see the module docs): a term may have a
    /// row in each shard, and its rows' postings are merged (a document in two of them is an
    /// error); its idf is taken from `df`, which must be the same in each of its rows, at
    /// least its postings and at most `n_docs`. Its terms are numbered in term order, so that
    /// scores are summed in the same order whichever shards are loaded.
    pub fn from_batches(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        who: &str,
        table: &str,
    ) -> Result<Self> {
        let not_index = |why: String| {
            plan_err!(
                "{who}: table '{table}' is not a BM25 index ({why}); build one with bm25_index('docs', 'id', 'text')"
            )
        };
        let with_static = schema.column_with_name("static_scores").is_some();
        for f in index_schema(with_static).fields() {
            match schema.column_with_name(f.name()) {
                None => return not_index(format!("no column '{}'", f.name())),
                Some((_, got)) if !same_shape(got.data_type(), f.data_type()) => {
                    return not_index(format!(
                        "column '{}' is {}, expected {}",
                        f.name(),
                        got.data_type(),
                        f.data_type()
                    ));
                }
                _ => {}
            }
        }
        let sharded = match schema.column_with_name("df") {
            None => false,
            Some((_, f)) if f.data_type() == &DataType::UInt64 => true,
            Some((_, f)) => {
                return not_index(format!(
                    "column 'df' is {}, expected {}",
                    f.data_type(),
                    DataType::UInt64
                ));
            }
        };
        if sharded {
            for name in ["shard", "shards"] {
                if schema.column_with_name(name).is_none() {
                    return not_index(format!("a 'df' column but no column '{name}'"));
                }
            }
        }
        // A sharded table's shard count, as its first row gives it.
        let mut shard_count: Option<u32> = None;
        let mut index = Self {
            statics: with_static.then(Vec::new),
            dfs: sharded.then(Vec::new),
            ..Self::empty()
        };
        // A sharded index's postings of terms met again, by term id: (doc, tf, len, static).
        let mut more = MorePostings::default();
        let mut tokenizer: Option<String> = None;
        let mut stats: Option<(u64, u64)> = None;
        // Each document's length and static score (as bits), as first met, and the sum of
        // its term frequencies (at most its length: equal unless term rows were deleted).
        let mut doc_seen: HashMap<u32, (u32, u64, u64), foldhash::fast::RandomState> =
            HashMap::default();
        for batch in batches {
            if batch.schema().fields().len() != schema.fields().len() {
                return not_index("batches of different schemas".into());
            }
            let col = |name: &str| -> Result<ArrayRef> {
                match batch.schema().index_of(name) {
                    Ok(i) => Ok(Arc::clone(batch.column(i))),
                    Err(_) => plan_err!(
                        "{who}: table '{table}' is not a BM25 index (no column '{name}' in a batch)"
                    ),
                }
            };
            let terms = cast_utf8(&col("term")?)?;
            let docs = col("doc_ids")?;
            let docs = docs.as_list::<i32>();
            let tfs = col("tfs")?;
            let tfs = tfs.as_list::<i32>();
            let lens = col("doc_lens")?;
            let lens = lens.as_list::<i32>();
            let statics = match with_static {
                true => Some(col("static_scores")?),
                false => None,
            };
            let n_docs = col("n_docs")?;
            let n_docs = n_docs.as_primitive::<UInt64Type>();
            let total = col("total_len")?;
            let total = total.as_primitive::<UInt64Type>();
            let toks = cast_utf8(&col("tokenizer")?)?;
            let dfs = match sharded {
                true => Some(col("df")?),
                false => None,
            };
            let dfs = dfs.as_ref().map(|d| d.as_primitive::<UInt64Type>());
            // A Hive-partitioned table gives `shard` as its directories' strings: cast.
            let shard_cols = match sharded {
                true => {
                    let as_u32 = |name: &str| -> Result<UInt32Array> {
                        cast_u32(&col(name)?).map_err(|e| {
                            datafusion::common::DataFusionError::Plan(format!(
                                "{who}: table '{table}' is not a BM25 index (column '{name}': {e})"
                            ))
                        })
                    };
                    Some((as_u32("shard")?, as_u32("shards")?))
                }
                false => None,
            };
            for r in 0..batch.num_rows() {
                if terms.is_null(r) || docs.is_null(r) || tfs.is_null(r) || lens.is_null(r) {
                    return not_index(format!("NULL in row {r}"));
                }
                if n_docs.is_null(r) || total.is_null(r) || toks.is_null(r) {
                    return not_index(format!("NULL n_docs, total_len or tokenizer in row {r}"));
                }
                let term = terms.value(r);
                let d = docs.value(r);
                let d = d.as_primitive::<UInt32Type>();
                let f = tfs.value(r);
                let f = f.as_primitive::<UInt32Type>();
                let l = lens.value(r);
                let l = l.as_primitive::<UInt32Type>();
                if d.len() != f.len()
                    || d.len() != l.len()
                    || d.null_count() + f.null_count() + l.null_count() > 0
                {
                    return not_index(format!(
                        "term '{term}': doc_ids, tfs and doc_lens differ in length or hold NULLs"
                    ));
                }
                if d.values().windows(2).any(|w| w[0] >= w[1]) {
                    return not_index(format!("term '{term}': doc_ids not strictly increasing"));
                }
                let row_stats = (n_docs.value(r), total.value(r));
                if *stats.get_or_insert(row_stats) != row_stats {
                    return not_index("n_docs / total_len differ between rows".into());
                }
                let tok = toks.value(r);
                if tokenizer.get_or_insert_with(|| tok.to_string()) != tok {
                    return not_index("tokenizer differs between rows".into());
                }
                let row_df = match dfs {
                    Some(d) if d.is_null(r) => {
                        return not_index(format!("term '{term}': NULL df"));
                    }
                    Some(d) => Some(d.value(r)),
                    None => None,
                };
                if let Some((shard, shards)) = &shard_cols {
                    if shard.is_null(r) || shards.is_null(r) {
                        return not_index(format!("term '{term}': NULL shard or shards"));
                    }
                    let (s, n) = (shard.value(r), shards.value(r));
                    if *shard_count.get_or_insert(n) != n {
                        return not_index("shards differs between rows".into());
                    }
                    if s >= n {
                        return not_index(format!("term '{term}': shard {s} of {n} shards"));
                    }
                    // Each document in its own shard only, so whole shards hold whole
                    // documents: a search per shard sees all of each of its documents.
                    if let Some(&doc) = d.values().iter().find(|&&doc| shard_of(doc, n) != s) {
                        return not_index(format!(
                            "term '{term}': document {doc} is in shard {s}, but belongs to shard {} of {n}",
                            shard_of(doc, n)
                        ));
                    }
                }
                let new_t = index.offsets.len() as u32 - 1;
                let (t, again) = match index.term_ids.get(term) {
                    Some(&t) if sharded => (t, true),
                    Some(_) => return not_index(format!("term '{term}' appears twice")),
                    None => {
                        index.term_ids.insert(term.to_string(), new_t);
                        (new_t, false)
                    }
                };
                if let (Some(all), Some(df)) = (&mut index.dfs, row_df) {
                    if !again {
                        all.push(df);
                    } else if all[t as usize] != df {
                        return not_index(format!(
                            "term '{term}': df differs between its rows ({} and {df})",
                            all[t as usize]
                        ));
                    }
                }
                let static_row = match &statics {
                    Some(s) => {
                        let s = s.as_list::<i32>();
                        if s.is_null(r) {
                            return not_index(format!("term '{term}': NULL static_scores"));
                        }
                        let s = s.value(r);
                        let s = s.as_primitive::<Float64Type>().clone();
                        if s.len() != d.len() || s.null_count() > 0 {
                            return not_index(format!(
                                "term '{term}': static_scores differ in length or hold NULLs"
                            ));
                        }
                        Some(s)
                    }
                    None => None,
                };
                // A term met again (a sharded table's other rows): its postings wait in `more`.
                let mut held = again.then(|| more.entry(t).or_default());
                for (i, ((&doc, &tf), &len)) in d
                    .values()
                    .iter()
                    .zip(f.values())
                    .zip(l.values())
                    .enumerate()
                {
                    let st = static_row.as_ref().map_or(0.0, |s| s.value(i));
                    if !st.is_finite() {
                        return not_index(format!(
                            "term '{term}': static score {st} of document {doc} is not finite"
                        ));
                    }
                    if tf == 0 || tf > len {
                        return not_index(format!(
                            "term '{term}': frequency {tf} in document {doc} of length {len}"
                        ));
                    }
                    let seen = doc_seen.entry(doc).or_insert((len, st.to_bits(), 0));
                    if (seen.0, seen.1) != (len, st.to_bits()) {
                        return not_index(format!(
                            "document {doc} has different lengths or static scores in different terms"
                        ));
                    }
                    seen.2 += tf as u64;
                    if seen.2 > len as u64 {
                        return not_index(format!(
                            "document {doc} holds more terms than its length {len}"
                        ));
                    }
                    if let Some(rows) = held.as_mut() {
                        rows.push((doc, tf, len, st));
                    }
                }
                if again {
                    continue;
                }
                index.docs.extend_from_slice(d.values());
                index.tfs.extend_from_slice(f.values());
                index.lens.extend_from_slice(l.values());
                if let (Some(dst), Some(s)) = (&mut index.statics, &static_row) {
                    dst.extend_from_slice(s.values());
                }
                index.offsets.push(index.docs.len());
            }
        }
        if sharded {
            index = index.merged(more, stats.map_or(0, |s| s.0), &not_index)?;
        }
        let (n_docs, total_len) = stats.unwrap_or((0, 0));
        if (doc_seen.len() as u64) > n_docs {
            return not_index(format!(
                "n_docs is {n_docs} but {} documents hold terms",
                doc_seen.len()
            ));
        }
        let lens: u64 = doc_seen.values().map(|&(len, ..)| len as u64).sum();
        if lens > total_len {
            return not_index(format!(
                "total_len is {total_len} but the documents' lengths add up to {lens}"
            ));
        }
        index.n_docs = n_docs;
        index.total_len = total_len;
        if let Some(t) = tokenizer {
            index.tokenizer = TokenizerOptions::parse(&t, who)?;
        }
        Ok(index)
    }

    /// A sharded load's index with each term's postings from every row merged (`more`: the
    /// postings of rows after a term's first), its terms numbered in term order, and every
    /// `df` checked against the postings and `n_docs`.
    fn merged(
        self,
        mut more: MorePostings,
        n_docs: u64,
        not_index: &dyn Fn(String) -> Result<Self>,
    ) -> Result<Self> {
        let old_dfs = self.dfs.as_deref().unwrap_or_default();
        let mut names: Vec<(&str, u32)> = self
            .term_ids
            .iter()
            .map(|(k, &t)| (k.as_str(), t))
            .collect();
        names.sort_unstable();
        let extra: usize = more.values().map(Vec::len).sum();
        let total = self.docs.len() + extra;
        let mut out = Self {
            term_ids: HashMap::with_capacity(names.len()),
            offsets: Vec::with_capacity(names.len() + 1),
            docs: Vec::with_capacity(total),
            tfs: Vec::with_capacity(total),
            lens: Vec::with_capacity(total),
            statics: self.statics.as_ref().map(|_| Vec::with_capacity(total)),
            dfs: Some(Vec::with_capacity(names.len())),
            n_docs: self.n_docs,
            total_len: self.total_len,
            tokenizer: self.tokenizer,
        };
        out.offsets.push(0);
        let mut postings: Vec<(u32, u32, u32, f64)> = Vec::new();
        for (new_t, &(name, t)) in names.iter().enumerate() {
            let df = old_dfs[t as usize];
            let first = self.range(t);
            let len = first.len();
            match more.remove(&t) {
                None => {
                    out.docs.extend_from_slice(&self.docs[first.clone()]);
                    out.tfs.extend_from_slice(&self.tfs[first.clone()]);
                    out.lens.extend_from_slice(&self.lens[first.clone()]);
                    if let (Some(dst), Some(src)) = (&mut out.statics, &self.statics) {
                        dst.extend_from_slice(&src[first]);
                    }
                }
                Some(rest) => {
                    postings.clear();
                    postings.extend(first.map(|p| {
                        let st = self.statics.as_ref().map_or(0.0, |s| s[p]);
                        (self.docs[p], self.tfs[p], self.lens[p], st)
                    }));
                    postings.extend(rest);
                    postings.sort_unstable_by_key(|e| e.0);
                    if let Some(w) = postings.windows(2).find(|w| w[0].0 == w[1].0) {
                        return not_index(format!(
                            "document {} is in two rows of term '{name}'",
                            w[0].0
                        ));
                    }
                    for &(doc, tf, len, st) in &postings {
                        out.docs.push(doc);
                        out.tfs.push(tf);
                        out.lens.push(len);
                        if let Some(dst) = &mut out.statics {
                            dst.push(st);
                        }
                    }
                }
            }
            let held = out.docs.len() - out.offsets[new_t];
            debug_assert!(held >= len);
            if df < held as u64 || df > n_docs {
                return not_index(format!(
                    "term '{name}': df {df} but {held} postings of {n_docs} documents"
                ));
            }
            out.offsets.push(out.docs.len());
            out.dfs.as_mut().expect("set above").push(df);
            out.term_ids.insert(name.to_string(), new_t as u32);
        }
        Ok(out)
    }

    /// An upper bound of the bytes [`from_batches`](Self::from_batches) holds while it loads
    /// `batches` (the index and its checks), reserved before it runs.
    pub fn load_bytes(batches: &[RecordBatch]) -> usize {
        let mut bytes = 0;
        for b in batches {
            let postings = b
                .schema()
                .index_of("doc_ids")
                .ok()
                .and_then(|i| b.column(i).as_list_opt::<i32>().map(|l| l.values().len()))
                .unwrap_or(0);
            let statics = b.schema().index_of("static_scores").is_ok() as usize;
            // A sharded index is merged into a second copy of its postings.
            let copies = 1 + b.schema().index_of("df").is_ok() as usize;
            let terms = b
                .column_by_name("term")
                .map_or(0, |t| t.get_array_memory_size());
            // Postings (12 bytes, 20 with static scores), the document check (up to one entry
            // per posting), and per term its name, offset and map slot.
            bytes += postings * (copies * (12 + 8 * statics) + 24) + terms + b.num_rows() * 48;
        }
        bytes
    }

    fn empty() -> Self {
        Self {
            term_ids: HashMap::new(),
            offsets: vec![0],
            docs: Vec::new(),
            tfs: Vec::new(),
            lens: Vec::new(),
            statics: None,
            dfs: None,
            n_docs: 0,
            total_len: 0,
            tokenizer: TokenizerOptions::default(),
        }
    }

    pub fn term_id(&self, term: &str) -> Option<u32> {
        self.term_ids.get(term).copied()
    }
    pub fn terms(&self) -> usize {
        self.offsets.len() - 1
    }
    /// Documents holding term `t` in the whole corpus: its postings, or the `df` a sharded
    /// index table gave it.
    pub fn df(&self, t: u32) -> u64 {
        match &self.dfs {
            Some(d) => d[t as usize],
            None => self.postings_len(t) as u64,
        }
    }
    pub fn postings_len(&self, t: u32) -> usize {
        self.offsets[t as usize + 1] - self.offsets[t as usize]
    }
    /// Where each term's postings start (`terms() + 1` entries, CSR).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }
    pub fn range(&self, t: u32) -> std::ops::Range<usize> {
        self.offsets[t as usize]..self.offsets[t as usize + 1]
    }
    pub fn docs(&self) -> &[u32] {
        &self.docs
    }
    pub fn tfs(&self) -> &[u32] {
        &self.tfs
    }
    pub fn lens(&self) -> &[u32] {
        &self.lens
    }
    pub fn statics(&self) -> Option<&[f64]> {
        self.statics.as_deref()
    }
    pub fn n_docs(&self) -> u64 {
        self.n_docs
    }
    pub fn total_len(&self) -> u64 {
        self.total_len
    }
    pub fn tokenizer(&self) -> TokenizerOptions {
        self.tokenizer
    }
    /// Bytes held (for memory accounting).
    pub fn size_bytes(&self) -> usize {
        self.docs.len() * 12
            + self.statics.as_ref().map_or(0, |s| s.len() * 8)
            + self.offsets.len() * 8
            + self.term_ids.keys().map(|k| k.len() + 32).sum::<usize>()
    }
}

/// Documents from which [`IndexBuilder::add_texts`] tokenizes on every core.
const PARALLEL_DOCS: usize = 512;

/// Builds an [`InvertedIndex`] one document at a time (any id order; ids distinct).
///
/// Documents go into parts: one for documents added one by one, and one per core for the
/// batches [`add_texts`](Self::add_texts) tokenizes on every core, each core keeping its part
/// from batch to batch. Nothing is merged until [`finish`](Self::finish), which takes every
/// part's terms in one sort: the parts are never folded into one map batch after batch (that
/// fold, a hash lookup per distinct term of every small part, ran on one core and bounded the
/// whole build).
pub struct IndexBuilder {
    tokenizer: TokenizerOptions,
    with_static: bool,
    /// Never empty: `parts[0]` takes documents added one by one.
    parts: Vec<Part>,
}

/// Documents, their terms and their postings.
struct Part {
    term_ids: HashMap<String, u32, foldhash::fast::RandomState>,
    /// Per term: (document ordinal, tf); ordinals number the part's documents in the order
    /// added.
    postings: Vec<Vec<(u32, u32)>>,
    /// Per document ordinal: its id, length and static score (with `with_static`).
    doc_ids: Vec<u32>,
    doc_lens: Vec<u32>,
    doc_statics: Vec<f64>,
    total_len: u64,
    doc_terms: Vec<u32>,
    /// Postings held, and the bytes of the postings' vectors and of the term map, kept as
    /// they grow (for memory accounting without a walk over every term).
    postings_count: usize,
    held_bytes: usize,
}

/// Bytes a term costs in [`Part::term_ids`] and [`Part::postings`] besides its postings.
const TERM_OVERHEAD: usize = 40 + 24;

impl Part {
    fn new() -> Self {
        Self {
            term_ids: HashMap::default(),
            postings: Vec::new(),
            doc_ids: Vec::new(),
            doc_lens: Vec::new(),
            doc_statics: Vec::new(),
            total_len: 0,
            doc_terms: Vec::new(),
            postings_count: 0,
            held_bytes: 0,
        }
    }

    fn term_id(&mut self, t: &str) -> u32 {
        match self.term_ids.get(t) {
            Some(&tid) => tid,
            None => {
                let tid = self.term_ids.len() as u32;
                self.term_ids.insert(t.to_string(), tid);
                self.postings.push(Vec::new());
                self.held_bytes += t.len() + TERM_OVERHEAD;
                tid
            }
        }
    }

    fn add_text(
        &mut self,
        tokenizer: &mut Tokenizer,
        id: u32,
        text: Option<&str>,
        static_score: Option<f64>,
        with_static: bool,
    ) {
        self.doc_terms.clear();
        if let Some(text) = text {
            tokenizer.for_each_term(text, |t| {
                let tid = self.term_id(t);
                self.doc_terms.push(tid);
            });
        }
        self.finish_doc(id, static_score, with_static);
    }

    fn finish_doc(&mut self, id: u32, static_score: Option<f64>, with_static: bool) {
        let ordinal = self.doc_ids.len() as u32;
        let len = self.doc_terms.len() as u32;
        self.doc_ids.push(id);
        self.doc_lens.push(len);
        if with_static {
            self.doc_statics.push(static_score.unwrap_or(0.0));
        }
        self.total_len += len as u64;
        // Each distinct term once, with its count.
        self.doc_terms.sort_unstable();
        for run in self.doc_terms.chunk_by(|a, b| a == b) {
            let p = &mut self.postings[run[0] as usize];
            let before = p.capacity();
            p.push((ordinal, run.len() as u32));
            self.held_bytes += (p.capacity() - before) * 8;
            self.postings_count += 1;
        }
    }

    fn size_bytes(&self) -> usize {
        self.held_bytes
            + self.postings.capacity() * 24
            + self.doc_ids.capacity() * 8
            + self.doc_statics.capacity() * 8
    }
}

impl IndexBuilder {
    pub fn new(tokenizer: TokenizerOptions, with_static: bool) -> Self {
        Self {
            tokenizer,
            with_static,
            parts: vec![Part::new()],
        }
    }

    /// Add a document given as its terms (repeats count).
    pub fn add_terms<'t>(
        &mut self,
        id: u32,
        terms: impl IntoIterator<Item = &'t str>,
        static_score: Option<f64>,
    ) {
        let part = &mut self.parts[0];
        part.doc_terms.clear();
        for t in terms {
            let tid = part.term_id(t);
            part.doc_terms.push(tid);
        }
        part.finish_doc(id, static_score, self.with_static);
    }

    /// Add a document given as text (`None`: a NULL text, an empty document).
    pub fn add_text(
        &mut self,
        tokenizer: &mut Tokenizer,
        id: u32,
        text: Option<&str>,
        static_score: Option<f64>,
    ) {
        self.parts[0].add_text(tokenizer, id, text, static_score, self.with_static);
    }

    /// Add documents `(id, text, static score)` as [`add_text`](Self::add_text) does; a
    /// large batch is tokenized on every core, each core into a part of its own (the finished
    /// index sorts each term's postings by id, so where and in which order documents were
    /// added does not show).
    pub fn add_texts(
        &mut self,
        tokenizer: &mut Tokenizer,
        docs: &[(u32, Option<&str>, Option<f64>)],
    ) {
        let threads = rayon::current_num_threads();
        if threads < 2 || docs.len() < PARALLEL_DOCS {
            for &(id, text, s) in docs {
                self.add_text(tokenizer, id, text, s);
            }
            return;
        }
        // Parts 1..=threads are the cores'.
        while self.parts.len() < threads + 1 {
            self.parts.push(Part::new());
        }
        let options = self.tokenizer;
        let with_static = self.with_static;
        let per_task = docs.len().div_ceil(threads);
        self.parts[1..=threads]
            .par_iter_mut()
            .zip(docs.par_chunks(per_task))
            .for_each(|(part, chunk)| {
                let mut tok = Tokenizer::new(options);
                for &(id, text, s) in chunk {
                    part.add_text(&mut tok, id, text, s, with_static);
                }
            });
    }

    /// Number of documents added.
    pub fn docs(&self) -> u64 {
        self.parts.iter().map(|p| p.doc_ids.len() as u64).sum()
    }

    /// Bytes held so far (an estimate for memory accounting).
    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(Part::size_bytes).sum()
    }

    /// An upper bound of the bytes [`finish`](Self::finish) allocates for the index (the
    /// builder's own memory is released term by term meanwhile).
    pub fn finished_bytes(&self) -> usize {
        let postings: usize = self.parts.iter().map(|p| p.postings_count).sum();
        let terms: usize = self.parts.iter().map(|p| p.term_ids.len()).sum();
        let keys: usize = (self.parts.iter())
            .flat_map(|p| p.term_ids.keys())
            .map(|k| k.len() + 40)
            .sum();
        let per_posting = 12 + if self.with_static { 8 } else { 0 };
        postings * per_posting + (terms + 1) * 8 + keys
    }

    pub fn finish(self) -> InvertedIndex {
        let with_static = self.with_static;
        let mut parts = self.parts;
        // Every part's terms, sorted by term, a term's parts in part order.
        let mut terms: Vec<(String, u32, u32)> =
            Vec::with_capacity(parts.iter().map(|p| p.term_ids.len()).sum());
        for (k, part) in parts.iter_mut().enumerate() {
            terms.extend(part.term_ids.drain().map(|(t, id)| (t, k as u32, id)));
        }
        terms.par_sort_unstable();
        // Global ordinals: the parts' documents one part after another.
        let mut base = Vec::with_capacity(parts.len());
        let mut n_docs = 0u32;
        for part in &parts {
            base.push(n_docs);
            n_docs += part.doc_ids.len() as u32;
        }
        let mut ids = Vec::with_capacity(n_docs as usize);
        let mut lens = Vec::with_capacity(n_docs as usize);
        let mut statics = Vec::with_capacity(if with_static { n_docs as usize } else { 0 });
        let mut total_len = 0;
        let mut postings = Vec::with_capacity(parts.len());
        for part in parts {
            ids.extend(part.doc_ids);
            lens.extend(part.doc_lens);
            statics.extend(part.doc_statics);
            total_len += part.total_len;
            postings.push(part.postings);
        }
        let total: usize = postings.iter().flatten().map(Vec::len).sum();
        let distinct = terms.chunk_by(|a, b| a.0 == b.0).count();
        let mut index = InvertedIndex {
            term_ids: HashMap::with_capacity(distinct),
            offsets: Vec::with_capacity(distinct + 1),
            docs: Vec::with_capacity(total),
            tfs: Vec::with_capacity(total),
            lens: Vec::with_capacity(total),
            statics: with_static.then(|| Vec::with_capacity(total)),
            dfs: None,
            n_docs: n_docs as u64,
            total_len,
            tokenizer: self.tokenizer,
        };
        index.offsets.push(0);
        let mut p: Vec<(u32, u32)> = Vec::new();
        for (new_id, group) in terms.chunk_by_mut(|a, b| a.0 == b.0).enumerate() {
            p.clear();
            for &(_, part, old) in group.iter() {
                let from = std::mem::take(&mut postings[part as usize][old as usize]);
                let b = base[part as usize];
                p.extend(from.into_iter().map(|(ord, tf)| (ord + b, tf)));
            }
            // Ordinals follow the order documents came in: already in id order when they
            // came in id order into one part.
            if !p.is_sorted_by_key(|e| ids[e.0 as usize]) {
                p.sort_unstable_by_key(|e| ids[e.0 as usize]);
            }
            for &(ord, tf) in &p {
                let ord = ord as usize;
                index.docs.push(ids[ord]);
                index.tfs.push(tf);
                index.lens.push(lens[ord]);
                if let Some(st) = &mut index.statics {
                    st.push(statics[ord]);
                }
            }
            index.offsets.push(index.docs.len());
            index
                .term_ids
                .insert(std::mem::take(&mut group[0].0), new_id as u32);
        }
        index
    }
}

/// The terms of `term_ids` in term-id order.
fn term_names(term_ids: &HashMap<String, u32>) -> Vec<&str> {
    let mut names = vec![""; term_ids.len()];
    for (k, &t) in term_ids {
        names[t as usize] = k.as_str();
    }
    names
}

/// The Arrow form of an index's parts: one row per name, in order, the CSR postings (laid out
/// in that order, so `offsets` are the lists' offsets) moved in.
pub(crate) fn index_batch(
    names: &[&str],
    offsets: &[usize],
    [docs, tfs, lens]: [Vec<u32>; 3],
    statics: Option<Vec<f64>>,
    (n_docs, total_len): (u64, u64),
    tokenizer: TokenizerOptions,
) -> Result<RecordBatch> {
    let n = names.len();
    let offsets: Vec<i32> = offsets
        .iter()
        .map(|&o| i32::try_from(o))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            datafusion::common::DataFusionError::Execution(
                "bm25_index: more than 2^31 postings in one index".into(),
            )
        })?;
    let offsets = OffsetBuffer::new(offsets.into());
    let list_u32 = |v: Vec<u32>| -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::UInt32, false)),
            offsets.clone(),
            Arc::new(UInt32Array::from(v)),
            None,
        ))
    };
    let with_static = statics.is_some();
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(names.iter().copied())),
        list_u32(docs),
        list_u32(tfs),
        list_u32(lens),
    ];
    if let Some(s) = statics {
        columns.push(Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, false)),
            offsets.clone(),
            Arc::new(Float64Array::from(s)),
            None,
        )));
    }
    columns.push(Arc::new(UInt64Array::from_value(n_docs, n)));
    columns.push(Arc::new(UInt64Array::from_value(total_len, n)));
    let tok = tokenizer.to_string();
    columns.push(Arc::new(StringArray::from_iter_values(
        std::iter::repeat_n(tok.as_str(), n),
    )));
    Ok(RecordBatch::try_new(index_schema(with_static), columns)?)
}

/// Whether two types match up to list field names/nullability and string flavour.
fn same_shape(got: &DataType, want: &DataType) -> bool {
    match (got, want) {
        (DataType::List(a), DataType::List(b)) => a.data_type() == b.data_type(),
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::Utf8) => true,
        (a, b) => a == b,
    }
}

/// `a` as UInt32, a value that does not fit an error.
fn cast_u32(a: &ArrayRef) -> Result<UInt32Array> {
    let options = datafusion::arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let c = datafusion::arrow::compute::cast_with_options(a, &DataType::UInt32, &options)?;
    Ok(c.as_primitive::<UInt32Type>().clone())
}

fn cast_utf8(a: &ArrayRef) -> Result<StringArray> {
    let c = datafusion::arrow::compute::cast(a, &DataType::Utf8)?;
    Ok(c.as_string::<i32>().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// Random documents over a small vocabulary (so terms repeat across tasks), some empty or
    /// NULL, ids shuffled, with static scores.
    fn docs(n: usize, seed: u64) -> Vec<(u32, Option<String>, Option<f64>)> {
        let mut rng = StdRng::seed_from_u64(seed);
        let words = [
            "gpu",
            "set",
            "Simd",
            "intersect",
            "join",
            "the",
            "running",
            "runs",
            "x1",
        ];
        let mut ids: Vec<u32> = (0..n as u32).map(|i| i * 7 + 3).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        ids.into_iter()
            .map(|id| {
                let text = (!rng.random_ratio(1, 20)).then(|| {
                    let len = rng.random_range(0..30);
                    (0..len)
                        .map(|_| words[rng.random_range(0..words.len())])
                        .collect::<Vec<_>>()
                        .join(" ")
                });
                let s = rng.random_ratio(3, 4).then(|| rng.random_range(0.0..1.0));
                (id, text, s)
            })
            .collect()
    }

    #[test]
    fn documents_indexed_on_every_core_give_the_one_thread_index() {
        for (n, stem) in [(3_000, false), (5_000, true), (PARALLEL_DOCS - 1, false)] {
            let english = stem.then_some(crate::search::tokenize::Language::English);
            let options = TokenizerOptions {
                stop_words: english,
                stem: english,
                ..TokenizerOptions::default()
            };
            let docs = docs(n, n as u64);
            let view: Vec<(u32, Option<&str>, Option<f64>)> = docs
                .iter()
                .map(|(i, t, s)| (*i, t.as_deref(), *s))
                .collect();
            let mut one = IndexBuilder::new(options, true);
            let mut tok = Tokenizer::new(options);
            for &(id, text, s) in &view {
                one.add_text(&mut tok, id, text, s);
            }
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap();
            let mut many = IndexBuilder::new(options, true);
            // In two batches, as two input batches would come (each core keeps its part from
            // one to the next), then a few documents one by one (into the builder's own part).
            let (a, rest) = view.split_at(n / 3);
            let (b, c) = rest.split_at(rest.len() - 10);
            let mut sizes = vec![many.size_bytes()];
            pool.install(|| {
                many.add_texts(&mut tok, a);
                sizes.push(many.size_bytes());
                many.add_texts(&mut tok, b);
                sizes.push(many.size_bytes());
            });
            for &(id, text, s) in c {
                many.add_text(&mut tok, id, text, s);
            }
            assert!(sizes.is_sorted() && sizes[2] > sizes[0], "{sizes:?}");
            assert_eq!(many.docs(), n as u64);
            let (one, many) = (one.finish(), many.finish());
            assert_eq!(one.n_docs(), many.n_docs());
            assert_eq!(one.total_len(), many.total_len());
            let (a, b) = (one.to_batch().unwrap(), many.to_batch().unwrap());
            assert_eq!(a, b, "{n} docs");
            assert_eq!(many.into_batch().unwrap(), b, "{n} docs, moved");
        }
    }

    /// The index of `docs(n, seed)`, with or without their static scores.
    fn indexed(n: usize, seed: u64, with_static: bool) -> InvertedIndex {
        let mut builder = IndexBuilder::new(TokenizerOptions::default(), with_static);
        let mut tok = Tokenizer::new(TokenizerOptions::default());
        for (id, text, s) in &docs(n, seed) {
            builder.add_text(&mut tok, *id, text.as_deref(), s.filter(|_| with_static));
        }
        builder.finish()
    }

    /// A sharded index: its whole table loads as the unsharded index, in any row order and
    /// batch split; each shard alone ranks its documents with the global statistics, so every
    /// hit's score is the unsharded index's bit for bit, and the shards' top-k lists merged
    /// (best score first, ties to the smaller id) are the unsharded top-k. AND-then-OR is not
    /// merged this way: its fallback to OR is decided per shard.
    #[test]
    fn shards_rank_with_the_global_statistics() {
        use crate::search::scoring::{Bm25Params, Scored};
        use crate::search::topk::{Hit, Mode, query_terms, top};
        use datafusion::arrow::compute::{filter_record_batch, take_record_batch};
        let plain = indexed(3_000, 11, true).into_batch().unwrap();
        let load = |b: &[RecordBatch]| InvertedIndex::from_batches(&b[0].schema(), b, "t", "idx");
        let reference = load(std::slice::from_ref(&plain)).unwrap();
        let shards = 5;
        let sharded = load(std::slice::from_ref(&plain))
            .unwrap()
            .into_sharded_batch(shards)
            .unwrap();
        assert_eq!(sharded.schema(), sharded_index_schema(true));
        assert!(sharded.num_rows() > plain.num_rows());
        // The whole table, as written and reversed in three batches: the unsharded index.
        assert_eq!(
            load(std::slice::from_ref(&sharded))
                .unwrap()
                .to_batch()
                .unwrap(),
            plain
        );
        let n = sharded.num_rows() as u32;
        let reversed =
            take_record_batch(&sharded, &UInt32Array::from_iter_values((0..n).rev())).unwrap();
        let (a, b) = (n as usize / 3, 2 * n as usize / 3);
        let split = [
            reversed.slice(0, a),
            reversed.slice(a, b - a),
            reversed.slice(b, n as usize - b),
        ];
        assert_eq!(load(&split).unwrap().to_batch().unwrap(), plain);
        // Each shard alone.
        let shard_col = sharded
            .column_by_name("shard")
            .unwrap()
            .as_primitive::<UInt32Type>()
            .clone();
        let alone: Vec<InvertedIndex> = (0..shards)
            .map(|s| {
                let rows = datafusion::arrow::compute::kernels::cmp::eq(
                    &shard_col,
                    &UInt32Array::new_scalar(s),
                )
                .unwrap();
                let part = filter_record_batch(&sharded, &rows).unwrap();
                assert!(part.num_rows() > 0, "shard {s} holds documents");
                load(&[part]).unwrap()
            })
            .collect();
        // Some shards' unsharded table would carry wrong document frequencies.
        assert!(alone[0].to_batch().is_err());
        let params = Bm25Params::default();
        let scored_ref = Scored::new(&reference, params);
        let scored: Vec<Scored> = alone.iter().map(|i| Scored::new(i, params)).collect();
        let words = [
            "gpu",
            "set",
            "simd",
            "intersect",
            "join",
            "the",
            "running",
            "x1",
            "absent",
        ];
        let bits = |h: &[Hit]| {
            h.iter()
                .map(|h| (h.doc, h.score.to_bits()))
                .collect::<Vec<_>>()
        };
        for q in 0..60usize {
            let query: Vec<&str> = (0..1 + q % 3)
                .map(|i| words[(q * 5 + i * 3) % words.len()])
                .collect();
            for mode in [Mode::Or, Mode::And] {
                for k in [1, 10, 3_000] {
                    let (terms, unknown) = query_terms(&reference, query.iter().copied());
                    let want = top(&reference, &scored_ref, &terms, unknown, k, mode);
                    let every = top(&reference, &scored_ref, &terms, unknown, 10_000, mode);
                    let score_of: HashMap<u32, u64> =
                        every.iter().map(|h| (h.doc, h.score.to_bits())).collect();
                    let mut merged = Vec::new();
                    for (index, scored) in alone.iter().zip(&scored) {
                        let (terms, unknown) = query_terms(index, query.iter().copied());
                        let hits = top(index, scored, &terms, unknown, k, mode);
                        for h in &hits {
                            assert_eq!(
                                Some(&h.score.to_bits()),
                                score_of.get(&h.doc),
                                "{query:?} {mode:?}"
                            );
                        }
                        merged.extend(hits);
                    }
                    merged.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
                    merged.truncate(k);
                    assert_eq!(bits(&merged), bits(&want), "{query:?} {mode:?} k={k}");
                }
            }
        }
    }

    /// A hand-edited sharded table is refused with the reason.
    #[test]
    fn broken_sharded_tables_are_refused() {
        let sharded = indexed(500, 3, false).into_sharded_batch(3).unwrap();
        let schema = sharded.schema();
        let load = |b: &RecordBatch| {
            InvertedIndex::from_batches(&schema, std::slice::from_ref(b), "topk_bm25", "idx")
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(load(&sharded), Ok(()));
        let with_df = |f: &dyn Fn(usize, u64) -> u64| {
            let dfs = sharded
                .column_by_name("df")
                .unwrap()
                .as_primitive::<UInt64Type>();
            let mut cols = sharded.columns().to_vec();
            let i = schema.index_of("df").unwrap();
            cols[i] = Arc::new(UInt64Array::from_iter_values(
                dfs.values().iter().enumerate().map(|(r, &d)| f(r, d)),
            ));
            RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
        };
        // A term whose rows disagree on df (the first term's first row, shard 0).
        let terms = cast_utf8(sharded.column_by_name("term").unwrap()).unwrap();
        let first = terms.value(0).to_string();
        let again = (1..sharded.num_rows())
            .find(|&r| terms.value(r) == first)
            .unwrap();
        let err = load(&with_df(&|r, d| if r == again { d + 1 } else { d })).unwrap_err();
        assert!(err.contains("df differs between its rows"), "{err}");
        // A df below the term's postings, and one above n_docs.
        let err = load(&with_df(&|_, _| 0)).unwrap_err();
        assert!(err.contains("postings of"), "{err}");
        let err = load(&with_df(&|_, _| 1_000_000)).unwrap_err();
        assert!(err.contains("postings of"), "{err}");
        // The same document in two rows of a term (a shard's rows twice).
        let twice =
            datafusion::arrow::compute::concat_batches(&schema, [&sharded, &sharded.slice(0, 1)])
                .unwrap();
        let err = load(&twice).unwrap_err();
        assert!(
            err.contains("is in two rows of term") || err.contains("more terms than its length"),
            "{err}"
        );
        // A df column of another type.
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let i = schema.index_of("df").unwrap();
        fields[i] = Field::new("df", DataType::Int64, false);
        let mut cols = sharded.columns().to_vec();
        cols[i] = datafusion::arrow::compute::cast(&cols[i], &DataType::Int64).unwrap();
        let other = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        let err = InvertedIndex::from_batches(&other.schema(), &[other], "topk_bm25", "idx")
            .unwrap_err()
            .to_string();
        assert!(err.contains("column 'df' is Int64"), "{err}");
        // The shard columns: a document moved to another shard, a shard past the count,
        // counts that differ, a shard column missing.
        let with_u32 = |name: &str, f: &dyn Fn(usize, u32) -> u32| {
            let i = schema.index_of(name).unwrap();
            let old = sharded.column(i).as_primitive::<UInt32Type>();
            let mut cols = sharded.columns().to_vec();
            cols[i] = Arc::new(UInt32Array::from_iter_values(
                old.values().iter().enumerate().map(|(r, &v)| f(r, v)),
            ));
            RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
        };
        let err = load(&with_u32("shard", &|r, v| if r == 0 { v + 1 } else { v })).unwrap_err();
        assert!(err.contains("but belongs to shard"), "{err}");
        let err = load(&with_u32("shard", &|_, v| v + 3)).unwrap_err();
        assert!(err.contains("of 3 shards"), "{err}");
        let err = load(&with_u32("shards", &|r, v| if r == 5 { v + 1 } else { v })).unwrap_err();
        assert!(err.contains("shards differs between rows"), "{err}");
        let err = load(&with_u32("shards", &|_, _| 0)).unwrap_err();
        assert!(err.contains("of 0 shards"), "{err}");
        let without = sharded
            .project(
                &(0..schema.fields().len())
                    .filter(|&i| schema.field(i).name() != "shards")
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let err = InvertedIndex::from_batches(&without.schema(), &[without], "topk_bm25", "idx")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no column 'shards'"), "{err}");
        // As a Hive-partitioned table reads it back: `shard` from the directories' names.
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let i = schema.index_of("shard").unwrap();
        fields[i] = Field::new("shard", DataType::Utf8, false);
        let mut cols = sharded.columns().to_vec();
        cols[i] = datafusion::arrow::compute::cast(&cols[i], &DataType::Utf8).unwrap();
        let hive =
            RecordBatch::try_new(Arc::new(Schema::new(fields.clone())), cols.clone()).unwrap();
        let from_hive =
            InvertedIndex::from_batches(&hive.schema(), &[hive], "topk_bm25", "idx").unwrap();
        let direct = InvertedIndex::from_batches(
            &schema,
            std::slice::from_ref(&sharded),
            "topk_bm25",
            "idx",
        )
        .unwrap();
        assert_eq!(from_hive.to_batch().unwrap(), direct.to_batch().unwrap());
        cols[i] = Arc::new(StringArray::from_iter_values((0..sharded.num_rows()).map(
            |r| {
                if r == 0 {
                    "x".to_string()
                } else {
                    "0".to_string()
                }
            },
        )));
        let bad = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        let err = InvertedIndex::from_batches(&bad.schema(), &[bad], "topk_bm25", "idx")
            .unwrap_err()
            .to_string();
        assert!(err.contains("column 'shard'"), "{err}");
    }
}
