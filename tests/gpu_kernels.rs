//! Every GPU kernel against the CPU kernel it mirrors, on real weights (the default Gemma model's
//! FFN, requantised to the types it does not use), run on whatever adapter wgpu finds (Mesa's
//! lavapipe in CI: `.ci/run` installs it). Shapes are small: lavapipe is slow.

mod common;

use std::sync::{Arc, OnceLock};

use half::f16;
use hotcold::cpu::{self, ops, Matrix};
use hotcold::gpu::{AdapterChoice, AttentionShape, GpuContext, GpuMatrix, RopeSettings};
use hotcold::model::{FfnActivation, Model};
use hotcold::models::DefaultModel;
use hotcold::quant::{self, GgmlType};

/// One device for the whole file (creating one on lavapipe takes a while).
fn gpu() -> &'static GpuContext {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        GpuContext::new(AdapterChoice::Any)
            .expect("the GPU tests need an adapter (apt-get install mesa-vulkan-drivers)")
    })
}

fn gemma() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::open(common::model_path(DefaultModel::Gemma3_270m)).unwrap())
}

/// Deterministic activations with the spread of a residual stream (a few large values).
fn activations(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let u = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            if i % 97 == 0 {
                u * 40.0
            } else {
                u * 2.0
            }
        })
        .collect()
}

/// The first `rows` rows of a real tensor, dequantised.
fn real_rows(w: &hotcold::model::Weight, rows: usize) -> Vec<f32> {
    let m = gemma().matrix(w);
    let mut out = vec![0f32; rows * m.cols];
    for (r, row) in out.chunks_exact_mut(m.cols).enumerate() {
        cpu::dequantize_row(&m, r, row).unwrap();
    }
    out
}

/// `values` (rows of `cols`) quantised to `ty`.
fn quantised(ty: GgmlType, values: &[f32], cols: usize) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut bytes = vec![0u8; values.len() / cols * row_bytes];
    for (src, dst) in values
        .chunks_exact(cols)
        .zip(bytes.chunks_exact_mut(row_bytes))
    {
        quant::quantize(ty, src, dst).unwrap();
    }
    bytes
}

/// Asserts `got ≈ want`: every value within `rel` of the largest magnitude of `want` (the
/// kernels agree up to float summation order), and `want` not trivially zero.
fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: the reference is all zero");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}: [{i}] gpu {g} cpu {w} (scale {scale})"
        );
    }
}

/// The matvec types and a real Gemma tensor each is checked on: the model's own types as they
/// are, the others requantised from its FFN rows.
const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// A `rows × cols` matrix of real weights of type `ty` (`cols` a multiple of 256).
fn real_matrix(ty: GgmlType, rows: usize) -> (Vec<u8>, usize) {
    let layer = &gemma().layers[0];
    let down = layer.down.as_ref().expect("gemma has ffn_down");
    let values = real_rows(down, rows);
    (quantised(ty, &values, down.cols), down.cols)
}

#[test]
fn matvec_and_gather_match_cpu_for_every_type() {
    let ctx = gpu();
    for &ty in TYPES {
        let rows = 40;
        let (bytes, cols) = real_matrix(ty, rows);
        let m = Matrix::new(ty, rows, cols, &bytes).unwrap();
        let w = GpuMatrix::upload(ctx, &m).unwrap();
        for n in [1, 3] {
            let x = activations(n * cols, n as u32);
            let mut want = vec![0f32; n * rows];
            cpu::matmul(&m, &x, n, &mut want).unwrap();
            let got = ctx.matvec(&w, &x, n).unwrap();
            assert_close(&got, &want, 2e-5, &format!("{ty} matvec n={n}"));

            let idx: Vec<u32> = vec![0, 3, 4, 17, 17, 39];
            let mut want_g = vec![0f32; n * idx.len()];
            cpu::gather_matmul(&m, &idx, &x, n, &mut want_g).unwrap();
            let got_g = ctx.gather_matvec(&w, &idx, &x, n).unwrap();
            assert_close(&got_g, &want_g, 2e-5, &format!("{ty} gather n={n}"));
        }
    }
}

#[test]
fn a_pair_of_gathers_equals_two_gathers() {
    // Gate and up in one submission (one upload of x, one read-back).
    let ctx = gpu();
    let layer = &gemma().layers[0];
    let (gate, up) = (gemma().matrix(gate_of(layer)), gemma().matrix(&layer.up));
    let (g, u) = (
        GpuMatrix::upload(ctx, &gate).unwrap(),
        GpuMatrix::upload(ctx, &up).unwrap(),
    );
    let x = activations(2 * gate.cols, 9);
    let idx = [3u32, 8, 100, 2047];
    let pair = ctx
        .submit_gather_matvec_pair(&g, &u, &idx, &x, 2)
        .unwrap()
        .wait(ctx)
        .unwrap();
    let mut want = ctx.gather_matvec(&g, &idx, &x, 2).unwrap();
    want.extend(ctx.gather_matvec(&u, &idx, &x, 2).unwrap());
    assert_eq!(pair, want);
    let (bytes, cols) = real_matrix(GgmlType::Q8_0, 4);
    let other = GpuMatrix::upload(ctx, &Matrix::new(GgmlType::Q8_0, 4, cols, &bytes).unwrap());
    assert!(ctx
        .submit_gather_matvec_pair(&g, &other.unwrap(), &[0], &x, 2)
        .is_err());
}

#[test]
fn the_models_own_tensors_match_cpu() {
    // Gemma's layer-0 FFN in the file's own types (Q4_K_M mixes K-quants with fallbacks).
    let ctx = gpu();
    let layer = &gemma().layers[0];
    for w in [gate_of(layer), &layer.up, layer.down.as_ref().unwrap()] {
        let m = gemma().matrix(w);
        let g = GpuMatrix::upload(ctx, &m).unwrap();
        let x = activations(m.cols, 7);
        let mut want = vec![0f32; m.rows];
        cpu::matmul(&m, &x, 1, &mut want).unwrap();
        assert_close(&ctx.matvec(&g, &x, 1).unwrap(), &want, 2e-5, &w.name);
    }
}

#[test]
fn chunked_weights_give_the_same_products() {
    let mut small = GpuContext::new(AdapterChoice::Any).unwrap();
    let ctx = Arc::get_mut(&mut small).unwrap();
    let (bytes, cols) = real_matrix(GgmlType::Q4_0, 24);
    let m = Matrix::new(GgmlType::Q4_0, 24, cols, &bytes).unwrap();
    let row_bytes = bytes.len() / 24;
    ctx.set_max_binding_bytes((5 * row_bytes + 4) as u64);
    let w = GpuMatrix::upload(ctx, &m).unwrap();
    assert_eq!(w.n_chunks(), 5);
    let x = activations(2 * cols, 3);
    let mut want = vec![0f32; 2 * 24];
    cpu::matmul(&m, &x, 2, &mut want).unwrap();
    assert_close(&ctx.matvec(&w, &x, 2).unwrap(), &want, 2e-5, "chunked");
    let idx = [1u32, 4, 5, 9, 10, 23];
    let mut want_g = vec![0f32; 2 * idx.len()];
    cpu::gather_matmul(&m, &idx, &x, 2, &mut want_g).unwrap();
    let got = ctx.gather_matvec(&w, &idx, &x, 2).unwrap();
    assert_close(&got, &want_g, 2e-5, "chunked gather");
}

#[test]
fn sparse_axpy_matches_cpu() {
    let ctx = gpu();
    let layer = &gemma().layers[0];
    // Neuron-major down rows: real gate rows stand in (n_ff rows of n_embd).
    let rows = 64;
    let values = real_rows(gate_of(layer), rows);
    let cols = gate_of(layer).cols;
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
    ] {
        let bytes = quantised(ty, &values, cols);
        let m = Matrix::new(ty, rows, cols, &bytes).unwrap();
        let n = 2;
        let mut a = activations(n * rows, 11);
        // ~70% zeros, as in a sparse FFN
        a.iter_mut()
            .enumerate()
            .filter(|(i, _)| i % 10 < 7)
            .for_each(|(_, v)| *v = 0.0);
        cpu::round_like_matmul_input(ty, &mut a, n, rows).unwrap();
        let mut want = vec![0f32; n * cols];
        cpu::sparse_axpy(&m, &a, n, &mut want).unwrap();
        // The GPU takes the held rows and their coefficients (all of them here).
        let w = GpuMatrix::upload(ctx, &m).unwrap();
        let idx: Vec<u32> = (0..rows as u32).collect();
        let got = ctx.sparse_axpy(&w, &idx, &a, n).unwrap();
        assert_close(&got, &want, 1e-5, &format!("{ty} axpy"));
    }
}

#[test]
fn predictor_matches_cpu() {
    let ctx = gpu();
    let layer = &gemma().layers[0];
    let (n_embd, rank, n_ff) = (gate_of(layer).cols, 32, 96);
    for ty in [GgmlType::F16, GgmlType::F32] {
        let fc1v = real_rows(&layer.up, rank);
        let fc2v: Vec<f32> = real_rows(&layer.wq, n_ff)
            .chunks_exact(n_embd)
            .flat_map(|r| r[..rank].to_vec())
            .collect();
        let (b1, b2) = (quantised(ty, &fc1v, n_embd), quantised(ty, &fc2v, rank));
        let fc1 = Matrix::new(ty, rank, n_embd, &b1).unwrap();
        let fc2 = Matrix::new(ty, n_ff, rank, &b2).unwrap();
        let x = activations(2 * n_embd, 5);
        let mut hidden = vec![0f32; 2 * rank];
        cpu::matmul(&fc1, &x, 2, &mut hidden).unwrap();
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut want = vec![0f32; 2 * n_ff];
        cpu::matmul(&fc2, &hidden, 2, &mut want).unwrap();
        let (g1, g2) = (
            GpuMatrix::upload(ctx, &fc1).unwrap(),
            GpuMatrix::upload(ctx, &fc2).unwrap(),
        );
        let got = ctx.predictor(&g1, &g2, &x, 2).unwrap();
        assert_close(&got, &want, 1e-4, &format!("{ty} predictor"));
    }
}

#[test]
fn rms_norm_rope_softmax_match_cpu() {
    let ctx = gpu();
    let hp = &gemma().hp;
    let layer = &gemma().layers[0];
    let x = activations(3 * hp.n_embd, 21);
    let got = ctx
        .rms_norm(&x, &layer.attn_norm.weight, hp.rms_eps)
        .unwrap();
    let mut want = x.clone();
    want.chunks_exact_mut(hp.n_embd)
        .for_each(|r| ops::rms_norm(r, &layer.attn_norm.weight, hp.rms_eps));
    assert_close(&got, &want, 1e-5, "rms_norm");

    for style in [ops::RopeStyle::Normal, ops::RopeStyle::Neox] {
        let (n_heads, hd) = (hp.n_head, hp.head_dim);
        let q = activations(2 * n_heads * hd, 4);
        let settings = RopeSettings {
            style,
            n_rot: hp.n_rot,
            freq_base: hp.rope_base,
            freq_scale: hp.rope_freq_scale,
        };
        let got = ctx.rope(&q, n_heads, hd, settings, 37).unwrap();
        let rope = ops::Rope::new(style, hp.n_rot, hp.rope_base, hp.rope_freq_scale);
        let mut want = q.clone();
        let mut angles = Vec::new();
        for (t, row) in want.chunks_exact_mut(n_heads * hd).enumerate() {
            rope.angles(37 + t, &mut angles);
            rope.apply(row, hd, &angles);
        }
        assert_close(&got, &want, 1e-5, &format!("rope {style:?}"));
    }

    let s = activations(4 * 300, 8);
    let got = ctx.softmax(&s, 300).unwrap();
    let mut want = s.clone();
    want.chunks_exact_mut(300).for_each(ops::softmax);
    assert_close(&got, &want, 1e-5, "softmax");
}

#[test]
fn attention_over_the_cache_matches_cpu() {
    let ctx = gpu();
    // GQA (4 query heads per KV head), a sliding window, two new tokens after 29 cached.
    let (n_head, n_head_kv, hd) = (4usize, 1usize, 64usize);
    let n_ctx = 40;
    let keys: Vec<f16> = activations(n_ctx * n_head_kv * hd, 1)
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let values: Vec<f16> = activations(n_ctx * n_head_kv * hd, 2)
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let q = activations(2 * n_head * hd, 3);
    for window in [None, Some(8)] {
        let shape = AttentionShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            head_dim_v: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
        };
        let got = ctx.attention(&q, &keys, &values, &shape, 29).unwrap();
        let want = cpu_attention(&q, &keys, &values, &shape, 29);
        assert_close(&got, &want, 1e-4, &format!("attention window {window:?}"));
    }
}

/// The CPU engine's attention (`engine::attention::attend`), restated for one KV layout.
fn cpu_attention(q: &[f32], k: &[f16], v: &[f16], s: &AttentionShape, pos0: usize) -> Vec<f32> {
    let (hd, hd_v) = (s.head_dim, s.head_dim_v);
    let group = s.n_head / s.n_head_kv;
    let n_tokens = q.len() / (s.n_head * hd);
    let mut out = vec![0f32; n_tokens * s.n_head * hd_v];
    for t in 0..n_tokens {
        let p = pos0 + t;
        let first = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        for h in 0..s.n_head {
            let kvh = h / group;
            let qh: Vec<f32> = q[(t * s.n_head + h) * hd..][..hd]
                .iter()
                .map(|&x| f16::from_f32(x).to_f32())
                .collect();
            let mut w: Vec<f32> = (first..=p)
                .map(|j| {
                    let kj: Vec<f32> = k[(j * s.n_head_kv + kvh) * hd..][..hd]
                        .iter()
                        .map(|x| x.to_f32())
                        .collect();
                    ops::dot_f32(&qh, &kj) * s.scale
                })
                .collect();
            ops::softmax(&mut w);
            let o = &mut out[(t * s.n_head + h) * hd_v..][..hd_v];
            for (jj, j) in (first..=p).enumerate() {
                let p16 = f16::from_f32(w[jj]).to_f32();
                for (d, o) in o.iter_mut().enumerate() {
                    *o += p16 * v[(j * s.n_head_kv + kvh) * hd_v + d].to_f32();
                }
            }
        }
    }
    out
}

#[test]
fn elementwise_kernels_match_cpu() {
    let ctx = gpu();
    let gate = activations(5000, 31);
    let up = activations(5000, 32);
    for act in [
        FfnActivation::Silu,
        FfnActivation::Gelu,
        FfnActivation::Relu,
        FfnActivation::DRelu,
    ] {
        let got = ctx.combine(act, &gate, &up).unwrap();
        let want: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| act.combine(g, u))
            .collect();
        // GELU goes through ggml's table on both sides: exact. SiLU's exp may differ in the
        // last bits.
        let rel = if act == FfnActivation::Silu {
            1e-6
        } else {
            0.0
        };
        assert_close(&got, &want, rel, &format!("{act:?}"));
    }
    let sum = ctx.add(&gate, &up).unwrap();
    let want: Vec<f32> = gate.iter().zip(&up).map(|(a, b)| a + b).collect();
    assert_close(&sum, &want, 0.0, "add");
    let scaled = ctx.scale(&gate, 0.375).unwrap();
    let want: Vec<f32> = gate.iter().map(|a| a * 0.375).collect();
    assert_close(&scaled, &want, 0.0, "scale");
}

#[test]
fn bad_arguments_are_errors() {
    let ctx = gpu();
    let (bytes, cols) = real_matrix(GgmlType::Q8_0, 4);
    let m = Matrix::new(GgmlType::Q8_0, 4, cols, &bytes).unwrap();
    let w = GpuMatrix::upload(ctx, &m).unwrap();
    assert!(ctx.matvec(&w, &[0.0; 3], 1).is_err());
    assert!(ctx.gather_matvec(&w, &[4], &vec![0.0; cols], 1).is_err());
    assert!(ctx.gather_matvec(&w, &[2, 1], &vec![0.0; cols], 1).is_err());
    assert!(ctx.softmax(&[1.0; 5], 2).is_err());
    let q41 = vec![0u8; GgmlType::Q4_1.row_bytes(32).unwrap() as usize];
    let m41 = Matrix::new(GgmlType::Q4_1, 1, 32, &q41).unwrap();
    assert!(GpuMatrix::upload(ctx, &m41).is_err());
}

/// Gemma's FFN gate (every Gemma layer has one).
fn gate_of(layer: &hotcold::model::LayerWeights) -> &hotcold::model::Weight {
    layer.gate.as_ref().expect("Gemma's FFN has a gate")
}
