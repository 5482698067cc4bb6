//! Helpers of the GPU tests: the shared adapter, `synth`'s tiny models, greedy decoding with a
//! session set up by the caller, and rounding-level noise on the CPU's FFN (the noise floor the
//! Gemma comparisons allow; see tests/gpu_hybrid.rs).

use std::sync::{Arc, OnceLock};

use hotcold::engine::{thread_pool, CpuFfn, FfnOffload, FfnTensor, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::gpu::{AdapterChoice, GpuContext};
use hotcold::model::Model;
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig};

/// The adapter every GPU test shares (any: lavapipe in CI).
pub fn gpu() -> Arc<GpuContext> {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        GpuContext::new(AdapterChoice::Any)
            .expect("the GPU tests need an adapter (apt-get install mesa-vulkan-drivers)")
    })
    .clone()
}

/// `synth`'s tiny preset with architecture `arch` and weight type `ty`.
pub fn tiny(arch: SynthArch, ty: GgmlType) -> Model {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.arch = arch;
    cfg.ty = ty;
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    Model::from_file(file).unwrap()
}

/// The CPU's FFN with every product scaled by `1 ± 2^-20` (alternating): rounding-level noise.
pub struct Jitter;

fn jitter(mut y: Vec<f32>) -> Vec<f32> {
    const EPS: f32 = 1.0 / (1 << 20) as f32;
    y.iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v *= if i % 2 == 0 { 1.0 + EPS } else { 1.0 - EPS });
    y
}

impl FfnOffload for Jitter {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> hotcold::Result<Vec<f32>> {
        CpuFfn.matmul(model, il, which, x, n).map(jitter)
    }

    fn gather(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> hotcold::Result<Vec<f32>> {
        CpuFfn.gather(model, il, which, rows, x, n).map(jitter)
    }

    fn down_axpy(
        &self,
        model: &Model,
        il: usize,
        a: &[f32],
        n: usize,
    ) -> hotcold::Result<Vec<f32>> {
        CpuFfn.down_axpy(model, il, a, n).map(jitter)
    }
}

/// Largest |got − want| of each step's logits.
pub fn step_diffs(got: &[Vec<f32>], want: &[Vec<f32>]) -> Vec<f32> {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            g.iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        })
        .collect()
}

/// Greedy tokens and each step's logits after `prompt`, on a session `setup` prepares.
pub fn greedy(
    model: &Model,
    setup: impl FnOnce(&mut Session),
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut session = Session::new(model, 64, thread_pool(2).unwrap());
    setup(&mut session);
    let mut logits = session.eval(prompt, Logits::Last).unwrap();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let next = hotcold::sample::argmax(&logits);
        tokens.push(next);
        all.push(logits);
        logits = session.eval(&[next], Logits::Last).unwrap();
    }
    (tokens, all)
}

/// The greedy choice and the logits of each step after `prompt` on a session `setup` prepares,
/// fed the tokens `along` (another run's choices) rather than its own, so that one near-tie
/// broken the other way does not change what every later step sees.
pub fn greedy_along(
    model: &Model,
    setup: impl FnOnce(&mut Session),
    prompt: &[u32],
    along: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut session = Session::new(model, 64, thread_pool(2).unwrap());
    setup(&mut session);
    let mut logits = session.eval(prompt, Logits::Last).unwrap();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for &fed in along {
        tokens.push(hotcold::sample::argmax(&logits));
        all.push(logits);
        logits = session.eval(&[fed], Logits::Last).unwrap();
    }
    (tokens, all)
}

/// Asserts that each step's greedy choice `got` is `want`'s, or a near-tie: a step may pick
/// another token only when `want_logits` put it within twice the step's logit bound (as in
/// [`assert_close`]) of the best one, a gap that float rounding on another GPU may close. On
/// lavapipe, whose arithmetic is the CPU's, the choices are the same.
pub fn assert_same_choices(
    got: &[u32],
    want: &[u32],
    want_logits: &[Vec<f32>],
    tolerance: f32,
    floor: &[f32],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (step, ((&g, &w), logits)) in got.iter().zip(want).zip(want_logits).enumerate() {
        if g == w {
            continue;
        }
        let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        let bound = (tolerance * scale).max(floor[step]);
        let gap = logits[w as usize] - logits[g as usize];
        assert!(
            gap <= 2.0 * bound,
            "{what}, step {step}: greedy token {g} instead of {w}, whose logit is {gap} higher (bound {bound})"
        );
    }
}

/// Asserts that each step's logits differ from `want` by at most `tolerance` of the step's
/// largest |logit| or `floor[step]`, whichever is larger; `what` names the run.
pub fn assert_close(
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    tolerance: f32,
    floor: &[f32],
    what: &str,
) {
    let diffs = step_diffs(got, want);
    for (step, (worst, want)) in diffs.iter().zip(want).enumerate() {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let bound = (tolerance * scale).max(floor[step]);
        assert!(
            *worst <= bound,
            "{what}, step {step}: logits differ by {worst} (scale {scale}, bound {bound})"
        );
    }
}
