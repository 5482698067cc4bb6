//! An opened GGUF file: its metadata, its tensor table and zero-copy access to tensor data.

use std::collections::HashMap;
use std::sync::Arc;

use super::parse::parse_header;
use super::value::{MetaArray, MetaValue};
use super::Magic;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`, …).
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order: `shape[0]` is the contiguous (row) dimension.
    pub shape: Vec<u64>,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Number of rows (all dimensions after the first).
    pub fn n_rows(&self) -> u64 {
        self.shape[1..].iter().product()
    }
}

/// The bytes behind a file: a memory map on native, an owned buffer elsewhere.
enum Storage {
    #[cfg(not(target_arch = "wasm32"))]
    Mmap(memmap2::Mmap),
    Bytes(Arc<[u8]>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        }
    }
}

/// A parsed and validated GGUF or PWRI file.
pub struct GgufFile {
    storage: Storage,
    magic: Magic,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`. Tensor data is not read until used.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            Storage::Bytes(Arc::from(Vec::new()))
        } else {
            // SAFETY: the map is read-only; like every mmap-based model loader we assume the file is
            // not truncated by another process while it is open.
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_storage(storage)
    }

    /// Parses a file already in memory (the browser path, and tests).
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Result<GgufFile> {
        Self::from_storage(Storage::Bytes(bytes.into()))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        let header = parse_header(storage.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            magic: header.magic,
            version: header.version,
            metadata: header.metadata,
            key_index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// `GGUF` or `PWRI`.
    pub fn magic(&self) -> Magic {
        self.magic
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Tensor data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the tensor data section from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`, or an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| Error::Tensor {
            tensor: name.into(),
            message: "missing from the file".into(),
        })
    }

    /// The bytes of a tensor's data (zero-copy; validated at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.storage.bytes()[start..start + info.n_bytes as usize]
    }

    /// An unsigned integer value of `key` (any integer type), or an error if missing or mistyped.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an unsigned integer", MetaValue::as_u64)?
            .ok_or_else(|| missing(key))
    }

    /// An optional unsigned integer value of `key`; present with the wrong type is an error.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "an unsigned integer", MetaValue::as_u64)
    }

    /// An optional float value of `key`; present with the wrong type is an error.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a float", |v| v.as_f64().map(|f| f as f32))
    }

    /// An optional string value of `key`; present with the wrong type is an error.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a string", v)),
        }
    }

    /// A string value of `key`, or an error if missing or mistyped.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    /// An optional bool value of `key`; present with the wrong type is an error.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", MetaValue::as_bool)
    }

    /// An optional array value of `key`; present with the wrong type is an error.
    pub fn get_array(&self, key: &str) -> Result<Option<&MetaArray>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array", v)),
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.require_str("general.architecture")
    }

    fn typed<T>(
        &self,
        key: &str,
        expected: &str,
        conv: impl Fn(&MetaValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => conv(v)
                .map(Some)
                .ok_or_else(|| wrong_type(key, expected, v)),
        }
    }
}

fn missing(key: &str) -> Error {
    Error::Metadata {
        key: key.into(),
        message: "missing".into(),
    }
}

fn wrong_type(key: &str, expected: &str, found: &MetaValue) -> Error {
    Error::Metadata {
        key: key.into(),
        message: format!("expected {expected}, found a {}", found.meta_type().name()),
    }
}
