//! Q4_0, Q5_0 and Q8_0 matrices repacked 16 rows at a time, for a product in which each 32-bit lane
//! of an AVX-512 register is one weight row.
//!
//! ggml's row-major layout puts one row's block in a register: `vpdpbusd` leaves eight partial sums
//! per block, and every block then costs a conversion, a scale multiply and an accumulate for only
//! two blocks' worth of lanes. Here the weights of 16 rows are interleaved four quants at a time, so
//! one `vpdpbusd` against a broadcast of four activation bytes advances 16 rows at once and eight of
//! them finish each row's whole block sum in its own lane: per block, 16 rows and one token take
//! eight `vpdpbusd` and three float instructions, 512 products for 11 instructions (plus the nibble
//! unpacking of Q4_0 and Q5_0). That is llama.cpp's idea of repacking weights for the CPU
//! ("interleaved" Q4_0 / Q8_0 layouts), here for the 512-bit VNNI product.
//!
//! Layout: groups of 16 rows (the last group padded with zero rows, scale 0); in a group, for each
//! block of 32 columns, the 16 rows' f16 scales (32 bytes), then the quants as unsigned values
//! (`q + offset`, the offset 8, 16 or 128 of the type), in steps of 64 bytes, four bytes per row,
//! row after row:
//! - Q8_0: eight steps; step `j` holds quants `4j..4j + 4` (as `q ^ 0x80`). 544 bytes per block.
//! - Q4_0: four steps; step `j` is ggml's quant bytes `4j..4j + 4` as they are: the low nibbles are
//!   quants `4j..4j + 4` and the high ones `16 + 4j..`. 288 bytes per block.
//! - Q5_0: Q4_0's four steps, then eight 64-bit masks (one bit per byte of a step) of the fifth
//!   bits: mask `2j` for the low nibbles of step `j`, `2j + 1` for the high ones. 352 bytes.
//!
//! Every type keeps exactly its ggml bytes per row.
//!
//! Arithmetic: for row `r` and token `t`, block by block in column order,
//! `acc = fma(f32(isum), dw · da, acc)` with `isum` the exact integer block sum (ggml's), `dw` the
//! weight's and `da` the activation's block scale; every path computes exactly that, so the scalar
//! loop and the AVX-512 kernel give the same bits. Against ggml's row-major product only the float
//! accumulation order differs.

use rayon::prelude::*;

use crate::quant::{fp16_to_fp32, GgmlType, QK};
use crate::{Error, Result};

use super::act::{ActKind, Acts};
use super::{Level, Matrix};

/// Rows per interleaved group (the lanes of one 512-bit register of i32).
const GROUP: usize = 16;
/// Bytes of one group's block scales (16 f16).
const SCALE_BYTES: usize = GROUP * 2;
/// Quants per row in one interleaved step (one `vpdpbusd` lane).
const QUAD: usize = 4;
/// Bytes of one step: four quants of each of the 16 rows.
const STEP_BYTES: usize = GROUP * QUAD;
/// Bytes of the 4-bit steps of one Q4_0 / Q5_0 block (16 quant bytes per row).
const NIBBLE_BYTES: usize = GROUP * QK / 2;

/// The weight types with an interleaved layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Q4_0,
    Q5_0,
    Q8_0,
}

impl Format {
    fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q4_0 => Some(Format::Q4_0),
            GgmlType::Q5_0 => Some(Format::Q5_0),
            GgmlType::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    fn ty(self) -> GgmlType {
        match self {
            Format::Q4_0 => GgmlType::Q4_0,
            Format::Q5_0 => GgmlType::Q5_0,
            Format::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of one group's block of 32 columns (scales, quants, fifth bits).
    const fn block_bytes(self) -> usize {
        SCALE_BYTES
            + match self {
                Format::Q4_0 => NIBBLE_BYTES,
                Format::Q5_0 => NIBBLE_BYTES + 8 * 8,
                Format::Q8_0 => GROUP * QK,
            }
    }

    /// What the stored unsigned quants exceed the signed ones by.
    fn offset(self) -> i32 {
        1 << super::offset_shift(self.ty())
    }

    /// Writes row `lane`'s block `src` (ggml's bytes, scale first) into a group block's quants.
    fn put(self, quants: &mut [u8], lane: usize, src: &[u8]) {
        let step = |j: usize| j * STEP_BYTES + lane * QUAD;
        match self {
            Format::Q8_0 => {
                for (k, &q) in src[2..2 + QK].iter().enumerate() {
                    quants[step(k / QUAD) + k % QUAD] = q ^ 0x80;
                }
            }
            Format::Q4_0 | Format::Q5_0 => {
                let (qh, qs) = if self == Format::Q5_0 {
                    (
                        u32::from_le_bytes(src[2..6].try_into().unwrap()),
                        &src[6..22],
                    )
                } else {
                    (0, &src[2..18])
                };
                for j in 0..QK / 2 / QUAD {
                    quants[step(j)..step(j) + QUAD].copy_from_slice(&qs[j * QUAD..(j + 1) * QUAD]);
                }
                if self == Format::Q5_0 {
                    for m in 0..8 {
                        let bits = (qh >> (16 * (m % 2) + QUAD * (m / 2))) & 15;
                        quants[NIBBLE_BYTES + 8 * m + lane / 2] |= (bits as u8) << (4 * (lane % 2));
                    }
                }
            }
        }
    }

    /// Row `lane`'s unsigned quant `k` of a group block's quants (the inverse of [`Format::put`]).
    fn get(self, quants: &[u8], lane: usize, k: usize) -> i32 {
        if self == Format::Q8_0 {
            return i32::from(quants[k / QUAD * STEP_BYTES + lane * QUAD + k % QUAD]);
        }
        let (high, k16) = (k / 16, k % 16);
        let byte = quants[k16 / QUAD * STEP_BYTES + lane * QUAD + k16 % QUAD];
        let nibble = i32::from((byte >> (4 * high)) & 15);
        if self == Format::Q4_0 {
            return nibble;
        }
        let mask = quants[NIBBLE_BYTES + 8 * (2 * (k16 / QUAD) + high) + lane / 2];
        nibble | i32::from((mask >> (4 * (lane % 2) + k16 % QUAD)) & 1) << 4
    }
}

/// A Q4_0, Q5_0 or Q8_0 matrix in the 16-row interleaved layout (see the module docs): `rows`
/// outputs of `cols` inputs.
#[derive(Debug)]
pub struct Interleaved {
    format: Format,
    rows: usize,
    cols: usize,
    data: Box<[u8]>,
}

impl Interleaved {
    /// The weight types this layout takes.
    pub const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0];

    /// Repacks a matrix of one of [`Interleaved::TYPES`] (in parallel on the current rayon pool).
    ///
    /// Errors: [`Error::InvalidArgument`] for a matrix of another type or a malformed one.
    pub fn from_matrix(w: &Matrix) -> Result<Self> {
        w.validate()?;
        let format = Format::of(w.ty).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the interleaved layout takes Q4_0, Q5_0 or Q8_0 weights, not {}",
                w.ty
            ))
        })?;
        let rb = w.row_bytes();
        let src_block = w.ty.block_bytes();
        let block_bytes = format.block_bytes();
        let group_bytes = w.cols / QK * block_bytes;
        let groups = w.rows.div_ceil(GROUP);
        let mut data = vec![0u8; groups * group_bytes].into_boxed_slice();
        data.par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, out)| {
                for (b, blk) in out.chunks_exact_mut(block_bytes).enumerate() {
                    let (scales, quants) = blk.split_at_mut(SCALE_BYTES);
                    // padding rows stay all zero (scale 0)
                    for lane in 0..GROUP.min(w.rows - g * GROUP) {
                        let src = &w.data[(g * GROUP + lane) * rb + b * src_block..][..src_block];
                        scales[lane * 2..lane * 2 + 2].copy_from_slice(&src[..2]);
                        format.put(quants, lane, src);
                    }
                }
            });
        Ok(Interleaved {
            format,
            rows: w.rows,
            cols: w.cols,
            data,
        })
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.format.ty()
    }

    /// Number of rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether this CPU runs the interleaved product faster than the row-major one (AVX-512 VNNI);
    /// elsewhere it runs a scalar loop, correct but slow.
    pub fn is_fast() -> bool {
        Level::current() >= Level::Avx512
    }

    /// `y[t * rows + r] = dot(row r, x[t * cols ..])` for `n_tokens` token rows of `x`, the
    /// activations quantised to Q8_0 as [`matmul`](super::matmul) does. Runs on the current rayon
    /// pool; the same bits at every thread count.
    ///
    /// Errors: [`Error::InvalidArgument`] for wrong `x` or `y` lengths.
    pub fn matmul(&self, x: &[f32], n_tokens: usize, y: &mut [f32]) -> Result<()> {
        self.matmul_at(Level::current(), x, n_tokens, y)
    }

    /// [`Interleaved::matmul`] on the scalar path (the reference, for tests and benches).
    #[doc(hidden)]
    pub fn matmul_scalar(&self, x: &[f32], n_tokens: usize, y: &mut [f32]) -> Result<()> {
        self.matmul_at(Level::Scalar, x, n_tokens, y)
    }

    fn matmul_at(&self, level: Level, x: &[f32], n_tokens: usize, y: &mut [f32]) -> Result<()> {
        if n_tokens.checked_mul(self.cols) != Some(x.len())
            || n_tokens.checked_mul(self.rows) != Some(y.len())
        {
            return Err(Error::InvalidArgument(format!(
                "x has {} values and y {}, expected {n_tokens} tokens × {} columns and × {} rows",
                x.len(),
                y.len(),
                self.cols,
                self.rows
            )));
        }
        if n_tokens == 0 || self.rows == 0 {
            return Ok(());
        }
        let mut acts = super::SCRATCH.with(|s| s.take()).unwrap_or_default();
        let shift = super::offset_shift(self.ty());
        acts.quantize(level, ActKind::Q8_0, shift, x, n_tokens, self.cols);
        let groups = self.rows.div_ceil(GROUP);
        let threads = rayon::current_num_threads().max(1);
        // 8 tasks per thread for balance, each at least ~64 KiB of weights
        let per_task = groups
            .div_ceil(threads * 8)
            .max((64 * 1024 / self.group_bytes()).max(1));
        let out = super::OutPtr(y.as_mut_ptr());
        let task = |c: usize| {
            let g0 = c * per_task;
            let g1 = (g0 + per_task).min(groups);
            self.run_groups(level, &acts, g0, g1, &out);
        };
        let n_tasks = groups.div_ceil(per_task);
        if n_tasks == 1 || threads == 1 {
            (0..n_tasks).for_each(task);
        } else {
            (0..n_tasks).into_par_iter().for_each(task);
        }
        super::SCRATCH.with(|s| s.set(Some(acts)));
        Ok(())
    }

    /// Bytes of one group of 16 rows.
    fn group_bytes(&self) -> usize {
        self.cols / QK * self.format.block_bytes()
    }

    /// The bytes of groups `g..g + ng`.
    fn groups(&self, g: usize, ng: usize) -> &[u8] {
        let group_bytes = self.group_bytes();
        &self.data[g * group_bytes..(g + ng) * group_bytes]
    }

    /// Groups `g0..g1` for every token, written into `out` (`n × rows`, token-major).
    fn run_groups(&self, level: Level, acts: &Acts, g0: usize, g1: usize, out: &super::OutPtr) {
        let mut tile = [[0f32; GROUP]; TILE];
        let mut g = g0;
        while g < g1 {
            let ng = (g1 - g).min(MAX_GROUPS);
            let mut t0 = 0;
            while t0 < acts.n {
                let nt = (acts.n - t0).min(MAX_TOKENS);
                match level {
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx512 => avx512::tile(self, g, ng, acts, t0, nt, &mut tile),
                    _ => self.scalar_tile(g, ng, acts, t0, nt, &mut tile),
                }
                for (i, lanes) in tile.iter().enumerate().take(ng * nt) {
                    let (gi, t) = (i / nt, i % nt);
                    let r0 = (g + gi) * GROUP;
                    let n = (self.rows - r0).min(GROUP);
                    // SAFETY: token t0 + t < n and rows r0..r0 + n < rows lie inside y; groups
                    // g0..g1 belong to this task alone.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            lanes.as_ptr(),
                            out.0.add((t0 + t) * self.rows + r0),
                            n,
                        )
                    };
                }
                t0 += nt;
            }
            g += ng;
        }
    }

    /// The reference: groups `g..g + ng` × tokens `t0..t0 + nt`, into `tile[gi * nt + t]`.
    fn scalar_tile(
        &self,
        g: usize,
        ng: usize,
        acts: &Acts,
        t0: usize,
        nt: usize,
        tile: &mut [[f32; GROUP]; TILE],
    ) {
        let (format, offset) = (self.format, self.format.offset());
        for (gi, group) in self
            .groups(g, ng)
            .chunks_exact(self.group_bytes())
            .enumerate()
        {
            for t in 0..nt {
                let (q, d, isum) = (acts.q(t0 + t), acts.d(t0 + t), acts.isum(t0 + t));
                let acc = &mut tile[gi * nt + t];
                acc.fill(0.0);
                for (b, blk) in group.chunks_exact(format.block_bytes()).enumerate() {
                    let (scales, quants) = blk.split_at(SCALE_BYTES);
                    for (lane, acc) in acc.iter_mut().enumerate() {
                        let mut s = -offset * isum[b];
                        for k in 0..QK {
                            s += format.get(quants, lane, k) * i32::from(q[b * QK + k]);
                        }
                        let dw = fp16_to_fp32(half::f16::from_le_bytes([
                            scales[lane * 2],
                            scales[lane * 2 + 1],
                        ]));
                        *acc = (s as f32).mul_add(dw * d[b], *acc);
                    }
                }
            }
        }
    }
}

/// Groups per kernel call.
const MAX_GROUPS: usize = 4;
/// Tokens per kernel call.
const MAX_TOKENS: usize = 4;
/// Output tiles of one call (group-major: `tile[g * nt + t]`).
const TILE: usize = MAX_GROUPS * MAX_TOKENS;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    // Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::*;

    use super::{
        Acts, Format, Interleaved, GROUP, NIBBLE_BYTES, QK, QUAD, SCALE_BYTES, STEP_BYTES, TILE,
    };

    /// The kernels' const-generic names of the formats.
    const Q4: u8 = 0;
    const Q5: u8 = 1;
    const Q8: u8 = 2;

    /// [`Interleaved::scalar_tile`] with AVX-512 VNNI (the same bits).
    pub(super) fn tile(
        il: &Interleaved,
        g: usize,
        ng: usize,
        acts: &Acts,
        t0: usize,
        nt: usize,
        tile: &mut [[f32; GROUP]; TILE],
    ) {
        assert!((1..=4).contains(&ng) && (1..=4).contains(&nt) && t0 + nt <= acts.n);
        let w = il.groups(g, ng);
        let gb = il.group_bytes();
        // SAFETY: only called on the AVX-512 level, which needs F/BW/VL/VNNI and F16C; the groups
        // (sliced above) and tokens (asserted) exist.
        unsafe {
            match il.format {
                Format::Q4_0 => tile_of::<Q4>(w.as_ptr(), gb, ng, acts, t0, nt, tile),
                Format::Q5_0 => tile_of::<Q5>(w.as_ptr(), gb, ng, acts, t0, nt, tile),
                Format::Q8_0 => tile_of::<Q8>(w.as_ptr(), gb, ng, acts, t0, nt, tile),
            }
        }
    }

    /// The format `F` of a const-generic name.
    const fn format(f: u8) -> Format {
        match f {
            Q4 => Format::Q4_0,
            Q5 => Format::Q5_0,
            _ => Format::Q8_0,
        }
    }

    /// [`tile`] for format `F`: the largest kernels that fit `ng` groups × `nt` tokens.
    unsafe fn tile_of<const F: u8>(
        wp: *const u8,
        gb: usize,
        ng: usize,
        acts: &Acts,
        t0: usize,
        nt: usize,
        tile: &mut [[f32; GROUP]; TILE],
    ) {
        match (ng, nt) {
            (4, 1) => kernel::<F, 4, 1>(wp, gb, acts, t0, tile),
            (4, 2) => kernel::<F, 4, 2>(wp, gb, acts, t0, tile),
            (g, n) if g >= 2 => {
                for g0 in (0..g - 1).step_by(2) {
                    let out = &mut tile[g0 * n..];
                    let p = wp.add(g0 * gb);
                    match n {
                        1 => kernel::<F, 2, 1>(p, gb, acts, t0, out),
                        2 => kernel::<F, 2, 2>(p, gb, acts, t0, out),
                        3 => kernel::<F, 2, 3>(p, gb, acts, t0, out),
                        _ => kernel::<F, 2, 4>(p, gb, acts, t0, out),
                    }
                }
                if g % 2 == 1 {
                    let out = &mut tile[(g - 1) * n..];
                    one_group::<F>(wp.add((g - 1) * gb), gb, acts, t0, n, out);
                }
            }
            (_, n) => one_group::<F>(wp, gb, acts, t0, n, tile),
        }
    }

    /// One group × `n` tokens.
    unsafe fn one_group<const F: u8>(
        p: *const u8,
        gb: usize,
        acts: &Acts,
        t0: usize,
        n: usize,
        out: &mut [[f32; GROUP]],
    ) {
        match n {
            1 => kernel::<F, 1, 1>(p, gb, acts, t0, out),
            2 => kernel::<F, 1, 2>(p, gb, acts, t0, out),
            3 => kernel::<F, 1, 3>(p, gb, acts, t0, out),
            _ => kernel::<F, 1, 4>(p, gb, acts, t0, out),
        }
    }

    /// Bytes ahead of the block being read that the first token tile prefetches.
    const PF_AHEAD: usize = 4096;

    /// Step pair `j` (of four) of a block's quants, as unsigned bytes, and the offsets of the
    /// activation quads each half multiplies: Q8_0 steps `2j` and `2j + 1`; Q4_0 / Q5_0 step `j`'s
    /// low and high nibbles (plus their fifth bits).
    #[inline(always)]
    unsafe fn step<const F: u8>(quants: *const u8, j: usize) -> ([__m512i; 2], [usize; 2]) {
        let load = |s: usize| _mm512_loadu_si512(quants.add(s * STEP_BYTES) as *const __m512i);
        if F == Q8 {
            return ([load(2 * j), load(2 * j + 1)], [8 * j, 8 * j + QUAD]);
        }
        let v = load(j);
        let nibble = _mm512_set1_epi8(15);
        let mut lo = _mm512_and_si512(v, nibble);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
        if F == Q5 {
            let masks = quants.add(NIBBLE_BYTES) as *const u64;
            let sixteen = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, masks.add(2 * j).read_unaligned(), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, masks.add(2 * j + 1).read_unaligned(), hi, sixteen);
        }
        ([lo, hi], [QUAD * j, QK / 2 + QUAD * j])
    }

    /// Format `F`, `G` groups × `N` tokens: `out[g * N + t]` (16 rows each).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel<const F: u8, const G: usize, const N: usize>(
        w: *const u8,
        gb: usize,
        acts: &Acts,
        t0: usize,
        out: &mut [[f32; GROUP]],
    ) {
        let block_bytes = format(F).block_bytes();
        let offset = format(F).offset();
        let nb = acts.nb();
        let q: [*const u8; N] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const u8);
        let d: [&[f32]; N] = std::array::from_fn(|t| acts.d(t0 + t));
        let isum: [&[i32]; N] = std::array::from_fn(|t| acts.isum(t0 + t));
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        for b in 0..nb {
            let blk: [*const u8; G] = std::array::from_fn(|g| w.add(g * gb + b * block_bytes));
            if t0 == 0 {
                for g in 0..G {
                    let ahead = blk[g].wrapping_add(PF_AHEAD);
                    for l in 0..block_bytes.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
                    }
                }
            }
            let mut s = [[_mm512_setzero_si512(); N]; G];
            for t in 0..N {
                let init = _mm512_set1_epi32(-offset * isum[t][b]);
                for g in 0..G {
                    s[g][t] = init;
                }
            }
            for j in 0..4 {
                let mut wv = [[_mm512_setzero_si512(); 2]; G];
                let mut at = [0; 2];
                for g in 0..G {
                    (wv[g], at) = step::<F>(blk[g].add(SCALE_BYTES), j);
                }
                for t in 0..N {
                    for h in 0..2 {
                        let a = (q[t].add(b * QK + at[h]) as *const i32).read_unaligned();
                        let av = _mm512_set1_epi32(a);
                        for g in 0..G {
                            s[g][t] = _mm512_dpbusd_epi32(s[g][t], wv[g][h], av);
                        }
                    }
                }
            }
            let dw: [__m512; G] = std::array::from_fn(|g| {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk[g] as *const __m256i))
            });
            for t in 0..N {
                let da = _mm512_set1_ps(d[t][b]);
                for g in 0..G {
                    let scale = _mm512_mul_ps(dw[g], da);
                    acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[g][t]), scale, acc[g][t]);
                }
            }
        }
        for g in 0..G {
            for t in 0..N {
                _mm512_storeu_ps(out[g * N + t].as_mut_ptr(), acc[g][t]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{in_pool, random_matrix, Rng};
    use super::super::{matmul_with_simd, round_like_matmul_input};
    use super::*;
    use crate::quant::dequantize;

    /// Shapes with partial last groups, one-block rows and every token-tile remainder.
    const SHAPES: &[(usize, usize)] = &[(1, 32), (15, 96), (16, 640), (37, 64), (100, 320)];

    fn case(
        rng: &mut Rng,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n: usize,
    ) -> (Vec<u8>, Vec<f32>) {
        let w = random_matrix(rng, ty, rows, cols);
        let x = (0..n * cols).map(|_| rng.f()).collect();
        (w, x)
    }

    fn interleave(ty: GgmlType, rows: usize, cols: usize, w: &[u8]) -> Interleaved {
        Interleaved::from_matrix(&Matrix::new(ty, rows, cols, w).unwrap()).unwrap()
    }

    fn product(il: &Interleaved, x: &[f32], n: usize, scalar: bool) -> Vec<f32> {
        let mut y = vec![f32::NAN; n * il.rows()];
        if scalar {
            il.matmul_scalar(x, n, &mut y).unwrap();
        } else {
            il.matmul(x, n, &mut y).unwrap();
        }
        y
    }

    #[test]
    fn the_layout_keeps_every_quant() {
        let mut rng = Rng(10);
        for ty in Interleaved::TYPES {
            let (rows, cols) = (37, 64);
            let w = random_matrix(&mut rng, ty, rows, cols);
            let il = interleave(ty, rows, cols, &w);
            assert_eq!(il.ty(), ty);
            let mut wf = vec![0f32; rows * cols];
            dequantize(ty, &w, &mut wf).unwrap();
            let format = il.format;
            for r in 0..rows {
                let group = il.groups(r / GROUP, 1);
                for b in 0..cols / QK {
                    let blk = &group[b * format.block_bytes()..][..format.block_bytes()];
                    let (scales, quants) = blk.split_at(SCALE_BYTES);
                    let lane = r % GROUP;
                    let dw = half::f16::from_le_bytes([scales[2 * lane], scales[2 * lane + 1]]);
                    for k in 0..QK {
                        let q = format.get(quants, lane, k) - format.offset();
                        let want = wf[r * cols + b * QK + k];
                        assert_eq!(q as f32 * fp16_to_fp32(dw), want, "{ty} row {r} col {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_fast_path_gives_the_scalar_bits() {
        let mut rng = Rng(11);
        for ty in Interleaved::TYPES {
            for &(rows, cols) in SHAPES {
                for n in 1..=9 {
                    let (w, x) = case(&mut rng, ty, rows, cols, n);
                    let il = interleave(ty, rows, cols, &w);
                    let (fast, scalar) = (product(&il, &x, n, false), product(&il, &x, n, true));
                    let same = fast
                        .iter()
                        .zip(&scalar)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty} {rows}×{cols}, {n} tokens: {fast:?} vs {scalar:?}"
                    );
                }
            }
        }
    }

    /// The scalar path against an f64 product of the dequantised weights and the activations as
    /// the row-major matmul rounds them, and against the row-major matmul itself.
    #[test]
    fn results_match_the_row_major_product() {
        let mut rng = Rng(12);
        for ty in Interleaved::TYPES {
            for &(rows, cols) in SHAPES {
                let n = 3;
                let (w, x) = case(&mut rng, ty, rows, cols, n);
                let m = Matrix::new(ty, rows, cols, &w).unwrap();
                let il = Interleaved::from_matrix(&m).unwrap();
                let y = product(&il, &x, n, true);
                let mut row_major = vec![0f32; n * rows];
                matmul_with_simd("scalar", &m, &x, n, &mut row_major).unwrap();
                let mut wf = vec![0f32; rows * cols];
                dequantize(ty, &w, &mut wf).unwrap();
                let mut xr = x.clone();
                round_like_matmul_input(ty, &mut xr, n, cols).unwrap();
                for t in 0..n {
                    for r in 0..rows {
                        let terms = wf[r * cols..(r + 1) * cols]
                            .iter()
                            .zip(&xr[t * cols..(t + 1) * cols])
                            .map(|(&a, &b)| f64::from(a) * f64::from(b));
                        let (exact, size) =
                            terms.fold((0f64, 0f64), |(s, m), p| (s + p, m + p.abs()));
                        // one rounding of the scale product and of each block's accumulate
                        let bound = size * (cols / QK + 2) as f64 * f64::from(f32::EPSILON);
                        let (got, rm) = (y[t * rows + r], row_major[t * rows + r]);
                        assert!(
                            (f64::from(got) - exact).abs() <= bound,
                            "{ty} {rows}×{cols} row {r} token {t}: {got} vs exact {exact} \
                             (bound {bound})"
                        );
                        assert!(
                            (f64::from(got) - f64::from(rm)).abs() <= 2.0 * bound,
                            "{ty} {rows}×{cols} row {r} token {t}: {got} vs row-major {rm}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bits_do_not_depend_on_the_batch_or_the_threads() {
        let mut rng = Rng(13);
        let (rows, cols, n) = (100, 320, 7);
        for ty in Interleaved::TYPES {
            let (w, x) = case(&mut rng, ty, rows, cols, n);
            let il = interleave(ty, rows, cols, &w);
            let batch = in_pool(2, || product(&il, &x, n, false));
            for t in 0..n {
                let alone = product(&il, &x[t * cols..(t + 1) * cols], 1, false);
                assert_eq!(alone, batch[t * rows..(t + 1) * rows], "{ty} token {t}");
            }
            for threads in [1, 3, 5] {
                assert_eq!(in_pool(threads, || product(&il, &x, n, false)), batch);
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let f16 = vec![0u8; 2 * 32 * 2];
        let m = Matrix::new(GgmlType::F16, 2, 32, &f16).unwrap();
        assert!(Interleaved::from_matrix(&m).is_err());
        let mut rng = Rng(14);
        let (w, x) = case(&mut rng, GgmlType::Q8_0, 4, 64, 2);
        let il = interleave(GgmlType::Q8_0, 4, 64, &w);
        let mut y = vec![0f32; 8];
        assert!(il.matmul(&x[..100], 2, &mut y).is_err());
        assert!(il.matmul(&x, 2, &mut y[..7]).is_err());
        assert!(il.matmul(&x, 3, &mut y).is_err());
        il.matmul(&x, 2, &mut y).unwrap();
    }
}
