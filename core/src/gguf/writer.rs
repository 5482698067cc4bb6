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
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("added twice".into()));
        }
        let expected = tensor_bytes(&name, ty, shape)?;
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
        let infos = self.tensors.iter().map(|t| {
            (
                t.name.as_str(),
                t.ty,
                t.shape.as_slice(),
                t.data.len() as u64,
            )
        });
        out.write_all(&self.header(infos, alignment)?)
            .map_err(io_error)?;
        for t in &self.tensors {
            write_padded(out, &t.data, alignment)?;
        }
        Ok(())
    }

    /// The header (magic, metadata, tensor infos, padding) for tensors of these names, types,
    /// shapes and sizes, laid out one after another in this order.
    fn header<'t>(
        &self,
        tensors: impl Iterator<Item = (&'t str, GgmlType, &'t [u64], u64)>,
        alignment: u64,
    ) -> Result<Vec<u8>> {
        let tensors: Vec<_> = tensors.collect();
        let mut header = Vec::new();
        header.extend_from_slice(self.magic.bytes());
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut header, key);
            header.extend_from_slice(&(value.meta_type() as u32).to_le_bytes());
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        for (name, ty, shape, n_bytes) in tensors {
            put_string(&mut header, name);
            header.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                header.extend_from_slice(&d.to_le_bytes());
            }
            let type_id = self.magic.type_id(ty).ok_or_else(|| Error::Tensor {
                tensor: name.to_string(),
                message: format!(
                    "type {} has no id in the {} format",
                    ty,
                    self.magic.format_name()
                ),
            })?;
            header.extend_from_slice(&type_id.to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + n_bytes).next_multiple_of(alignment);
        }
        pad_to(&mut header, alignment);
        Ok(header)
    }

    /// Starts streaming a file to `out`: writes the header of this writer's metadata and of the
    /// tensors `declared` (this writer must hold no tensors), whose data then follows one tensor
    /// at a time through [`GgufStream::write_tensor`], so that the file is never whole in memory.
    pub fn stream<W: Write>(&self, declared: Vec<TensorDecl>, mut out: W) -> Result<GgufStream<W>> {
        if !self.tensors.is_empty() {
            return Err(Error::InvalidArgument(
                "a streamed file declares all its tensors; this writer already holds some".into(),
            ));
        }
        let alignment = self.alignment()?;
        let mut sizes = Vec::with_capacity(declared.len());
        for (i, t) in declared.iter().enumerate() {
            if declared[..i].iter().any(|u| u.name == t.name) {
                return Err(Error::Tensor {
                    tensor: t.name.clone(),
                    message: "declared twice".into(),
                });
            }
            sizes.push(tensor_bytes(&t.name, t.ty, &t.shape)?);
        }
        let infos = declared
            .iter()
            .zip(&sizes)
            .map(|(t, &n)| (t.name.as_str(), t.ty, t.shape.as_slice(), n));
        out.write_all(&self.header(infos, alignment)?)
            .map_err(io_error)?;
        Ok(GgufStream {
            out,
            declared,
            sizes,
            next: 0,
            alignment,
        })
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
        write_file_atomically(path.as_ref(), |out| self.write_to(out))
    }
}

/// A tensor of a streamed file, declared before its data: name, type and shape (ggml order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order.
    pub shape: Vec<u64>,
}

/// A GGUF file being streamed (see [`GgufWriter::stream`]): the header is written; the declared
/// tensors' data follows in declaration order.
pub struct GgufStream<W: Write> {
    out: W,
    declared: Vec<TensorDecl>,
    sizes: Vec<u64>,
    next: usize,
    alignment: u64,
}

impl<W: Write> GgufStream<W> {
    /// Writes the data of the next declared tensor, which must be `name` and exactly its size.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let Some(decl) = self.declared.get(self.next) else {
            return Err(Error::Tensor {
                tensor: name.into(),
                message: "not declared (all declared tensors are written)".into(),
            });
        };
        if decl.name != name || self.sizes[self.next] != data.len() as u64 {
            return Err(Error::Tensor {
                tensor: name.into(),
                message: format!(
                    "{} bytes written where {} ({} bytes) was declared next",
                    data.len(),
                    decl.name,
                    self.sizes[self.next]
                ),
            });
        }
        write_padded(&mut self.out, data, self.alignment)?;
        self.next += 1;
        Ok(())
    }

    /// The tensor whose data comes next, if any.
    pub fn next_tensor(&self) -> Option<&TensorDecl> {
        self.declared.get(self.next)
    }

    /// Checks that every declared tensor was written and returns the output.
    pub fn finish(self) -> Result<W> {
        match self.declared.get(self.next) {
            Some(missing) => Err(Error::Tensor {
                tensor: missing.name.clone(),
                message: "declared but never written".into(),
            }),
            None => Ok(self.out),
        }
    }
}

/// Writes a file at `path` with `write`, through a temporary file in the same directory that is
/// renamed when complete, so that a reader never sees half a file.
pub fn write_file_atomically(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<()>,
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut out = std::io::BufWriter::new(file);
    let written = write(&mut out).and_then(|()| out.flush().map_err(io));
    drop(out);
    match written {
        Ok(()) => std::fs::rename(&tmp, path).map_err(io),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The data size of a tensor of `shape` (ggml order) and `ty`; an error for a bad shape.
fn tensor_bytes(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64> {
    let bad = |message: String| Error::Tensor {
        tensor: name.into(),
        message,
    };
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(bad(format!(
            "{} dimensions (expected 1..={MAX_DIMS})",
            shape.len()
        )));
    }
    let rows: u64 = shape[1..].iter().product();
    Ok(ty.row_bytes(shape[0]).map_err(|e| bad(e.to_string()))? * rows)
}

fn io_error(source: std::io::Error) -> Error {
    Error::Io {
        path: "<gguf output>".into(),
        source,
    }
}

/// Writes `data` and zeros up to the next multiple of `alignment`.
fn write_padded(out: &mut impl Write, data: &[u8], alignment: u64) -> Result<()> {
    out.write_all(data).map_err(io_error)?;
    let pad = (data.len() as u64).next_multiple_of(alignment) - data.len() as u64;
    out.write_all(&vec![0u8; pad as usize]).map_err(io_error)
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
