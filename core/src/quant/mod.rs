//! ggml block formats: the type table, dequantisation and quantisation.

mod types;

pub use types::GgmlType;
