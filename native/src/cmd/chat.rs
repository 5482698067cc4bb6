//! `hotcold chat`: an interactive terminal conversation (Qwen2.5-Coder Instruct by default),
//! rendered with the model's chat template; only the new part of each turn is evaluated.

use std::io::{BufRead, Write};

use hotcold_core::engine::{generate, GenerateOptions};
use hotcold_core::models::DefaultModel;
use hotcold_core::sample::Sampler;
use hotcold_core::tokenizer::{ChatMessage, ChatTemplate};

use super::common::{ModelArgs, SamplingArgs};

/// Arguments of `hotcold chat`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// System prompt.
    #[arg(long = "system")]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
}

/// Runs `hotcold chat`: reads user turns from stdin until end of input or `/exit`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = args.model.load(DefaultModel::Qwen25Coder05bInstruct)?;
    let template = ChatTemplate::from_gguf(loaded.model.file())?;
    let mut session = loaded.session()?;
    let mut sampler = Sampler::new(args.sampling.config());
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.clone()));
    }
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    eprintln!("hotcold chat: type a message, /exit or end of input to quit");
    loop {
        write!(out, "\n> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim() == "/exit" {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let text = template.render_for(&loaded.tokenizer, &messages, true)?;
        let tokens = loaded.tokenizer.encode(&text, true, true)?;
        // Reuse the cache for the common prefix; evaluate only the rest.
        let common = cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        if tokens.len() + args.n_predict > session.n_ctx() {
            anyhow::bail!(
                "the conversation ({} tokens) no longer fits the context of {} (use a larger -c)",
                tokens.len(),
                session.n_ctx()
            );
        }
        session.truncate(common);
        let mut reply = String::new();
        let opts = GenerateOptions {
            max_tokens: args.n_predict,
            ignore_eos: false,
        };
        let stats = generate(
            &mut session,
            &loaded.tokenizer,
            &mut sampler,
            &tokens[common..],
            opts,
            |piece| {
                reply.push_str(piece);
                out.write_all(piece.as_bytes())
                    .and_then(|()| out.flush())
                    .is_ok()
            },
        )?;
        writeln!(out)?;
        eprintln!(
            "[{} new prompt tokens, {:.1} tok/s; {} tokens, {:.1} tok/s]",
            stats.prompt_tokens,
            stats.prompt_tok_per_s(),
            stats.generated_tokens,
            stats.decode_tok_per_s()
        );
        cached = tokens;
        cached.extend(
            stats
                .tokens
                .iter()
                .filter(|&&t| !loaded.tokenizer.is_eog(t)),
        );
        // The cache holds the reply without its end-of-turn token: the next render adds it.
        session.truncate(cached.len());
        messages.push(ChatMessage::new("assistant", reply));
    }
    Ok(())
}
