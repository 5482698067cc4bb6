//! CPU-side cost of one decode step of the GPU-resident forward pass: the time `GpuSession::submit`
//! takes (embedding, recording every dispatch, submission; the GPU's work is waited for outside
//! the timer) and the wgpu objects a step creates.
//!
//!   cargo run --release --example gpu_encode -- MODEL.gguf [STEPS] [sparse]
//!
//! On a software adapter (lavapipe) the timings of the GPU's work mean nothing, but the recording
//! cost is the CPU's and is what a real GPU would see too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hotcold::engine::{FfnMode, Logits};
use hotcold::gpu::forward::{GpuModel, GpuSession};
use hotcold::gpu::{AdapterChoice, GpuContext, ObjectCounts};
use hotcold::model::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: gpu_encode MODEL.gguf [STEPS] [sparse]")?;
    let steps: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let mode = match args.next().as_deref() {
        Some("sparse") => FfnMode::Sparse,
        _ => FfnMode::Dense,
    };
    let model = Model::open(&path)?;
    let ctx = GpuContext::new(AdapterChoice::Any)?;
    let gpu = Arc::new(GpuModel::upload(ctx.clone(), &model, mode)?);
    let mut session = GpuSession::new(gpu, steps + 8)?;
    let mut token = 1u32;
    let mut encode = Duration::ZERO;
    let mut objects = None;
    let mut dispatches = 0;
    for step in 0..steps {
        // The first step creates the session's bind groups: measure the steady state.
        let start = Instant::now();
        let before = counts(&ctx);
        let recorded = ctx.dispatches_recorded();
        let pending = session.submit(&model, &[token], Logits::Last, mode)?;
        let after = counts(&ctx);
        dispatches = ctx.dispatches_recorded() - recorded;
        if step > 0 {
            encode += start.elapsed();
            objects = after
                .zip(before)
                .map(|(a, b)| a.since(b))
                .map(|c| c.buffers + c.bind_groups);
        }
        let logits = pending.wait()?;
        token = hotcold::sample::argmax(&logits);
    }
    let per = encode.as_secs_f64() * 1e6 / (steps - 1) as f64;
    println!(
        "{}: {} on {}: submit (CPU) {per:.0} µs/token over {} steps; {dispatches} dispatches and {} buffers + bind groups created per step",
        path,
        format!("{mode:?}").to_lowercase(),
        ctx.describe(),
        steps - 1,
        objects.map_or("not counted".into(), |o| o.to_string())
    );
    Ok(())
}

/// The objects created so far.
fn counts(ctx: &GpuContext) -> Option<ObjectCounts> {
    Some(ctx.objects_created())
}
