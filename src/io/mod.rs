//! Input helpers that know nothing of set operations: [`parquet_split`] cuts a Parquet scan
//! into row ranges at page boundaries; [`same_data`] tells whether two plans read the same rows;
//! [`time_slice`] makes a stream hand control back to tokio by time.

pub mod parquet_split;
pub mod same_data;
pub mod time_slice;
