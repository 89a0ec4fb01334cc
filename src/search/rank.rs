//! Rank a batch of query texts against a loaded index: the shared core of the `topk_bm25`
//! scalar function (many queries per batch) and table function (one query).

use datafusion::arrow::array::{Array, StringArray};
use rayon::prelude::*;

use super::loaded::LoadedIndex;
use super::scoring::Scored;
use super::tokenize::Tokenizer;
use super::topk::{Hit, Mode, query_terms, top};

/// Queries per rayon task.
const QUERIES_PER_TASK: usize = 64;

/// The top-k of one query text.
pub fn rank_one(
    loaded: &LoadedIndex,
    scored: &Scored,
    tokenizer: &mut Tokenizer,
    text: &str,
    k: usize,
    mode: Mode,
) -> Vec<Hit> {
    let terms = tokenizer.terms(text);
    let (ids, unknown) = query_terms(&loaded.index, terms.iter().map(String::as_str));
    top(&loaded.index, scored, &ids, unknown, k, mode)
}

/// The top-k of every row of `texts` (`None` for NULL rows), queries run in parallel on
/// rayon's pool.
pub fn rank_batch(
    loaded: &LoadedIndex,
    scored: &Scored,
    texts: &StringArray,
    k: usize,
    mode: Mode,
) -> Vec<Option<Vec<Hit>>> {
    let options = loaded.index.tokenizer();
    (0..texts.len())
        .into_par_iter()
        .with_min_len(QUERIES_PER_TASK)
        .map_init(
            || Tokenizer::new(options),
            |tok, r| {
                texts
                    .is_valid(r)
                    .then(|| rank_one(loaded, scored, tok, texts.value(r), k, mode))
            },
        )
        .collect()
}
