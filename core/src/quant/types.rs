//! The ggml tensor types: ids as stored in GGUF files, block sizes and bytes per block.
//!
//! The table covers every type a current llama.cpp writes, so that any file can be inspected and its
//! layout validated; which types can be dequantised is a separate question ([`super::dequantize`]).

use crate::{Error, Result};

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal; )*) => {
        /// A ggml tensor element type, with its GGUF id.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $(
                #[doc = concat!("ggml `", $name, "`: ", stringify!($block), " elements in ", stringify!($bytes), " bytes per block.")]
                $variant = $id,
            )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with GGUF id `id`, if hotcold knows it.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's name of the type (`"q4_K"`, `"f16"`, …), as `gguf-dump` prints it in upper case.
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Number of elements in one block.
            pub fn block_size(self) -> usize {
                match self { $(GgmlType::$variant => $block,)* }
            }

            /// Number of bytes in one block.
            pub fn block_bytes(self) -> usize {
                match self { $(GgmlType::$variant => $bytes,)* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "f32", 1, 4;
    F16 = 1, "f16", 1, 2;
    Q4_0 = 2, "q4_0", 32, 18;
    Q4_1 = 3, "q4_1", 32, 20;
    Q5_0 = 6, "q5_0", 32, 22;
    Q5_1 = 7, "q5_1", 32, 24;
    Q8_0 = 8, "q8_0", 32, 34;
    Q8_1 = 9, "q8_1", 32, 36;
    Q2_K = 10, "q2_K", 256, 84;
    Q3_K = 11, "q3_K", 256, 110;
    Q4_K = 12, "q4_K", 256, 144;
    Q5_K = 13, "q5_K", 256, 176;
    Q6_K = 14, "q6_K", 256, 210;
    Q8_K = 15, "q8_K", 256, 292;
    IQ2_XXS = 16, "iq2_xxs", 256, 66;
    IQ2_XS = 17, "iq2_xs", 256, 74;
    IQ3_XXS = 18, "iq3_xxs", 256, 98;
    IQ1_S = 19, "iq1_s", 256, 50;
    IQ4_NL = 20, "iq4_nl", 32, 18;
    IQ3_S = 21, "iq3_s", 256, 110;
    IQ2_S = 22, "iq2_s", 256, 82;
    IQ4_XS = 23, "iq4_xs", 256, 136;
    I8 = 24, "i8", 1, 1;
    I16 = 25, "i16", 1, 2;
    I32 = 26, "i32", 1, 4;
    I64 = 27, "i64", 1, 8;
    F64 = 28, "f64", 1, 8;
    IQ1_M = 29, "iq1_m", 256, 56;
    BF16 = 30, "bf16", 1, 2;
    TQ1_0 = 34, "tq1_0", 256, 54;
    TQ2_0 = 35, "tq2_0", 256, 66;
    MXFP4 = 39, "mxfp4", 32, 17;
}

impl GgmlType {
    /// Bytes taken by one row of `n` elements, or an error when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: u64) -> Result<u64> {
        let block = self.block_size() as u64;
        if !n.is_multiple_of(block) {
            return Err(Error::InvalidArgument(format!(
                "{} elements is not a multiple of the {} block size {block}",
                n,
                self.name()
            )));
        }
        (n / block)
            .checked_mul(self.block_bytes() as u64)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("size of {n} {} elements overflows", self.name()))
            })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn row_bytes_checks_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512).unwrap(), 288);
        assert_eq!(GgmlType::F32.row_bytes(3).unwrap(), 12);
        assert!(GgmlType::Q8_0.row_bytes(33).is_err());
        assert!(GgmlType::F32.row_bytes(u64::MAX).is_err());
    }
}
