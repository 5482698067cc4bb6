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
}

#[cfg(test)]
mod tests;
