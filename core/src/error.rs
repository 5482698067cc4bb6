//! The one error type of `hotcold-core`, with enough context (key, tensor, offset) to act on.

use std::path::PathBuf;

/// Result alias used throughout `hotcold-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way an operation of `hotcold-core` can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error, with the path it concerned.
    #[error("{path}: {source}")]
    Io {
        /// The file that could not be read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file ended before a structure that the header promised.
    #[error("truncated file: {what} at offset {offset} needs {needed} bytes, {available} left")]
    Truncated {
        /// What was being read (a key, a tensor info, tensor data).
        what: String,
        /// Byte offset where the read started.
        offset: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// The first four bytes are neither `GGUF` nor PowerInfer's `PWRI`.
    #[error("not a GGUF file: magic {0:?} (expected \"GGUF\" or \"PWRI\")")]
    BadMagic([u8; 4]),
    /// A GGUF version this reader does not support.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// A structurally invalid GGUF file (bad count, bad offset, overlap, misalignment, …).
    #[error("invalid GGUF at offset {offset}: {message}")]
    InvalidGguf {
        /// Byte offset of the offending structure.
        offset: u64,
        /// What is wrong, naming the key or tensor.
        message: String,
    },
    /// A ggml tensor type id that hotcold does not know.
    #[error("unknown ggml type id {id} for tensor {tensor:?}")]
    UnknownGgmlType {
        /// The raw type id from the file.
        id: u32,
        /// The tensor that declared it.
        tensor: String,
    },
    /// A ggml type that is known but not supported by the requested operation.
    #[error("ggml type {ty} is not supported for {op}")]
    UnsupportedType {
        /// The type's ggml name.
        ty: &'static str,
        /// The operation that cannot handle it.
        op: &'static str,
    },
    /// A metadata key is missing or has the wrong type.
    #[error("metadata key {key:?}: {message}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor is missing or has the wrong shape or type.
    #[error("tensor {tensor:?}: {message}")]
    Tensor {
        /// The tensor's name.
        tensor: String,
        /// What is wrong with it.
        message: String,
    },
    /// A caller passed a value that cannot work (a buffer of the wrong length, a bad argument).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A tokenizer or chat template cannot do what was asked (no byte-fallback token for a byte,
    /// a template that fails to render, …).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A default model is not in the local cache.
    #[error("model {name} not found at {path}; run scripts/fetch-models.sh first")]
    ModelNotFound {
        /// Short name of the model.
        name: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The GPU backend cannot run: no adapter, a lost device, a failed read-back.
    #[error("gpu: {0}")]
    Gpu(String),
}

impl Error {
    /// Builds an [`Error::InvalidGguf`] at `offset`.
    pub fn invalid_gguf(offset: u64, message: impl Into<String>) -> Self {
        Error::InvalidGguf {
            offset,
            message: message.into(),
        }
    }
}
