//! Q8_0 matrices repacked 16 rows at a time, for a product in which each 32-bit lane of an AVX-512
//! register is one weight row.
//!
//! ggml's row-major Q8_0 layout puts one row's block in a register: `vpdpbusd` leaves eight partial
//! sums per block, and every block then costs a conversion, a scale multiply and an accumulate for
//! only two blocks' worth of lanes (four instructions per 64 products). Here the weights of 16 rows
//! are interleaved four bytes at a time, so one `vpdpbusd` against a broadcast of four activation
//! bytes advances 16 rows at once and eight of them finish each row's whole block sum in its own
//! lane: per block, 16 rows and one token take eight `vpdpbusd` and the same three float
//! instructions, 512 products for 11 instructions. That is llama.cpp's idea of repacking weights
//! for the CPU ("interleaved" Q4_0 / Q8_0 layouts), here for the 512-bit VNNI product.
//!
//! Layout: groups of 16 rows (the last group padded with zero rows); in a group, for each block of
//! 32 columns, 544 bytes: the 16 rows' f16 scales, then eight quads, each the 16 rows' next four
//! quants as unsigned bytes (`q + 128`), row after row. The same bytes per row as Q8_0.
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
/// Bytes of one group's block: 16 f16 scales and 16 × 32 quants.
const BLOCK_BYTES: usize = GROUP * 2 + GROUP * QK;
/// Quants per row in one interleaved step (one `vpdpbusd` lane).
const QUAD: usize = 4;
/// The offset that makes a Q8_0 quant an unsigned byte.
const OFFSET: i32 = 128;

/// A Q8_0 matrix in the 16-row interleaved layout (see the module docs): `rows` outputs of `cols`
/// inputs.
#[derive(Debug)]
pub struct InterleavedQ8_0 {
    rows: usize,
    cols: usize,
    data: Box<[u8]>,
}

impl InterleavedQ8_0 {
    /// Repacks a Q8_0 matrix (in parallel on the current rayon pool).
    ///
    /// Errors: [`Error::InvalidArgument`] for a matrix of another type or a malformed one.
    pub fn from_q8_0(w: &Matrix) -> Result<Self> {
        w.validate()?;
        if w.ty != GgmlType::Q8_0 {
            return Err(Error::InvalidArgument(format!(
                "the interleaved layout takes Q8_0 weights, not {}",
                w.ty
            )));
        }
        let nb = w.cols / QK;
        let rb = w.row_bytes();
        let group_bytes = nb * BLOCK_BYTES;
        let groups = w.rows.div_ceil(GROUP);
        let mut data = vec![0u8; groups * group_bytes].into_boxed_slice();
        data.par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, out)| {
                for (b, blk) in out.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                    let (scales, quants) = blk.split_at_mut(GROUP * 2);
                    for lane in 0..GROUP {
                        let r = g * GROUP + lane;
                        if r >= w.rows {
                            // padding: scale 0 and quants 0 (stored as 128)
                            for j in 0..QK / QUAD {
                                quants[(j * GROUP + lane) * QUAD..][..QUAD].fill(OFFSET as u8);
                            }
                            continue;
                        }
                        let src = &w.data[r * rb + b * GgmlType::Q8_0.block_bytes()..];
                        scales[lane * 2..lane * 2 + 2].copy_from_slice(&src[..2]);
                        for (k, &q) in src[2..2 + QK].iter().enumerate() {
                            let (j, i) = (k / QUAD, k % QUAD);
                            quants[(j * GROUP + lane) * QUAD + i] = (q as i8 as i32 + OFFSET) as u8;
                        }
                    }
                }
            });
        Ok(InterleavedQ8_0 {
            rows: w.rows,
            cols: w.cols,
            data,
        })
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

    /// [`InterleavedQ8_0::matmul`] on the scalar path (the reference, for tests and benches).
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
        let shift = super::offset_shift(GgmlType::Q8_0);
        acts.quantize(level, ActKind::Q8_0, shift, x, n_tokens, self.cols);
        let groups = self.rows.div_ceil(GROUP);
        let threads = rayon::current_num_threads().max(1);
        // 8 tasks per thread for balance, each at least ~64 KiB of weights
        let group_bytes = self.group_bytes();
        let per_task = groups
            .div_ceil(threads * 8)
            .max((64 * 1024 / group_bytes).max(1));
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
        self.cols / QK * BLOCK_BYTES
    }

    /// Groups `g0..g1` for every token, written into `out` (`n × rows`, token-major).
    fn run_groups(&self, level: Level, acts: &Acts, g0: usize, g1: usize, out: &super::OutPtr) {
        let group_bytes = self.group_bytes();
        let mut tile = [[0f32; GROUP]; TILE];
        let mut g = g0;
        while g < g1 {
            let ng = (g1 - g).min(MAX_GROUPS);
            let mut t0 = 0;
            while t0 < acts.n {
                let nt = (acts.n - t0).min(MAX_TOKENS);
                let w = &self.data[g * group_bytes..(g + ng) * group_bytes];
                match level {
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx512 => avx512::tile(w, group_bytes, ng, acts, t0, nt, &mut tile),
                    _ => scalar_tile(w, group_bytes, ng, acts, t0, nt, &mut tile),
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
}

/// Groups per kernel call.
const MAX_GROUPS: usize = 4;
/// Tokens per kernel call.
const MAX_TOKENS: usize = 4;
/// Output tiles of one call (group-major: `tile[g * nt + t]`).
const TILE: usize = MAX_GROUPS * MAX_TOKENS;

/// The reference: groups `ng` groups at `w` (each `group_bytes`) × tokens `t0..t0 + nt`, into
/// `tile[g * nt + t]`.
fn scalar_tile(
    w: &[u8],
    group_bytes: usize,
    ng: usize,
    acts: &Acts,
    t0: usize,
    nt: usize,
    tile: &mut [[f32; GROUP]; TILE],
) {
    for g in 0..ng {
        let group = &w[g * group_bytes..(g + 1) * group_bytes];
        for t in 0..nt {
            let (q, d, isum) = (acts.q(t0 + t), acts.d(t0 + t), acts.isum(t0 + t));
            let acc = &mut tile[g * nt + t];
            acc.fill(0.0);
            for (b, blk) in group.chunks_exact(BLOCK_BYTES).enumerate() {
                let (scales, quants) = blk.split_at(GROUP * 2);
                for (lane, acc) in acc.iter_mut().enumerate() {
                    let mut s = -OFFSET * isum[b];
                    for k in 0..QK {
                        let u = quants[(k / QUAD * GROUP + lane) * QUAD + k % QUAD];
                        s += i32::from(u) * i32::from(q[b * QK + k]);
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    // Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::*;

    use super::{Acts, BLOCK_BYTES, GROUP, OFFSET, QK, QUAD, TILE};

    /// [`super::scalar_tile`] with AVX-512 VNNI (the same bits).
    pub(super) fn tile(
        w: &[u8],
        group_bytes: usize,
        ng: usize,
        acts: &Acts,
        t0: usize,
        nt: usize,
        tile: &mut [[f32; GROUP]; TILE],
    ) {
        assert!(
            (1..=4).contains(&ng)
                && (1..=4).contains(&nt)
                && w.len() >= ng * group_bytes
                && t0 + nt <= acts.n
        );
        let wp = w.as_ptr();
        // SAFETY: only called on the AVX-512 level, which needs F/BW/VL/VNNI and F16C; the groups
        // and tokens exist (asserted above).
        unsafe {
            match (ng, nt) {
                (4, 1) => kernel::<4, 1>(wp, group_bytes, acts, t0, tile),
                (4, 2) => kernel::<4, 2>(wp, group_bytes, acts, t0, tile),
                (g, n) if g >= 2 => {
                    for g0 in (0..g - 1).step_by(2) {
                        let out = &mut tile[g0 * n..];
                        let p = wp.add(g0 * group_bytes);
                        match n {
                            1 => kernel::<2, 1>(p, group_bytes, acts, t0, out),
                            2 => kernel::<2, 2>(p, group_bytes, acts, t0, out),
                            3 => kernel::<2, 3>(p, group_bytes, acts, t0, out),
                            _ => kernel::<2, 4>(p, group_bytes, acts, t0, out),
                        }
                    }
                    if g % 2 == 1 {
                        let out = &mut tile[(g - 1) * n..];
                        let p = wp.add((g - 1) * group_bytes);
                        one_group(p, group_bytes, acts, t0, n, out);
                    }
                }
                (_, n) => one_group(wp, group_bytes, acts, t0, n, tile),
            }
        }
    }

    /// One group × `n` tokens.
    unsafe fn one_group(
        p: *const u8,
        group_bytes: usize,
        acts: &Acts,
        t0: usize,
        n: usize,
        out: &mut [[f32; GROUP]],
    ) {
        match n {
            1 => kernel::<1, 1>(p, group_bytes, acts, t0, out),
            2 => kernel::<1, 2>(p, group_bytes, acts, t0, out),
            3 => kernel::<1, 3>(p, group_bytes, acts, t0, out),
            _ => kernel::<1, 4>(p, group_bytes, acts, t0, out),
        }
    }

    const PF_AHEAD: usize = 4096;

    /// `G` groups × `N` tokens: `out[g * N + t]` (16 rows each).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel<const G: usize, const N: usize>(
        w: *const u8,
        group_bytes: usize,
        acts: &Acts,
        t0: usize,
        out: &mut [[f32; GROUP]],
    ) {
        let nb = acts.nb();
        let q: [*const u8; N] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const u8);
        let d: [&[f32]; N] = std::array::from_fn(|t| acts.d(t0 + t));
        let isum: [&[i32]; N] = std::array::from_fn(|t| acts.isum(t0 + t));
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        for b in 0..nb {
            let blk: [*const u8; G] =
                std::array::from_fn(|g| w.add(g * group_bytes + b * BLOCK_BYTES));
            if t0 == 0 {
                for g in 0..G {
                    let ahead = blk[g].wrapping_add(PF_AHEAD);
                    for l in 0..BLOCK_BYTES.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
                    }
                }
            }
            let dw: [__m512; G] = std::array::from_fn(|g| {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk[g] as *const __m256i))
            });
            let mut s = [[_mm512_setzero_si512(); N]; G];
            for t in 0..N {
                let init = _mm512_set1_epi32(-OFFSET * isum[t][b]);
                for g in 0..G {
                    s[g][t] = init;
                }
            }
            for j in 0..QK / QUAD {
                let wv: [__m512i; G] = std::array::from_fn(|g| {
                    _mm512_loadu_si512(blk[g].add(GROUP * 2 + j * GROUP * QUAD) as *const __m512i)
                });
                for t in 0..N {
                    let av = _mm512_set1_epi32(
                        (q[t].add(b * QK + j * QUAD) as *const i32).read_unaligned(),
                    );
                    for g in 0..G {
                        s[g][t] = _mm512_dpbusd_epi32(s[g][t], wv[g], av);
                    }
                }
            }
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

    fn case(rng: &mut Rng, rows: usize, cols: usize, n: usize) -> (Vec<u8>, Vec<f32>) {
        let w = random_matrix(rng, GgmlType::Q8_0, rows, cols);
        let x = (0..n * cols).map(|_| rng.f()).collect();
        (w, x)
    }

    fn product(il: &InterleavedQ8_0, x: &[f32], n: usize, scalar: bool) -> Vec<f32> {
        let mut y = vec![f32::NAN; n * il.rows()];
        if scalar {
            il.matmul_scalar(x, n, &mut y).unwrap();
        } else {
            il.matmul(x, n, &mut y).unwrap();
        }
        y
    }

    #[test]
    fn the_fast_path_gives_the_scalar_bits() {
        let mut rng = Rng(11);
        for &(rows, cols) in SHAPES {
            for n in 1..=9 {
                let (w, x) = case(&mut rng, rows, cols, n);
                let il = InterleavedQ8_0::from_q8_0(
                    &Matrix::new(GgmlType::Q8_0, rows, cols, &w).unwrap(),
                )
                .unwrap();
                let (fast, scalar) = (product(&il, &x, n, false), product(&il, &x, n, true));
                let same = fast
                    .iter()
                    .zip(&scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{rows}×{cols}, {n} tokens: {fast:?} vs {scalar:?}");
            }
        }
    }

    /// The scalar path against an f64 product of the dequantised weights and the activations as
    /// the row-major matmul rounds them, and against the row-major matmul itself.
    #[test]
    fn results_match_the_row_major_product() {
        let mut rng = Rng(12);
        for &(rows, cols) in SHAPES {
            let n = 3;
            let (w, x) = case(&mut rng, rows, cols, n);
            let m = Matrix::new(GgmlType::Q8_0, rows, cols, &w).unwrap();
            let il = InterleavedQ8_0::from_q8_0(&m).unwrap();
            let y = product(&il, &x, n, true);
            let mut row_major = vec![0f32; n * rows];
            matmul_with_simd("scalar", &m, &x, n, &mut row_major).unwrap();
            let mut wf = vec![0f32; rows * cols];
            dequantize(GgmlType::Q8_0, &w, &mut wf).unwrap();
            let mut xr = x.clone();
            round_like_matmul_input(GgmlType::Q8_0, &mut xr, n, cols).unwrap();
            for t in 0..n {
                for r in 0..rows {
                    let terms = wf[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(&xr[t * cols..(t + 1) * cols])
                        .map(|(&a, &b)| f64::from(a) * f64::from(b));
                    let (exact, size) = terms.fold((0f64, 0f64), |(s, m), p| (s + p, m + p.abs()));
                    // one rounding of the scale product and of each block's accumulate
                    let bound = size * (cols / QK + 2) as f64 * f64::from(f32::EPSILON);
                    let (got, rm) = (y[t * rows + r], row_major[t * rows + r]);
                    assert!(
                        (f64::from(got) - exact).abs() <= bound,
                        "{rows}×{cols} row {r} token {t}: {got} vs exact {exact} (bound {bound})"
                    );
                    assert!(
                        (f64::from(got) - f64::from(rm)).abs() <= 2.0 * bound,
                        "{rows}×{cols} row {r} token {t}: {got} vs row-major {rm}"
                    );
                }
            }
        }
    }

    #[test]
    fn bits_do_not_depend_on_the_batch_or_the_threads() {
        let mut rng = Rng(13);
        let (rows, cols, n) = (100, 320, 7);
        let (w, x) = case(&mut rng, rows, cols, n);
        let il = InterleavedQ8_0::from_q8_0(&Matrix::new(GgmlType::Q8_0, rows, cols, &w).unwrap())
            .unwrap();
        let batch = in_pool(2, || product(&il, &x, n, false));
        for t in 0..n {
            let alone = product(&il, &x[t * cols..(t + 1) * cols], 1, false);
            assert_eq!(alone, batch[t * rows..(t + 1) * rows], "token {t}");
        }
        for threads in [1, 3, 5] {
            assert_eq!(in_pool(threads, || product(&il, &x, n, false)), batch);
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let f16 = vec![0u8; 2 * 32 * 2];
        let m = Matrix::new(GgmlType::F16, 2, 32, &f16).unwrap();
        assert!(InterleavedQ8_0::from_q8_0(&m).is_err());
        let mut rng = Rng(14);
        let (w, x) = case(&mut rng, 4, 64, 2);
        let il =
            InterleavedQ8_0::from_q8_0(&Matrix::new(GgmlType::Q8_0, 4, 64, &w).unwrap()).unwrap();
        let mut y = vec![0f32; 8];
        assert!(il.matmul(&x[..100], 2, &mut y).is_err());
        assert!(il.matmul(&x, 2, &mut y[..7]).is_err());
        assert!(il.matmul(&x, 3, &mut y).is_err());
        il.matmul(&x, 2, &mut y).unwrap();
    }
}
