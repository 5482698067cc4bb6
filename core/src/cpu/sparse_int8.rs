//! [`sparse_axpy_int8`]: the column-sparse product `out += Σ_{i : a_i ≠ 0} a_i · row_i(W_t)` over
//! Q4_0 rows with the coefficients rounded to 8 bits, so that the sums run on integer dot-product
//! instructions (AVX-512 VNNI) instead of decoding every weight to a float. The rows are stored as
//! a [`SplitQ4_0`]: the same blocks with the scales of every 16 blocks gathered in front of their
//! nibbles, so that they load as one vector from the row's one stream.
//!
//! [`sparse_axpy`](super::sparse_axpy) is exact per term but spends about ten vector operations
//! per 32 weights decoding nibbles to floats; this operator does the same product in about a
//! third of the operations, at the price of rounding each coefficient as a Q8_0 activation is
//! rounded in a dense matmul. Its numerics, identical on every path:
//!
//! - The non-zero coefficients are taken in row order in groups of [`GROUP`] (the last group
//!   padded with zero coefficients).
//! - For group `g` and output block `b` (32 columns): `c_k = a_k · d_{k,b}` (f32, `d` the row's
//!   block scale); `m = max_k |c_k|`; `q_k = round_half_even(c_k · (127 / m))` (0 when `m` is 0);
//!   `s = m / 127`.
//! - For each column of the block: `S = Σ_k q_k · (n_k − 8)` over the rows' 4-bit quants `n_k`
//!   (exact, in `i32`), then `sum = fma(S, s, sum)`, group after group, where `sum` is the
//!   column's sum of the group's band: the `G` groups are dealt to `BANDS` = 4 bands of
//!   consecutive groups (band `b` holds groups `⌊bG/4⌋..⌊(b+1)G/4⌋`), each band's sums start
//!   at 0.
//! - Then `out += sum` band after band (a band without groups adds nothing).
//!
//! Tasks are (band, column range) pairs, so the result does not depend on the thread count. The AVX-512 kernel (VBMI + VNNI) interleaves four rows'
//! quant bytes with one `vpermb` and sums four rows per `vpdpbusd`; the AVX2 kernel interleaves
//! with unpacks and sums with `vpmaddubsw` + `vpmaddwd`; a scalar loop gives the same bits.

use half::f16;
use rayon::prelude::*;

use crate::quant::{GgmlType, QK};
use crate::{Error, Result};

use super::Matrix;

/// Rows summed per integer step (two `vpdpbusd` of four rows each).
pub const GROUP: usize = 8;

/// Bands of consecutive groups summed apart and added to the output in order at the end: a task
/// reads whole rows (one band's groups over all of its columns), long enough for the memory
/// system to stream, where splitting only the columns cut each row into one short piece per
/// thread (Q4_0 TEAL 50% on four Llama-2-7B-shaped layers, 2 threads: 12.2–12.7 → 11.1–11.4 ms).
/// Fixed, so that the result does not depend on the thread count.
const BANDS: usize = 4;

/// How many groups ahead a task prefetches its rows (every line, into L2), a chunk at a time as it
/// reads the same chunk of the current group's rows. Q4_0 TEAL 50% on four Llama-2-7B-shaped
/// layers, 2 threads: the first 512 bytes of the next group's rows into L1, 16.0–16.2 ms per
/// token; every line one group ahead into L2, 12.2–12.5; two groups ahead, 12.2–12.7 with the
/// column split and 11.1–11.4 with the bands.
#[cfg(target_arch = "x86_64")]
const PREFETCH_GROUPS: usize = 2;

/// Bytes of a block's nibbles (32 four-bit quants).
const QUANT_BYTES: usize = 16;

/// Bytes of a block: its f16 scale and its nibbles.
const BLOCK_BYTES: usize = 2 + QUANT_BYTES;

/// Blocks per chunk of a [`SplitQ4_0`] row (their scales fill one 256-bit load).
const CHUNK: usize = 16;

/// Q4_0 rows regrouped in chunks of [`CHUNK`] blocks: each chunk of `n` blocks (16, fewer in a
/// row's last) is the blocks' `n` f16 scales followed by their `n × 16` bytes of nibbles in
/// ggml's order (byte `j`: element `j` low, `j + 16` high). The same values and as many bytes as
/// the Q4_0 matrix, in one stream per row.
pub struct SplitQ4_0 {
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl SplitQ4_0 {
    /// Regroups a Q4_0 matrix.
    ///
    /// Errors: [`Error::UnsupportedType`] for another type.
    pub fn new(w: &Matrix) -> Result<SplitQ4_0> {
        if w.ty != GgmlType::Q4_0 {
            return Err(Error::UnsupportedType {
                ty: w.ty.name(),
                op: "SplitQ4_0",
            });
        }
        let mut data = Vec::with_capacity(w.data.len());
        for row in w.data.chunks_exact(w.cols / QK * BLOCK_BYTES) {
            for chunk in row.chunks(CHUNK * BLOCK_BYTES) {
                for block in chunk.chunks_exact(BLOCK_BYTES) {
                    data.extend_from_slice(&block[..2]);
                }
                for block in chunk.chunks_exact(BLOCK_BYTES) {
                    data.extend_from_slice(&block[2..]);
                }
            }
        }
        Ok(SplitQ4_0 {
            rows: w.rows,
            cols: w.cols,
            data,
        })
    }

    /// Rows (inputs of the product).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (outputs of the product).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (as many as the Q4_0 matrix).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` from block `b0` (a multiple of [`CHUNK`]) on.
    fn row_from(&self, r: usize, b0: usize) -> &[u8] {
        let rb = self.cols / QK * BLOCK_BYTES;
        &self.data[r * rb + b0 * BLOCK_BYTES..(r + 1) * rb]
    }
}

/// Where block `j` of a chunk of `n` blocks keeps its scale and its nibbles, from the chunk's
/// start.
fn chunk_offsets(n: usize, j: usize) -> (usize, usize) {
    (2 * j, 2 * n + QUANT_BYTES * j)
}

/// The kernels of [`sparse_axpy_int8`], all giving the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Portable Rust.
    Scalar,
    /// AVX2 (`vpmaddubsw` + `vpmaddwd` for the integer sums).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// AVX-512 VBMI + VNNI (`vpermb` + `vpdpbusd`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

impl Path {
    /// The paths this CPU can run at the kernels' current level, fastest first.
    pub(crate) fn available() -> Vec<Path> {
        #[cfg(target_arch = "x86_64")]
        let level = super::Level::current();
        #[cfg(target_arch = "x86_64")]
        let simd = [
            (
                Path::Avx512,
                level >= super::Level::Avx512 && x86::has_vbmi(),
            ),
            (Path::Avx2, level >= super::Level::Avx2),
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let simd: [(Path, bool); 0] = [];
        simd.into_iter()
            .filter_map(|(path, ok)| ok.then_some(path))
            .chain([Path::Scalar])
            .collect()
    }
}

/// Whether [`sparse_axpy_int8`] runs a SIMD kernel here (AVX2 or AVX-512 VBMI + VNNI; else the
/// scalar loop, far slower than [`sparse_axpy`](super::sparse_axpy)'s SIMD paths).
pub fn sparse_axpy_int8_is_fast() -> bool {
    Path::available()[0] != Path::Scalar
}

/// `out[c] += Σ_{i : a[i] ≠ 0} a[i] · w_t[i][c]` for one token, with 8-bit coefficients (see the
/// module docs for the exact numerics). `w_t` holds one row per entry of `a`; `out` has
/// `w_t.cols()` values. Zero coefficients (`0.0` and `-0.0`) are skipped: their rows are not read.
///
/// Errors: [`Error::InvalidArgument`] for wrong `a` or `out` lengths.
pub fn sparse_axpy_int8(w_t: &SplitQ4_0, a: &[f32], out: &mut [f32]) -> Result<()> {
    sparse_axpy_int8_at(Path::available()[0], w_t, a, out)
}

/// [`sparse_axpy_int8`] on the kernel `path` (one of [`Path::available`]).
pub(crate) fn sparse_axpy_int8_at(
    path: Path,
    w_t: &SplitQ4_0,
    a: &[f32],
    out: &mut [f32],
) -> Result<()> {
    if a.len() != w_t.rows {
        return Err(Error::InvalidArgument(format!(
            "a has {} values, expected {} rows",
            a.len(),
            w_t.rows
        )));
    }
    if out.len() != w_t.cols {
        return Err(Error::InvalidArgument(format!(
            "out has {} values, expected {} columns",
            out.len(),
            w_t.cols
        )));
    }
    let groups = Groups::new(a);
    if groups.rows.is_empty() {
        return Ok(());
    }
    let cols = w_t.cols;
    let nb = cols / QK;
    let n_groups = groups.rows.len() / GROUP;
    // tasks: each band's groups over a range of whole chunks of columns, enough ranges for every
    // thread to have a task (the ranges do not change the bits, the bands would)
    let threads = rayon::current_num_threads().max(1);
    let per = nb.div_ceil(threads.div_ceil(BANDS)).div_ceil(CHUNK).max(1) * CHUNK;
    let mut sums = BAND_SUMS.with(|c| c.take()).unwrap_or_default();
    sums.clear();
    sums.resize(BANDS * cols, 0.0);
    let task = |(band, c, part): (usize, usize, &mut [f32])| {
        let (g0, g1) = (band * n_groups / BANDS, (band + 1) * n_groups / BANDS);
        band_groups(path, w_t, &groups, g0..g1, c * per, part);
    };
    let tasks = sums.chunks_mut(cols).enumerate().flat_map(|(band, sum)| {
        sum.chunks_mut(per * QK)
            .enumerate()
            .map(move |(c, part)| (band, c, part))
    });
    if threads == 1 {
        tasks.for_each(task);
    } else {
        tasks.collect::<Vec<_>>().into_par_iter().for_each(task);
    }
    for (band, sum) in sums.chunks_exact(cols).enumerate() {
        if band * n_groups / BANDS < (band + 1) * n_groups / BANDS {
            for (o, s) in out.iter_mut().zip(sum) {
                *o += s;
            }
        }
    }
    BAND_SUMS.with(|c| c.set(Some(sums)));
    Ok(())
}

thread_local! {
    /// The band sums of [`sparse_axpy_int8`] (a reused buffer).
    static BAND_SUMS: std::cell::Cell<Option<Vec<f32>>> = const { std::cell::Cell::new(None) };
}

/// Groups `groups` in order over the blocks from `b0` (a multiple of [`CHUNK`]) on, into `out`
/// (those blocks' columns), prefetching the rows of the group [`PREFETCH_GROUPS`] ahead as it
/// goes.
fn band_groups(
    path: Path,
    w_t: &SplitQ4_0,
    groups: &Groups,
    range: std::ops::Range<usize>,
    b0: usize,
    out: &mut [f32],
) {
    let rows_of = |g: usize| -> [&[u8]; GROUP] {
        std::array::from_fn(|k| w_t.row_from(groups.rows[g * GROUP + k] as usize, b0))
    };
    for g in range.clone() {
        let rows = rows_of(g);
        let coefs: &[f32; GROUP] = groups.coefs[g * GROUP..][..GROUP].try_into().unwrap();
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 | Path::Avx2 => {
                let ahead = (g + PREFETCH_GROUPS < range.end).then(|| rows_of(g + PREFETCH_GROUPS));
                // SAFETY: `path` is one of `Path::available()`, so the CPU has its features;
                // each row holds the blocks of `out`.
                unsafe {
                    if path == Path::Avx512 {
                        x86::group_avx512(&rows, coefs, ahead.as_ref(), out)
                    } else {
                        x86::group_avx2(&rows, coefs, ahead.as_ref(), out)
                    }
                }
            }
            _ => scalar_group(&rows, coefs, out),
        }
    }
}

/// The non-zero coefficients and their rows, padded to whole groups with zero coefficients on
/// the first row.
struct Groups {
    rows: Vec<u32>,
    coefs: Vec<f32>,
}

impl Groups {
    fn new(a: &[f32]) -> Groups {
        let (mut rows, mut coefs) = (Vec::new(), Vec::new());
        for (i, &v) in a.iter().enumerate() {
            if v != 0.0 {
                rows.push(i as u32);
                coefs.push(v);
            }
        }
        if let Some(&first) = rows.first() {
            while rows.len() % GROUP != 0 {
                rows.push(first);
                coefs.push(0.0);
            }
        }
        Groups { rows, coefs }
    }
}

/// One group's 8-bit coefficients for one block from its rows' scales: `(q_k, −8 · Σ q_k, s)`.
fn block_coefs(d: [f16; GROUP], coefs: &[f32; GROUP]) -> ([i8; GROUP], i32, f32) {
    let c: [f32; GROUP] = std::array::from_fn(|k| coefs[k] * d[k].to_f32());
    // the order and the comparison of `vmaxps(m, v)`: m if m > v, else v
    let m = c[1..]
        .iter()
        .fold(c[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() });
    let inv = if m > 0.0 { 127.0 / m } else { 0.0 };
    // `vcvtps2dq`: round half to even; out of range and NaN give i32::MIN
    let q: [i32; GROUP] = std::array::from_fn(|k| {
        let r = (c[k] * inv).round_ties_even();
        if r.is_nan() || r.abs() >= 2_147_483_648.0 {
            i32::MIN
        } else {
            r as i32
        }
    });
    let sum = q.iter().fold(0i32, |s, &v| s.wrapping_add(v));
    (q.map(|v| v as i8), sum.wrapping_mul(-8), m / 127.0)
}

/// The scalar path: blocks `0..out.len() / 32` of the group's rows.
fn scalar_group(rows: &[&[u8]; GROUP], coefs: &[f32; GROUP], out: &mut [f32]) {
    let nb = out.len() / QK;
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        let (chunk, j) = (b / CHUNK * CHUNK, b % CHUNK);
        let (d_at, q_at) = chunk_offsets((nb - chunk).min(CHUNK), j);
        let at = |k: usize, off: usize| &rows[k][chunk * BLOCK_BYTES + off..];
        let d = std::array::from_fn(|k| f16::from_le_bytes([at(k, d_at)[0], at(k, d_at)[1]]));
        let (q, init, s) = block_coefs(d, coefs);
        for (e, o) in o.iter_mut().enumerate() {
            let mut sum = init;
            for (k, &qk) in q.iter().enumerate() {
                let byte = at(k, q_at)[e % 16];
                let nib = if e < 16 { byte & 0x0F } else { byte >> 4 };
                sum = sum.wrapping_add(qk as i32 * nib as i32);
            }
            *o = (sum as f32).mul_add(s, *o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 VBMI + VNNI and AVX2 kernels.

    use std::arch::x86_64::*;

    use super::super::prefetch_ptr;
    use super::{chunk_offsets, BLOCK_BYTES, CHUNK, GROUP};
    use crate::quant::QK;

    /// `vpermb` indices of [`interleave4`]: byte `4l + k` of the result is byte `l` of row `k`,
    /// i.e. source byte `16k + l`.
    static INTERLEAVE: [u8; 64] = {
        let mut idx = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            idx[i] = (16 * (i % 4) + i / 4) as u8;
            i += 1;
        }
        idx
    };

    pub(super) fn has_vbmi() -> bool {
        is_x86_feature_detected!("avx512vbmi")
    }

    /// One group over the blocks of `out` (see the module docs), chunk by chunk: `prepare` gives
    /// a chunk's coefficients, `block` adds block `j` (nibbles at the given row pointers). Each
    /// chunk first prefetches the same chunk of the `ahead` rows (a later group's).
    #[inline(always)]
    unsafe fn group(
        rows: &[&[u8]; GROUP],
        ahead: Option<&[&[u8]; GROUP]>,
        out: &mut [f32],
        prepare: impl Fn(&[*const u8; GROUP], usize) -> Prepared,
        block: impl Fn(&[*const u8; GROUP], &Prepared, usize, *mut f32),
    ) {
        let nb = out.len() / QK;
        for r in rows {
            assert!(r.len() >= nb * BLOCK_BYTES);
        }
        let mut b0 = 0;
        while b0 < nb {
            let n = (nb - b0).min(CHUNK);
            let chunk: [*const u8; GROUP] =
                std::array::from_fn(|k| rows[k].as_ptr().add(b0 * BLOCK_BYTES));
            if let Some(ahead) = ahead {
                let (from, bytes) = (b0 * BLOCK_BYTES, n * BLOCK_BYTES);
                for r in ahead {
                    let p = r.as_ptr().wrapping_add(from);
                    for off in (0..bytes).step_by(64).chain([bytes - 1]) {
                        prefetch_ptr(p.wrapping_add(off));
                    }
                }
            }
            let prep = prepare(&chunk, n);
            for j in 0..n {
                let quants = chunk.map(|c| c.add(chunk_offsets(n, j).1));
                block(&quants, &prep, j, out.as_mut_ptr().add((b0 + j) * QK));
            }
            b0 += n;
        }
    }

    /// [`group`] on AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI/VBMI and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    pub(super) unsafe fn group_avx512(
        rows: &[&[u8]; GROUP],
        coefs: &[f32; GROUP],
        ahead: Option<&[&[u8]; GROUP]>,
        out: &mut [f32],
    ) {
        group(
            rows,
            ahead,
            out,
            |chunk, n| prepare(chunk, coefs, n),
            |q, prep, j, o| block(q, prep, j, o),
        )
    }

    /// [`group`] on AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn group_avx2(
        rows: &[&[u8]; GROUP],
        coefs: &[f32; GROUP],
        ahead: Option<&[&[u8]; GROUP]>,
        out: &mut [f32],
    ) {
        group(
            rows,
            ahead,
            out,
            |chunk, n| prepare_avx2(chunk, coefs, n),
            |q, prep, j, o| block_avx2(q, prep, j, o),
        )
    }

    /// [`prepare`] on AVX2: the same operations on two halves of 8 lanes.
    #[inline(always)]
    unsafe fn prepare_avx2(chunk: &[*const u8; GROUP], coefs: &[f32; GROUP], n: usize) -> Prepared {
        let mut p = Prepared {
            quad: [[0; CHUNK]; 2],
            init: [0; CHUNK],
            scale: [0.0; CHUNK],
        };
        for half in 0..2 {
            let lanes = n.saturating_sub(8 * half).min(8);
            let c: [__m256; GROUP] = std::array::from_fn(|k| {
                let at = (chunk[k] as *const u16).add(8 * half);
                // a whole half loads directly; a short one through a zeroed copy
                let h = if lanes == 8 {
                    _mm_loadu_si128(at as *const __m128i)
                } else {
                    let mut h = [0u16; 8];
                    std::ptr::copy_nonoverlapping(at, h.as_mut_ptr(), lanes);
                    _mm_loadu_si128(h.as_ptr() as *const __m128i)
                };
                let d = _mm256_cvtph_ps(h);
                _mm256_mul_ps(_mm256_set1_ps(coefs[k]), d)
            });
            let abs = |v: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
            let mut m = abs(c[0]);
            for ck in &c[1..] {
                m = _mm256_max_ps(m, abs(*ck));
            }
            let k127 = _mm256_set1_ps(127.0);
            let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_setzero_ps());
            let inv = _mm256_and_ps(_mm256_div_ps(k127, m), positive);
            let q: [__m256i; GROUP] =
                std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(c[k], inv)));
            let mut sum = q[0];
            for qk in &q[1..] {
                sum = _mm256_add_epi32(sum, *qk);
            }
            let init = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(sum));
            let byte = _mm256_set1_epi32(0xFF);
            let pack = |q: &[__m256i]| {
                let b1 = _mm256_slli_epi32::<8>(_mm256_and_si256(q[1], byte));
                let b2 = _mm256_slli_epi32::<16>(_mm256_and_si256(q[2], byte));
                let b3 = _mm256_slli_epi32::<24>(q[3]);
                _mm256_or_si256(
                    _mm256_or_si256(_mm256_and_si256(q[0], byte), b1),
                    _mm256_or_si256(b2, b3),
                )
            };
            let at = 8 * half;
            _mm256_storeu_si256(p.quad[0][at..].as_mut_ptr() as *mut __m256i, pack(&q[..4]));
            _mm256_storeu_si256(p.quad[1][at..].as_mut_ptr() as *mut __m256i, pack(&q[4..]));
            _mm256_storeu_si256(p.init[at..].as_mut_ptr() as *mut __m256i, init);
            _mm256_storeu_ps(p.scale[at..].as_mut_ptr(), _mm256_div_ps(m, k127));
        }
        p
    }

    /// [`block`] on AVX2: the four rows interleaved with byte and word unpacks, the integer sums
    /// as `vpmaddubsw` (two products, at most 2 · 15 · 127 in magnitude: no saturation) then
    /// `vpmaddwd` by ones: the same i32 sums as `vpdpbusd`.
    #[inline(always)]
    unsafe fn block_avx2(quants: &[*const u8; GROUP], prep: &Prepared, j: usize, o: *mut f32) {
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let init = _mm256_set1_epi32(prep.init[j]);
        // [columns 0..8, 8..16, 16..24, 24..32]
        let mut acc = [init; 4];
        for (half, quad) in prep.quad.iter().enumerate() {
            let r: [__m128i; 4] =
                std::array::from_fn(|k| _mm_loadu_si128(quants[4 * half + k] as *const __m128i));
            let (a_lo, a_hi) = (_mm_unpacklo_epi8(r[0], r[1]), _mm_unpackhi_epi8(r[0], r[1]));
            let (b_lo, b_hi) = (_mm_unpacklo_epi8(r[2], r[3]), _mm_unpackhi_epi8(r[2], r[3]));
            // dword l of z0 / z1: byte l / 8 + l of each row
            let z0 = _mm256_set_m128i(
                _mm_unpackhi_epi16(a_lo, b_lo),
                _mm_unpacklo_epi16(a_lo, b_lo),
            );
            let z1 = _mm256_set_m128i(
                _mm_unpackhi_epi16(a_hi, b_hi),
                _mm_unpacklo_epi16(a_hi, b_hi),
            );
            let c = _mm256_set1_epi32(quad[j]);
            let dot = |u: __m256i| _mm256_madd_epi16(_mm256_maddubs_epi16(u, c), ones);
            let nib = |z: __m256i, high: bool| {
                let z = if high { _mm256_srli_epi16::<4>(z) } else { z };
                _mm256_and_si256(z, low)
            };
            acc[0] = _mm256_add_epi32(acc[0], dot(nib(z0, false)));
            acc[1] = _mm256_add_epi32(acc[1], dot(nib(z1, false)));
            acc[2] = _mm256_add_epi32(acc[2], dot(nib(z0, true)));
            acc[3] = _mm256_add_epi32(acc[3], dot(nib(z1, true)));
        }
        let s = _mm256_set1_ps(prep.scale[j]);
        for (i, a) in acc.iter().enumerate() {
            let oi = o.add(8 * i);
            _mm256_storeu_ps(
                oi,
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(*a), s, _mm256_loadu_ps(oi)),
            );
        }
    }

    /// The coefficients of a chunk's blocks, one lane each: quants of rows 0..4 and 4..8 as
    /// packed bytes, `−8 · Σ q`, and the scale.
    struct Prepared {
        quad: [[i32; CHUNK]; 2],
        init: [i32; CHUNK],
        scale: [f32; CHUNK],
    }

    /// [`super::block_coefs`] for the `n` blocks of the chunks at `chunk` in 16 lanes.
    #[inline(always)]
    unsafe fn prepare(chunk: &[*const u8; GROUP], coefs: &[f32; GROUP], n: usize) -> Prepared {
        let mask: __mmask16 = if n == CHUNK { !0 } else { (1u16 << n) - 1 };
        let c: [__m512; GROUP] = std::array::from_fn(|k| {
            let h = _mm256_maskz_loadu_epi16(mask, chunk[k] as *const i16);
            _mm512_mul_ps(_mm512_set1_ps(coefs[k]), _mm512_cvtph_ps(h))
        });
        let mut m = _mm512_abs_ps(c[0]);
        for ck in &c[1..] {
            m = _mm512_max_ps(m, _mm512_abs_ps(*ck));
        }
        let k127 = _mm512_set1_ps(127.0);
        let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, _mm512_setzero_ps());
        let inv = _mm512_maskz_div_ps(positive, k127, m);
        let q: [__m512i; GROUP] =
            std::array::from_fn(|k| _mm512_cvtps_epi32(_mm512_mul_ps(c[k], inv)));
        let mut sum = q[0];
        for qk in &q[1..] {
            sum = _mm512_add_epi32(sum, *qk);
        }
        let init = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<3>(sum));
        let byte = _mm512_set1_epi32(0xFF);
        let pack = |q: &[__m512i]| {
            let b1 = _mm512_slli_epi32::<8>(_mm512_and_si512(q[1], byte));
            let b2 = _mm512_slli_epi32::<16>(_mm512_and_si512(q[2], byte));
            let b3 = _mm512_slli_epi32::<24>(q[3]);
            _mm512_or_si512(
                _mm512_or_si512(_mm512_and_si512(q[0], byte), b1),
                _mm512_or_si512(b2, b3),
            )
        };
        let mut p = Prepared {
            quad: [[0; CHUNK]; 2],
            init: [0; CHUNK],
            scale: [0.0; CHUNK],
        };
        _mm512_storeu_si512(p.quad[0].as_mut_ptr() as *mut __m512i, pack(&q[..4]));
        _mm512_storeu_si512(p.quad[1].as_mut_ptr() as *mut __m512i, pack(&q[4..]));
        _mm512_storeu_si512(p.init.as_mut_ptr() as *mut __m512i, init);
        _mm512_storeu_ps(p.scale.as_mut_ptr(), _mm512_div_ps(m, k127));
        p
    }

    /// Four rows' 16 quant bytes as one vector, interleaved so that dword `l` holds byte `l` of
    /// each row (rows in order).
    #[inline(always)]
    unsafe fn interleave4(q: &[*const u8]) -> __m512i {
        let at = |k: usize| _mm_loadu_si128(q[k] as *const __m128i);
        let z = _mm512_castsi128_si512(at(0));
        let z = _mm512_inserti32x4::<1>(z, at(1));
        let z = _mm512_inserti32x4::<2>(z, at(2));
        let z = _mm512_inserti32x4::<3>(z, at(3));
        _mm512_permutexvar_epi8(_mm512_loadu_si512(INTERLEAVE.as_ptr() as *const __m512i), z)
    }

    /// One block (lane `j` of `prep`, nibbles at `quants`) of the group into `o[0..32]`.
    #[inline(always)]
    unsafe fn block(quants: &[*const u8; GROUP], prep: &Prepared, j: usize, o: *mut f32) {
        let low = _mm512_set1_epi8(0x0F);
        let init = _mm512_set1_epi32(prep.init[j]);
        let mut lo = init;
        let mut hi = init;
        for (half, quad) in prep.quad.iter().enumerate() {
            let z = interleave4(&quants[4 * half..]);
            let c = _mm512_set1_epi32(quad[j]);
            lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(z, low), c);
            hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16::<4>(z), low), c);
        }
        let s = _mm512_set1_ps(prep.scale[j]);
        _mm512_storeu_ps(
            o,
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s, _mm512_loadu_ps(o)),
        );
        let o16 = o.add(16);
        _mm512_storeu_ps(
            o16,
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s, _mm512_loadu_ps(o16)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bits, in_pool, Rng};
    use super::*;
    use crate::quant::{dequantize, quantize};

    /// Random Q4_0 rows.
    fn weights(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let f: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
        let mut data = vec![0u8; rows * cols / QK * 18];
        quantize(GgmlType::Q4_0, &f, &mut data).unwrap();
        data
    }

    /// About `density` of the coefficients non-zero (the rest 0.0 or -0.0).
    fn coefs(n: usize, density: f64, rng: &mut Rng) -> Vec<f32> {
        (0..n)
            .map(|_| match (rng.next() % 1000) as f64 >= density * 1000.0 {
                true if rng.below(2) == 0 => 0.0,
                true => -0.0,
                false => rng.f() * 3.0,
            })
            .collect()
    }

    fn run(path: Path, w: &Matrix, a: &[f32], out0: &[f32]) -> Vec<f32> {
        let mut out = out0.to_vec();
        sparse_axpy_int8_at(path, &SplitQ4_0::new(w).unwrap(), a, &mut out).unwrap();
        out
    }

    /// The exact product in f64, and per output the bound of the coefficient rounding: each term
    /// is off by at most `s / 2 · |n − 8| <= 4 s`, `s = max_k |c_k| / 127` per group and block.
    fn reference(w: &Matrix, a: &[f32], out0: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (rows, cols) = (w.rows, w.cols);
        let mut deq = vec![0f32; rows * cols];
        dequantize(GgmlType::Q4_0, w.data, &mut deq).unwrap();
        let mut want: Vec<f64> = out0.iter().map(|&v| v as f64).collect();
        let mut bound: Vec<f64> = out0.iter().map(|&v| 1e-6 * (v as f64).abs()).collect();
        let groups = Groups::new(a);
        let rb = cols / QK * 18;
        for g in groups.rows.chunks(GROUP).zip(groups.coefs.chunks(GROUP)) {
            for b in 0..cols / QK {
                let mut m = 0f64;
                for (&r, &c) in g.0.iter().zip(g.1) {
                    let p = &w.data[r as usize * rb + b * 18..];
                    let d = f16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f64();
                    m = m.max((c as f64 * d).abs());
                }
                for e in b * QK..(b + 1) * QK {
                    bound[e] += 8.0 * 4.0 * m / 127.0;
                    for (&r, &c) in g.0.iter().zip(g.1) {
                        let v = c as f64 * deq[r as usize * cols + e] as f64;
                        want[e] += v;
                        bound[e] += 1e-6 * v.abs();
                    }
                }
            }
        }
        (want, bound)
    }

    #[test]
    fn matches_the_exact_product_within_the_rounding_bound_and_scalar_bits() {
        let mut rng = Rng(0x1278);
        for cols in [32, 96, 544, 1056] {
            let rows = 61;
            let data = weights(rows, cols, &mut rng);
            let w = Matrix::new(GgmlType::Q4_0, rows, cols, &data).unwrap();
            for density in [1.0, 0.5, 0.1] {
                let a = coefs(rows, density, &mut rng);
                let out0: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let (want, bound) = reference(&w, &a, &out0);
                let slow = run(Path::Scalar, &w, &a, &out0);
                for (e, &g) in slow.iter().enumerate() {
                    assert!(
                        (g as f64 - want[e]).abs() <= bound[e],
                        "cols={cols} density={density} e={e}: got {g}, want {} ± {}",
                        want[e],
                        bound[e]
                    );
                }
                for path in Path::available() {
                    let got = run(path, &w, &a, &out0);
                    assert_eq!(
                        bits(&slow),
                        bits(&got),
                        "{path:?} cols={cols} density={density}"
                    );
                }
            }
        }
    }

    #[test]
    fn is_much_closer_than_the_bound_on_average() {
        // the bound is the worst case; typical rounding errors are a few per mille of the sum
        let mut rng = Rng(31);
        let (rows, cols) = (512, 1024);
        let data = weights(rows, cols, &mut rng);
        let w = Matrix::new(GgmlType::Q4_0, rows, cols, &data).unwrap();
        let a = coefs(rows, 0.5, &mut rng);
        let zero = vec![0f32; cols];
        let (want, _) = reference(&w, &a, &zero);
        let got = run(Path::available()[0], &w, &a, &zero);
        let err: f64 = got
            .iter()
            .zip(&want)
            .map(|(&g, w)| (g as f64 - w).powi(2))
            .sum();
        let norm: f64 = want.iter().map(|w| w * w).sum();
        let rel = (err / norm).sqrt();
        eprintln!("int8 coefficients: relative RMS error {rel:.2e}");
        assert!(rel < 0.01, "relative RMS error {rel}");
    }

    #[test]
    fn is_deterministic_across_thread_counts() {
        let mut rng = Rng(77);
        let (rows, cols) = (300, 4096);
        let data = weights(rows, cols, &mut rng);
        let w = Matrix::new(GgmlType::Q4_0, rows, cols, &data).unwrap();
        for density in [1.0, 0.1] {
            let a = coefs(rows, density, &mut rng);
            let out0: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let first = bits(&in_pool(1, || run(Path::Scalar, &w, &a, &out0)));
            for threads in [1, 2, 3, 5] {
                let split = SplitQ4_0::new(&w).unwrap();
                let out = in_pool(threads, || {
                    let mut out = out0.clone();
                    sparse_axpy_int8(&split, &a, &mut out).unwrap();
                    out
                });
                assert_eq!(first, bits(&out), "{threads} threads, density {density}");
            }
        }
    }

    #[test]
    fn skipped_rows_are_not_read() {
        let mut rng = Rng(3);
        let (rows, cols) = (40, 96);
        let mut data = weights(rows, cols, &mut rng);
        let rb = cols / QK * 18;
        let mut a = coefs(rows, 0.3, &mut rng);
        a[7] = 0.0;
        a[8] = -0.0;
        for r in [7, 8] {
            // a NaN scale in every block of the skipped rows
            for b in 0..cols / QK {
                data[r * rb + b * 18..][..2].copy_from_slice(&0x7e00u16.to_le_bytes());
            }
        }
        let w = Matrix::new(GgmlType::Q4_0, rows, cols, &data).unwrap();
        for path in Path::available() {
            let out = run(path, &w, &a, &vec![0.5; cols]);
            assert!(out.iter().all(|v| v.is_finite()), "{path:?}");
            let untouched = run(path, &w, &vec![0.0; rows], &vec![0.5; cols]);
            assert!(untouched.iter().all(|&v| v == 0.5));
        }
    }

    #[test]
    fn errors() {
        let mut rng = Rng(1);
        let data = weights(4, 64, &mut rng);
        let w = SplitQ4_0::new(&Matrix::new(GgmlType::Q4_0, 4, 64, &data).unwrap()).unwrap();
        assert_eq!((w.rows(), w.cols(), w.bytes()), (4, 64, data.len()));
        assert!(sparse_axpy_int8(&w, &[1.0; 3], &mut [0.0; 64]).is_err());
        assert!(sparse_axpy_int8(&w, &[1.0; 4], &mut [0.0; 63]).is_err());
        let f = vec![0u8; 4 * 64 * 4];
        let wf = Matrix::new(GgmlType::F32, 4, 64, &f).unwrap();
        assert!(matches!(
            SplitQ4_0::new(&wf),
            Err(Error::UnsupportedType { .. })
        ));
    }
}
