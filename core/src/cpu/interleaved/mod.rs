//! Q4_0, Q5_0, Q8_0, Q4_K and Q6_K matrices repacked 16 rows at a time, for a product in which each
//! 32-bit lane of an AVX-512 register is one weight row.
//!
//! ggml's row-major layout puts one row's block in a register: `vpdpbusd` leaves partial sums that
//! every block must reduce, scale and accumulate for only a few lanes' worth of products. Here the
//! weights of 16 rows are interleaved four quants at a time, so one `vpdpbusd` against a broadcast
//! of four activation bytes advances 16 rows at once and eight of them finish each row's whole
//! 32-quant sum in its own lane: per 32 columns, 16 rows and one token take eight `vpdpbusd` and a
//! few scale instructions, shared by the 16 rows. That is llama.cpp's idea of repacking weights
//! for the CPU ("interleaved" Q4_0 / Q4_K / Q8_0 layouts), here for the 512-bit VNNI product.
//!
//! Layout: groups of 16 rows (the last group padded with zero rows, scale 0); in a group, for each
//! ggml block of the row (32 or 256 columns), the 16 rows' scales, then the quants as unsigned
//! values in steps of 64 bytes, four bytes per row, row after row:
//! - Q8_0: f16 scales; eight steps, step `j` holding quants `4j..4j + 4` as `q ^ 0x80`. 544 bytes.
//! - Q4_0: f16 scales; four steps, step `j` ggml's quant bytes `4j..4j + 4` as they are: the low
//!   nibbles are quants `4j..4j + 4`, the high ones `16 + 4j..`. 288 bytes.
//! - Q5_0: Q4_0's, then eight 64-bit masks (one bit per byte of a step) of the fifth bits: mask
//!   `2j` for the low nibbles of step `j`, `2j + 1` for the high ones. 352 bytes.
//! - Q4_K: f16 `d` and `dmin`, the eight 6-bit scales `[sub-block][row]` and mins
//!   `[pair of sub-blocks][row][2]` unpacked to bytes, then ggml's 128 quant bytes as 32 steps
//!   (step `8j + i` = bytes `32j + 4i..`: low nibbles quants `64j + 4i..`, high `64j + 32 + 4i..`).
//!   2368 bytes (ggml's 16 × 144 plus 64 for the unpacked scales).
//! - Q6_K: f16 `d`, the sixteen i8 scales `[sub-block][row]`, ggml's 128 `ql` bytes as 32 steps and
//!   its 64 `qh` bytes as 16; quarter `f` of half `h` joins a nibble of `ql` step `16h + 8(f % 2) + i`
//!   with bit pair `f` of `qh` step `8h + i`. 3360 bytes, ggml's own.
//!
//! Arithmetic: for row `r` and token `t`, block by block in column order, the exact integer sums of
//! ggml's `vec_dot` (`isum`, and Q4_K's `msum` of mins times the token's 32-sums), then
//! `acc = fma(f32(isum), dw · da, acc)` (Q4_K then `acc = fma(f32(msum), −(dmin · da), acc)`) with
//! `dw` the weight's and `da` the activation's block scale; every path computes exactly that, so
//! the scalar loop and the AVX-512 kernels give the same bits. Against ggml's row-major product
//! only the float accumulation order differs.

use rayon::prelude::*;

use crate::quant::{fp16_to_fp32, GgmlType, QK, QK_K};
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

/// Q4_K group block: where the 16 rows' 6-bit scales (`[sub-block][row]`, u8) start.
const Q4K_SC: usize = 2 * SCALE_BYTES;
/// Q4_K: where the 6-bit mins (`[pair of sub-blocks][row][2]`, u8) start.
const Q4K_M: usize = Q4K_SC + 8 * GROUP;
/// Q4_K: where the 32 nibble steps start.
const Q4K_QS: usize = Q4K_M + 8 * GROUP;
/// Q4_K: where row `lane`'s min of sub-block `s` lies (`[pair of sub-blocks][row][2]`).
const fn q4k_min_at(s: usize, lane: usize) -> usize {
    Q4K_M + s / 2 * 2 * GROUP + 2 * lane + s % 2
}
/// Q6_K group block: where the 16 rows' scales (`[sub-block][row]`, i8) start.
const Q6K_SC: usize = SCALE_BYTES;
/// Q6_K: where the 32 steps of low nibbles start.
const Q6K_QL: usize = Q6K_SC + 16 * GROUP;
/// Q6_K: where the 16 steps of high bit pairs start.
const Q6K_QH: usize = Q6K_QL + 32 * STEP_BYTES;

/// The weight types with an interleaved layout (named as ggml names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
enum Format {
    Q4_0,
    Q5_0,
    Q8_0,
    Q4_K,
    Q6_K,
}

impl Format {
    fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q4_0 => Some(Format::Q4_0),
            GgmlType::Q5_0 => Some(Format::Q5_0),
            GgmlType::Q8_0 => Some(Format::Q8_0),
            GgmlType::Q4_K => Some(Format::Q4_K),
            GgmlType::Q6_K => Some(Format::Q6_K),
            _ => None,
        }
    }

    fn ty(self) -> GgmlType {
        match self {
            Format::Q4_0 => GgmlType::Q4_0,
            Format::Q5_0 => GgmlType::Q5_0,
            Format::Q8_0 => GgmlType::Q8_0,
            Format::Q4_K => GgmlType::Q4_K,
            Format::Q6_K => GgmlType::Q6_K,
        }
    }

    /// Columns per block (ggml's block size).
    const fn block_cols(self) -> usize {
        match self {
            Format::Q4_K | Format::Q6_K => QK_K,
            _ => QK,
        }
    }

    /// Bytes of one group's block (scales, quants, fifth bits or mins).
    const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => SCALE_BYTES + NIBBLE_BYTES,
            Format::Q5_0 => SCALE_BYTES + NIBBLE_BYTES + 8 * 8,
            Format::Q8_0 => SCALE_BYTES + GROUP * QK,
            Format::Q4_K => Q4K_QS + 32 * STEP_BYTES,
            Format::Q6_K => Q6K_QH + 16 * STEP_BYTES,
        }
    }

    /// Bytes of one group of 16 rows of `cols` columns.
    fn group_bytes(self, cols: usize) -> usize {
        cols / self.block_cols() * self.block_bytes()
    }

    /// The activations' format: ggml's `vec_dot_type`.
    fn act_kind(self) -> ActKind {
        match self {
            Format::Q4_K | Format::Q6_K => ActKind::Q8K,
            _ => ActKind::Q8_0,
        }
    }

    /// What the stored unsigned quants of a 32-column format exceed the signed ones by.
    fn offset(self) -> i32 {
        1 << super::offset_shift(self.ty())
    }

    /// Writes row `lane`'s block `src` (ggml's bytes) into the group block `blk`.
    fn put(self, blk: &mut [u8], lane: usize, src: &[u8]) {
        // step `s` of the quants starting at `at`: this row's four bytes
        let step = |at: usize, s: usize| at + s * STEP_BYTES + lane * QUAD;
        let copy4 = |blk: &mut [u8], to: usize, from: &[u8]| {
            blk[to..to + QUAD].copy_from_slice(&from[..QUAD])
        };
        // the f16 `d`: first in ggml's blocks, last in Q6_K's
        let d_at = if self == Format::Q6_K { 208 } else { 0 };
        blk[2 * lane..2 * lane + 2].copy_from_slice(&src[d_at..d_at + 2]);
        match self {
            Format::Q8_0 => {
                for (k, &q) in src[2..2 + QK].iter().enumerate() {
                    blk[step(SCALE_BYTES, k / QUAD) + k % QUAD] = q ^ 0x80;
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
                    copy4(blk, step(SCALE_BYTES, j), &qs[j * QUAD..]);
                }
                if self == Format::Q5_0 {
                    for m in 0..8 {
                        let bits = (qh >> (16 * (m % 2) + QUAD * (m / 2))) & 15;
                        blk[SCALE_BYTES + NIBBLE_BYTES + 8 * m + lane / 2] |=
                            (bits as u8) << (4 * (lane % 2));
                    }
                }
            }
            Format::Q4_K => {
                blk[SCALE_BYTES + 2 * lane..SCALE_BYTES + 2 * lane + 2].copy_from_slice(&src[2..4]);
                let (sc, m) = super::scalar::k4_scales_mins(src[4..16].try_into().unwrap());
                for s in 0..8 {
                    blk[Q4K_SC + s * GROUP + lane] = sc[s];
                    blk[q4k_min_at(s, lane)] = m[s];
                }
                for st in 0..32 {
                    copy4(blk, step(Q4K_QS, st), &src[16 + st * QUAD..]);
                }
            }
            Format::Q6_K => {
                for s in 0..16 {
                    blk[Q6K_SC + s * GROUP + lane] = src[192 + s];
                }
                for st in 0..32 {
                    copy4(blk, step(Q6K_QL, st), &src[st * QUAD..]);
                }
                for st in 0..16 {
                    copy4(blk, step(Q6K_QH, st), &src[128 + st * QUAD..]);
                }
            }
        }
    }

    /// Row `lane`'s unsigned quant `k` of the group block `blk` (see [`Format::put`]): Q8_0's
    /// `q + 128`, Q4_0's nibble, Q5_0's five bits, Q4_K's nibble, Q6_K's six bits.
    fn get(self, blk: &[u8], lane: usize, k: usize) -> i32 {
        let byte = |at: usize, s: usize, i: usize| blk[at + s * STEP_BYTES + lane * QUAD + i];
        match self {
            Format::Q8_0 => i32::from(byte(SCALE_BYTES, k / QUAD, k % QUAD)),
            Format::Q4_0 | Format::Q5_0 => {
                let (high, k16) = (k / 16, k % 16);
                let q = (byte(SCALE_BYTES, k16 / QUAD, k16 % QUAD) >> (4 * high)) & 15;
                if self == Format::Q4_0 {
                    return i32::from(q);
                }
                let mask =
                    blk[SCALE_BYTES + NIBBLE_BYTES + 8 * (2 * (k16 / QUAD) + high) + lane / 2];
                i32::from(q | ((mask >> (4 * (lane % 2) + k16 % QUAD)) & 1) << 4)
            }
            Format::Q4_K => {
                // quants 64j..64j + 32 are the low nibbles of steps 8j.., the next 32 the high ones
                let (j, high, l) = (k / 64, k / 32 % 2, k % 32);
                i32::from((byte(Q4K_QS, 8 * j + l / QUAD, l % QUAD) >> (4 * high)) & 15)
            }
            Format::Q6_K => {
                // half h, quarter f of it: ggml's ql/qh arrangement
                let (h, f, l) = (k / 128, k % 128 / 32, k % 32);
                let low = byte(Q6K_QL, 16 * h + 8 * (f % 2) + l / QUAD, l % QUAD) >> (4 * (f / 2));
                let high = byte(Q6K_QH, 8 * h + l / QUAD, l % QUAD) >> (2 * f);
                i32::from((low & 15) | (high & 3) << 4)
            }
        }
    }

    /// `acc` plus row `lane`'s product of the group block `blk` (block `b`) with token `t`: the
    /// exact integer sums of ggml's `vec_dot`, then `fma(f32(isum), dw · da, acc)` (and for Q4_K
    /// `fma(f32(msum), −(dmin · da), ·)`).
    fn accumulate(self, blk: &[u8], lane: usize, acts: &Acts, t: usize, b: usize, acc: f32) -> f32 {
        let cols = self.block_cols();
        let q = &acts.q(t)[b * cols..(b + 1) * cols];
        let dot = |k0: usize, n: usize| -> i32 {
            (k0..k0 + n)
                .map(|k| self.get(blk, lane, k) * i32::from(q[k]))
                .sum()
        };
        let f16_at = |at: usize| {
            fp16_to_fp32(half::f16::from_le_bytes([
                blk[at + 2 * lane],
                blk[at + 2 * lane + 1],
            ]))
        };
        let dd = f16_at(0) * acts.d(t)[b];
        match self {
            Format::Q4_0 | Format::Q5_0 | Format::Q8_0 => {
                let isum = dot(0, QK) - self.offset() * acts.isum(t)[b];
                (isum as f32).mul_add(dd, acc)
            }
            Format::Q4_K => {
                let bsums = &acts.bsums(t)[b * 16..(b + 1) * 16];
                let (mut isum, mut msum) = (0, 0);
                for s in 0..8 {
                    isum += i32::from(blk[Q4K_SC + s * GROUP + lane]) * dot(32 * s, 32);
                    let m = i32::from(blk[q4k_min_at(s, lane)]);
                    msum += m * (i32::from(bsums[2 * s]) + i32::from(bsums[2 * s + 1]));
                }
                let dm = f16_at(SCALE_BYTES) * acts.d(t)[b];
                (msum as f32).mul_add(-dm, (isum as f32).mul_add(dd, acc))
            }
            Format::Q6_K => {
                let bsums = &acts.bsums(t)[b * 16..(b + 1) * 16];
                let isum: i32 = (0..16)
                    .map(|s| {
                        let sc = i32::from(blk[Q6K_SC + s * GROUP + lane] as i8);
                        sc * (dot(16 * s, 16) - 32 * i32::from(bsums[s]))
                    })
                    .sum();
                (isum as f32).mul_add(dd, acc)
            }
        }
    }
}

/// A Q4_0, Q5_0, Q8_0, Q4_K or Q6_K matrix in the 16-row interleaved layout (see the module docs):
/// `rows` outputs of `cols` inputs.
#[derive(Debug)]
pub struct Interleaved {
    format: Format,
    rows: usize,
    cols: usize,
    data: Box<[u8]>,
}

impl Interleaved {
    /// Rows per interleaved group: the fused sparse FFN takes row slices starting at multiples of it.
    pub const GROUP_ROWS: usize = GROUP;

    /// The weight types this layout takes.
    pub const TYPES: [GgmlType; 5] = [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// Repacks a matrix of one of [`Interleaved::TYPES`] (in parallel on the current rayon pool).
    ///
    /// Errors: [`Error::InvalidArgument`] for a matrix of another type, without columns or
    /// malformed.
    pub fn from_matrix(w: &Matrix) -> Result<Self> {
        w.validate()?;
        if w.cols == 0 {
            return Err(Error::InvalidArgument(
                "the interleaved layout needs at least one column".into(),
            ));
        }
        let format = Format::of(w.ty).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the interleaved layout takes Q4_0, Q5_0, Q8_0, Q4_K or Q6_K weights, not {}",
                w.ty
            ))
        })?;
        let rb = w.row_bytes();
        let src_block = w.ty.block_bytes();
        let block_bytes = format.block_bytes();
        let group_bytes = format.group_bytes(w.cols);
        let groups = w.rows.div_ceil(GROUP);
        let mut data = vec![0u8; groups * group_bytes].into_boxed_slice();
        data.par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, out)| {
                for (b, blk) in out.chunks_exact_mut(block_bytes).enumerate() {
                    // padding rows stay all zero (scale 0)
                    for lane in 0..GROUP.min(w.rows - g * GROUP) {
                        let src = &w.data[(g * GROUP + lane) * rb + b * src_block..][..src_block];
                        format.put(blk, lane, src);
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

    /// Whether weights of type `ty` have this layout and this CPU runs it faster than the
    /// row-major product (AVX2 or AVX-512 VNNI); elsewhere it runs a scalar loop, correct but slow.
    pub fn is_fast_for(ty: GgmlType) -> bool {
        Interleaved::TYPES.contains(&ty) && Level::current() >= Level::Avx2
    }

    /// `y[t * rows + r] = dot(row r, x[t * cols ..])` for `n_tokens` token rows of `x`, the
    /// activations quantised (to Q8_0 or Q8_K) as [`matmul`](super::matmul) does. Runs on the
    /// current rayon pool; the same bits at every thread count.
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
        acts.quantize(level, self.format.act_kind(), shift, x, n_tokens, self.cols);
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
            self.run_groups(level, &acts, g0, g1, (0, self.rows), &out);
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
        self.format.group_bytes(self.cols)
    }

    /// The bytes of groups `g..g + ng`.
    fn groups(&self, g: usize, ng: usize) -> &[u8] {
        let group_bytes = self.group_bytes();
        &self.data[g * group_bytes..(g + ng) * group_bytes]
    }

    /// `y[r - r0] = dot(row r, x)` for the rows `r0..r1` (`r0` a multiple of 16, `r1` one too or
    /// [`Interleaved::rows`]) and one token `x` quantised as [`matmul`](super::matmul) quantises
    /// it for this weight type, on this thread: a slice of [`Interleaved::matmul`]'s product, with
    /// its bits.
    pub(crate) fn run_rows(&self, level: Level, x: &Acts, r0: usize, r1: usize, y: &mut [f32]) {
        assert!(
            r0.is_multiple_of(GROUP) && (r1.is_multiple_of(GROUP) || r1 == self.rows) && r0 <= r1
        );
        assert!(r1 <= self.rows && y.len() == r1 - r0 && x.n == 1 && x.cols == self.cols);
        assert_eq!(x.kind, self.format.act_kind());
        let out = super::OutPtr(y.as_mut_ptr());
        self.run_groups(
            level,
            x,
            r0 / GROUP,
            r1.div_ceil(GROUP),
            (r0, r1 - r0),
            &out,
        );
    }

    /// Groups `g0..g1` for every token, written into `out`: row `r` of token `t` at
    /// `t * stride + r - base`, for `(base, stride)` = `frame` (the matrix: `(0, rows)`).
    fn run_groups(
        &self,
        level: Level,
        acts: &Acts,
        g0: usize,
        g1: usize,
        (base, stride): (usize, usize),
        out: &super::OutPtr,
    ) {
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
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx2 => avx2::tile(self, g, ng, acts, t0, nt, &mut tile),
                    _ => self.scalar_tile(g, ng, acts, t0, nt, &mut tile),
                }
                for (i, lanes) in tile.iter().enumerate().take(ng * nt) {
                    let (gi, t) = (i / nt, i % nt);
                    let r0 = (g + gi) * GROUP;
                    let n = (self.rows - r0).min(GROUP);
                    // SAFETY: token t0 + t < n and rows r0..r0 + n lie inside the caller's
                    // frame of y; groups g0..g1 belong to this task alone.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            lanes.as_ptr(),
                            out.0.add((t0 + t) * stride + r0 - base),
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
        let format = self.format;
        for (gi, group) in self
            .groups(g, ng)
            .chunks_exact(self.group_bytes())
            .enumerate()
        {
            for t in 0..nt {
                let acc = &mut tile[gi * nt + t];
                acc.fill(0.0);
                for (b, blk) in group.chunks_exact(format.block_bytes()).enumerate() {
                    for (lane, acc) in acc.iter_mut().enumerate() {
                        *acc = format.accumulate(blk, lane, acts, t0 + t, b, *acc);
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

/// The SIMD kernels' const-generic names of the formats.
#[cfg(target_arch = "x86_64")]
const Q4: u8 = 0;
#[cfg(target_arch = "x86_64")]
const Q5: u8 = 1;
#[cfg(target_arch = "x86_64")]
const Q8: u8 = 2;
#[cfg(target_arch = "x86_64")]
const Q4K: u8 = 3;
#[cfg(target_arch = "x86_64")]
const Q6K: u8 = 4;

/// The format `F` of a const-generic name.
#[cfg(target_arch = "x86_64")]
const fn format(f: u8) -> Format {
    match f {
        Q4 => Format::Q4_0,
        Q5 => Format::Q5_0,
        Q8 => Format::Q8_0,
        Q4K => Format::Q4_K,
        _ => Format::Q6_K,
    }
}

/// Tokens `t0..t0 + N` of Q8_K activations: quants, block scales and 16-sums.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn k_tokens<const N: usize>(acts: &Acts, t0: usize) -> ([*const u8; N], [&[f32]; N], [&[i16]; N]) {
    (
        std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const u8),
        std::array::from_fn(|t| acts.d(t0 + t)),
        std::array::from_fn(|t| acts.bsums(t0 + t)),
    )
}

/// Super-block `b`'s sums of the token's 32-sub-blocks (from its 16-sums `bsums`), paired as
/// Q4_K's mins are: pair `p` is sub-blocks `2p` (low 16 bits) and `2p + 1` (high), for a
/// `vpmaddwd` with each row's (min, min).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn q4k_min_pairs(bsums: &[i16], b: usize) -> [u32; 4] {
    let bs = &bsums[b * 16..(b + 1) * 16];
    let s32 = |s: usize| (bs[2 * s] + bs[2 * s + 1]) as u16 as u32;
    std::array::from_fn(|p| s32(2 * p) | s32(2 * p + 1) << 16)
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    // Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::*;

    use super::{
        format, k_tokens, q4k_min_pairs, Acts, Format, Interleaved, GROUP, NIBBLE_BYTES, Q4, Q4K,
        Q4K_M, Q4K_QS, Q4K_SC, Q5, Q6K, Q6K_QH, Q6K_QL, Q6K_SC, Q8, QK, QK_K, QUAD, SCALE_BYTES,
        STEP_BYTES, TILE,
    };

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
                Format::Q4_K => tile_k::<Q4K>(w.as_ptr(), gb, ng, acts, t0, nt, tile),
                Format::Q6_K => tile_k::<Q6K>(w.as_ptr(), gb, ng, acts, t0, nt, tile),
            }
        }
    }

    /// [`tile`] for the K formats, whose kernels keep more registers per group and token: at most
    /// four (group, token) pairs per call.
    unsafe fn tile_k<const F: u8>(
        wp: *const u8,
        gb: usize,
        ng: usize,
        acts: &Acts,
        t0: usize,
        nt: usize,
        tile: &mut [[f32; GROUP]; TILE],
    ) {
        let mut g = 0;
        while g < ng {
            let (p, out) = (wp.add(g * gb), &mut tile[g * nt..]);
            match (ng - g, nt) {
                (2.., 1) => kernel::<F, 2, 1>(p, gb, acts, t0, out),
                (2.., 2) => kernel::<F, 2, 2>(p, gb, acts, t0, out),
                _ => {
                    one_group::<F>(p, gb, acts, t0, nt, out);
                    g += 1;
                    continue;
                }
            }
            g += 2;
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

    /// Step pair `j` (of four) of block `blk`'s quants, as unsigned bytes, and the offsets of the
    /// activation quads each half multiplies: Q8_0 steps `2j` and `2j + 1`; Q4_0 / Q5_0 step `j`'s
    /// low and high nibbles (plus their fifth bits).
    #[inline(always)]
    unsafe fn step<const F: u8>(blk: *const u8, j: usize) -> ([__m512i; 2], [usize; 2]) {
        let load = |s: usize| load_step(blk, SCALE_BYTES, s);
        if F == Q8 {
            return ([load(2 * j), load(2 * j + 1)], [8 * j, 8 * j + QUAD]);
        }
        let (mut lo, mut hi) = nibbles(load(j));
        if F == Q5 {
            let masks = blk.add(SCALE_BYTES + NIBBLE_BYTES) as *const u64;
            let sixteen = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, masks.add(2 * j).read_unaligned(), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, masks.add(2 * j + 1).read_unaligned(), hi, sixteen);
        }
        ([lo, hi], [QUAD * j, QK / 2 + QUAD * j])
    }

    /// Format `F`, `G` groups × `N` tokens: `out[g * N + t]` (16 rows each).
    #[inline(always)]
    unsafe fn kernel<const F: u8, const G: usize, const N: usize>(
        w: *const u8,
        gb: usize,
        acts: &Acts,
        t0: usize,
        out: &mut [[f32; GROUP]],
    ) {
        match F {
            Q4K => kernel_q4k::<G, N>(w, gb, acts, t0, out),
            Q6K => kernel_q6k::<G, N>(w, gb, acts, t0, out),
            _ => kernel32::<F, G, N>(w, gb, acts, t0, out),
        }
    }

    /// Block `b` (`bytes` long) of each of `G` groups (`gb` bytes apart) at `w`.
    #[inline(always)]
    unsafe fn blocks<const G: usize>(
        w: *const u8,
        gb: usize,
        b: usize,
        bytes: usize,
    ) -> [*const u8; G] {
        std::array::from_fn(|g| w.add(g * gb + b * bytes))
    }

    /// Prefetches part `part` of `parts` of the lines `PF_AHEAD` bytes ahead of each block (by the
    /// first token tile only): a K-quant block's 37–53 lines are spread over its steps, as one burst of them fills the
    /// line-fill buffers (from DRAM the K kernels then streamed at 0.9–1.0× the row-major ones).
    #[inline(always)]
    unsafe fn prefetch_part<const G: usize>(
        blk: &[*const u8; G],
        bytes: usize,
        part: usize,
        parts: usize,
    ) {
        let lines = bytes.div_ceil(64);
        for g in 0..G {
            let ahead = blk[g].wrapping_add(PF_AHEAD);
            for l in part * lines / parts..(part + 1) * lines / parts {
                crate::cpu::prefetch_ptr(ahead.wrapping_add(64 * l));
            }
        }
    }

    /// Step `s` of the quants at `at` of block `blk`.
    #[inline(always)]
    unsafe fn load_step(blk: *const u8, at: usize, s: usize) -> __m512i {
        _mm512_loadu_si512(blk.add(at + s * STEP_BYTES) as *const __m512i)
    }

    /// The 16 rows' bytes at `p` (one per row) widened to i32, unsigned or signed.
    #[inline(always)]
    unsafe fn widen16<const SIGNED: bool>(p: *const u8) -> __m512i {
        let v = _mm_loadu_si128(p as *const __m128i);
        if SIGNED {
            _mm512_cvtepi8_epi32(v)
        } else {
            _mm512_cvtepu8_epi32(v)
        }
    }

    /// The low and the high nibbles of each byte of `v`.
    #[inline(always)]
    unsafe fn nibbles(v: __m512i) -> (__m512i, __m512i) {
        let nibble = _mm512_set1_epi8(15);
        (
            _mm512_and_si512(v, nibble),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble),
        )
    }

    /// The 16 rows' f16 scales at `p` as f32.
    #[inline(always)]
    unsafe fn scales16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    /// Four activation quants at `p` broadcast to every lane.
    #[inline(always)]
    unsafe fn quad(p: *const u8) -> __m512i {
        _mm512_set1_epi32((p as *const i32).read_unaligned())
    }

    /// Q4_K, `G` groups × `N` tokens (see [`Format::accumulate`]): per sub-block of 32, eight
    /// `vpdpbusd` steps over the nibbles, then `vpmulld` by the row's scale; the mins by
    /// `vpdpwssd` of each row's (min, min) pairs with the token's pairs of 32-sums.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel_q4k<const G: usize, const N: usize>(
        w: *const u8,
        gb: usize,
        acts: &Acts,
        t0: usize,
        out: &mut [[f32; GROUP]],
    ) {
        let bytes = Format::Q4_K.block_bytes();
        let (q, d, bsums) = k_tokens::<N>(acts, t0);
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        for b in 0..acts.nb() {
            let blk = blocks::<G>(w, gb, b, bytes);
            let mut isum = [[_mm512_setzero_si512(); N]; G];
            for j in 0..4 {
                let mut lo = [[_mm512_setzero_si512(); N]; G];
                let mut hi = [[_mm512_setzero_si512(); N]; G];
                for i in 0..8 {
                    if t0 == 0 {
                        prefetch_part(&blk, bytes, 8 * j + i, 32);
                    }
                    let w: [(__m512i, __m512i); G] =
                        std::array::from_fn(|g| nibbles(load_step(blk[g], Q4K_QS, 8 * j + i)));
                    for t in 0..N {
                        let at = q[t].add(b * QK_K + 64 * j + QUAD * i);
                        let (al, ah) = (quad(at), quad(at.add(32)));
                        for g in 0..G {
                            lo[g][t] = _mm512_dpbusd_epi32(lo[g][t], w[g].0, al);
                            hi[g][t] = _mm512_dpbusd_epi32(hi[g][t], w[g].1, ah);
                        }
                    }
                }
                for g in 0..G {
                    let sl = widen16::<false>(blk[g].add(Q4K_SC + 2 * j * GROUP));
                    let sh = widen16::<false>(blk[g].add(Q4K_SC + (2 * j + 1) * GROUP));
                    for t in 0..N {
                        let both = _mm512_add_epi32(
                            _mm512_mullo_epi32(lo[g][t], sl),
                            _mm512_mullo_epi32(hi[g][t], sh),
                        );
                        isum[g][t] = _mm512_add_epi32(isum[g][t], both);
                    }
                }
            }
            let pairs: [[__m512i; 4]; N] = std::array::from_fn(|t| {
                q4k_min_pairs(bsums[t], b).map(|v| _mm512_set1_epi32(v as i32))
            });
            for g in 0..G {
                let mins: [__m512i; 4] = std::array::from_fn(|p| {
                    let at = blk[g].add(Q4K_M + 2 * p * GROUP) as *const __m256i;
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(at))
                });
                let (dw, dmin) = (scales16(blk[g]), scales16(blk[g].add(SCALE_BYTES)));
                for t in 0..N {
                    let mut msum = _mm512_setzero_si512();
                    for p in 0..4 {
                        msum = _mm512_dpwssd_epi32(msum, mins[p], pairs[t][p]);
                    }
                    let da = _mm512_set1_ps(d[t][b]);
                    let dd = _mm512_mul_ps(dw, da);
                    let dm = _mm512_mul_ps(dmin, da);
                    let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), dd, acc[g][t]);
                    acc[g][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), dm, a);
                }
            }
        }
        store(&acc, out);
    }

    /// Q6_K, `G` groups × `N` tokens (see [`Format::accumulate`]): per sub-block of 16, the sum
    /// starts at `−32 ·` the token's 16-sum, four `vpdpbusd` steps over the six-bit quants
    /// (nibble and bit pair joined), then `vpmulld` by the row's signed scale.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel_q6k<const G: usize, const N: usize>(
        w: *const u8,
        gb: usize,
        acts: &Acts,
        t0: usize,
        out: &mut [[f32; GROUP]],
    ) {
        let bytes = Format::Q6_K.block_bytes();
        let (q, d, bsums) = k_tokens::<N>(acts, t0);
        let mut acc = [[_mm512_setzero_ps(); N]; G];
        for b in 0..acts.nb() {
            let blk = blocks::<G>(w, gb, b, bytes);
            let mut isum = [[_mm512_setzero_si512(); N]; G];
            let bs: [&[i16]; N] = std::array::from_fn(|t| &bsums[t][b * 16..(b + 1) * 16]);
            let qb: [*const u8; N] = std::array::from_fn(|t| q[t].add(b * QK_K));
            for h in 0..2 {
                for half in 0..2 {
                    if t0 == 0 {
                        prefetch_part(&blk, bytes, 2 * h + half, 4);
                    }
                    q6k_sub::<0, G, N>(&blk, &qb, &bs, h, half, &mut isum);
                    q6k_sub::<1, G, N>(&blk, &qb, &bs, h, half, &mut isum);
                    q6k_sub::<2, G, N>(&blk, &qb, &bs, h, half, &mut isum);
                    q6k_sub::<3, G, N>(&blk, &qb, &bs, h, half, &mut isum);
                }
            }
            for g in 0..G {
                let dw = scales16(blk[g]);
                for t in 0..N {
                    let dd = _mm512_mul_ps(dw, _mm512_set1_ps(d[t][b]));
                    acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), dd, acc[g][t]);
                }
            }
        }
        store(&acc, out);
    }

    /// Q6_K sub-block `8h + 2F + half` of a block (quarter `F` of half `h`), added to `isum` as
    /// `scale · (Σ u·a − 32 · 16-sum)`: `qb` the tokens' quants of the block, `bs` their 16-sums.
    #[inline(always)]
    unsafe fn q6k_sub<const F: usize, const G: usize, const N: usize>(
        blk: &[*const u8; G],
        qb: &[*const u8; N],
        bs: &[&[i16]; N],
        h: usize,
        half: usize,
        isum: &mut [[__m512i; N]; G],
    ) {
        let pair_bits = _mm512_set1_epi8(0x30);
        let sub = 8 * h + 2 * F + half;
        let mut s: [[__m512i; N]; G] =
            [std::array::from_fn(|t| _mm512_set1_epi32(-32 * i32::from(bs[t][sub]))); G];
        for i in 4 * half..4 * half + 4 {
            let u: [__m512i; G] = std::array::from_fn(|g| {
                let (lo, hi) = nibbles(load_step(blk[g], Q6K_QL, 16 * h + 8 * (F % 2) + i));
                let qh = load_step(blk[g], Q6K_QH, 8 * h + i);
                let bits = match F {
                    0 => _mm512_slli_epi16::<4>(qh),
                    1 => _mm512_slli_epi16::<2>(qh),
                    2 => qh,
                    _ => _mm512_srli_epi16::<2>(qh),
                };
                // nibble | (bits & 0x30)
                _mm512_ternarylogic_epi32::<0xF8>(if F < 2 { lo } else { hi }, bits, pair_bits)
            });
            for t in 0..N {
                let a = quad(qb[t].add(128 * h + 32 * F + QUAD * i));
                for g in 0..G {
                    s[g][t] = _mm512_dpbusd_epi32(s[g][t], u[g], a);
                }
            }
        }
        for g in 0..G {
            let sc = widen16::<true>(blk[g].add(Q6K_SC + sub * GROUP));
            for t in 0..N {
                isum[g][t] = _mm512_add_epi32(isum[g][t], _mm512_mullo_epi32(s[g][t], sc));
            }
        }
    }

    /// The accumulators of `G` groups × `N` tokens into `out[g * N + t]`.
    #[inline(always)]
    unsafe fn store<const G: usize, const N: usize>(
        acc: &[[__m512; N]; G],
        out: &mut [[f32; GROUP]],
    ) {
        for g in 0..G {
            for t in 0..N {
                _mm512_storeu_ps(out[g * N + t].as_mut_ptr(), acc[g][t]);
            }
        }
    }

    /// Q4_0, Q5_0, Q8_0: `G` groups × `N` tokens.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel32<const F: u8, const G: usize, const N: usize>(
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
            let blk = blocks::<G>(w, gb, b, block_bytes);
            if t0 == 0 {
                prefetch_part(&blk, block_bytes, 0, 1);
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
                    (wv[g], at) = step::<F>(blk[g], j);
                }
                for t in 0..N {
                    for h in 0..2 {
                        let av = quad(q[t].add(b * QK + at[h]));
                        for g in 0..G {
                            s[g][t] = _mm512_dpbusd_epi32(s[g][t], wv[g][h], av);
                        }
                    }
                }
            }
            let dw: [__m512; G] = std::array::from_fn(|g| scales16(blk[g]));
            for t in 0..N {
                let da = _mm512_set1_ps(d[t][b]);
                for g in 0..G {
                    let scale = _mm512_mul_ps(dw[g], da);
                    acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[g][t]), scale, acc[g][t]);
                }
            }
        }
        store(&acc, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{in_pool, random_matrix, Rng};
    use super::super::{matmul_with_simd, round_like_matmul_input};
    use super::*;
    use crate::quant::dequantize;

    /// Runs `f` on every type and on shapes with partial last groups, one-block rows and every
    /// token-tile remainder (counted in blocks of the type's columns).
    fn each_shape(mut f: impl FnMut(GgmlType, usize, usize)) {
        for ty in Interleaved::TYPES {
            for (rows, blocks) in [(1, 1), (15, 3), (16, 20), (37, 2), (100, 10)] {
                f(ty, rows, blocks * ty.block_size());
            }
        }
    }

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

    /// Row `lane`'s weight `k` of a group block, dequantised from the interleaved bytes as ggml
    /// dequantises its own blocks.
    fn weight(format: Format, blk: &[u8], lane: usize, k: usize) -> f32 {
        let f16_at = |at: usize| {
            fp16_to_fp32(half::f16::from_le_bytes([
                blk[at + 2 * lane],
                blk[at + 2 * lane + 1],
            ]))
        };
        let u = format.get(blk, lane, k);
        match format {
            Format::Q4_K => {
                let s = k / 32;
                let sc = f32::from(blk[Q4K_SC + s * GROUP + lane]);
                let m = f32::from(blk[q4k_min_at(s, lane)]);
                (f16_at(0) * sc) * u as f32 - f16_at(SCALE_BYTES) * m
            }
            Format::Q6_K => {
                let sc = f32::from(blk[Q6K_SC + k / 16 * GROUP + lane] as i8);
                f16_at(0) * sc * (u - 32) as f32
            }
            _ => (u - format.offset()) as f32 * f16_at(0),
        }
    }

    #[test]
    fn the_layout_keeps_every_weight() {
        let mut rng = Rng(10);
        for ty in Interleaved::TYPES {
            let (rows, cols) = (37, 2 * ty.block_size());
            let w = random_matrix(&mut rng, ty, rows, cols);
            let il = interleave(ty, rows, cols, &w);
            assert_eq!(il.ty(), ty);
            let mut wf = vec![0f32; rows * cols];
            dequantize(ty, &w, &mut wf).unwrap();
            let (format, bc) = (il.format, ty.block_size());
            for r in 0..rows {
                let group = il.groups(r / GROUP, 1);
                for k in 0..cols {
                    let blk = &group[k / bc * format.block_bytes()..][..format.block_bytes()];
                    let got = weight(format, blk, r % GROUP, k % bc);
                    assert_eq!(
                        got.to_bits(),
                        wf[r * cols + k].to_bits(),
                        "{ty} row {r} col {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_fast_paths_give_the_scalar_bits() {
        let mut rng = Rng(11);
        let levels: Vec<Level> = [Level::Avx2, Level::Avx512]
            .into_iter()
            .filter(|l| l.available())
            .collect();
        each_shape(|ty, rows, cols| {
            for n in 1..=9 {
                let (w, x) = case(&mut rng, ty, rows, cols, n);
                let il = interleave(ty, rows, cols, &w);
                let scalar = product(&il, &x, n, true);
                for &level in &levels {
                    let mut fast = vec![f32::NAN; n * rows];
                    il.matmul_at(level, &x, n, &mut fast).unwrap();
                    let same = fast
                        .iter()
                        .zip(&scalar)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty} {rows}×{cols}, {n} tokens, {}: {fast:?} vs {scalar:?}",
                        level.name()
                    );
                }
            }
        });
    }

    /// The scalar path against an f64 product of the dequantised weights and the activations as
    /// the row-major matmul rounds them, and against the row-major matmul itself.
    #[test]
    fn results_match_the_row_major_product() {
        let mut rng = Rng(12);
        each_shape(|ty, rows, cols| {
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
                    let row = &wf[r * cols..(r + 1) * cols];
                    let xt = &xr[t * cols..(t + 1) * cols];
                    let exact: f64 = row
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    // Q4_K's scaled quants and mins each reach about the row's largest weight
                    // and may cancel: bound by that, not by the products
                    let w_max = row.iter().fold(0f64, |m, &a| m.max(f64::from(a.abs())));
                    let size: f64 = xt.iter().map(|&b| 2.0 * w_max * f64::from(b.abs())).sum();
                    // one rounding of the scale product and of each block's accumulate(s)
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
        });
    }

    #[test]
    fn bits_do_not_depend_on_the_batch_or_the_threads() {
        let mut rng = Rng(13);
        let (rows, n) = (100, 7);
        for ty in Interleaved::TYPES {
            let cols = 3 * ty.block_size();
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
        let no_columns = Matrix::new(GgmlType::Q8_0, 3, 0, &[]).unwrap();
        assert!(Interleaved::from_matrix(&no_columns).is_err());
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
