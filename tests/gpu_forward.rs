//! The GPU-resident forward pass (weights, KV cache and activations on the GPU, one submission and
//! one read-back per evaluation) equals the CPU pass: the same greedy tokens and logits within
//! 1e-3 of the largest logit, on `synth`'s tiny llama (F16) and bamboo (Q4_0) models in `--ffn
//! sparse` (predictor, masked gate/up and sparse axpy on the GPU) and `dense`, and on the default
//! Gemma 3 model (dense), where the bound also allows twice the effect of rounding-level noise on
//! the CPU pass (see tests/gpu_hybrid.rs for why Gemma needs it).

mod common;

use std::sync::Arc;

use common::gpu::{
    assert_close, assert_same_choices, gpu, greedy, greedy_along, step_diffs, tiny, Jitter,
};
use hotcold::engine::{thread_pool, FfnMode, Logits, Session};
use hotcold::gpu::forward::{check_supported, GpuModel, GpuSession};
use hotcold::gpu::{AdapterChoice, GpuContext, ObjectCounts};
use hotcold::model::Model;
use hotcold::models::DefaultModel;
use hotcold::quant::GgmlType;
use hotcold::synth::SynthArch;

/// Largest |GPU − CPU| of a step's logits, relative to the step's largest |logit|.
const TOLERANCE: f32 = 1e-3;

/// The same bound for a model whose products take Q8_0 activations (Q4_0 weights). The GPU
/// quantises on the GPU values that differ from the CPU's in the last bits (norm and attention sum
/// in another order), so now and then a quant at a rounding tie lands one step away; in the tiny
/// model one such quant moves a logit by up to about 1/127 of its input's range, which is ~4e-3 of
/// the largest logit. A wrong kernel moves them by far more (and changes the greedy tokens).
const QUANT_FLIP_TOLERANCE: f32 = 1e-2;

/// Sets the FFN mode and, when given, the GPU model of a session.
fn with(mode: FfnMode, gpu_model: Option<&Arc<GpuModel>>) -> impl FnOnce(&mut Session) + '_ {
    move |s: &mut Session| {
        s.set_ffn_mode(mode).unwrap();
        if let Some(g) = gpu_model {
            s.set_gpu_model(g.clone()).unwrap();
            assert!(s.on_gpu());
        }
    }
}

/// Greedy decoding in `mode` on the CPU: its tokens and each step's logits.
fn on_cpu(model: &Model, mode: FfnMode, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy(model, with(mode, None), prompt, n)
}

/// The GPU's greedy choices and logits along the CPU's tokens `along`.
fn on_gpu(
    model: &Model,
    mode: FfnMode,
    gpu_model: &Arc<GpuModel>,
    prompt: &[u32],
    along: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_along(model, with(mode, Some(gpu_model)), prompt, along)
}

#[test]
fn resident_tiny_models_equal_cpu_sparse_and_dense() {
    let prompt = [1u32, 17, 42, 7, 99];
    for (arch, ty, tolerance) in [
        (SynthArch::Llama, GgmlType::F16, TOLERANCE),
        (SynthArch::Bamboo, GgmlType::Q4_0, QUANT_FLIP_TOLERANCE),
    ] {
        let model = tiny(arch, ty);
        let gpu_model = Arc::new(GpuModel::upload(gpu(), &model, FfnMode::Sparse).unwrap());
        assert!(gpu_model.bytes() > 0);
        for mode in [FfnMode::Sparse, FfnMode::Dense] {
            let (want_tokens, want) = on_cpu(&model, mode, &prompt, 8);
            let (tokens, got) = on_gpu(&model, mode, &gpu_model, &prompt, &want_tokens);
            let what = format!("{arch:?} {ty} {mode:?}");
            assert_same_choices(&tokens, &want_tokens, &want, tolerance, &[0.0; 8], &what);
            assert_close(&got, &want, tolerance, &[0.0; 8], &what);
        }
        // Every token's logits of a prompt, in one submission.
        let all = |gpu_model: Option<&Arc<GpuModel>>| {
            let mut s = Session::new(&model, 16, thread_pool(2).unwrap());
            if let Some(g) = gpu_model {
                s.set_gpu_model(g.clone()).unwrap();
            }
            let v = s.eval(&prompt, Logits::All).unwrap();
            v.chunks(model.hp.n_vocab)
                .map(<[f32]>::to_vec)
                .collect::<Vec<_>>()
        };
        let want = all(None);
        assert_eq!(want.len(), prompt.len());
        assert_close(
            &all(Some(&gpu_model)),
            &want,
            tolerance,
            &[0.0; 5],
            "all logits",
        );
    }
}

#[test]
fn resident_gemma_equals_cpu() {
    let model = Model::open(common::model_path(DefaultModel::Gemma3_270m)).unwrap();
    // "<bos>The capital of France is"
    let prompt = [2u32, 818, 5279, 529, 7001, 563];
    let n = 4;
    let mode = FfnMode::Dense;
    let (want_tokens, want) = on_cpu(&model, mode, &prompt, n);
    let (_, noisy) = greedy(
        &model,
        |s: &mut Session| s.set_ffn_offload(Arc::new(Jitter)),
        &prompt,
        n,
    );
    let floor: Vec<f32> = step_diffs(&noisy, &want).iter().map(|d| 2.0 * d).collect();
    let gpu_model = Arc::new(GpuModel::upload(gpu(), &model, mode).unwrap());
    let (tokens, got) = on_gpu(&model, mode, &gpu_model, &prompt, &want_tokens);
    assert_same_choices(&tokens, &want_tokens, &want, TOLERANCE, &floor, "gemma");
    assert_close(&got, &want, TOLERANCE, &floor, "gemma");
}

#[test]
fn what_the_resident_pass_does_not_run_is_a_clear_error() {
    let model = tiny(SynthArch::Llama, GgmlType::F16);
    let e = check_supported(&model, FfnMode::Oracle).unwrap_err();
    assert!(e.to_string().contains("does not run --ffn oracle"), "{e}");
    let gemma = Model::open(common::model_path(DefaultModel::Gemma3_270m)).unwrap();
    let e = check_supported(&gemma, FfnMode::Sparse).unwrap_err();
    assert!(e.to_string().contains("needs a predictor"), "{e}");
    // The GPU model is set before the first token only.
    let on_gpu = Arc::new(GpuModel::upload(gpu(), &model, FfnMode::Dense).unwrap());
    let mut s = Session::new(&model, 16, thread_pool(1).unwrap());
    s.eval(&[1, 2], Logits::Last).unwrap();
    assert!(s.set_gpu_model(on_gpu).is_err());
}

/// A decode step records into its session's parameter ring with the bind groups made during the
/// session's first submission: from then on a step creates no buffer and no bind group, only its
/// command encoder; and a read-back dropped unread is replaced, never reused.
#[test]
fn decode_steps_create_no_wgpu_objects() {
    // A context of its own: the other tests' objects must not be counted.
    let ctx = GpuContext::new(AdapterChoice::Any).unwrap();
    let step_only = ObjectCounts {
        buffers: 0,
        bind_groups: 0,
        encoders: 1,
    };
    for (arch, ty, mode) in [
        (SynthArch::Llama, GgmlType::F16, FfnMode::Sparse),
        (SynthArch::Bamboo, GgmlType::Q4_0, FfnMode::Dense),
    ] {
        let model = tiny(arch, ty);
        let on_gpu = Arc::new(GpuModel::upload(ctx.clone(), &model, mode).unwrap());
        let mut s = GpuSession::new(on_gpu, 32).unwrap();
        let step = |s: &mut GpuSession, token: u32| {
            let before = ctx.objects_created();
            let logits = s.submit(&model, &[token], Logits::Last, mode).unwrap();
            let made = ctx.objects_created().since(before);
            (hotcold::sample::argmax(&logits.wait().unwrap()), made)
        };
        let prompt = s.submit(&model, &[1, 17, 42], Logits::Last, mode);
        let mut token = hotcold::sample::argmax(&prompt.unwrap().wait().unwrap());
        for _ in 0..4 {
            let made;
            (token, made) = step(&mut s, token);
            assert_eq!(made, step_only, "{arch:?} {mode:?}");
        }
        drop(s.submit(&model, &[token], Logits::Last, mode).unwrap());
        let (_, made) = step(&mut s, token);
        assert_eq!(made.buffers, 1, "{arch:?} {mode:?}: a new read-back buffer");
        assert_eq!(made.bind_groups, 0, "{arch:?} {mode:?}");
    }
}
