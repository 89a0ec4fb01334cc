//! The intersection engine: integer list columns seen through their Arrow buffers
//! ([`lists`]), the per-batch row loop that runs `list_intersect` / `list_intersect_count`
//! on the CPU kernels or hands the batch to the GPU driver ([`rows`], [`gpu`]), the
//! per-column cache of row verdicts (sorted, strictly increasing, ...; [`verdicts`]) and the
//! set similarity measures with their per-row engine ([`similarity`]), which the similarity
//! join shares; lists of strings become lists of dense ids for all of them ([`strings`]).

pub(crate) mod gpu;
pub mod lists;
pub mod rows;
pub mod similarity;
pub mod strings;
pub mod verdicts;
