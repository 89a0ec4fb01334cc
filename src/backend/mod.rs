//! Backends: the kernels that do the set work, behind one interface.
//!
//! `cpu` holds the scalar, galloping and SIMD kernels (chosen per row at run time).
//! `gpu` holds the CUDA backend (batched k-way intersection on the device).

pub mod cpu;
pub mod gpu;
