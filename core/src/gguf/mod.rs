//! GGUF v2/v3 files (and PowerInfer's `PWRI` variant): reader and writer.
//!
//! [`GgufFile`] parses the header, metadata and tensor table of a file (memory-mapped on native,
//! or from an in-memory buffer in the browser), validates every count, offset and size against
//! the file before use, and hands out zero-copy slices of tensor data. [`GgufWriter`] writes files
//! that llama.cpp and the `gguf` Python package read back.

mod cursor;
mod file;
mod parse;
mod value;
mod writer;

pub use file::{GgufFile, TensorInfo};
pub use value::{MetaArray, MetaType, MetaValue};
pub use writer::{write_file_atomically, GgufStream, GgufWriter, TensorDecl};

use crate::quant::GgmlType;

/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays the reader accepts (real files use at most 2).
pub const MAX_ARRAY_DEPTH: usize = 16;

/// Which of the two magics a file started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Magic {
    /// `GGUF`: a llama.cpp file.
    Gguf,
    /// `PWRI`: a PowerInfer file (same layout, sparse-model tensors).
    PowerInfer,
}

impl Magic {
    /// The four bytes at the start of the file.
    pub fn bytes(self) -> &'static [u8; 4] {
        match self {
            Magic::Gguf => b"GGUF",
            Magic::PowerInfer => b"PWRI",
        }
    }

    /// A human name for the format.
    pub fn format_name(self) -> &'static str {
        match self {
            Magic::Gguf => "GGUF",
            Magic::PowerInfer => "PowerInfer (PWRI)",
        }
    }

    /// The ggml type a tensor type id denotes in a file with this magic. PowerInfer's ggml
    /// predates the IQ types: its `I8`, `I16`, `I32` are ids 16, 17, 18 (its GPU index files
    /// store `I32` tensors as 18), and it has no id above 18.
    pub fn ggml_type(self, id: u32) -> Option<GgmlType> {
        match (self, id) {
            (Magic::Gguf, _) | (Magic::PowerInfer, 0..=15) => GgmlType::from_id(id),
            (Magic::PowerInfer, 16) => Some(GgmlType::I8),
            (Magic::PowerInfer, 17) => Some(GgmlType::I16),
            (Magic::PowerInfer, 18) => Some(GgmlType::I32),
            (Magic::PowerInfer, _) => None,
        }
    }

    /// The id of `ty` in a file with this magic (see [`Magic::ggml_type`]), or `None` when the
    /// format cannot store it.
    pub fn type_id(self, ty: GgmlType) -> Option<u32> {
        match (self, ty) {
            (Magic::PowerInfer, GgmlType::I8) => Some(16),
            (Magic::PowerInfer, GgmlType::I16) => Some(17),
            (Magic::PowerInfer, GgmlType::I32) => Some(18),
            (Magic::PowerInfer, ty) if ty as u32 >= 16 => None,
            (_, ty) => Some(ty as u32),
        }
    }
}

#[cfg(test)]
mod tests;
