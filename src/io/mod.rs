//! Input helpers that know nothing of set operations: [`parquet_split`] cuts a Parquet scan
//! into row ranges at page boundaries; [`same_data`] tells whether two plans read the same rows.

pub mod parquet_split;
pub mod same_data;
