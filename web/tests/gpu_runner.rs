//! The browser engine's GPU path, run natively on any wgpu adapter (lavapipe in CI): the runner
//! on hotcold-core's GPU-resident forward pass, driven through its async API as the page drives
//! it (here a tiny executor polls the device where a browser's event loop would), must give the
//! CPU runner's greedy text on the tiny synthetic model, in sparse and dense FFN modes; the
//! synchronous calls must refuse the GPU path with an error, and stop must end it between tokens.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use hotcold_core::engine::{FfnMode, StopReason};
use hotcold_core::gpu::{AdapterChoice, GpuContext};
use hotcold_core::synth::{build, SynthConfig};
use hotcold_web::{Runner, StartOptions};

const PROMPT: &str = "The capital of France is";

fn tiny_bytes() -> Vec<u8> {
    let cfg = SynthConfig::preset("tiny").unwrap();
    build(&cfg).unwrap().0.to_bytes().unwrap()
}

fn greedy(max_tokens: usize, ffn: Option<FfnMode>) -> StartOptions {
    StartOptions {
        max_tokens,
        temperature: 0.0,
        seed: 0,
        ffn,
    }
}

/// Runs `fut` to completion, letting the GPU finish its work whenever it waits.
fn block_on<F: Future>(ctx: &GpuContext, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        ctx.poll().unwrap();
    }
}

/// The text of a whole generation through the async API.
fn generate_async(runner: &mut Runner, ctx: &GpuContext, opts: &StartOptions) -> String {
    block_on(ctx, async {
        runner.start_async(PROMPT, opts).await.unwrap();
        let mut text = String::new();
        while let Some(piece) = runner.next_token_async().await.unwrap() {
            text.push_str(&piece);
        }
        text
    })
}

#[test]
fn gpu_text_equals_cpu_text() {
    let ctx = GpuContext::new(AdapterChoice::Any)
        .expect("the GPU tests need an adapter (apt-get install mesa-vulkan-drivers)");
    let bytes = tiny_bytes();
    let mut cpu = Runner::load(bytes.clone(), 0).unwrap();
    let mut gpu = Runner::load(bytes, 0).unwrap();
    assert!(gpu.use_gpu(ctx.clone()).unwrap() > 0);
    assert!(gpu.gpu().is_some());
    for ffn in [None, Some(FfnMode::Dense)] {
        let opts = greedy(40, ffn);
        let want = generate_async(&mut cpu, &ctx, &opts);
        assert!(!want.is_empty());
        assert_eq!(generate_async(&mut gpu, &ctx, &opts), want, "{ffn:?}");
        assert_eq!(gpu.generated(), cpu.generated(), "{ffn:?}");
        let t = gpu.timings();
        assert_eq!((t.prompt_tokens, t.generated_tokens), (13, 40));
        assert_eq!(t.computed_density, None);
    }
    // Back on the CPU, the synchronous path works again.
    gpu.use_cpu();
    gpu.start(PROMPT, &greedy(4, None)).unwrap();
    assert!(gpu.next_token().unwrap().is_some());
}

#[test]
fn the_sync_calls_refuse_the_gpu_path() {
    let ctx = GpuContext::new(AdapterChoice::Any)
        .expect("the GPU tests need an adapter (apt-get install mesa-vulkan-drivers)");
    let mut runner = Runner::load(tiny_bytes(), 0).unwrap();
    runner.use_gpu(ctx.clone()).unwrap();
    let err = runner.start(PROMPT, &greedy(4, None)).unwrap_err();
    assert!(err.to_string().contains("start_async"), "{err}");
    block_on(&ctx, runner.start_async(PROMPT, &greedy(4, None))).unwrap();
    let err = runner.next_token().unwrap_err();
    assert!(err.to_string().contains("next_token_async"), "{err}");
    // The generation is intact: the async call goes on with it.
    assert!(block_on(&ctx, runner.next_token_async()).unwrap().is_some());
    // Stop ends it between tokens, as on the CPU.
    runner.stop();
    assert_eq!(block_on(&ctx, runner.next_token_async()).unwrap(), None);
    assert_eq!(runner.stop_reason(), Some(StopReason::Callback));
    assert_eq!(runner.generated().len(), 1);
    // A prompt longer than the context is an error on the GPU too.
    let long = "word ".repeat(300);
    assert!(block_on(&ctx, runner.start_async(&long, &greedy(4, None))).is_err());
}
