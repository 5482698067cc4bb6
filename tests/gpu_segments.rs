//! Dense models under a partial VRAM budget: their last layers run whole on the GPU (attention,
//! FFN and KV cache: a segment), the CPU runs the others and the LM head, and the residual stream
//! crosses the bus once each way per step. The result equals the CPU pass: the same greedy tokens
//! and logits within 1e-3 of the largest logit (Gemma: or twice the effect of rounding-level
//! noise on the CPU pass, see tests/gpu_hybrid.rs), at budgets holding no layer, about half of
//! them and all of them, on `synth`'s tiny llama (`--ffn dense`) and the default Gemma 3 model.

mod common;

use std::sync::Arc;

use common::gpu::{
    assert_close, assert_same_choices, gpu, greedy, greedy_along, step_diffs, tiny, Jitter,
};
use hotcold::engine::{thread_pool, FfnMode, Logits, Session};
use hotcold::gpu::forward::{segment_costs, GpuModel, GpuSession};
use hotcold::model::Model;
use hotcold::models::DefaultModel;
use hotcold::placement::segment::dense_segment;
use hotcold::quant::GgmlType;
use hotcold::synth::SynthArch;

/// Largest |GPU − CPU| of a step's logits, relative to the step's largest |logit|.
const TOLERANCE: f32 = 1e-3;

/// Context of the sessions of [`greedy`], which the budgets are planned for.
const N_CTX: usize = 64;

/// The budgets (bytes) that hold no layer, half the layers (rounded down) and all of them.
fn budgets(model: &Model) -> [(u64, usize); 3] {
    let (costs, scratch) = segment_costs(model, N_CTX);
    let n = costs.len();
    let tail = |m: usize| scratch + costs[n - m..].iter().map(|c| c.bytes()).sum::<u64>();
    [(scratch, 0), (tail(n / 2), n / 2), (tail(n), n)]
}

/// Greedy decoding in `mode` with the planned segment for each budget compared with the CPU
/// pass (`noise_floor`: the Gemma bound).
fn check(model: &Model, mode: FfnMode, prompt: &[u32], n: usize, noise_floor: bool) {
    let setup = |segment: Option<Arc<GpuModel>>| {
        move |s: &mut Session| {
            s.set_ffn_mode(mode).unwrap();
            if let Some(g) = segment {
                s.set_gpu_model(g).unwrap();
                assert!(!s.on_gpu(), "a segment is not the whole model");
            }
        }
    };
    let (want_tokens, want) = greedy(model, setup(None), prompt, n);
    let floor: Vec<f32> = if noise_floor {
        let jitter = |s: &mut Session| s.set_ffn_offload(Arc::new(Jitter));
        let (_, noisy) = greedy(model, jitter, prompt, n);
        step_diffs(&noisy, &want).iter().map(|d| 2.0 * d).collect()
    } else {
        vec![0.0; n]
    };
    let (costs, scratch) = segment_costs(model, N_CTX);
    for (budget, layers) in budgets(model) {
        let plan = dense_segment(&costs, scratch, budget);
        assert_eq!(plan.layers.len(), layers, "budget {budget}");
        assert!(plan.bytes() <= budget);
        if plan.layers.is_empty() {
            continue; // the CPU pass itself
        }
        let segment = GpuModel::upload_segment(gpu(), model, mode, plan.layers.clone()).unwrap();
        assert_eq!(segment.layers(), plan.layers);
        assert!(!segment.is_whole());
        let gpu_setup = setup(Some(Arc::new(segment)));
        let (tokens, got) = greedy_along(model, gpu_setup, prompt, &want_tokens);
        let what = format!("layers {:?} on the GPU", plan.layers);
        assert_same_choices(&tokens, &want_tokens, &want, TOLERANCE, &floor, &what);
        assert_close(&got, &want, TOLERANCE, &floor, &what);
    }
}

#[test]
fn tiny_llama_segments_equal_cpu() {
    let model = tiny(SynthArch::Llama, GgmlType::F16);
    check(&model, FfnMode::Dense, &[1, 17, 42, 7, 99], 8, false);
}

#[test]
fn gemma_segments_equal_cpu() {
    let model = Model::open(common::model_path(DefaultModel::Gemma3_270m)).unwrap();
    // "<bos>The capital of France is"
    check(
        &model,
        FfnMode::Dense,
        &[2, 818, 5279, 529, 7001, 563],
        4,
        true,
    );
}

/// A prompt longer than one submission (32 tokens) with every token's logits, then a
/// truncation and a re-evaluation from the middle: the segment's cache follows the CPU's.
#[test]
fn long_prompts_and_truncation_follow_the_cpu() {
    let model = tiny(SynthArch::Llama, GgmlType::F16);
    let n_layer = model.hp.n_layer;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 200).collect();
    let run = |segment: bool| {
        let mut s = Session::new(&model, N_CTX, thread_pool(2).unwrap());
        s.set_ffn_mode(FfnMode::Dense).unwrap();
        if segment {
            let g = GpuModel::upload_segment(gpu(), &model, FfnMode::Dense, 1..n_layer).unwrap();
            s.set_gpu_model(Arc::new(g)).unwrap();
        }
        let all = s.eval(&prompt, Logits::All).unwrap();
        s.truncate(20);
        let again = s.eval(&prompt[20..23], Logits::All).unwrap();
        [all, again]
            .iter()
            .flat_map(|v| v.chunks(model.hp.n_vocab).map(<[f32]>::to_vec))
            .collect::<Vec<_>>()
    };
    let want = run(false);
    assert_eq!(want.len(), prompt.len() + 3);
    assert_close(
        &run(true),
        &want,
        TOLERANCE,
        &vec![0.0; want.len()],
        "long prompt",
    );
}

#[test]
fn segments_are_refused_where_they_do_not_apply() {
    let model = tiny(SynthArch::Llama, GgmlType::F16);
    let n_layer = model.hp.n_layer;
    for bad in [0..0, 1..n_layer + 1] {
        let e = GpuModel::upload_segment(gpu(), &model, FfnMode::Dense, bad).unwrap_err();
        assert!(e.to_string().contains("GPU segment of layers"), "{e}");
    }
    let segment = Arc::new(GpuModel::upload_segment(gpu(), &model, FfnMode::Dense, 0..1).unwrap());
    let mut s = GpuSession::new(segment, 8).unwrap();
    let Err(e) = s.submit(&model, &[1], Logits::Last, FfnMode::Dense) else {
        panic!("a segment cannot submit a whole step")
    };
    assert!(e.to_string().contains("run_segment"), "{e}");
    let x = vec![0.5f32; model.hp.n_embd];
    let e = s.run_segment(&x[1..], 0, FfnMode::Dense).unwrap_err();
    assert!(e.to_string().contains("whole rows"), "{e}");
    let e = s.run_segment(&x, 1, FfnMode::Dense).unwrap_err();
    assert!(e.to_string().contains("do not follow"), "{e}");
    assert_eq!(s.run_segment(&x, 0, FfnMode::Dense).unwrap().len(), x.len());
    let whole = Arc::new(GpuModel::upload(gpu(), &model, FfnMode::Dense).unwrap());
    let mut w = GpuSession::new(whole, 8).unwrap();
    let e = w.run_segment(&x, 0, FfnMode::Dense).unwrap_err();
    assert!(e.to_string().contains("whole model"), "{e}");
}
