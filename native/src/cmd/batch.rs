//! `hotcold batch`: generate for many prompts at once with continuous batching (PowerInfer's and
//! llama.cpp's `batched` example), printing each completion and the aggregate speed.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use hotcold_core::models::DefaultModel;

use super::common::{ModelArgs, SamplingArgs};
use crate::serve::scheduler::{Event, GenParams, Job, Scheduler, SchedulerConfig};
use crate::serve::Metrics;

/// Arguments of `hotcold batch`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// File of prompts, one per line (blank lines are skipped).
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Tokens to generate per prompt.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    n_predict: usize,
    /// Sequences decoded together (default: all the prompts).
    #[arg(long)]
    parallel: Option<usize>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

/// Runs `hotcold batch`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let prompts: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    anyhow::ensure!(
        !prompts.is_empty(),
        "{} has no prompts",
        args.file.display()
    );
    anyhow::ensure!(args.n_predict > 0, "-n must be at least 1");
    let loaded = Arc::new(args.model.load_for_batches(DefaultModel::Gemma3_270m)?);
    let mut tokenized = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let tokens = loaded.tokenizer.encode(p, true, true)?;
        anyhow::ensure!(
            tokens.len() < loaded.n_ctx,
            "prompt {} has {} tokens, more than the context of {} (use a larger -c)",
            i + 1,
            tokens.len(),
            loaded.n_ctx
        );
        tokenized.push(tokens);
    }
    let parallel = args
        .parallel
        .unwrap_or(prompts.len())
        .clamp(1, prompts.len());
    let metrics = Arc::new(Metrics::default());
    let config = SchedulerConfig {
        parallel,
        n_ctx: loaded.n_ctx,
        max_queue: prompts.len(),
    };
    let (scheduler, thread) = Scheduler::start(loaded.clone(), config, metrics.clone())?;
    let params = GenParams {
        sampling: args.sampling.config(),
        max_tokens: args.n_predict,
        stop: Vec::new(),
        ignore_eos: args.ignore_eos,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let jobs = tokenized
        .iter()
        .enumerate()
        .map(|(index, prompt)| Job {
            prompt: prompt.clone(),
            params: params.clone(),
            index,
            events: tx.clone(),
        })
        .collect();
    drop(tx);
    let start = Instant::now();
    scheduler
        .submit(jobs)
        .map_err(|_| anyhow::anyhow!("the scheduler refused the prompts"))?;
    let mut texts = vec![String::new(); prompts.len()];
    let mut generated = 0;
    let mut done = 0;
    while let Some((i, event)) = rx.blocking_recv() {
        match event {
            Event::Text(t) => texts[i].push_str(&t),
            Event::Done(f) => {
                generated += f.completion_tokens;
                done += 1;
            }
            Event::Failed(message) => anyhow::bail!("prompt {}: {message}", i + 1),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    anyhow::ensure!(done == prompts.len(), "the model thread stopped early");
    drop(scheduler);
    let _ = thread.join();
    let mut out = std::io::stdout().lock();
    for (i, (p, t)) in prompts.iter().zip(&texts).enumerate() {
        writeln!(out, "[{}] {p}{t}", i + 1)?;
    }
    let prompt_tokens: usize = tokenized.iter().map(Vec::len).sum();
    let steps = metrics.steps.load(Ordering::Relaxed);
    eprintln!(
        "batch: {} prompts ({} prompt tokens), {} generated tokens in {:.2} s: aggregate {:.1} tok/s | {} in parallel, {} steps ({:.2} tokens a step) | {} threads, {} | ffn mean density {:.3} per token, {:.3} read per step (union of the step's tokens)",
        prompts.len(),
        prompt_tokens,
        generated,
        secs,
        generated as f64 / secs.max(1e-9),
        parallel,
        steps,
        (prompt_tokens + generated).saturating_sub(prompts.len()) as f64 / steps.max(1) as f64,
        loaded.pool.current_num_threads(),
        hotcold_core::cpu::simd_level(),
        metrics.density(),
        metrics.union_density(),
    );
    Ok(())
}
