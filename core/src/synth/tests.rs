use super::*;
use crate::gguf::GgufFile;
use crate::model::PredictorTypes;
use crate::quant::{dequantize, QK};
use crate::tokenizer::Tokenizer;

const PARAGRAPH: &str = "When the children came home from school, their mother was waiting at \
the door with a warm meal. They told her about the new teacher, the long walk along the river and \
the small dog that had followed them all the way through the town. After dinner the family sat \
together and talked about their plans for the summer, when the days are long and the fields are \
green. Father said that they could travel to the sea, or visit the mountains in the north, if the \
weather was good and the work on the farm was done.";

fn tiny(ty: GgmlType, arch: SynthArch) -> GgufFile {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.ty = ty;
    cfg.arch = arch;
    let (w, _) = build(&cfg).unwrap();
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn matrix(file: &GgufFile, name: &str) -> (Vec<f32>, usize) {
    let t = file.require_tensor(name).unwrap();
    let mut out = vec![0.0f32; t.n_elements() as usize];
    dequantize(t.ty, file.tensor_data(t), &mut out).unwrap();
    (out, t.shape[0] as usize)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The norm's positive scale `s` of a residual row: `h = s·(x or centred x)·w (+ b)`.
fn norm_scale(arch: SynthArch, x: &[f32]) -> f32 {
    let e = x.len() as f32;
    if arch.layer_norm() {
        let mean = x.iter().sum::<f32>() / e;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / e;
        1.0 / (var + 1e-5).sqrt()
    } else {
        1.0 / (dot(x, x) / e + 1e-5).sqrt()
    }
}

#[test]
fn predictor_is_exact() {
    let d = Dims {
        n_embd: 64,
        n_ff: 96,
        n_head: 4,
        n_head_kv: 4,
        rank: 8,
        c0: C0,
        alpha: ALPHA,
    };
    for arch in ARCHS {
        let mut frng = Rng::new(1);
        let freq = layer::zipf_frequencies(&mut frng, d.n_ff, 0.1, 1.2);
        let lw = layer::build(&d, arch, 7, 0, 1.0, &freq);
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            let mut x = vec![0.0f32; 64];
            rng.fill_normal(&mut x, 1.0);
            x[0] = C0;
            let hidden: Vec<f32> = lw.fc1.chunks(64).map(|r| dot(r, &x).max(0.0)).collect();
            assert_eq!(hidden.len(), 2 * d.rank);
            let h = layer::ffn_input(arch, &lw, &x);
            let s = norm_scale(arch, &x);
            for i in 0..d.n_ff {
                let pred = dot(&lw.fc2[i * 16..(i + 1) * 16], &hidden);
                // the pre-activation that decides the neuron, biases included
                let decider = lw.gate.as_ref().unwrap_or(&lw.up);
                let u = dot(&decider[i * 64..(i + 1) * 64], &h)
                    + match (&lw.gate, &lw.up_b) {
                        (None, Some(b)) => b[i],
                        _ => 0.0,
                    };
                assert!(
                    (pred * s - u).abs() < 1e-4 * (1.0 + u.abs()),
                    "{arch:?}: {pred} · {s} vs {u}"
                );
            }
        }
    }
}

const ARCHS: [SynthArch; 4] = [
    SynthArch::Llama,
    SynthArch::Bamboo,
    SynthArch::Falcon,
    SynthArch::Opt,
];

#[test]
fn deterministic_for_a_seed() {
    let cfg = SynthConfig::preset("tiny").unwrap();
    let a = build(&cfg).unwrap().0.to_bytes().unwrap();
    let b = build(&cfg).unwrap().0.to_bytes().unwrap();
    assert!(a == b);
    let mut other = cfg.clone();
    other.seed = 1;
    let c = build(&other).unwrap().0.to_bytes().unwrap();
    assert!(a != c);
}

#[test]
fn tiny_file_has_powerinfer_layout() {
    for (ty, arch) in [
        (GgmlType::F16, SynthArch::Llama),
        (GgmlType::Q4_0, SynthArch::Bamboo),
        (GgmlType::Q8_0, SynthArch::Llama),
    ] {
        let mut cfg = SynthConfig::preset("tiny").unwrap();
        cfg.ty = ty;
        cfg.arch = arch;
        let (w, report) = build(&cfg).unwrap();
        let bytes = w.to_bytes().unwrap();
        assert!(bytes.len() < 2 << 20, "tiny is {} bytes", bytes.len());
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.magic(), Magic::PowerInfer);
        assert_eq!(f.version(), 3);
        assert_eq!(f.architecture().unwrap(), arch.name());
        assert_eq!(
            f.get_str("hotcold.ffn_activation").unwrap(),
            Some(arch.activation())
        );
        assert_eq!(
            f.get_f32("powerinfer.sparse_threshold").unwrap(),
            Some(cfg.threshold())
        );
        let a = arch.name();
        assert_eq!(
            f.require_u64(&format!("{a}.feed_forward_length")).unwrap(),
            512
        );
        let (e, ff, v, r2) = (128u64, 512u64, 1000u64, 32u64);
        let mut expected: Vec<(String, Vec<u64>, GgmlType)> = vec![
            ("token_embd.weight".into(), vec![e, v], ty),
            ("output_norm.weight".into(), vec![e], GgmlType::F32),
            ("output.weight".into(), vec![e, v], ty),
        ];
        for il in 0..2 {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            expected.extend([
                (n("attn_norm"), vec![e], GgmlType::F32),
                (n("attn_q"), vec![e, e], ty),
                (n("attn_k"), vec![e, e], ty),
                (n("attn_v"), vec![e, e], ty),
                (n("attn_output"), vec![e, e], ty),
                (n("ffn_norm"), vec![e], GgmlType::F32),
                (n("ffn_gate"), vec![e, ff], ty),
                (n("ffn_up"), vec![e, ff], ty),
                (n("ffn_down_t"), vec![e, ff], ty),
                (n("fc1"), vec![e, r2], GgmlType::F16),
                (n("fc2"), vec![r2, ff], GgmlType::F16),
            ]);
        }
        assert_eq!(f.tensors().len(), expected.len());
        assert_eq!(report.n_tensors, expected.len());
        for (name, shape, t) in expected {
            let info = f.require_tensor(&name).unwrap();
            assert_eq!(info.shape, shape, "{name}");
            assert_eq!(info.ty, t, "{name}");
        }
        assert!(report.ffn_bytes > 0 && report.predictor_bytes > 0);
    }
}

#[test]
fn tokenizer_round_trips_english() {
    let f = tiny(GgmlType::F16, SynthArch::Llama);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.vocab_size(), 1000);
    let text = "The children walked along the river, and their mother was waiting at home.";
    let ids = tok.encode(text, true, false).unwrap();
    assert_eq!(ids[0], 1);
    let bytes = ids.iter().filter(|&&i| (3..259).contains(&i)).count();
    assert!(bytes == 0, "{bytes} byte tokens in {ids:?}");
    assert!(ids.len() < text.len() / 2, "{} tokens", ids.len());
    assert_eq!(tok.decode(&ids[1..]).trim_start(), text);
    let odd = "Zürich — 東京 ~ {x}";
    let ids = tok.encode(odd, false, false).unwrap();
    assert_eq!(tok.decode(&ids).trim_start(), odd);
}

/// Layer 0 on the embeddings of an English paragraph: gate density, heavy tail, predictor recall
/// (the predictors rounded as the loader's default copies round them,
/// [`PredictorTypes::default_for`]: recall 0.991–0.993 on tiny Q4_0 files, 0.994 on `small`).
fn measure(ty: GgmlType, arch: SynthArch) -> (f64, f64, f64, f64) {
    let f = tiny(ty, arch);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let mut ids = tok.encode(PARAGRAPH, false, false).unwrap();
    ids.extend(tok.encode(vocab::CORPUS, false, false).unwrap());
    let (embd, e) = matrix(&f, "token_embd.weight");
    let norm_name = match arch {
        SynthArch::Falcon => "blk.0.attn_norm",
        _ => "blk.0.ffn_norm",
    };
    let (norm, _) = matrix(&f, &format!("{norm_name}.weight"));
    let norm_b = arch
        .layer_norm()
        .then(|| matrix(&f, &format!("{norm_name}.bias")).0);
    let (up, _) = matrix(&f, "blk.0.ffn_up.weight");
    let up_b = (arch == SynthArch::Opt).then(|| matrix(&f, "blk.0.ffn_up.bias").0);
    let gate = match arch.gated() {
        true => matrix(&f, "blk.0.ffn_gate.weight").0,
        false => up.clone(),
    };
    // the predictors as the loader's default copies round them
    let types = PredictorTypes::default_for(ty == GgmlType::Q4_0);
    let predictor = |name: &str, as_ty: GgmlType| {
        let (w, cols) = matrix(&f, name);
        let mut bytes = vec![0u8; w.len() / QK * as_ty.block_bytes()];
        crate::quant::quantize(as_ty, &w, &mut bytes).unwrap();
        let mut rounded = vec![0f32; w.len()];
        dequantize(as_ty, &bytes, &mut rounded).unwrap();
        (rounded, cols)
    };
    let (fc1, _) = predictor("blk.0.fc1.weight", types.fc1);
    let (fc2, r2) = predictor("blk.0.fc2.weight", types.fc2);
    let t = f.get_f32("powerinfer.sparse_threshold").unwrap().unwrap();
    let n_ff = gate.len() / e;
    let mut counts = vec![0u64; n_ff];
    let (mut active, mut predicted_active, mut predicted) = (0u64, 0u64, 0u64);
    for &id in &ids {
        let x = &embd[id as usize * e..(id as usize + 1) * e];
        let s = norm_scale(arch, x);
        let mean = match arch.layer_norm() {
            true => x.iter().sum::<f32>() / e as f32,
            false => 0.0,
        };
        let h: Vec<f32> = x
            .iter()
            .zip(&norm)
            .enumerate()
            .map(|(j, (v, n))| (v - mean) * s * n + norm_b.as_ref().map_or(0.0, |b| b[j]))
            .collect();
        let hid: Vec<f32> = fc1.chunks(e).map(|r| dot(r, x).max(0.0)).collect();
        for i in 0..n_ff {
            let g = dot(&gate[i * e..(i + 1) * e], &h) + up_b.as_ref().map_or(0.0, |b| b[i]);
            let on = match arch {
                SynthArch::Bamboo => g > 0.0 && dot(&up[i * e..(i + 1) * e], &h) > 0.0,
                _ => g > 0.0,
            };
            let pred = dot(&fc2[i * r2..(i + 1) * r2], &hid) >= t;
            if on {
                counts[i] += 1;
                active += 1;
                predicted_active += u64::from(pred);
            }
            predicted += u64::from(pred);
        }
    }
    let density = active as f64 / (ids.len() * n_ff) as f64;
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let top10: u64 = counts[..n_ff / 10].iter().sum();
    let share = top10 as f64 / active as f64;
    let recall = predicted_active as f64 / active as f64;
    let pdensity = predicted as f64 / (ids.len() * n_ff) as f64;
    eprintln!(
        "{ty} {arch:?}: {} tokens, density {density:.4}, top-10% share {share:.3}, \
         recall {recall:.4}, predicted density {pdensity:.4}",
        ids.len()
    );
    (density, share, recall, pdensity)
}

#[test]
fn layer0_sparsity_on_text() {
    for (ty, arch) in [
        (GgmlType::F16, SynthArch::Llama),
        (GgmlType::Q4_0, SynthArch::Llama),
        (GgmlType::Q8_0, SynthArch::Bamboo),
        (GgmlType::Q4_0, SynthArch::Bamboo),
        (GgmlType::F16, SynthArch::Falcon),
        (GgmlType::Q4_0, SynthArch::Falcon),
        (GgmlType::Q8_0, SynthArch::Opt),
        (GgmlType::Q4_0, SynthArch::Opt),
    ] {
        let (density, share, recall, _) = measure(ty, arch);
        assert!(
            (density - 0.1).abs() < 0.03,
            "{ty} {arch:?}: density {density}"
        );
        assert!(share > 0.4, "{ty} {arch:?}: top-10% share {share}");
        assert!(recall >= 0.99, "{ty} {arch:?}: recall {recall}");
    }
}

/// `dense_silu`: a llama.cpp file of a dense SwiGLU llama whose row-major `ffn_down` is the ReLU
/// file's `ffn_down_t` transposed, with no predictor; other architectures are refused.
#[test]
fn dense_silu_file_is_a_plain_swiglu_llama() {
    let relu = tiny(GgmlType::F16, SynthArch::Llama);
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.dense_silu = true;
    let (w, report) = build(&cfg).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.magic(), Magic::Gguf);
    assert_eq!(f.get_str("hotcold.ffn_activation").unwrap(), Some("silu"));
    assert_eq!(f.get_f32("powerinfer.sparse_threshold").unwrap(), None);
    assert_eq!(report.predictor_bytes, 0);
    for il in 0..2 {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        for gone in ["ffn_down_t", "fc1", "fc2"] {
            assert!(f.tensor(&n(gone)).is_none(), "{gone}");
        }
        let (down, cols) = matrix(&f, &n("ffn_down"));
        let (down_t, cols_t) = matrix(&relu, &n("ffn_down_t"));
        assert_eq!((cols, cols_t), (512, 128));
        for (r, row) in down.chunks_exact(cols).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                assert_eq!(v, down_t[c * cols_t + r], "blk.{il} down[{r}, {c}]");
            }
        }
        assert_eq!(matrix(&f, &n("ffn_gate")), matrix(&relu, &n("ffn_gate")));
    }
    cfg.arch = SynthArch::Bamboo;
    let e = build(&cfg).err().unwrap();
    assert!(e.to_string().contains("llama"), "{e}");
}

/// `SynthLayout::LlamaCpp`: the PowerInfer file's tensors and metadata byte for byte, except the
/// magic, the threshold key, the predictor and the down projection, stored row-major (on every
/// architecture; OPT's down bias renamed).
#[test]
fn llama_cpp_layout_is_the_same_model_without_predictors() {
    for arch in [
        SynthArch::Llama,
        SynthArch::Bamboo,
        SynthArch::Falcon,
        SynthArch::Opt,
    ] {
        let sparse = tiny(GgmlType::F16, arch);
        let mut cfg = SynthConfig::preset("tiny").unwrap();
        cfg.arch = arch;
        cfg.layout = SynthLayout::LlamaCpp;
        let (w, report) = build(&cfg).unwrap();
        let twin = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(twin.magic(), Magic::Gguf);
        assert_eq!(report.predictor_bytes, 0);
        let meta = |f: &GgufFile| -> Vec<String> {
            f.metadata()
                .iter()
                .filter(|(k, _)| k != "powerinfer.sparse_threshold")
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect()
        };
        assert_eq!(meta(&twin), meta(&sparse), "{arch:?}");
        assert_eq!(twin.get_f32("powerinfer.sparse_threshold").unwrap(), None);
        let mut moved = 0;
        for t in sparse.tensors() {
            let name = t.name.as_str();
            if name.contains(".fc1.") || name.contains(".fc2.") {
                assert!(twin.tensor(name).is_none(), "{arch:?} {name}");
                continue;
            }
            if name.contains("ffn_down_t") {
                let row_major = name.replace("ffn_down_t", "ffn_down");
                assert!(twin.tensor(name).is_none(), "{arch:?} {name}");
                let (down_t, e) = matrix(&sparse, name);
                let (down, ff) = matrix(&twin, &row_major);
                if name.ends_with(".bias") {
                    assert_eq!(down, down_t, "{arch:?} {name}");
                } else {
                    assert_eq!((e, ff), (128, 512), "{arch:?} {name}");
                    for (r, row) in down.chunks_exact(ff).enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            assert_eq!(v, down_t[c * e + r], "{arch:?} {row_major}[{r}, {c}]");
                        }
                    }
                }
                moved += 1;
                continue;
            }
            let same = twin.tensor(name).expect(name);
            assert_eq!(
                sparse.tensor_data(t),
                twin.tensor_data(same),
                "{arch:?} {name}"
            );
        }
        let biases = usize::from(arch == SynthArch::Opt);
        assert_eq!(moved, 2 * (1 + biases), "{arch:?}");
        assert_eq!(twin.tensors().len(), sparse.tensors().len() - 4, "{arch:?}");
    }
    assert!(SynthLayout::parse("llama.cpp").is_ok() && SynthLayout::parse("dense").is_ok());
    assert!(SynthLayout::parse("ggml").is_err());
}

#[test]
fn presets_and_bad_configs() {
    for p in PRESETS {
        SynthConfig::preset(p).unwrap().validate().unwrap();
    }
    assert!(SynthConfig::preset("huge").is_err());
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.ty = GgmlType::Q4_K;
    assert!(build(&cfg).is_err());
    assert_eq!(SynthArch::parse("bamboo").unwrap(), SynthArch::Bamboo);
    assert!(SynthArch::parse("gpt2").is_err());
}

#[test]
fn falcon_and_opt_files_have_powerinfer_tensors() {
    let (e, ff, v, r2) = (128u64, 512u64, 1000u64, 32u64);
    for arch in [SynthArch::Falcon, SynthArch::Opt] {
        let mut cfg = SynthConfig::preset("tiny").unwrap();
        cfg.arch = arch;
        cfg.ty = GgmlType::Q4_0;
        let bytes = build(&cfg).unwrap().0.to_bytes().unwrap();
        assert!(
            bytes.len() < 2 << 20,
            "tiny {arch:?} is {} bytes",
            bytes.len()
        );
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.architecture().unwrap(), arch.name());
        let ty = GgmlType::Q4_0;
        let f32t = GgmlType::F32;
        let mut expected: Vec<(String, Vec<u64>, GgmlType)> = vec![
            ("token_embd.weight".into(), vec![e, v], ty),
            ("output_norm.weight".into(), vec![e], f32t),
            ("output_norm.bias".into(), vec![e], f32t),
        ];
        for il in 0..2 {
            let n = |s: &str| format!("blk.{il}.{s}");
            expected.extend([
                (n("attn_norm.weight"), vec![e], f32t),
                (n("attn_norm.bias"), vec![e], f32t),
                (n("attn_output.weight"), vec![e, e], ty),
                (n("ffn_up.weight"), vec![e, ff], ty),
                (n("ffn_down_t.weight"), vec![e, ff], ty),
                (n("fc1.weight"), vec![e, r2], GgmlType::F16),
                (n("fc2.weight"), vec![r2, ff], GgmlType::F16),
            ]);
            match arch {
                SynthArch::Falcon => expected.push((n("attn_qkv.weight"), vec![e, 3 * e], ty)),
                _ => {
                    for role in ["attn_q", "attn_k", "attn_v"] {
                        expected.push((n(&format!("{role}.weight")), vec![e, e], ty));
                        expected.push((n(&format!("{role}.bias")), vec![e], f32t));
                    }
                    expected.extend([
                        (n("attn_output.bias"), vec![e], f32t),
                        (n("ffn_norm.weight"), vec![e], f32t),
                        (n("ffn_norm.bias"), vec![e], f32t),
                        (n("ffn_up.bias"), vec![ff], f32t),
                        (n("ffn_down_t.bias"), vec![e], f32t),
                    ]);
                }
            }
        }
        match arch {
            SynthArch::Falcon => expected.push(("output.weight".into(), vec![e, v], ty)),
            _ => expected.push((
                "position_embd.weight".into(),
                vec![e, OPT_POSITIONS as u64],
                ty,
            )),
        }
        assert_eq!(f.tensors().len(), expected.len(), "{arch:?}");
        for (name, shape, t) in expected {
            let info = f.require_tensor(&name).unwrap();
            assert_eq!((&info.shape, info.ty), (&shape, t), "{arch:?} {name}");
        }
        let a = arch.name();
        assert_eq!(
            f.get_f32(&format!("{a}.attention.layer_norm_epsilon"))
                .unwrap(),
            Some(1e-5)
        );
    }
}

#[test]
fn streamed_file_equals_in_memory_file() {
    let dir = std::env::temp_dir().join(format!("hotcold-synth-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (arch, ty) in [
        (SynthArch::Llama, GgmlType::Q4_0),
        (SynthArch::Bamboo, GgmlType::F16),
        (SynthArch::Falcon, GgmlType::Q8_0),
        (SynthArch::Opt, GgmlType::Q4_0),
    ] {
        let mut cfg = SynthConfig::preset("tiny").unwrap();
        cfg.arch = arch;
        cfg.ty = ty;
        let path = dir.join(format!("{}.gguf", arch.name()));
        let streamed = write(&cfg, &path).unwrap();
        let (w, in_memory) = build(&cfg).unwrap();
        let bytes = w.to_bytes().unwrap();
        assert!(std::fs::read(&path).unwrap() == bytes, "{arch:?} {ty}");
        assert_eq!(streamed.bytes, bytes.len() as u64);
        assert_eq!(streamed.weight_bytes, in_memory.weight_bytes);
        assert_eq!(streamed.n_tensors, in_memory.n_tensors);
        assert_eq!(streamed.layer_density, in_memory.layer_density);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
