//! `hotcold run`: generate text from a prompt, streaming it to stdout (llama.cpp's `llama-cli`).

use std::io::Write;

use anyhow::Context;
use hotcold_core::engine::{generate, GenerateOptions};
use hotcold_core::models::DefaultModel;
use hotcold_core::sample::Sampler;

use super::common::{ModelArgs, SamplingArgs};

/// Arguments of `hotcold run`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// The prompt.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "The capital of France is"
    )]
    prompt: String,
    /// Read the prompt from a file instead.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    file: Option<std::path::PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

/// Runs `hotcold run`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = args.model.load(DefaultModel::Gemma3_270m)?;
    let prompt_text = match &args.file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None => args.prompt.clone(),
    };
    let prompt = loaded.tokenizer.encode(&prompt_text, true, true)?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    anyhow::ensure!(
        prompt.len() < loaded.n_ctx,
        "the prompt has {} tokens, more than the context of {} (use a larger -c)",
        prompt.len(),
        loaded.n_ctx
    );
    let mut session = loaded.session()?;
    let mut sampler = Sampler::new(args.sampling.config());
    let mut out = std::io::stdout().lock();
    write!(out, "{prompt_text}")?;
    out.flush()?;
    let opts = GenerateOptions {
        max_tokens: args.n_predict,
        ignore_eos: args.ignore_eos,
    };
    let stats = generate(
        &mut session,
        &loaded.tokenizer,
        &mut sampler,
        &prompt,
        opts,
        |text| {
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .is_ok()
        },
    )?;
    writeln!(out)?;
    eprintln!(
        "load {:.0} ms | prompt {} tokens, {:.1} tok/s | decode {} tokens, {:.1} tok/s | stop: {:?} | {} threads, {}",
        loaded.load_secs * 1000.0,
        stats.prompt_tokens,
        stats.prompt_tok_per_s(),
        stats.generated_tokens,
        stats.decode_tok_per_s(),
        stats.stop,
        loaded.pool.current_num_threads(),
        hotcold_core::cpu::simd_level()
    );
    eprintln!("{}", super::common::sparsity_summary(&loaded, &session));
    Ok(())
}
