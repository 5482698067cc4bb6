//! Activation quantisation: each token row of `x` becomes the weight type's `vec_dot_type`, exactly
//! as ggml's x86 CPU backend makes it.
//!
//! - Q8_0 / Q8_1 follow ggml's AVX `quantize_row_q8_0` / `quantize_row_q8_1` (which is what a
//!   llama.cpp built for this CPU runs): `d = amax / 127` stored as f16, quants
//!   `round_half_even(x * (127 / amax))`. (ggml's portable reference uses `x * (1 / d)` and rounds
//!   half away from zero; the two differ on rare ties.)
//! - Q8_K is ggml's `quantize_row_q8_K_ref` (the x86 build calls it too), from [`crate::quant`].
//! - F16 / BF16 activations are rounded to the 16-bit format and kept as f32.
//!
//! The quantised rows are kept as a structure of arrays ([`Acts`]): quants, scales, and the integer
//! sums of the quants per block (which the kernels use to fold weight offsets such as Q4_0's `-8`
//! into one multiply per block; ggml's `block_q8_1::s` and `block_q8_K::bsums` serve the same end).

use rayon::prelude::*;

use crate::quant::{
    bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16, BlockQ8K, QuantizeBlock, QK, QK_K,
};

use super::Level;

/// One token row's Q8_0/Q8_1 outputs (quants, scales, `s`, integer sums) and its input.
type Q8Row<'a> = (
    (
        (&'a mut [i8], &'a mut [f32]),
        (&'a mut [f32], &'a mut [i32]),
    ),
    &'a [f32],
);
/// One token row's Q8_K outputs (quants, scales, bsums) and its input.
type Q8KRow<'a> = ((&'a mut [i8], &'a mut [f32]), (&'a mut [i16], &'a [f32]));

/// Which format the activations are quantised to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum ActKind {
    /// f32 as is (F32 weights).
    #[default]
    F32,
    /// Rounded to f16 (F16 weights).
    F16,
    /// Rounded to bf16 (BF16 weights).
    Bf16,
    /// ggml Q8_0: blocks of 32, f16 scale (Q4_0, Q5_0, Q8_0 weights).
    Q8_0,
    /// ggml Q8_1: Q8_0 plus `s = f16(d * sum q)` (Q4_1, Q5_1 weights).
    Q8_1,
    /// ggml Q8_K: blocks of 256, f32 scale, sums per 16 (K-quant weights).
    Q8K,
}

/// `n` quantised token rows of `cols` values (a reusable buffer: only the parts `kind` uses are
/// filled).
#[derive(Default, Debug)]
pub(crate) struct Acts {
    /// The format.
    pub kind: ActKind,
    /// Values per token row.
    pub cols: usize,
    /// Number of token rows.
    pub n: usize,
    /// Float kinds: `n * cols` (rounded) values.
    pub f: Vec<f32>,
    /// Q8 kinds: `n * cols` quants.
    pub q: Vec<i8>,
    /// Q8 kinds: one scale per block (`n * cols / block`), f16-rounded for Q8_0 and Q8_1.
    pub d: Vec<f32>,
    /// Q8_1: `f16(d * sum q)` per block, as f32.
    pub s: Vec<f32>,
    /// Q8_0 and Q8_1: the sum of the quants of each block of 32.
    pub isum: Vec<i32>,
    /// Q8_K: the sums of each 16 quants (16 per block), as ggml's `bsums`.
    pub bsums: Vec<i16>,
    /// AVX-512, Q8_0/Q8_1: per pair of blocks, 16 lanes `[d0 ×8, d1 ×8]` (`n * nb/2 * 16`).
    pub dv: Vec<f32>,
    /// AVX-512, Q8_0/Q8_1: per pair of blocks, 16 lanes `[−off·isum0, 0 ×7, −off·isum1, 0 ×7]`,
    /// with `off` the weight type's offset (`1 << shift` of [`Acts::quantize`]).
    pub nis: Vec<i32>,
    /// AVX-512, Q8_1: per pair of blocks, 16 lanes `[s0, 0 ×7, s1, 0 ×7]`.
    pub sv: Vec<f32>,
}

/// Token rows at or above which quantisation itself runs in parallel.
const PAR_TOKENS: usize = 8;

impl Acts {
    /// Blocks per token row.
    #[inline]
    pub fn nb(&self) -> usize {
        match self.kind {
            ActKind::F32 | ActKind::F16 | ActKind::Bf16 => self.cols,
            ActKind::Q8_0 | ActKind::Q8_1 => self.cols / QK,
            ActKind::Q8K => self.cols / QK_K,
        }
    }

    /// Float values of token `t`.
    #[inline]
    pub fn f(&self, t: usize) -> &[f32] {
        &self.f[t * self.cols..(t + 1) * self.cols]
    }

    /// Quants of token `t`.
    #[inline]
    pub fn q(&self, t: usize) -> &[i8] {
        &self.q[t * self.cols..(t + 1) * self.cols]
    }

    /// Block scales of token `t`.
    #[inline]
    pub fn d(&self, t: usize) -> &[f32] {
        let nb = self.nb();
        &self.d[t * nb..(t + 1) * nb]
    }

    /// Q8_1 `s` values of token `t`.
    #[inline]
    pub fn s(&self, t: usize) -> &[f32] {
        let nb = self.nb();
        &self.s[t * nb..(t + 1) * nb]
    }

    /// Integer block sums of token `t` (Q8_0, Q8_1).
    #[inline]
    pub fn isum(&self, t: usize) -> &[i32] {
        let nb = self.nb();
        &self.isum[t * nb..(t + 1) * nb]
    }

    /// Q8_K sums per 16 of token `t` (16 per block).
    #[inline]
    pub fn bsums(&self, t: usize) -> &[i16] {
        let nb = self.nb();
        &self.bsums[t * nb * 16..(t + 1) * nb * 16]
    }

    /// Pairs of blocks per token row (the AVX-512 vectors [`Acts::dv`] etc. cover `nb / 2` pairs).
    #[inline]
    pub fn npairs(&self) -> usize {
        self.nb() / 2
    }

    /// Quantises the `n` token rows of `x` (each `cols` values, a whole number of blocks) to
    /// `kind`, reusing this buffer's memory. `shift` is log2 of the offset of the weights the
    /// activations will meet (Q4_0: 3, Q5_0: 4, Q8_0 as unsigned: 7), for [`Acts::nis`].
    pub fn quantize(
        &mut self,
        level: Level,
        kind: ActKind,
        shift: u32,
        x: &[f32],
        n: usize,
        cols: usize,
    ) {
        debug_assert_eq!(x.len(), n * cols);
        self.kind = kind;
        self.cols = cols;
        self.n = n;
        let par = n >= PAR_TOKENS && rayon::current_num_threads() > 1;
        let nb = self.nb();
        match kind {
            ActKind::F32 | ActKind::F16 | ActKind::Bf16 => {
                resize(&mut self.f, n * cols);
                let round: fn(f32) -> f32 = match kind {
                    ActKind::F32 => |v| v,
                    ActKind::F16 => |v| fp16_to_fp32(fp32_to_fp16(v)),
                    _ => |v| bf16_to_fp32(fp32_to_bf16(v)),
                };
                if kind == ActKind::F32 {
                    self.f.copy_from_slice(x);
                } else if kind == ActKind::F16 && level >= Level::Avx2 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX2 and F16C were detected (a level is at most the detected one).
                    unsafe {
                        super::avx2::round_f16_row(x, &mut self.f, round)
                    };
                } else if par {
                    self.f
                        .par_chunks_mut(cols)
                        .zip(x.par_chunks(cols))
                        .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &v)| *o = round(v)));
                } else {
                    self.f.iter_mut().zip(x).for_each(|(o, &v)| *o = round(v));
                }
            }
            ActKind::Q8_0 | ActKind::Q8_1 => {
                resize(&mut self.q, n * cols);
                resize(&mut self.d, n * nb);
                resize(&mut self.s, n * nb);
                resize(&mut self.isum, n * nb);
                let with_s = kind == ActKind::Q8_1;
                let work = |(((q, d), (s, isum)), x): Q8Row| {
                    quantize_q8_0_row(level, x, q, d, isum);
                    if with_s {
                        // ggml: s = f16(d * sum) with the unrounded d = amax / 127
                        for (i, (s, &sum)) in s.iter_mut().zip(isum.iter()).enumerate() {
                            let amax = absmax(&x[i * QK..(i + 1) * QK]);
                            *s = fp16_to_fp32(fp32_to_fp16(amax / 127.0 * sum as f32));
                        }
                    }
                };
                if par {
                    self.q
                        .par_chunks_mut(cols)
                        .zip(self.d.par_chunks_mut(nb))
                        .zip(self.s.par_chunks_mut(nb).zip(self.isum.par_chunks_mut(nb)))
                        .zip(x.par_chunks(cols))
                        .for_each(work);
                } else {
                    self.q
                        .chunks_mut(cols)
                        .zip(self.d.chunks_mut(nb))
                        .zip(self.s.chunks_mut(nb).zip(self.isum.chunks_mut(nb)))
                        .zip(x.chunks(cols))
                        .for_each(work);
                }
                if level >= Level::Avx512 {
                    self.expand_pairs(shift);
                }
            }
            ActKind::Q8K => {
                resize(&mut self.q, n * cols);
                resize(&mut self.d, n * nb);
                resize(&mut self.bsums, n * nb * 16);
                let work = |((q, d), (bs, x)): Q8KRow| quantize_q8k_row(level, x, q, d, bs);
                if par {
                    self.q
                        .par_chunks_mut(cols)
                        .zip(self.d.par_chunks_mut(nb))
                        .zip(self.bsums.par_chunks_mut(nb * 16).zip(x.par_chunks(cols)))
                        .for_each(work);
                } else {
                    self.q
                        .chunks_mut(cols)
                        .zip(self.d.chunks_mut(nb))
                        .zip(self.bsums.chunks_mut(nb * 16).zip(x.chunks(cols)))
                        .for_each(work);
                }
            }
        }
    }
}

impl Acts {
    /// Fills [`Acts::dv`], [`Acts::nis`] and [`Acts::sv`] from the per-block arrays.
    fn expand_pairs(&mut self, shift: u32) {
        let (nb, np) = (self.nb(), self.npairs());
        let len = self.n * np * 16;
        resize(&mut self.dv, len);
        resize(&mut self.nis, len);
        resize(&mut self.sv, len);
        for t in 0..self.n {
            for p in 0..np {
                let o = (t * np + p) * 16;
                for h in 0..2 {
                    let b = t * nb + 2 * p + h;
                    self.dv[o + 8 * h..o + 8 * h + 8].fill(self.d[b]);
                    self.nis[o + 8 * h] = -(self.isum[b] << shift);
                    self.sv[o + 8 * h] = self.s[b];
                }
            }
        }
    }
}

/// Sets `v`'s length to `n` (contents are overwritten by the caller).
fn resize<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() != n {
        v.clear();
        v.resize(n, T::default());
    }
}

/// Largest magnitude in `x` (0 for an empty slice).
#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, &v| m.max(v.abs()))
}

/// One token row to Q8_0 (x86 ggml semantics): quants, f16-rounded scales, integer block sums.
fn quantize_q8_0_row(level: Level, x: &[f32], q: &mut [i8], d: &mut [f32], isum: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx2 {
        // SAFETY: AVX2 and F16C were detected (a level is only ever at most the detected one).
        unsafe { super::avx2::quantize_q8_0_row(x, q, d, isum) };
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if level == Level::Simd128 {
        super::simd128::quantize_q8_0_row(x, q, d, isum);
        return;
    }
    let _ = level;
    for (((x, q), d), isum) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut())
        .zip(isum.iter_mut())
    {
        let amax = absmax(x);
        *d = fp16_to_fp32(fp32_to_fp16(amax / 127.0));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in q.iter_mut().zip(x) {
            let r = (v * id).round_ties_even() as i32;
            *q = r.clamp(-128, 127) as i8;
            sum += *q as i32;
        }
        *isum = sum;
    }
}

/// One token row to Q8_K (ggml's `quantize_row_q8_K_ref`; the AVX2 version is bit-exact).
pub(crate) fn quantize_q8k_row(
    level: Level,
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    bsums: &mut [i16],
) {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx2 {
        // SAFETY: AVX2 was detected (a level is only ever at most the detected one).
        unsafe { super::avx2::quantize_q8k_row(x, q, d, bsums) };
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if level == Level::Simd128 {
        super::simd128::quantize_q8k_row(x, q, d, bsums);
        return;
    }
    let _ = level;
    for (((x, q), d), bs) in x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
        .zip(bsums.chunks_exact_mut(16))
    {
        quantize_q8k_block_scalar(x, q, d, bs);
    }
}

/// One Q8_K block by [`crate::quant`]'s reference quantiser.
pub(crate) fn quantize_q8k_block_scalar(x: &[f32], q: &mut [i8], d: &mut f32, bsums: &mut [i16]) {
    let b = BlockQ8K::quantize(x);
    q.copy_from_slice(&b.qs);
    *d = b.d;
    bsums.copy_from_slice(&b.bsums);
}
