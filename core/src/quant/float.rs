//! f32 ↔ f16 / bf16 conversions exactly as ggml makes them (`ggml_compute_fp32_to_fp16`,
//! `ggml_compute_fp32_to_bf16`), NaN handling included.

use half::{bf16, f16};

/// f32 → f16 as ggml converts: round to nearest even, overflow to infinity, and every NaN to the
/// quiet NaN `0x7E00` with the input's sign.
#[inline]
pub fn fp32_to_fp16(x: f32) -> f16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        f16::from_bits(sign | 0x7E00)
    } else {
        f16::from_f32(x)
    }
}

/// f16 → f32 (exact; a NaN keeps its payload and becomes quiet, as in ggml on x86).
#[inline]
pub fn fp16_to_fp32(h: f16) -> f32 {
    h.to_f32()
}

/// f32 → bf16 as ggml converts: round to nearest even on the top 16 bits; a NaN is truncated and
/// made quiet (bit 6 of the result set).
#[inline]
pub fn fp32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// bf16 → f32: the bits shifted into the top half, NaNs unchanged.
#[inline]
pub fn bf16_to_fp32(h: bf16) -> f32 {
    f32::from_bits((h.to_bits() as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_nan_is_canonical() {
        assert_eq!(fp32_to_fp16(f32::from_bits(0x7f80_0001)).to_bits(), 0x7E00);
        assert_eq!(fp32_to_fp16(f32::from_bits(0xffc1_2345)).to_bits(), 0xFE00);
        assert_eq!(fp32_to_fp16(65520.0).to_bits(), 0x7C00);
        assert_eq!(fp32_to_fp16(65519.0).to_bits(), 0x7BFF);
        // 2^-25 is the tie between 0 and the smallest subnormal: rounds to even (zero)
        assert_eq!(fp32_to_fp16(2f32.powi(-25)).to_bits(), 0);
        assert_eq!(fp32_to_fp16(3.0 * 2f32.powi(-25)).to_bits(), 2);
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(fp32_to_bf16(1.0 + 2f32.powi(-8)).to_bits(), 0x3F80); // tie to even (down)
        assert_eq!(fp32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)).to_bits(), 0x3F82); // tie to even (up)
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7f80_0001)).to_bits(), 0x7FC0);
        assert_eq!(fp32_to_bf16(f32::INFINITY).to_bits(), 0x7F80);
        assert_eq!(bf16_to_fp32(bf16::from_bits(0xC040)), -3.0);
    }
}
