//! `hotcold`: the command-line front-end of the hotcold inference engine.

mod cmd;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// hotcold: LLM inference with a neuron-level hot (GPU) / cold (CPU) split.
#[derive(Parser)]
#[command(name = "hotcold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout; timings to stderr).
    Run(cmd::run::Args),
    /// Interactive chat with the model's chat template.
    Chat(cmd::chat::Args),
    /// OpenAI-compatible HTTP server with continuous batching of concurrent requests.
    Serve(cmd::serve::Args),
    /// Generate for many prompts at once (continuous batching) and print the aggregate speed.
    Batch(cmd::batch::Args),
    /// Prompt-processing and decode speed, like llama-bench.
    Bench(cmd::bench::Args),
    /// Perplexity of a text file, llama.cpp's method.
    Perplexity(cmd::perplexity::Args),
    /// Record activation statistics on a text and train a predictor per layer (ReLU models).
    Calibrate(cmd::calibrate::Args),
    /// Print a GGUF file's format, hyper-parameters, tokenizer and tensor table.
    Inspect(cmd::inspect::Args),
    /// Write a synthetic ReLU model in PowerInfer's format (power-law sparsity, exact predictors).
    Synth(cmd::synth::Args),
    /// Place hot neurons and dense tensors on the GPU for a VRAM budget; predict the speed.
    Plan(cmd::plan::Args),
}

fn main() -> ExitCode {
    quiet_vulkan_device_select();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Batch(args) => cmd::batch::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Calibrate(args) => cmd::calibrate::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Plan(args) => cmd::plan::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Turns off Mesa's implicit `VK_LAYER_MESA_device_select` layer unless the user set
/// `NODEVICE_SELECT` themselves: wgpu picks the adapter on its own, and the layer only prints an
/// `XDG_RUNTIME_DIR` error on machines without a desktop session (servers, CI, containers).
fn quiet_vulkan_device_select() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // Before any other thread exists, so no one reads the environment concurrently.
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
