//! Input helpers that know nothing of set operations: [`parquet_split`] cuts a Parquet scan
//! into row ranges at page boundaries.

pub mod parquet_split;
