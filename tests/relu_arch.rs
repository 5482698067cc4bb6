//! Falcon and OPT (PowerInfer's other ReLU architectures) on synthetic models (`synth --arch
//! falcon|opt`): the oracle equals the dense path, the predictor path equals it too (its
//! predictors are exact in sign), on F16, Q8_0 and Q4_0; their specific steps (fused QKV,
//! LayerNorm with bias, learned positions, biases) are checked against a plain reference forward
//! pass written from PowerInfer's `build_falcon` / `build_opt`.

mod common;

use std::sync::Arc;

use hotcold::engine::{thread_pool, FfnMode, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::model::{Model, PredictorTypes};
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig};
use hotcold::tokenizer::Tokenizer;

/// Largest |oracle − dense| of a logit: the oracle only skips neurons that are exactly zero.
const ORACLE_TOLERANCE: f32 = 1e-4;

const ARCHS: [SynthArch; 2] = [SynthArch::Falcon, SynthArch::Opt];
const TYPES: [GgmlType; 3] = [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0];

fn tiny(arch: SynthArch, ty: GgmlType) -> (Model, Tokenizer) {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.arch = arch;
    cfg.ty = ty;
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    (Model::from_file(file).unwrap(), tokenizer)
}

/// Greedy continuation on 2 threads, and the logits of every step.
fn greedy(model: &Model, mode: FfnMode, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    common::greedy_with_logits(model, mode, prompt, n, 2)
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Largest |sparse − dense| of a logit. The predictor is exact in sign for the weights before
/// quantisation, and `synth`'s threshold margin covers F16 and Q8_0 rounding; Q4_0's rounding of
/// `ffn_up` (±0.25 in logit units) can exceed it for neurons whose pre-activation is that close to
/// zero, so the predictor misses a few barely-active neurons (recall ≥ 0.99, checked by `synth`'s
/// tests) and the logits move by a few hundredths.
fn sparse_tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::Q4_0 => 0.1,
        _ => ORACLE_TOLERANCE,
    }
}

const PROMPT: &str = "When in the course of human events, it becomes necessary for one people";

#[test]
fn oracle_and_sparse_equal_dense_on_falcon_and_opt() {
    for arch in ARCHS {
        for ty in TYPES {
            let (model, tok) = tiny(arch, ty);
            let prompt = tok.encode(PROMPT, true, false).unwrap();
            let (dense_tokens, dense) = greedy(&model, FfnMode::Dense, &prompt, 16);
            let (oracle_tokens, oracle) = greedy(&model, FfnMode::Oracle, &prompt, 16);
            let (sparse_tokens, sparse) = greedy(&model, FfnMode::Sparse, &prompt, 16);
            let (o, s) = (max_diff(&dense, &oracle), max_diff(&dense, &sparse));
            eprintln!("{arch:?} {ty}: oracle {o:e}, sparse {s:e}, tokens {dense_tokens:?}");
            assert_eq!(oracle_tokens, dense_tokens, "{arch:?} {ty}: oracle");
            assert!(
                o <= ORACLE_TOLERANCE,
                "{arch:?} {ty}: oracle logits differ by {o}"
            );
            assert_eq!(sparse_tokens, dense_tokens, "{arch:?} {ty}: sparse");
            let tolerance = sparse_tolerance(ty);
            assert!(s <= tolerance, "{arch:?} {ty}: sparse logits differ by {s}");
        }
    }
}

/// A plain f32 forward pass written from PowerInfer's `build_falcon` and `build_opt` (dense
/// weights dequantised by name, nothing shared with the engine): every position's logits.
mod reference {
    use hotcold::gguf::GgufFile;
    use hotcold::quant::dequantize;

    pub struct Reference<'a> {
        file: &'a GgufFile,
        arch: &'a str,
        n_head: usize,
        n_head_kv: usize,
        eps: f32,
    }

    fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn add(x: &mut [f32], y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }

    impl<'a> Reference<'a> {
        pub fn new(file: &'a GgufFile) -> Reference<'a> {
            let arch = file.architecture().unwrap();
            let key = |k: &str| format!("{arch}.{k}");
            Reference {
                file,
                arch,
                n_head: file.require_u64(&key("attention.head_count")).unwrap() as usize,
                n_head_kv: file.require_u64(&key("attention.head_count_kv")).unwrap() as usize,
                eps: file
                    .get_f32(&key("attention.layer_norm_epsilon"))
                    .unwrap()
                    .unwrap(),
            }
        }

        fn t(&self, name: &str) -> Vec<f32> {
            let info = self.file.require_tensor(name).unwrap();
            let mut out = vec![0f32; info.n_elements() as usize];
            dequantize(info.ty, self.file.tensor_data(info), &mut out).unwrap();
            out
        }

        fn layer_norm(&self, x: &[f32], prefix: &str) -> Vec<f32> {
            let (w, b) = (
                self.t(&format!("{prefix}.weight")),
                self.t(&format!("{prefix}.bias")),
            );
            let n = x.len() as f32;
            let mean = x.iter().sum::<f32>() / n;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
            let s = 1.0 / (var + self.eps).sqrt();
            x.iter()
                .zip(w.iter().zip(&b))
                .map(|(v, (w, b))| (v - mean) * s * w + b)
                .collect()
        }

        /// NEOX RoPE (Falcon), base 10000, every dimension of each head rotated.
        fn rope(x: &mut [f32], head_dim: usize, pos: usize) {
            let half = head_dim / 2;
            for head in x.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let theta = pos as f32 * 10000f32.powf(-2.0 * i as f32 / head_dim as f32);
                    let (s, c) = theta.sin_cos();
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * c - b * s;
                    head[i + half] = a * s + b * c;
                }
            }
        }

        pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
            let falcon = self.arch == "falcon";
            let embd = self.t("token_embd.weight");
            let e = self.file.require_tensor("token_embd.weight").unwrap().shape[0] as usize;
            let n_layer = self
                .file
                .require_u64(&format!("{}.block_count", self.arch))
                .unwrap() as usize;
            let hd = e / self.n_head;
            let kv_w = self.n_head_kv * hd;
            let mut xs: Vec<Vec<f32>> = tokens
                .iter()
                .enumerate()
                .map(|(p, &t)| {
                    let mut x = embd[t as usize * e..(t as usize + 1) * e].to_vec();
                    if !falcon {
                        let pos = self.t("position_embd.weight");
                        add(&mut x, &pos[(p + 2) * e..(p + 3) * e]);
                    }
                    x
                })
                .collect();
            for il in 0..n_layer {
                let n = |s: &str| format!("blk.{il}.{s}");
                let (mut keys, mut values) = (Vec::new(), Vec::new());
                for (p, x) in xs.iter_mut().enumerate() {
                    let h = self.layer_norm(x, &n("attn_norm"));
                    let (mut q, mut k, v) = if falcon {
                        // Falcon-40B: the attention has its own norm, `attn_norm` feeds the FFN
                        let attn_in = match self.file.tensor(&n("attn_norm_2.weight")) {
                            Some(_) => self.layer_norm(x, &n("attn_norm_2")),
                            None => h.clone(),
                        };
                        let qkv = matvec(&self.t(&n("attn_qkv.weight")), &attn_in);
                        (
                            qkv[..e].to_vec(),
                            qkv[e..e + kv_w].to_vec(),
                            qkv[e + kv_w..].to_vec(),
                        )
                    } else {
                        let proj = |role: &str| {
                            let mut y = matvec(&self.t(&n(&format!("{role}.weight"))), &h);
                            add(&mut y, &self.t(&n(&format!("{role}.bias"))));
                            y
                        };
                        (proj("attn_q"), proj("attn_k"), proj("attn_v"))
                    };
                    if falcon {
                        Self::rope(&mut q, hd, p);
                        Self::rope(&mut k, hd, p);
                    }
                    keys.push(k);
                    values.push(v);
                    let mut out = vec![0f32; e];
                    for head in 0..self.n_head {
                        let kvh = head / (self.n_head / self.n_head_kv);
                        let qh = &q[head * hd..(head + 1) * hd];
                        let scores: Vec<f32> = keys
                            .iter()
                            .map(|k| {
                                let kh = &k[kvh * hd..(kvh + 1) * hd];
                                qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>()
                                    / (hd as f32).sqrt()
                            })
                            .collect();
                        let max = scores.iter().cloned().fold(f32::MIN, f32::max);
                        let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                        let sum: f32 = w.iter().sum();
                        for (wj, vj) in w.iter().zip(&values) {
                            for d in 0..hd {
                                out[head * hd + d] += wj / sum * vj[kvh * hd + d];
                            }
                        }
                    }
                    let mut attn = matvec(&self.t(&n("attn_output.weight")), &out);
                    if !falcon {
                        add(&mut attn, &self.t(&n("attn_output.bias")));
                    }
                    // Falcon: the FFN reads the block's input (h); OPT: the residual after attention
                    let ffn_in = if falcon {
                        h
                    } else {
                        add(x, &attn);
                        self.layer_norm(x, &n("ffn_norm"))
                    };
                    let mut up = matvec(&self.t(&n("ffn_up.weight")), &ffn_in);
                    if !falcon {
                        add(&mut up, &self.t(&n("ffn_up.bias")));
                    }
                    let down_t = self.t(&n("ffn_down_t.weight"));
                    let mut ffn = vec![0f32; e];
                    for (i, u) in up.iter().enumerate() {
                        if *u > 0.0 {
                            for (o, w) in ffn.iter_mut().zip(&down_t[i * e..(i + 1) * e]) {
                                *o += u * w;
                            }
                        }
                    }
                    if falcon {
                        add(x, &attn);
                    } else {
                        add(&mut ffn, &self.t(&n("ffn_down_t.bias")));
                    }
                    add(x, &ffn);
                }
            }
            let head = match self.file.tensor("output.weight") {
                Some(_) => self.t("output.weight"),
                None => embd,
            };
            xs.iter()
                .map(|x| matvec(&head, &self.layer_norm(x, "output_norm")))
                .collect()
        }
    }
}

/// Largest |engine − reference| of a logit on F16 weights: the engine rounds matmul inputs,
/// queries and attention weights to f16 as ggml does; the reference stays in f32.
const REFERENCE_TOLERANCE: f32 = 0.02;

#[test]
fn falcon_and_opt_match_a_plain_reference_forward_pass() {
    // Falcon-7B's multi-query attention (one KV head) splits the fused QKV unevenly.
    // Falcon-40B's second norm (`attn_norm_2`, for the attention) is added to a Falcon file.
    let cases = [
        (SynthArch::Falcon, 1, false),
        (SynthArch::Falcon, 4, true),
        (SynthArch::Opt, 2, false),
    ];
    for (arch, n_head_kv, norm_2) in cases {
        let mut cfg = SynthConfig::preset("tiny").unwrap();
        cfg.arch = arch;
        cfg.n_head_kv = n_head_kv;
        let (mut writer, _) = synth::build(&cfg).unwrap();
        if norm_2 {
            for il in 0..cfg.n_layer {
                for (part, base) in [("weight", 1.0f32), ("bias", 0.0)] {
                    let values: Vec<u8> = (0..cfg.n_embd)
                        .map(|j| base + 0.3 * ((j * 7 + il) as f32).sin())
                        .flat_map(f32::to_le_bytes)
                        .collect();
                    let shape = [cfg.n_embd as u64];
                    let name = format!("blk.{il}.attn_norm_2.{part}");
                    writer
                        .add_tensor(name, GgmlType::F32, &shape, values)
                        .unwrap();
                }
            }
        }
        let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let model = Model::from_file(file.clone()).unwrap();
        let prompt = tok.encode(PROMPT, true, false).unwrap();
        let expected = reference::Reference::new(&file).logits(&prompt);
        let mut session = Session::new(&model, 256, thread_pool(2).unwrap());
        session.set_ffn_mode(FfnMode::Dense).unwrap();
        let got = session.eval(&prompt, Logits::All).unwrap();
        let got: Vec<Vec<f32>> = got.chunks(model.hp.n_vocab).map(<[f32]>::to_vec).collect();
        let worst = max_diff(&expected, &got);
        let spread = expected
            .iter()
            .flatten()
            .map(|v| v.abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{arch:?}, {n_head_kv} KV heads, attn_norm_2 {norm_2}: worst logit difference {worst:e} (largest |logit| \
             {spread})"
        );
        assert!(worst <= REFERENCE_TOLERANCE, "{arch:?}: {worst}");
        for (p, (a, b)) in expected.iter().zip(&got).enumerate() {
            let (ra, rb) = (hotcold::sample::argmax(a), hotcold::sample::argmax(b));
            assert_eq!(ra, rb, "{arch:?}: argmax at position {p}");
        }
    }
}

#[test]
fn opt_rejects_positions_past_its_table() {
    let (model, _) = tiny(SynthArch::Opt, GgmlType::Q8_0);
    assert_eq!(model.hp.n_ctx_train, synth::OPT_POSITIONS - 2);
    let mut session = Session::new(&model, 4096, thread_pool(1).unwrap());
    let tokens = vec![5u32; synth::OPT_POSITIONS - 1];
    let err = session.eval(&tokens, Logits::Last).unwrap_err().to_string();
    assert!(err.contains("learned positions"), "{err}");
}

/// The predictors' in-memory copies (the default: Q8_0, fc2 Q4_0 in a Q4_0 model; and both as
/// Q4_0, `--predictor-type q4_0`) keep the sparse path's tokens those of the dense path and its
/// logits within [`sparse_tolerance`] (Q4_0 Llama: 0.032 with Q8_0 predictors, 0.047 with Q4_0).
#[test]
fn quantised_predictor_copy_keeps_the_sparse_path_exact() {
    let (q8, q4) = (GgmlType::Q8_0, GgmlType::Q4_0);
    let default = |fc2| PredictorTypes { fc1: q8, fc2 };
    for (arch, ty, types, is_default) in [
        (SynthArch::Llama, GgmlType::F16, default(q8), true),
        (SynthArch::Falcon, GgmlType::F16, default(q8), true),
        (SynthArch::Opt, GgmlType::Q8_0, default(q8), true),
        (SynthArch::Llama, q4, default(q4), true),
        (SynthArch::Falcon, q4, default(q4), true),
        (SynthArch::Llama, q4, PredictorTypes::both(q4), false),
    ] {
        let (mut model, tok) = tiny(arch, ty);
        let prompt = tok.encode(PROMPT, true, false).unwrap();
        let (dense_tokens, dense) = greedy(&model, FfnMode::Dense, &prompt, 16);
        let bytes = |m: &Model, fc2: bool| -> u64 {
            m.layers
                .iter()
                .flat_map(|l| l.predictor.as_ref())
                .map(|p| if fc2 { &p.fc2 } else { &p.fc1 }.n_bytes())
                .sum()
        };
        let before = [bytes(&model, false), bytes(&model, true)];
        assert_eq!(model.default_predictor_types() == Some(types), is_default);
        model.quantize_predictors(types).unwrap();
        // F16 is 64 bytes per 32 values
        for (layer, (fc2, ty)) in [(false, types.fc1), (true, types.fc2)].iter().enumerate() {
            let want = before[layer] / 64 * ty.block_bytes() as u64;
            assert_eq!(bytes(&model, *fc2), want, "{arch:?}: {ty} bytes");
        }
        let p = model.layers[0].predictor.as_ref().unwrap();
        assert_eq!((p.fc1.ty, p.fc2.ty), (types.fc1, types.fc2));
        assert_eq!(
            model.default_predictor_types(),
            None,
            "quantised predictors stay"
        );
        let (sparse_tokens, sparse) = greedy(&model, FfnMode::Sparse, &prompt, 16);
        let worst = max_diff(&dense, &sparse);
        eprintln!("{arch:?} {ty}, {types:?}: sparse vs dense {worst:e}");
        assert_eq!(sparse_tokens, dense_tokens, "{arch:?} {ty} {types:?}");
        assert!(worst <= sparse_tolerance(ty), "{arch:?} {ty}: {worst}");
    }
}
