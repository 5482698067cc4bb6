//! Parsing of the GGUF header, metadata and tensor table from bytes, with every count, offset and
//! size checked against the file before it is used.

use std::collections::HashMap;

use super::cursor::Cursor;
use super::value::{check_count, MetaArray, MetaType, MetaValue};
use super::{Magic, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::{Error, Result};

/// Everything in a GGUF file before the tensor data.
pub(crate) struct Header {
    pub magic: Magic,
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Parses and validates the header of a GGUF (or PWRI) file held in `buf`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor::new(buf);
    let magic_bytes: [u8; 4] = c.take(4, || "magic".into())?.try_into().expect("4 bytes");
    let magic = match &magic_bytes {
        b"GGUF" => Magic::Gguf,
        b"PWRI" => Magic::PowerInfer,
        _ => return Err(Error::BadMagic(magic_bytes)),
    };
    let version = c.u32(|| "version".into())?;
    if version != 2 && version != 3 {
        if matches!(version.swap_bytes(), 2 | 3) {
            return Err(Error::invalid_gguf(
                4,
                "big-endian GGUF files are not supported",
            ));
        }
        return Err(Error::UnsupportedVersion(version));
    }
    let tensor_count_offset = c.pos();
    let tensor_count = c.u64(|| "tensor count".into())?;
    let kv_count_offset = c.pos();
    let kv_count = c.u64(|| "metadata count".into())?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    let kv_count = check_count(
        kv_count,
        13,
        c.remaining(),
        kv_count_offset,
        "metadata count",
    )?;
    let tensor_count = check_count(
        tensor_count,
        24,
        c.remaining(),
        tensor_count_offset,
        "tensor count",
    )?;

    let mut metadata = Vec::with_capacity(kv_count);
    let mut seen = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        let key_offset = c.pos();
        let key = c
            .string(|| format!("key of metadata entry {i}"))?
            .to_owned();
        if seen.insert(key.clone(), ()).is_some() {
            return Err(Error::invalid_gguf(
                key_offset,
                format!("duplicate metadata key {key:?}"),
            ));
        }
        let value = read_value(&mut c, &key)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(Error::Metadata {
                key: "general.alignment".into(),
                message: format!("must be a power-of-two uint32, found {v:?}"),
            })
        }
    };

    let mut tensors = Vec::with_capacity(tensor_count);
    let mut names = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info_offset = c.pos();
        let info = read_tensor_info(&mut c, i, magic)?;
        if names.insert(info.name.clone(), ()).is_some() {
            return Err(Error::invalid_gguf(
                info_offset,
                format!("duplicate tensor name {:?}", info.name),
            ));
        }
        tensors.push(info);
    }

    let data_offset = c.pos().next_multiple_of(alignment);
    if !tensors.is_empty() && data_offset > buf.len() as u64 {
        return Err(Error::Truncated {
            what: "padding before the tensor data".into(),
            offset: c.pos(),
            needed: data_offset - c.pos(),
            available: c.remaining(),
        });
    }
    let data_len = (buf.len() as u64).saturating_sub(data_offset);
    validate_tensor_layout(&tensors, alignment, data_offset, data_len)?;
    Ok(Header {
        magic,
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_value(c: &mut Cursor, key: &str) -> Result<MetaValue> {
    let type_offset = c.pos();
    let type_id = c.u32(|| format!("value type of {key:?}"))?;
    let ty = MetaType::from_id(type_id).ok_or_else(|| {
        Error::invalid_gguf(
            type_offset,
            format!("key {key:?}: unknown value type {type_id}"),
        )
    })?;
    read_typed_value(c, ty, key, 0)
}

fn read_typed_value(c: &mut Cursor, ty: MetaType, key: &str, depth: usize) -> Result<MetaValue> {
    let what = || format!("value of {key:?}");
    Ok(match ty {
        MetaType::U8 => MetaValue::U8(c.u8(what)?),
        MetaType::I8 => MetaValue::I8(c.u8(what)? as i8),
        MetaType::U16 => MetaValue::U16(c.u16(what)?),
        MetaType::I16 => MetaValue::I16(c.u16(what)? as i16),
        MetaType::U32 => MetaValue::U32(c.u32(what)?),
        MetaType::I32 => MetaValue::I32(c.u32(what)? as i32),
        MetaType::F32 => MetaValue::F32(f32::from_bits(c.u32(what)?)),
        MetaType::U64 => MetaValue::U64(c.u64(what)?),
        MetaType::I64 => MetaValue::I64(c.u64(what)? as i64),
        MetaType::F64 => MetaValue::F64(f64::from_bits(c.u64(what)?)),
        MetaType::Bool => MetaValue::Bool(read_bool(c, key)?),
        MetaType::String => MetaValue::String(c.string(what)?.to_owned()),
        MetaType::Array => MetaValue::Array(read_array(c, key, depth)?),
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool> {
    let offset = c.pos();
    match c.u8(|| format!("value of {key:?}"))? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(Error::invalid_gguf(
            offset,
            format!("key {key:?}: bool byte {b} is neither 0 nor 1"),
        )),
    }
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<MetaArray> {
    let offset = c.pos();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(Error::invalid_gguf(
            offset,
            format!("key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}"),
        ));
    }
    let type_id = c.u32(|| format!("array element type of {key:?}"))?;
    let ty = MetaType::from_id(type_id).ok_or_else(|| {
        Error::invalid_gguf(
            offset,
            format!("key {key:?}: unknown array element type {type_id}"),
        )
    })?;
    let count_offset = c.pos();
    let count = c.u64(|| format!("array length of {key:?}"))?;
    let n = check_count(
        count,
        ty.min_encoded_bytes(),
        c.remaining(),
        count_offset,
        &format!("array {key:?}"),
    )?;
    let what = || format!("array {key:?}");
    macro_rules! fixed {
        ($variant:ident, $t:ty, $size:literal, $conv:expr) => {{
            let bytes = c.take(n as u64 * $size, what)?;
            MetaArray::$variant(
                bytes
                    .chunks_exact($size)
                    .map(|b| $conv(b.try_into().unwrap()))
                    .collect(),
            )
        }};
    }
    Ok(match ty {
        MetaType::U8 => MetaArray::U8(c.take(n as u64, what)?.to_vec()),
        MetaType::I8 => MetaArray::I8(c.take(n as u64, what)?.iter().map(|&b| b as i8).collect()),
        MetaType::U16 => fixed!(U16, u16, 2, u16::from_le_bytes),
        MetaType::I16 => fixed!(I16, i16, 2, i16::from_le_bytes),
        MetaType::U32 => fixed!(U32, u32, 4, u32::from_le_bytes),
        MetaType::I32 => fixed!(I32, i32, 4, i32::from_le_bytes),
        MetaType::F32 => fixed!(F32, f32, 4, f32::from_le_bytes),
        MetaType::U64 => fixed!(U64, u64, 8, u64::from_le_bytes),
        MetaType::I64 => fixed!(I64, i64, 8, i64::from_le_bytes),
        MetaType::F64 => fixed!(F64, f64, 8, f64::from_le_bytes),
        MetaType::Bool => {
            MetaArray::Bool((0..n).map(|_| read_bool(c, key)).collect::<Result<_>>()?)
        }
        MetaType::String => MetaArray::String(
            (0..n)
                .map(|i| {
                    c.string(|| format!("element {i} of array {key:?}"))
                        .map(str::to_owned)
                })
                .collect::<Result<_>>()?,
        ),
        MetaType::Array => MetaArray::Array(
            (0..n)
                .map(|_| read_array(c, key, depth + 1))
                .collect::<Result<_>>()?,
        ),
    })
}

fn read_tensor_info(c: &mut Cursor, index: usize, magic: Magic) -> Result<TensorInfo> {
    let name = c.string(|| format!("name of tensor {index}"))?.to_owned();
    let dims_offset = c.pos();
    let n_dims = c.u32(|| format!("dimension count of tensor {name:?}"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(Error::invalid_gguf(
            dims_offset,
            format!("tensor {name:?}: {n_dims} dimensions (expected 1..={MAX_DIMS})"),
        ));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        shape.push(c.u64(|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let type_offset = c.pos();
    let type_id = c.u32(|| format!("type of tensor {name:?}"))?;
    let ty = magic
        .ggml_type(type_id)
        .ok_or_else(|| Error::UnknownGgmlType {
            id: type_id,
            tensor: name.clone(),
        })?;
    let offset = c.u64(|| format!("data offset of tensor {name:?}"))?;
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < (1u64 << 62))
        .ok_or_else(|| {
            Error::invalid_gguf(
                dims_offset,
                format!("tensor {name:?}: element count of {shape:?} overflows"),
            )
        })?;
    let row_bytes = ty
        .row_bytes(shape[0])
        .map_err(|e| Error::invalid_gguf(type_offset, format!("tensor {name:?}: {e}")))?;
    let n_bytes = row_bytes
        .checked_mul(n_elements.checked_div(shape[0]).unwrap_or(0))
        .ok_or_else(|| {
            Error::invalid_gguf(dims_offset, format!("tensor {name:?}: byte size overflows"))
        })?;
    Ok(TensorInfo {
        name,
        ty,
        shape,
        offset,
        n_bytes,
    })
}

/// Checks that every tensor is aligned, lies inside the data section, and overlaps no other.
fn validate_tensor_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    data_len: u64,
) -> Result<()> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(Error::invalid_gguf(
                data_offset.saturating_add(t.offset),
                format!(
                    "tensor {:?}: data offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                ),
            ));
        }
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(Error::Truncated {
                what: format!("data of tensor {:?}", t.name),
                offset: data_offset.saturating_add(t.offset),
                needed: t.n_bytes,
                available: data_len.saturating_sub(t.offset),
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].n_bytes > pair[1].offset {
            return Err(Error::invalid_gguf(
                data_offset + pair[1].offset,
                format!("tensors {:?} and {:?} overlap", pair[0].name, pair[1].name),
            ));
        }
    }
    Ok(())
}
