//! BM25 ranking over an inverted index stored as an Arrow table: tokenizer, index (Arrow and
//! in-memory forms), scoring, the top-k evaluators, and the loaded-index cache the SQL
//! functions (`functions::bm25_index`, `functions::topk_bm25`) share.

pub mod build;
pub mod catalog_watch;
pub mod gpu;
pub mod index;
pub mod loaded;
pub mod queries;
pub mod rank;
pub mod scoring;
pub mod shards;
pub mod tokenize;
pub mod topk;
