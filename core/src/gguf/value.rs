//! GGUF metadata values: the thirteen value types, typed arrays (nested to a bounded depth).

use crate::{Error, Result};

/// The GGUF metadata value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetaType {
    /// `uint8`
    U8 = 0,
    /// `int8`
    I8 = 1,
    /// `uint16`
    U16 = 2,
    /// `int16`
    I16 = 3,
    /// `uint32`
    U32 = 4,
    /// `int32`
    I32 = 5,
    /// `float32`
    F32 = 6,
    /// `bool` (one byte, 0 or 1)
    Bool = 7,
    /// `string` (u64 length + UTF-8 bytes)
    String = 8,
    /// `array` (u32 element type + u64 count + elements)
    Array = 9,
    /// `uint64`
    U64 = 10,
    /// `int64`
    I64 = 11,
    /// `float64`
    F64 = 12,
}

impl MetaType {
    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<MetaType> {
        use MetaType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes one value of this type takes in a file: lets the reader reject
    /// a count before allocating for it.
    pub fn min_encoded_bytes(self) -> u64 {
        use MetaType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// The name `gguf-dump` uses for this type.
    pub fn name(self) -> &'static str {
        use MetaType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `float32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// `string`
    String(String),
    /// `array`
    Array(MetaArray),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float64`
    F64(f64),
}

/// A typed GGUF array; arrays of arrays nest.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// `uint8[]`
    U8(Vec<u8>),
    /// `int8[]`
    I8(Vec<i8>),
    /// `uint16[]`
    U16(Vec<u16>),
    /// `int16[]`
    I16(Vec<i16>),
    /// `uint32[]`
    U32(Vec<u32>),
    /// `int32[]`
    I32(Vec<i32>),
    /// `float32[]`
    F32(Vec<f32>),
    /// `bool[]`
    Bool(Vec<bool>),
    /// `string[]`
    String(Vec<String>),
    /// `array[]`: each element carries its own element type.
    Array(Vec<MetaArray>),
    /// `uint64[]`
    U64(Vec<u64>),
    /// `int64[]`
    I64(Vec<i64>),
    /// `float64[]`
    F64(Vec<f64>),
}

impl MetaValue {
    /// The value's type id.
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(_) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// Any integer value that fits in a `u64` (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float value (`float32` or `float64`), as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetaArray {
    /// The element type.
    pub fn elem_type(&self) -> MetaType {
        match self {
            MetaArray::U8(_) => MetaType::U8,
            MetaArray::I8(_) => MetaType::I8,
            MetaArray::U16(_) => MetaType::U16,
            MetaArray::I16(_) => MetaType::I16,
            MetaArray::U32(_) => MetaType::U32,
            MetaArray::I32(_) => MetaType::I32,
            MetaArray::F32(_) => MetaType::F32,
            MetaArray::Bool(_) => MetaType::Bool,
            MetaArray::String(_) => MetaType::String,
            MetaArray::Array(_) => MetaType::Array,
            MetaArray::U64(_) => MetaType::U64,
            MetaArray::I64(_) => MetaType::I64,
            MetaArray::F64(_) => MetaType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as integers (any integer element type) when all fit in an `i64`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy + TryInto<i64>>(v: &[T]) -> Option<Vec<i64>> {
            v.iter().map(|&x| x.try_into().ok()).collect()
        }
        match self {
            MetaArray::U8(v) => conv(v),
            MetaArray::I8(v) => conv(v),
            MetaArray::U16(v) => conv(v),
            MetaArray::I16(v) => conv(v),
            MetaArray::U32(v) => conv(v),
            MetaArray::I32(v) => conv(v),
            MetaArray::U64(v) => conv(v),
            MetaArray::I64(v) => conv(v),
            _ => None,
        }
    }

    /// The elements as `f32` (from `float32` or `float64` arrays).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            MetaArray::F32(v) => Some(v.clone()),
            MetaArray::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// The elements of a `string[]`.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetaArray::String(v) => Some(v),
            _ => None,
        }
    }
}

/// Checks that `count` values of at least `min_bytes` each can fit in `available` bytes, so that a
/// hostile count never sizes an allocation.
pub(crate) fn check_count(
    count: u64,
    min_bytes: u64,
    available: u64,
    offset: u64,
    what: &str,
) -> Result<usize> {
    let needed = count.checked_mul(min_bytes).ok_or_else(|| {
        Error::invalid_gguf(offset, format!("{what}: count {count} is impossibly large"))
    })?;
    if needed > available {
        return Err(Error::Truncated {
            what: format!("{what} ({count} entries)"),
            offset,
            needed,
            available,
        });
    }
    usize::try_from(count)
        .map_err(|_| Error::invalid_gguf(offset, format!("{what}: count {count} too large")))
}
