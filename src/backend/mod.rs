//! Backends: the kernels that do the set work, behind one interface.
//!
//! `cpu` holds the scalar, galloping and SIMD kernels (chosen per row at run time).
//! The GPU backend (issue: GPU backend) will live beside it as `gpu`.

pub mod cpu;
