//! Tests of the matmul kernels: every SIMD path against the scalar path (bit-exact on data whose
//! float arithmetic is exact, within 1e-5 otherwise), the scalar path against an f32 reference on
//! dequantised weights, odd shapes, thread counts and argument errors.

use half::f16;

use super::*;
use crate::quant::{dequantize, quantize, GgmlType};

const TYPES: &[GgmlType] = MATMUL_TYPES;

/// A small deterministic generator (xorshift64*), shared with the sparse operators' tests.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub(super) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Uniform integer in `lo..=hi`.
    pub(super) fn int(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u64) as i32
    }
    /// Uniform in `0..n`.
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Runs `f` on a rayon pool of `n` threads; on wasm32, which has no threads, on the calling
/// thread (the thread-count tests then check the single-threaded result there).
pub(super) fn in_pool<R: Send>(n: usize, f: impl FnOnce() -> R + Send) -> R {
    if cfg!(target_arch = "wasm32") {
        return f();
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
        .install(f)
}

/// The SIMD levels this CPU can run, scalar first.
fn levels() -> Vec<&'static str> {
    ["scalar", "simd128", "avx2", "avx512"]
        .into_iter()
        .filter(|name| Level::from_name(name).is_some_and(Level::available))
        .collect()
}

/// Columns to test for a type (a few block counts).
fn col_choices(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        256 => vec![256, 512, 1280],
        32 => vec![32, 96, 640],
        _ => vec![7, 64, 200],
    }
}

/// Random weights of `ty` quantised from smooth-ish random floats (with a few outliers).
pub(super) fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let v = rng.f();
            if i % 97 == 0 {
                4.0 * v
            } else {
                v
            }
        })
        .collect();
    let mut data = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
    quantize(ty, &f, &mut data).unwrap();
    data
}

fn run(simd: &str, w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    matmul_with_simd(simd, w, x, n, &mut y).unwrap();
    y
}

/// The bound on |x_i − x̃_i| that activation quantisation to `ty`'s dot type allows.
fn act_error_bound(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let kind = kind_for(ty).unwrap();
    let block = match kind {
        ActKind::Q8_0 | ActKind::Q8_1 => 32,
        ActKind::Q8K => 256,
        _ => 1,
    };
    x.chunks(block)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            b.iter().map(move |&v| match kind {
                ActKind::F32 => 0.0,
                ActKind::F16 => v.abs() * 2f32.powi(-11),
                ActKind::Bf16 => v.abs() * 2f32.powi(-8),
                // half a step, plus the f16 rounding of the scale times |q| <= 127
                _ => amax / 127.0 * 0.5 + amax * 2f32.powi(-11),
            })
        })
        .collect()
}

#[test]
fn scalar_matches_f32_reference_on_dequantised_weights() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for &ty in TYPES {
        for cols in col_choices(ty) {
            for &(rows, n) in &[(1, 1), (5, 3), (13, 17), (37, 4)] {
                let data = random_matrix(&mut rng, ty, rows, cols);
                let w = Matrix::new(ty, rows, cols, &data).unwrap();
                let mut wf = vec![0f32; rows * cols];
                dequantize(ty, &data, &mut wf).unwrap();
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
                let y = run("scalar", &w, &x, n);
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let e = act_error_bound(ty, xt);
                    for r in 0..rows {
                        let wr = &wf[r * cols..(r + 1) * cols];
                        let exact: f64 =
                            wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| (a as f64 * b as f64).abs())
                            .sum();
                        let bound: f64 = wr
                            .iter()
                            .zip(&e)
                            .map(|(&a, &b)| (a as f64).abs() * b as f64)
                            .sum();
                        let tol = bound * 1.01 + 1e-5 * mag + 1e-30;
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - exact).abs() <= tol,
                            "{ty} {rows}x{cols} n={n} t={t} r={r}: got {got}, exact {exact}, tol {tol}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn simd_paths_match_scalar_within_1e5() {
    let mut rng = Rng(0xfeed_beef_cafe_f00d);
    for &ty in TYPES {
        for cols in col_choices(ty) {
            for &(rows, n) in &[(1, 1), (7, 1), (13, 3), (33, 17), (4, 5)] {
                let data = random_matrix(&mut rng, ty, rows, cols);
                let w = Matrix::new(ty, rows, cols, &data).unwrap();
                let mut wf = vec![0f32; rows * cols];
                dequantize(ty, &data, &mut wf).unwrap();
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let reference = run("scalar", &w, &x, n);
                for simd in levels().into_iter().skip(1) {
                    let y = run(simd, &w, &x, n);
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        for r in 0..rows {
                            let wr = &wf[r * cols..(r + 1) * cols];
                            let mag: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                            let (a, b) = (y[t * rows + r], reference[t * rows + r]);
                            assert!(
                                (a - b).abs() <= 1e-5 * mag + 1e-30,
                                "{simd} {ty} {rows}x{cols} n={n} t={t} r={r}: {a} vs scalar {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Weight bytes whose every scale is 1 (and whose quants are random), so that with integer
/// activations whose block maximum is 127 every float operation of every path is exact.
fn unit_scale_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let one = f16::from_f32(1.0).to_bits().to_le_bytes();
    let nb = rows * cols / ty.block_size();
    let bb = ty.block_bytes();
    let mut data = Vec::with_capacity(nb * bb);
    for _ in 0..nb {
        let mut b = rng.bytes(bb);
        match ty {
            GgmlType::F32 => b = (rng.int(-20, 20) as f32).to_le_bytes().to_vec(),
            GgmlType::F16 => {
                b = f16::from_f32(rng.int(-20, 20) as f32)
                    .to_bits()
                    .to_le_bytes()
                    .to_vec()
            }
            GgmlType::BF16 => {
                b = half::bf16::from_f32(rng.int(-20, 20) as f32)
                    .to_bits()
                    .to_le_bytes()
                    .to_vec()
            }
            // d first
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => b[..2].copy_from_slice(&one),
            // d, m first
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                b[..2].copy_from_slice(&one);
                b[2..4].copy_from_slice(&one);
            }
            GgmlType::Q6_K => {
                // ql 128, qh 64, scales 16 (small, to keep sums below 2^24), d
                for s in &mut b[192..208] {
                    *s = rng.int(-4, 4) as i8 as u8;
                }
                b[208..210].copy_from_slice(&one);
            }
            _ => unreachable!(),
        }
        data.extend_from_slice(&b);
    }
    data
}

/// Integer activations in -4..=4 with one ±127 per 32 (so every Q8 scale is exactly 1).
fn unit_scale_acts(rng: &mut Rng, len: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..len).map(|_| rng.int(-4, 4) as f32).collect();
    for (i, b) in x.chunks_mut(32).enumerate() {
        let at = rng.int(0, b.len() as i32 - 1) as usize;
        b[at] = if i % 2 == 0 { 127.0 } else { -127.0 };
    }
    x
}

#[test]
fn simd_integer_parts_are_exact() {
    let mut rng = Rng(0x0dd_ba11_5eed);
    for &ty in TYPES {
        let cols_list: &[usize] = match ty.block_size() {
            256 => &[512, 768],
            32 => &[256, 288, 32],
            _ => &[96, 23],
        };
        for (&cols, &(rows, n)) in
            cols_list
                .iter()
                .cycle()
                .zip(&[(1, 1), (9, 1), (6, 3), (5, 17), (3, 2), (8, 4)])
        {
            let data = unit_scale_matrix(&mut rng, ty, rows, cols);
            let w = Matrix::new(ty, rows, cols, &data).unwrap();
            let x = unit_scale_acts(&mut rng, n * cols);
            let reference = run("scalar", &w, &x, n);
            for simd in levels().into_iter().skip(1) {
                let y = run(simd, &w, &x, n);
                for (i, (a, b)) in y.iter().zip(&reference).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{simd} {ty} {rows}x{cols} n={n} output {i}: {a} vs {b}"
                    );
                    assert_eq!(a.fract(), 0.0, "{ty}: not an integer");
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let mut rng = Rng(42);
    for &ty in &[GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16] {
        let (rows, cols, n) = (301, 512, 17);
        let data = random_matrix(&mut rng, ty, rows, cols);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
        let mut outs = Vec::new();
        for threads in [1, 3] {
            let mut y = vec![0f32; n * rows];
            in_pool(threads, || matmul(&w, &x, n, &mut y)).unwrap();
            outs.push(y);
        }
        assert_eq!(outs[0], outs[1], "{ty}");
    }
}

/// Continuous batching relies on it: a token's product has the same bits whether it runs alone
/// or in a batch of any size (the tiles, 1–4 rows × 1–4 tokens, give every (row, token) its own
/// accumulators), at every SIMD level, for every type.
#[test]
fn a_tokens_bits_do_not_depend_on_the_batch() {
    let mut rng = Rng(11);
    for level in levels() {
        for &ty in TYPES {
            let (rows, cols) = (7, 2 * ty.block_size());
            let data = random_matrix(&mut rng, ty, rows, cols);
            let w = Matrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..9 * cols).map(|_| rng.f()).collect();
            let alone = each_token_alone(level, &w, &x);
            for n in 2..=9 {
                let mut y = vec![0f32; n * rows];
                matmul_with_simd(level, &w, &x[..n * cols], n, &mut y).unwrap();
                for (t, yt) in y.chunks(rows).enumerate() {
                    let (a, b) = (bits(yt), bits(&alone[t]));
                    assert_eq!(a, b, "{level} {ty}: token {t} of {n}");
                }
            }
        }
    }
}

/// The AVX2 batch path that widens F16 and BF16 rows to f32 once per task (small batches per tile
/// of rows, long ones per task) gives each token the bits of its product alone: rows that span
/// several tasks and a partial last tile, columns with a 16-wide body, an 8-wide step and a
/// scalar tail.
#[test]
fn widened_float_batches_match_each_token_alone() {
    let mut rng = Rng(23);
    let (rows, cols, n_max) = (301, 16 * 12 + 8 + 3, 40);
    let x: Vec<f32> = (0..n_max * cols).map(|_| rng.f()).collect();
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let data = random_matrix(&mut rng, ty, rows, cols);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        for level in levels() {
            let alone = each_token_alone(level, &w, &x);
            for n in [3, 4, 8, 17, n_max] {
                for threads in [1, 2] {
                    let mut y = vec![0f32; n * rows];
                    in_pool(threads, || {
                        matmul_with_simd(level, &w, &x[..n * cols], n, &mut y)
                    })
                    .unwrap();
                    for (t, yt) in y.chunks(rows).enumerate() {
                        let (a, b) = (bits(yt), bits(&alone[t]));
                        assert_eq!(a, b, "{level} {ty}: token {t} of {n}, {threads} threads");
                    }
                }
            }
        }
    }
}

/// The product of each token of `x` (rows of `w.cols` values) run alone at `level`.
fn each_token_alone(level: &str, w: &Matrix, x: &[f32]) -> Vec<Vec<f32>> {
    x.chunks(w.cols)
        .map(|xt| {
            let mut y = vec![0f32; w.rows];
            matmul_with_simd(level, w, xt, 1, &mut y).unwrap();
            y
        })
        .collect()
}

/// The bit patterns of `v` (shared with the sparse operators' tests).
pub(super) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn nested_calls_inside_parallel_loops_work() {
    use rayon::prelude::*;
    let mut rng = Rng(7);
    let (rows, cols) = (64, 256);
    let data = random_matrix(&mut rng, GgmlType::Q4_K, rows, cols);
    let w = Matrix::new(GgmlType::Q4_K, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
    let mut want = vec![0f32; rows];
    matmul(&w, &x, 1, &mut want).unwrap();
    (0..16).into_par_iter().for_each(|_| {
        let mut y = vec![0f32; rows];
        matmul(&w, &x, 1, &mut y).unwrap();
        assert_eq!(y, want);
    });
}

#[test]
fn dequantize_row_matches_dequantize() {
    let mut rng = Rng(99);
    for &ty in TYPES {
        let (rows, cols) = (3, col_choices(ty)[1]);
        let data = random_matrix(&mut rng, ty, rows, cols);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let mut all = vec![0f32; rows * cols];
        dequantize(ty, &data, &mut all).unwrap();
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(&w, r, &mut row).unwrap();
            assert_eq!(row, all[r * cols..(r + 1) * cols], "{ty} row {r}");
        }
        assert!(dequantize_row(&w, rows, &mut row).is_err());
        assert!(dequantize_row(&w, 0, &mut row[1..]).is_err());
    }
}

#[test]
fn bad_arguments_are_errors() {
    let data = vec![0u8; 2 * 34];
    // size, block multiple, type
    assert!(Matrix::new(GgmlType::Q8_0, 2, 32, &data).is_ok());
    assert!(Matrix::new(GgmlType::Q8_0, 3, 32, &data).is_err());
    assert!(Matrix::new(GgmlType::Q8_0, 1, 48, &data).is_err());
    assert!(matches!(
        Matrix::new(GgmlType::Q2_K, 1, 256, &[0u8; 84]),
        Err(Error::UnsupportedType { op: "matmul", .. })
    ));
    assert!(matches!(
        Matrix::new(GgmlType::I32, 1, 1, &[0u8; 4]),
        Err(Error::UnsupportedType { .. })
    ));
    let w = Matrix::new(GgmlType::Q8_0, 2, 32, &data).unwrap();
    let x = vec![0f32; 64];
    let mut y = vec![0f32; 4];
    assert!(matmul(&w, &x, 2, &mut y).is_ok());
    assert!(matmul(&w, &x[..63], 2, &mut y).is_err());
    assert!(matmul(&w, &x, 2, &mut y[..3]).is_err());
    assert!(matmul(&w, &x, 3, &mut y).is_err());
    assert!(matmul(&w, &x, usize::MAX, &mut y).is_err());
    assert!(matmul(&w, &[], 0, &mut []).is_ok());
    // a hand-built, inconsistent matrix
    let bad = Matrix { rows: 5, ..w };
    assert!(matmul(&bad, &x, 2, &mut [0f32; 10]).is_err());
    assert!(matmul_with_simd("sse9", &w, &x, 2, &mut y).is_err());
}

#[test]
fn simd_level_is_named() {
    assert!(["scalar", "simd128", "avx2", "avx512"].contains(&simd_level()));
    if cfg!(all(target_arch = "wasm32", target_feature = "simd128"))
        && std::env::var_os("HOTCOLD_SIMD").is_none()
    {
        assert_eq!(simd_level(), "simd128");
        assert_eq!(levels(), ["scalar", "simd128"]);
    }
    assert_eq!(set_simd_level(simd_level()).unwrap(), simd_level());
    assert!(set_simd_level("sse9").is_err());
    if simd_level() != "scalar" {
        assert!(
            set_simd_level("scalar").is_err(),
            "the level is fixed once chosen"
        );
    }
}

#[test]
fn zero_activations_give_zero() {
    for &ty in TYPES {
        let cols = col_choices(ty)[0];
        let mut rng = Rng(5);
        let data = random_matrix(&mut rng, ty, 3, cols);
        let w = Matrix::new(ty, 3, cols, &data).unwrap();
        for simd in levels() {
            assert!(
                run(simd, &w, &vec![0f32; 2 * cols], 2)
                    .iter()
                    .all(|&v| v == 0.0),
                "{simd} {ty}"
            );
        }
    }
}

#[test]
fn simd_activation_quantisers_are_bit_exact() {
    use super::act::{quantize_q8k_row, Acts};
    let mut rng = Rng(0xabcdef);
    let cols = 1024;
    let mut rows: Vec<Vec<f32>> = (0..40)
        .map(|i| {
            (0..cols)
                .map(|j| match i % 5 {
                    0 => rng.f() * 10.0,
                    // small integers: many exact ties at .5 after scaling
                    1 => (rng.int(-40, 40) as f32) * 0.5,
                    2 => {
                        if j % 7 == 0 {
                            0.0
                        } else {
                            rng.f() * 1e-3
                        }
                    }
                    3 => rng.f() * 1e6,
                    _ => (rng.int(-127, 127) as f32) * 0.25,
                })
                .collect()
        })
        .collect();
    rows.push(vec![0.0; cols]);
    // the largest magnitude first negative, then positive, and vice versa
    let mut r = vec![1.0f32; cols];
    r[3] = -5.0;
    r[9] = 5.0;
    rows.push(r.clone());
    r[3] = 5.0;
    r[9] = -5.0;
    rows.push(r);
    let mut r = vec![0.5f32; cols];
    r[100] = f32::NAN;
    r[300] = f32::INFINITY;
    rows.push(r);
    for x in &rows {
        let nb = cols / 256;
        let (mut q0, mut d0, mut b0) = (vec![0i8; cols], vec![0f32; nb], vec![0i16; nb * 16]);
        let (mut q1, mut d1, mut b1) = (q0.clone(), d0.clone(), b0.clone());
        quantize_q8k_row(Level::Scalar, x, &mut q0, &mut d0, &mut b0);
        quantize_q8k_row(Level::current(), x, &mut q1, &mut d1, &mut b1);
        assert_eq!(q0, q1);
        assert_eq!(
            d0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(b0, b1);
        let (mut s, mut v) = (Acts::default(), Acts::default());
        s.quantize(Level::Scalar, ActKind::Q8_0, 0, x, 1, cols);
        v.quantize(Level::current(), ActKind::Q8_0, 0, x, 1, cols);
        if x.iter().all(|v| v.is_finite()) {
            assert_eq!(s.q, v.q);
            assert_eq!(s.d, v.d);
            assert_eq!(s.isum, v.isum);
        }
    }
}

#[test]
fn unaligned_weights_give_the_same_result() {
    let mut rng = Rng(31337);
    for &ty in TYPES {
        let (rows, cols, n) = (9, col_choices(ty)[1], 5);
        let data = random_matrix(&mut rng, ty, rows, cols);
        let mut shifted = vec![0u8; data.len() + 1];
        shifted[1..].copy_from_slice(&data);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
        for simd in levels() {
            let a = run(simd, &Matrix::new(ty, rows, cols, &data).unwrap(), &x, n);
            let b = run(
                simd,
                &Matrix::new(ty, rows, cols, &shifted[1..]).unwrap(),
                &x,
                n,
            );
            assert_eq!(a, b, "{simd} {ty}");
        }
    }
}

#[test]
fn f16_activation_rounding_is_the_scalar_rounding_bit_for_bit() {
    // random values over many binades, f16 ties, subnormals, overflow, infinities and NaNs with
    // payloads, at lengths that leave a tail
    let mut rng = Rng(0x0f16_0f16_0f16_0f16);
    let mut x: Vec<f32> = (0..4099)
        .map(|_| rng.f() * 2f32.powi(rng.int(-30, 20)))
        .collect();
    let tie = f32::from_bits(f16::from_f32(1.0).to_f32().to_bits() + (1 << 12));
    let specials = [
        tie,
        -tie,
        65520.0,
        65519.0,
        1e-8,
        -6e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7fa0_0001),
        f32::from_bits(0xffc1_2345),
        -0.0,
    ];
    for (i, s) in specials.iter().enumerate() {
        x[i * 37 % 4000] = *s;
    }
    for n in [1usize, 7, 8, 4099] {
        let x = &x[..n];
        let mut want = Acts::default();
        want.quantize(Level::Scalar, ActKind::F16, 0, x, 1, n);
        let mut got = Acts::default();
        got.quantize(Level::current(), ActKind::F16, 0, x, 1, n);
        let bits = |a: &Acts| a.f(0).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{n} values");
    }
}
