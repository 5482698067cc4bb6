//! Where the GPU-resident pass departs from the CPU's, on `synth`'s tiny models: for each
//! architecture, weight type and FFN mode, the largest logit difference (relative to the row's
//! largest |logit|) over 13 teacher-forced positions, evaluated three ways: all in one
//! submission, the prompt then one token per submission, and one token per submission throughout.
//!
//!   cargo run --release --example gpu_check
//!
//! A kernel that is wrong shows in every column; state carried wrongly between submissions shows
//! in the last two only.

use std::sync::Arc;

use hotcold::engine::{thread_pool, FfnMode, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::gpu::forward::GpuModel;
use hotcold::gpu::{AdapterChoice, GpuContext};
use hotcold::model::Model;
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig};

const PROMPT: [u32; 5] = [1, 17, 42, 7, 99];

fn tiny(arch: SynthArch, ty: GgmlType) -> Result<Model, Box<dyn std::error::Error>> {
    let mut cfg = SynthConfig::preset("tiny")?;
    cfg.arch = arch;
    cfg.ty = ty;
    let (writer, _) = synth::build(&cfg)?;
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes()?)?);
    Ok(Model::from_file(file)?)
}

/// Logits of every position of `tokens`, evaluated in the runs of lengths `runs`.
fn logits(
    model: &Model,
    mode: FfnMode,
    gpu: Option<&Arc<GpuModel>>,
    tokens: &[u32],
    runs: &[usize],
) -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error>> {
    let mut s = Session::new(model, 64, thread_pool(2)?);
    s.set_ffn_mode(mode)?;
    if let Some(g) = gpu {
        s.set_gpu_model(g.clone())?;
    }
    let mut out = Vec::new();
    let mut at = 0;
    for &n in runs {
        let v = s.eval(&tokens[at..at + n], Logits::All)?;
        out.extend(v.chunks(model.hp.n_vocab).map(<[f32]>::to_vec));
        at += n;
    }
    Ok(out)
}

/// The worst relative difference and its position.
fn worst(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, usize) {
    let mut w = (0f32, 0);
    for (i, (g, r)) in got.iter().zip(want).enumerate() {
        let scale = r.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        let d = g.iter().zip(r).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        if d > w.0 || d.is_nan() {
            w = (d, i);
        }
    }
    w
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = GpuContext::new(AdapterChoice::Any)?;
    println!("adapter: {}", ctx.describe());
    println!(
        "| model | mode | one submission | prompt, then 1 per submission | 1 per submission |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for arch in [SynthArch::Llama, SynthArch::Bamboo] {
        for ty in [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            let model = tiny(arch, ty)?;
            let gpu = Arc::new(GpuModel::upload(ctx.clone(), &model, FfnMode::Sparse)?);
            for mode in [FfnMode::Dense, FfnMode::Sparse] {
                // the CPU's greedy continuation, teacher-forced everywhere
                let mut tokens = PROMPT.to_vec();
                let mut s = Session::new(&model, 64, thread_pool(2)?);
                s.set_ffn_mode(mode)?;
                let mut l = s.eval(&PROMPT, Logits::Last)?;
                for _ in 0..8 {
                    let t = hotcold::sample::argmax(&l);
                    tokens.push(t);
                    l = s.eval(&[t], Logits::Last)?;
                }
                let n = tokens.len();
                let want = logits(&model, mode, None, &tokens, &[n])?;
                let ways = [
                    vec![n],
                    std::iter::once(PROMPT.len())
                        .chain(std::iter::repeat_n(1, n - PROMPT.len()))
                        .collect(),
                    vec![1; n],
                ];
                let mut row = format!("| {arch:?} {ty} | {mode:?} |");
                for runs in &ways {
                    let got = logits(&model, mode, Some(&gpu), &tokens, runs)?;
                    let (d, at) = worst(&got, &want);
                    row += &format!(" {d:.1e} at {at} |");
                }
                println!("{row}");
            }
        }
    }
    Ok(())
}
