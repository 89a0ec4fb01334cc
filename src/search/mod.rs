//! BM25 ranking over an inverted index stored as an Arrow table: tokenizer, index (Arrow and
//! in-memory forms), scoring, the top-k evaluators, and the loaded-index cache the SQL
//! functions share.

pub mod gpu;
pub mod index;
pub mod index_function;
pub mod loaded;
pub mod queries;
pub mod rank;
pub mod scoring;
pub mod tokenize;
pub mod topk;
pub mod topk_function;
