//! Writing GGUF files: metadata in insertion order, tensors laid out one after another, each
//! aligned, as llama.cpp's and the `gguf` Python package's writers do.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use super::value::{MetaArray, MetaValue};
use super::{GgufFile, Magic, DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::quant::GgmlType;
use crate::{Error, Result};

struct PendingTensor<'a> {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF (or PWRI) file in memory and writes it out.
pub struct GgufWriter<'a> {
    magic: Magic,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor<'a>>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new(Magic::Gguf)
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty GGUF v3 file with the given magic.
    pub fn new(magic: Magic) -> Self {
        GgufWriter {
            magic,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A writer holding all of `file`'s metadata and tensors (data borrowed, not copied), to be
    /// amended and written out.
    pub fn from_file(file: &'a GgufFile) -> Self {
        let mut w = GgufWriter::new(file.magic());
        w.metadata = file.metadata().to_vec();
        for t in file.tensors() {
            w.tensors.push(PendingTensor {
                name: t.name.clone(),
                ty: t.ty,
                shape: t.shape.clone(),
                data: Cow::Borrowed(file.tensor_data(t)),
            });
        }
        w
    }

    /// Changes the magic (`GGUF` for llama.cpp, `PWRI` for PowerInfer).
    pub fn set_magic(&mut self, magic: Magic) {
        self.magic = magic;
    }

    /// Sets `key` to `value`, replacing an earlier value in place or appending a new key.
    pub fn set(&mut self, key: impl Into<String>, value: MetaValue) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Removes `key` if present.
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    /// Adds a tensor; `shape` is in ggml order and `data` must be exactly its size.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let name = name.into();
        let data = data.into();
        let bad = |message: String| Error::Tensor {
            tensor: name.clone(),
            message,
        };
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions (expected 1..={MAX_DIMS})",
                shape.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("added twice".into()));
        }
        let rows: u64 = shape[1..].iter().product();
        let expected = ty.row_bytes(shape[0]).map_err(|e| bad(e.to_string()))? * rows;
        if data.len() as u64 != expected {
            return Err(bad(format!(
                "data is {} bytes, shape {shape:?} of {ty} needs {expected}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            ty,
            shape: shape.to_vec(),
            data,
        });
        Ok(())
    }

    /// Removes the tensor named `name` if present.
    pub fn remove_tensor(&mut self, name: &str) {
        self.tensors.retain(|t| t.name != name);
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some((_, v)) => Err(Error::Metadata {
                key: "general.alignment".into(),
                message: format!("must be a power-of-two uint32, found {v:?}"),
            }),
        }
    }

    /// Serialises the whole file.
    pub fn write_to(&self, out: &mut impl Write) -> Result<()> {
        let alignment = self.alignment()?;
        let mut header = Vec::new();
        header.extend_from_slice(self.magic.bytes());
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut header, key);
            header.extend_from_slice(&(value.meta_type() as u32).to_le_bytes());
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                header.extend_from_slice(&d.to_le_bytes());
            }
            let type_id = self.magic.type_id(t.ty).ok_or_else(|| Error::Tensor {
                tensor: t.name.clone(),
                message: format!(
                    "type {} has no id in the {} format",
                    t.ty,
                    self.magic.format_name()
                ),
            })?;
            header.extend_from_slice(&type_id.to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad_to(&mut header, alignment);
        let io = |source| Error::Io {
            path: "<gguf output>".into(),
            source,
        };
        out.write_all(&header).map_err(io)?;
        let zeros = vec![0u8; alignment as usize];
        for t in &self.tensors {
            out.write_all(&t.data).map_err(io)?;
            let pad = (t.data.len() as u64).next_multiple_of(alignment) - t.data.len() as u64;
            out.write_all(&zeros[..pad as usize]).map_err(io)?;
        }
        Ok(())
    }

    /// Serialises the whole file into a byte vector.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `path` (through a temporary file in the same directory, then renamed,
    /// so that a reader never sees half a file).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let tmp = path.with_extension("partial");
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        self.write_to(&mut out)?;
        out.flush().map_err(io)?;
        drop(out);
        std::fs::rename(&tmp, path).map_err(io)
    }
}

fn pad_to(buf: &mut Vec<u8>, alignment: u64) {
    let len = (buf.len() as u64).next_multiple_of(alignment) as usize;
    buf.resize(len, 0);
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => buf.push(*v),
        MetaValue::I8(v) => buf.push(*v as u8),
        MetaValue::U16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => buf.push(u8::from(*v)),
        MetaValue::String(s) => put_string(buf, s),
        MetaValue::Array(a) => put_array(buf, a),
        MetaValue::U64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => buf.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(buf: &mut Vec<u8>, a: &MetaArray) {
    buf.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetaArray::U8(v) => buf.extend_from_slice(v),
        MetaArray::I8(v) => buf.extend(v.iter().map(|&x| x as u8)),
        MetaArray::U16(v) => each!(v),
        MetaArray::I16(v) => each!(v),
        MetaArray::U32(v) => each!(v),
        MetaArray::I32(v) => each!(v),
        MetaArray::F32(v) => each!(v),
        MetaArray::U64(v) => each!(v),
        MetaArray::I64(v) => each!(v),
        MetaArray::F64(v) => each!(v),
        MetaArray::Bool(v) => buf.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::String(v) => v.iter().for_each(|s| put_string(buf, s)),
        MetaArray::Array(v) => v.iter().for_each(|inner| put_array(buf, inner)),
    }
}
