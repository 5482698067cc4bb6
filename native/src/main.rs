//! `hotcold`: the command-line front-end of the hotcold inference engine.

mod cmd;

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
    /// Print a GGUF file's format, hyper-parameters, tokenizer and tensor table.
    Inspect(cmd::inspect::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => cmd::inspect::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
