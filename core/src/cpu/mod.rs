//! CPU kernels: dense quantised matrix × activation products (this file and its submodules) and the
//! element-wise kernels in [`ops`].
//!
//! [`matmul`] computes `y = W · x` for a batch of token rows the way ggml's CPU backend does: each
//! token row of `x` is first quantised to the weight type's `vec_dot_type` (Q8_0 for Q4_0/Q5_0/Q8_0,
//! Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, f16/bf16 for F16/BF16 weights), then every output is
//! an integer block dot product scaled by the blocks' scales, as in `ggml_vec_dot_*`. Integer parts
//! are exact on every path; only the order of the float accumulation differs between paths.
//!
//! - `act`: activation quantisation (ggml's x86 `quantize_row_q8_0` / `q8_1`, `quantize_row_q8_K`).
//! - `scalar`: the portable kernels, also the reference for tests.
//! - `avx2` / `avx512`: x86-64 kernels behind runtime feature detection (never AMX).
//! - `simd128`: wasm32 kernels (the browser's CPU path), compiled in with
//!   `-C target-feature=+simd128` (wasm has no run-time detection: a module either validates
//!   with SIMD instructions or not at all).
//!
//! Work is split over output rows with rayon in the *current* pool. Kernels compute tiles of up to
//! 4 rows × 4 tokens; for a batch each task keeps its rows in cache while it sweeps all token
//! rows, and on AVX-512 a batch of 16 or more tokens first unpacks the task's rows once (nibbles,
//! high bits, f16 and 6-bit scales) so that the token sweeps only load them. Decode (one token)
//! streams the weights once, with software prefetch a few KiB ahead. No allocation per call
//! beyond thread-local buffers that are reused.

/// Wraps `$f::<R, N>(w, rb, a, t0, out)`, an `unsafe fn` computing a tile of R weight rows × N
/// tokens whose only requirement beyond in-bounds rows and tokens is its instruction set, into a
/// [`Kernel`]: tiles of R·N ≤ 4 (4 rows for one token, 2 × 2, one row for 3–4 tokens), which keeps
/// the accumulators and unpacked weights in 16 vector registers (x86's ymm, the xmm registers a
/// browser maps wasm's v128 onto) and gives 4 independent accumulation chains.
/// `tiled_kernel!($f, token_pairs)` takes 3–4 tokens as two 2 × 2 tiles (2 × 1 for a third)
/// instead: for float rows, with no unpacking for the tokens to share, two rows per weight-row
/// pass need fewer loads per multiply-add (AVX2 F16, 1024 × 1024, 8 tokens, 2 threads: 42.4 →
/// 48.0 GMAC/s). Every (row, token) has its own accumulators, so the bits stay the same.
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )),
    allow(unused_macros)
)]
macro_rules! tiled_kernel {
    ($f:ident) => {
        tiled_kernel!(@tiles $f, false)
    };
    ($f:ident, token_pairs) => {
        tiled_kernel!(@tiles $f, true)
    };
    (@tiles $f:ident, $token_pairs:literal) => {
        |w: &[u8], rb: usize, nr: usize, a: &Acts, t0: usize, nt: usize, out: &mut [f32]| {
            assert!(
                w.len() >= nr * rb
                    && (1..=NT).contains(&nt)
                    && t0 + nt <= a.n
                    && out.len() >= nr * NT
            );
            let rmax: usize = match nt {
                1 => 4,
                2 => 2,
                _ if $token_pairs => 2,
                _ => 1,
            };
            let mut i = 0;
            while i < nr {
                let r = match (nr - i).min(rmax) {
                    4.. => 4,
                    2 | 3 => 2,
                    _ => 1,
                };
                let (wp, o) = (w[i * rb..].as_ptr(), &mut out[i * NT..]);
                // SAFETY: a kernel is only selected for a level whose instruction set this CPU
                // has (see `Level::available`); rows i..i+r and tokens t0..t0+nt exist (asserted
                // above).
                unsafe {
                    match (r, nt) {
                        (4, _) => $f::<4, 1>(wp, rb, a, t0, o),
                        (2, 1) => $f::<2, 1>(wp, rb, a, t0, o),
                        (2, 2) => $f::<2, 2>(wp, rb, a, t0, o),
                        (2, _) => {
                            $f::<2, 2>(wp, rb, a, t0, o);
                            match nt {
                                3 => $f::<2, 1>(wp, rb, a, t0 + 2, &mut o[2..]),
                                _ => $f::<2, 2>(wp, rb, a, t0 + 2, &mut o[2..]),
                            }
                        }
                        (_, 1) => $f::<1, 1>(wp, rb, a, t0, o),
                        (_, 2) => $f::<1, 2>(wp, rb, a, t0, o),
                        (_, 3) => $f::<1, 3>(wp, rb, a, t0, o),
                        (_, _) => $f::<1, 4>(wp, rb, a, t0, o),
                    }
                }
                i += r;
            }
        }
    };
}

pub mod ops;
pub mod sparse;
pub mod sparse_ffn;
pub mod sparse_int8;

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod interleaved;
mod scalar;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::quant::GgmlType;
use crate::{Error, Result};

pub(crate) use act::{ActKind, Acts};
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::widen_f16_row;

pub use interleaved::Interleaved;
pub use sparse::{gather_matmul, sparse_axpy};
pub use sparse_int8::{sparse_axpy_int8, sparse_axpy_int8_is_fast, SplitQ4_0};

/// A dense row-major weight matrix in one of ggml's formats, borrowed from a GGUF file (or any byte
/// buffer): `rows` rows of `cols` elements each, every row `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    /// Element type of the weights.
    pub ty: GgmlType,
    /// Number of rows (outputs of [`matmul`]).
    pub rows: usize,
    /// Number of columns (inputs of [`matmul`]; ggml's `ne[0]`).
    pub cols: usize,
    /// The packed rows, exactly `rows * ty.row_bytes(cols)` bytes; may start at any address.
    pub data: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// Wraps `data` as a `rows × cols` matrix of type `ty`.
    ///
    /// Errors: [`Error::UnsupportedType`] for a type [`matmul`] does not support,
    /// [`Error::InvalidArgument`] when `cols` is not a whole number of blocks or `data` is not
    /// exactly `rows` rows long.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        if kind_for(ty).is_none() {
            return Err(Error::UnsupportedType {
                ty: ty.name(),
                op: "matmul",
            });
        }
        let rb = ty.row_bytes(cols as u64)?;
        let want = rb.checked_mul(rows as u64).ok_or_else(|| {
            Error::InvalidArgument(format!("{rows} rows of {cols} {ty} elements overflow"))
        })?;
        if want != data.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "a {rows}×{cols} {ty} matrix takes {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(Matrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes in one row.
    #[inline]
    fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.block_bytes()
    }

    /// Re-checks the invariants of [`Matrix::new`] (the fields are public, so a caller may have
    /// built or changed one by hand).
    fn validate(&self) -> Result<()> {
        Matrix::new(self.ty, self.rows, self.cols, self.data).map(|_| ())
    }
}

/// The SIMD path a kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// Portable Rust (the reference).
    Scalar,
    /// wasm simd128 (the module is built with `-C target-feature=+simd128`).
    #[cfg_attr(
        not(all(target_arch = "wasm32", target_feature = "simd128")),
        allow(dead_code)
    )]
    Simd128,
    /// AVX2 + FMA (+ F16C).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// AVX-512 F/BW/VL/VNNI on top of AVX2.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Simd128 => "simd128",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    fn from_name(name: &str) -> Option<Level> {
        match name.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(Level::Scalar),
            "simd128" => Some(Level::Simd128),
            "avx2" => Some(Level::Avx2),
            "avx512" => Some(Level::Avx512),
            _ => None,
        }
    }

    /// The best level this CPU supports.
    fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            if avx512 {
                return Level::Avx512;
            }
            if avx2 {
                return Level::Avx2;
            }
        }
        if cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
            return Level::Simd128;
        }
        Level::Scalar
    }

    /// Whether this CPU can run the level: scalar always, simd128 in a SIMD wasm module, the x86
    /// levels up to the detected one.
    fn available(self) -> bool {
        let best = Level::detect();
        match self {
            Level::Scalar => true,
            Level::Simd128 => best == Level::Simd128,
            Level::Avx2 | Level::Avx512 => best >= self,
        }
    }

    /// `asked` lowered to what this CPU runs (never raised): the lower of it and the detected
    /// level, or scalar where that is another family's (simd128 asked for on x86).
    fn lowered_to(asked: Level) -> Level {
        let level = asked.min(Level::detect());
        if level.available() {
            level
        } else {
            Level::Scalar
        }
    }

    /// The level that runs: the detected one, lowered (never raised) by `HOTCOLD_SIMD` or by
    /// [`set_simd_level`] before the first kernel ran.
    fn current() -> Level {
        *LEVEL.get_or_init(|| {
            match std::env::var("HOTCOLD_SIMD")
                .ok()
                .as_deref()
                .and_then(Level::from_name)
            {
                Some(asked) => Level::lowered_to(asked),
                None => Level::detect(),
            }
        })
    }
}

/// Whether the kernels run on AVX2 (or AVX-512) here: for code outside the kernels that compiles
/// a copy of itself for AVX2 (the same operations, wider vectors).
pub(crate) fn has_avx2() -> bool {
    Level::current() >= Level::Avx2
}

/// The level chosen on first use (see [`Level::current`]).
static LEVEL: OnceLock<Level> = OnceLock::new();

/// Which SIMD path [`matmul`] runs: `"avx512"`, `"avx2"`, `"simd128"` or `"scalar"` (for logs and
/// benches).
///
/// Detected once at run time on x86-64 (AVX-512 needs F, BW, VL and VNNI; AVX2 needs FMA and
/// F16C); on wasm32, `"simd128"` when the module was built with `-C target-feature=+simd128`. The
/// environment variable `HOTCOLD_SIMD=scalar|simd128|avx2|avx512` (or [`set_simd_level`]) can
/// lower (never raise) the level.
pub fn simd_level() -> &'static str {
    Level::current().name()
}

/// Lowers the SIMD path for the rest of the process, as `HOTCOLD_SIMD` does, for front-ends
/// without environment variables (the browser page's `simd` parameter, to compare paths).
/// Returns the level that runs (a path this CPU lacks is lowered: see [`simd_level`]).
///
/// Errors: [`Error::InvalidArgument`] for an unknown name, or when a kernel already ran on
/// another level (the level is fixed on first use).
pub fn set_simd_level(name: &str) -> Result<&'static str> {
    let asked = Level::from_name(name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "unknown SIMD level {name:?} (expected scalar, simd128, avx2 or avx512)"
        ))
    })?;
    let level = Level::lowered_to(asked);
    let now = *LEVEL.get_or_init(|| level);
    if now != level {
        return Err(Error::InvalidArgument(format!(
            "the SIMD level is already {} (it is fixed when the first kernel runs)",
            now.name()
        )));
    }
    Ok(now.name())
}

/// The activation format and kernels for a weight type, or `None` when unsupported.
fn kind_for(ty: GgmlType) -> Option<ActKind> {
    use GgmlType::*;
    Some(match ty {
        F32 => ActKind::F32,
        F16 => ActKind::F16,
        BF16 => ActKind::Bf16,
        Q4_0 | Q5_0 | Q8_0 => ActKind::Q8_0,
        Q4_1 | Q5_1 => ActKind::Q8_1,
        Q4_K | Q5_K | Q6_K => ActKind::Q8K,
        _ => return None,
    })
}

/// log2 of the offset that the unsigned-weight kernels remove (`q − 8`, `q − 16`, `w + 128`).
fn offset_shift(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::Q4_0 => 3,
        GgmlType::Q5_0 => 4,
        GgmlType::Q8_0 => 7,
        _ => 0,
    }
}

/// The weight types [`matmul`] (and [`gather_matmul`], [`sparse_axpy`]) have kernels for.
pub const MATMUL_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Rounds each of the `n_tokens` rows of `x` (each `cols` values) exactly as [`matmul`] quantises
/// its input for weights of type `ty` (to f16, Q8_0 or Q8_K, and back to f32), so that a product
/// computed another way (the sparse axpy) sees the activations ggml's product would see.
pub fn round_like_matmul_input(
    ty: GgmlType,
    x: &mut [f32],
    n_tokens: usize,
    cols: usize,
) -> Result<()> {
    let kind = kind_for(ty).ok_or(Error::UnsupportedType {
        ty: ty.name(),
        op: "matmul",
    })?;
    if n_tokens.checked_mul(cols) != Some(x.len()) {
        return Err(Error::InvalidArgument(format!(
            "x has {} values, expected {n_tokens} × {cols}",
            x.len()
        )));
    }
    let Some(block) = rounding_block(kind) else {
        return Ok(());
    };
    if !cols.is_multiple_of(block) {
        return Err(Error::InvalidArgument(format!(
            "{cols} values are not a whole number of {block}-value blocks"
        )));
    }
    round_with(&mut Acts::default(), kind, block, x, n_tokens, cols);
    Ok(())
}

/// The values per rounding group of the activation kind `kind` (`None`: f32, not rounded).
fn rounding_block(kind: ActKind) -> Option<usize> {
    match kind {
        ActKind::F32 => None,
        ActKind::F16 | ActKind::Bf16 => Some(1),
        ActKind::Q8_0 | ActKind::Q8_1 => Some(32),
        ActKind::Q8K => Some(256),
    }
}

/// [`round_like_matmul_input`] after its checks (`kind` the activation kind, `block` its block
/// size), with `acts` as scratch.
fn round_with(
    acts: &mut Acts,
    kind: ActKind,
    block: usize,
    x: &mut [f32],
    n_tokens: usize,
    cols: usize,
) {
    acts.quantize(Level::current(), kind, 0, x, n_tokens, cols);
    for (t, row) in x.chunks_exact_mut(cols).enumerate() {
        if block == 1 {
            row.copy_from_slice(acts.f(t));
            continue;
        }
        let (q, d) = (acts.q(t), acts.d(t));
        for (i, v) in row.iter_mut().enumerate() {
            *v = d[i / block] * f32::from(q[i]);
        }
    }
}

/// The activations exactly as [`matmul`] quantises them for weights of type `ty` (for the GPU
/// backend, whose kernels take the same quants and scales).
///
/// Errors: as [`round_like_matmul_input`].
#[cfg_attr(
    not(all(feature = "gpu", not(target_arch = "wasm32"))),
    allow(dead_code)
)]
pub(crate) fn quantize_like_matmul(
    ty: GgmlType,
    x: &[f32],
    n_tokens: usize,
    cols: usize,
) -> Result<Acts> {
    let kind = kind_for(ty).ok_or(Error::UnsupportedType {
        ty: ty.name(),
        op: "matmul",
    })?;
    if n_tokens.checked_mul(cols) != Some(x.len()) || !cols.is_multiple_of(ty.block_size()) {
        return Err(Error::InvalidArgument(format!(
            "x has {} values, expected {n_tokens} × {cols} (a whole number of {ty} blocks)",
            x.len()
        )));
    }
    let mut acts = Acts::default();
    acts.quantize(Level::current(), kind, offset_shift(ty), x, n_tokens, cols);
    Ok(acts)
}

/// Computes `y[t*rows + r] = dot(W row r, x[t*cols .. (t+1)*cols])` for `t` in `0..n_tokens`.
///
/// `x` holds `n_tokens` token rows of `w.cols` f32 values; `y` receives `n_tokens` rows of
/// `w.rows` values. The dot products follow ggml (see the module docs). Runs in parallel on the
/// current rayon pool. Errors: [`Error::InvalidArgument`] for a malformed matrix or wrong `x`/`y`
/// lengths, [`Error::UnsupportedType`] for a weight type without kernels.
pub fn matmul(w: &Matrix, x: &[f32], n_tokens: usize, y: &mut [f32]) -> Result<()> {
    matmul_at(Level::current(), w, x, n_tokens, y)
}

/// [`matmul`] on a named SIMD path (`"scalar"`, `"simd128"`, `"avx2"`, `"avx512"`), for benches and tests that
/// compare paths in one process. A path this CPU lacks gives [`Error::InvalidArgument`].
#[doc(hidden)]
pub fn matmul_with_simd(
    simd: &str,
    w: &Matrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let level = Level::from_name(simd)
        .ok_or_else(|| Error::InvalidArgument(format!("unknown SIMD level {simd:?}")))?;
    if !level.available() {
        return Err(Error::InvalidArgument(format!(
            "this CPU cannot run the {simd} path (best: {})",
            Level::detect().name()
        )));
    }
    matmul_at(level, w, x, n_tokens, y)
}

/// Dequantises row `r` of `w` into `out` (`w.cols` values), e.g. for embedding look-ups.
///
/// Bit-exact with ggml's `dequantize_row_*`. Errors: [`Error::InvalidArgument`] for a row out of
/// range, a wrong `out` length or a malformed matrix.
pub fn dequantize_row(w: &Matrix, r: usize, out: &mut [f32]) -> Result<()> {
    w.validate()?;
    if r >= w.rows {
        return Err(Error::InvalidArgument(format!(
            "row {r} out of range for a matrix of {} rows",
            w.rows
        )));
    }
    if out.len() != w.cols {
        return Err(Error::InvalidArgument(format!(
            "output has {} values, the row has {}",
            out.len(),
            w.cols
        )));
    }
    let rb = w.row_bytes();
    crate::quant::dequantize(w.ty, &w.data[r * rb..(r + 1) * rb], out)
}

/// A row-gather kernel: for the rows of `n` values at the addresses `rows` (at most [`MR`], each
/// anywhere) and token `t` of the activations, writes `out[i * NT]` = dot(row `i`, token `t`),
/// with the bits of the [`Kernel`] of the same type.
///
/// Safety of a call: each address must hold a whole row of the kernel's type; `t` must be a token of the
/// activations; `out` must hold `(rows.len() - 1) * NT + 1` values.
pub(crate) type RowsKernel =
    unsafe fn(rows: &[*const u8], a: &Acts, t: usize, n: usize, out: &mut [f32]);

/// The [`RowsKernel`] for `ty` at `level`, if there is one (F16 on AVX-512, the 32-element block
/// formats on AVX2: each level's own, as their bits are its [`Kernel`]'s).
fn rows_kernel_for(level: Level, ty: GgmlType) -> Option<RowsKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        // the level whose kernel `kernel_for` picks
        if level >= Level::Avx512 && avx512::kernel(ty).is_some() {
            return avx512::rows_kernel(ty);
        }
        if level >= Level::Avx2 {
            return avx2::rows_kernel(ty);
        }
    }
    let _ = (level, ty);
    None
}

/// A row kernel: for `nr` weight rows starting at `w` (each `rb` bytes) and the `nt` (≤ [`NT`])
/// token rows `t0..t0+nt` of `acts`, writes `out[i * NT + t]` = dot(row `i`, token `t0 + t`).
pub(crate) type Kernel =
    fn(w: &[u8], rb: usize, nr: usize, acts: &Acts, t0: usize, nt: usize, out: &mut [f32]);

/// Tokens per kernel call (the inner tile width).
pub(crate) const NT: usize = 4;
/// Rows per kernel call (the inner tile height).
pub(crate) const MR: usize = 4;

/// The kernel for `ty` on `level` (falls back to a lower level where a type has no faster path).
fn kernel_for(level: Level, ty: GgmlType) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx512 {
            if let Some(k) = avx512::kernel(ty) {
                return k;
            }
        }
        if level >= Level::Avx2 {
            if let Some(k) = avx2::kernel(ty) {
                return k;
            }
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if level == Level::Simd128 {
        if let Some(k) = simd128::kernel(ty) {
            return k;
        }
    }
    let _ = level;
    scalar::kernel(ty).expect("kind_for and scalar::kernel cover the same types")
}

/// The dense-matmul kernel for `ty` that prefetches its own rows, if this level has one.
fn streaming_kernel_for(level: Level, ty: GgmlType) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx512 {
        return avx512::streaming_kernel(ty);
    }
    let _ = (level, ty);
    None
}

/// How far ahead of the kernel the weights are prefetched (the rows are short and DRAM latency is
/// long: without it a single thread streams at about half the memory bandwidth).
const PREFETCH_AHEAD: usize = 4 * 1024;

/// Asks for the cache line holding `p` (see [`prefetch_ptr`]).
#[inline(always)]
fn prefetch(p: &u8) {
    prefetch_ptr(p);
}

/// Asks for the cache line at `p` ahead of its use, into the core's L2 cache (`prefetcht1`); a
/// no-op where there is no prefetch instruction. Never faults: `p` may point anywhere, past the
/// end of the weights included. Every weight prefetch of the CPU kernels goes through here.
///
/// L2, not L1: a `prefetcht0` holds one of the L1's few miss buffers until its line arrives, so
/// a kernel prefetching a few KiB ahead of several streams ran out of them and stalled, while the
/// L2 keeps many more misses in flight and the kernel's own loads find the lines there. On the
/// project's 2-core AMD EPYC machine (decode, 2 threads) `prefetcht0` → `prefetcht1` took the
/// dense Q4_0 `small` twin from 823 to 1014 tok/s, Gemma 3 270M Q4_K_M from 96 to 120, Qwen2.5
/// 0.5B from 64 to 73, and four F16 Llama-2-7B-shaped TEAL layers from 38.6 to 32.8 ms.
#[inline(always)]
pub(crate) fn prefetch_ptr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching has no architectural effect; SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Token rows up to which a batch runs all its token groups on a tile of rows before the next
/// rows (the rows then come from memory once and are reused from L1); longer batches sweep the
/// rows once per token group.
const ROW_MAJOR_MAX_TOKENS: usize = 16;

/// Token rows from which a batch unpacks each task's weights once (AVX-512 only). Below it the
/// unpacking costs more than it saves: a decode step of 8 sequences (`hotcold serve`) ran about 15%
/// faster on Gemma 3 270M with the threshold at 16 than at 8.
#[cfg(target_arch = "x86_64")]
const PACK_MIN_TOKENS: usize = 16;

#[cfg(target_arch = "x86_64")]
type PackedPath = (avx512::Packer, avx512::PackedKernel);
#[cfg(not(target_arch = "x86_64"))]
type PackedPath = std::convert::Infallible;

/// The batched path for this call, if it takes one.
fn packed_for(level: Level, w: &Matrix, n_tokens: usize) -> Option<PackedPath> {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx512 && n_tokens >= PACK_MIN_TOKENS {
        return avx512::packed(w.ty, w.cols);
    }
    let _ = (level, w, n_tokens);
    None
}

/// Token rows from which an AVX2 batch of F16 or BF16 weights widens each task's rows to f32 once
/// (see [`widened_for`]); from 3 tokens their kernels would convert each weight twice or more.
#[cfg(target_arch = "x86_64")]
const WIDEN_MIN_TOKENS: usize = 3;

/// Widens whole F16 or BF16 weight rows, back to back in `w`, to f32 in `out`.
///
/// # Safety
/// The CPU must support the instructions of the level that chose it.
type WidenRows = unsafe fn(w: &[u8], out: &mut [f32]);

/// The widened form of the dense path for this call, if it takes one: on AVX2, a batch of F16 or
/// BF16 weights runs the F32 kernel over rows widened to f32 once per task, instead of their
/// kernels converting every weight again for each pair of tokens. Same products and sums, so the
/// same bits as those kernels. On an AVX2-only EPYC (`cargo bench --bench matmul`, F16 2048×640
/// and 640×2048) a step of 8 sequences ran 33 -> 41 GFLOP/s, a 64-token prompt 33 -> 53.
fn widened_for(level: Level, w: &Matrix, n_tokens: usize) -> Option<(WidenRows, Kernel)> {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && n_tokens >= WIDEN_MIN_TOKENS {
        let widen: WidenRows = match w.ty {
            GgmlType::F16 => avx2::widen_f16_bytes,
            GgmlType::BF16 => avx2::widen_bf16_bytes,
            _ => return None,
        };
        return Some((widen, avx2::kernel(GgmlType::F32)?));
    }
    let _ = (level, w, n_tokens);
    None
}

/// A raw output pointer shared by the row tasks, each of which writes a disjoint set of indices.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks write disjoint elements (distinct rows), and `matmul_at` outlives them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes a kernel's `nr × nt` tile (rows `col..col + nr` for tokens `t0..t0 + nt`) into the
    /// `n_tokens × width` output, token-major.
    ///
    /// # Safety
    /// `t0 + nt <= n_tokens` and `col + nr <= width` for the output this points to, and no other
    /// task writes those elements meanwhile.
    unsafe fn store_tile(
        &self,
        tile: &[f32],
        nr: usize,
        nt: usize,
        t0: usize,
        width: usize,
        col: usize,
    ) {
        for i in 0..nr {
            for t in 0..nt {
                // SAFETY: in bounds by the caller's contract.
                unsafe { *self.0.add((t0 + t) * width + col + i) = tile[i * NT + t] };
            }
        }
    }
}

thread_local! {
    /// Reused quantised-activation buffers (taken out during a call, so nested calls just allocate).
    static SCRATCH: std::cell::Cell<Option<Box<Acts>>> = const { std::cell::Cell::new(None) };
    /// Each worker's widened weight rows (see [`widened_for`]; taken out during a task).
    static WIDE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

fn matmul_at(level: Level, w: &Matrix, x: &[f32], n_tokens: usize, y: &mut [f32]) -> Result<()> {
    w.validate()?;
    let kind = kind_for(w.ty).ok_or(Error::UnsupportedType {
        ty: w.ty.name(),
        op: "matmul",
    })?;
    let want_x = n_tokens.checked_mul(w.cols);
    if want_x != Some(x.len()) {
        return Err(Error::InvalidArgument(format!(
            "x has {} values, expected {n_tokens} tokens × {} columns",
            x.len(),
            w.cols
        )));
    }
    let want_y = n_tokens.checked_mul(w.rows);
    if want_y != Some(y.len()) {
        return Err(Error::InvalidArgument(format!(
            "y has {} values, expected {n_tokens} tokens × {} rows",
            y.len(),
            w.rows
        )));
    }
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }

    let mut acts = SCRATCH.with(|s| s.take()).unwrap_or_default();
    acts.quantize(level, kind, offset_shift(w.ty), x, n_tokens, w.cols);
    match packed_for(level, w, n_tokens) {
        #[cfg(target_arch = "x86_64")]
        Some((packer, pk)) => run_rows_packed(packer, pk, w, &acts, n_tokens, y),
        _ => match (
            streaming_kernel_for(level, w.ty),
            widened_for(level, w, n_tokens),
        ) {
            (Some(kernel), _) => run_rows(kernel, false, None, w, &acts, n_tokens, y),
            (None, Some((widen, kernel))) => {
                run_rows(kernel, true, Some(widen), w, &acts, n_tokens, y)
            }
            (None, None) => run_rows(kernel_for(level, w.ty), true, None, w, &acts, n_tokens, y),
        },
    }
    SCRATCH.with(|s| s.set(Some(acts)));
    Ok(())
}

/// Splits the rows over rayon tasks and runs `kernel` on tiles of [`MR`] rows × [`NT`] tokens,
/// prefetching the rows ahead of it when `prefetch_rows` (a kernel that does not itself). With
/// `widen`, each task first widens its rows to f32 (per tile of rows for a small batch, all at
/// once for a long one) and `kernel` reads them from there.
fn run_rows(
    kernel: Kernel,
    prefetch_rows: bool,
    widen: Option<WidenRows>,
    w: &Matrix,
    acts: &Acts,
    n_tokens: usize,
    y: &mut [f32],
) {
    let rows = w.rows;
    let rb = w.row_bytes();
    let cols = w.cols;
    let threads = rayon::current_num_threads().max(1);

    // Rows per task: enough tasks for load balance (8 per thread), each at least ~16 KiB of
    // weights (rayon's per-task cost is ~1 µs), and for batches at most ~64 KiB so that a task's
    // rows stay in L2 while it sweeps the tokens.
    let min_rows = (16 * 1024 / rb.max(1)).max(MR);
    let mut chunk = rows.div_ceil(threads * 8).max(min_rows);
    if n_tokens > 1 {
        chunk = chunk.min((64 * 1024 / rb.max(1)).max(MR));
    }
    let chunk = chunk.div_ceil(MR) * MR;
    let n_chunks = rows.div_ceil(chunk);
    let out = OutPtr(y.as_mut_ptr());
    let long = n_tokens > ROW_MAJOR_MAX_TOKENS;

    let task = move |c: usize| {
        let out = out;
        let r0 = c * chunk;
        let r1 = (r0 + chunk).min(rows);
        let mut tile = [0f32; MR * NT];
        let mut wide = WIDE.take();
        if widen.is_some() {
            let n = if long { r1 - r0 } else { MR.min(r1 - r0) };
            wide.resize(wide.len().max(n * cols), 0.0);
        }
        // software prefetch runs PREFETCH_AHEAD bytes ahead of the rows being read, on the first
        // pass over them
        let mut pf = r0 * rb;
        let chunk_end = r1 * rb;
        let mut prefetch_to = |r: usize| {
            if !prefetch_rows {
                return;
            }
            let until = (r * rb + PREFETCH_AHEAD).min(chunk_end);
            while pf < until {
                prefetch(&w.data[pf]);
                pf += 64;
            }
        };
        // rows r..r + nr widened into `wide` from its row `at` on
        let widen_rows = |wide: &mut [f32], r: usize, nr: usize, at: usize| {
            if let Some(widen) = widen {
                // SAFETY: `widened_for` chose `widen` for this CPU's level.
                unsafe {
                    widen(
                        &w.data[r * rb..(r + nr) * rb],
                        &mut wide[at * cols..][..nr * cols],
                    )
                };
            }
        };
        // one tile of rows r..r + nr (in `wide` from its row `at` on, when widened) for tokens
        // t0..t0 + nt
        let mut tile_at = |wide: &[f32], r: usize, nr: usize, at: usize, t0: usize, nt: usize| {
            let (src, stride) = match widen {
                Some(_) => (
                    bytemuck::cast_slice(&wide[at * cols..][..nr * cols]),
                    cols * 4,
                ),
                None => (&w.data[r * rb..(r + nr) * rb], rb),
            };
            kernel(src, stride, nr, acts, t0, nt, &mut tile);
            // SAFETY: t0 + nt <= n_tokens and r + nr <= rows, so the tile is inside y (length
            // n_tokens * rows); rows r0..r1 belong to this task alone.
            unsafe { out.store_tile(&tile, nr, nt, t0, rows, r) };
        };
        if !long {
            // a small batch: every token group right after its rows arrive, from L1
            let mut r = r0;
            while r < r1 {
                let nr = (r1 - r).min(MR);
                prefetch_to(r + nr);
                widen_rows(&mut wide, r, nr, 0);
                let mut t0 = 0;
                while t0 < n_tokens {
                    let nt = (n_tokens - t0).min(NT);
                    tile_at(&wide, r, nr, 0, t0, nt);
                    t0 += nt;
                }
                r += nr;
            }
        } else {
            // a long batch: the activations outgrow L1, so the token groups sweep the task's rows
            // (kept in L2, widened first when asked) one after another
            if widen.is_some() {
                let mut r = r0;
                while r < r1 {
                    let nr = (r1 - r).min(MR);
                    prefetch_to(r + nr);
                    widen_rows(&mut wide, r, nr, r - r0);
                    r += nr;
                }
            }
            sweep_token_groups(r0..r1, n_tokens, |r, nr, t0, nt| {
                if t0 == 0 {
                    prefetch_to(r + nr);
                }
                tile_at(&wide, r, nr, r - r0, t0, nt);
            });
        }
        WIDE.set(wide);
    };
    if n_chunks == 1 || threads == 1 {
        (0..n_chunks).for_each(task);
    } else {
        (0..n_chunks).into_par_iter().for_each(task);
    }
}

/// Calls `tile(r, nr, t0, nt)` on every tile of up to [`MR`] of the `rows` × [`NT`] tokens, token
/// group after token group, each group sweeping all the rows (which a long batch keeps in L2).
fn sweep_token_groups(
    rows: std::ops::Range<usize>,
    n_tokens: usize,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(NT);
        let mut r = rows.start;
        while r < rows.end {
            let nr = (rows.end - r).min(MR);
            tile(r, nr, t0, nt);
            r += nr;
        }
        t0 += nt;
    }
}

/// Rows per task of the batched path: the unpacked rows (2–3× their packed size) stay in L2.
#[cfg(target_arch = "x86_64")]
const PACK_CHUNK_BYTES: usize = 48 * 1024;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each worker's unpacked rows (taken out during a task, so a nested call just allocates).
    static PACKED: std::cell::Cell<Option<Box<avx512::Packed>>> = const { std::cell::Cell::new(None) };
}

/// [`run_rows`] for a batch on the AVX-512 batched path: each task unpacks its rows once, then
/// sweeps all token groups over them.
#[cfg(target_arch = "x86_64")]
fn run_rows_packed(
    packer: avx512::Packer,
    pk: avx512::PackedKernel,
    w: &Matrix,
    acts: &Acts,
    n_tokens: usize,
    y: &mut [f32],
) {
    let rows = w.rows;
    let rb = w.row_bytes();
    let threads = rayon::current_num_threads().max(1);
    let chunk = rows
        .div_ceil(threads * 4)
        .clamp(MR, (PACK_CHUNK_BYTES / rb.max(1)).max(MR))
        .div_ceil(MR)
        * MR;
    let n_chunks = rows.div_ceil(chunk);
    let out = OutPtr(y.as_mut_ptr());
    let task = move |c: usize| {
        let out = out;
        let r0 = c * chunk;
        let r1 = (r0 + chunk).min(rows);
        let mut packed = PACKED.with(|p| p.take()).unwrap_or_default();
        packer(&w.data[r0 * rb..r1 * rb], rb, r1 - r0, &mut packed);
        let mut tile = [0f32; MR * NT];
        sweep_token_groups(r0..r1, n_tokens, |r, nr, t0, nt| {
            pk(&packed, r - r0, nr, acts, t0, nt, &mut tile);
            // SAFETY: as in run_rows: in bounds, and rows r0..r1 are this task's.
            unsafe { out.store_tile(&tile, nr, nt, t0, rows, r) };
        });
        PACKED.with(|p| p.set(Some(packed)));
    };
    if n_chunks == 1 || threads == 1 {
        (0..n_chunks).for_each(task);
    } else {
        (0..n_chunks).into_par_iter().for_each(task);
    }
}
