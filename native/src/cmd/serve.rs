//! `hotcold serve`: the OpenAI-compatible HTTP server (llama.cpp's `llama-server`).

use hotcold_core::models::DefaultModel;

use super::common::ModelArgs;
use super::model_arg;

/// Arguments of `hotcold serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded together in one batch (slots); each has its own context of -c tokens.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a slot; beyond that the server answers 503.
    #[arg(long = "queue-size", default_value_t = 64)]
    queue_size: usize,
    /// Require `Authorization: Bearer KEY` on every request (except /health).
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// The model's name in the API (default: the file name without `.gguf`).
    #[arg(long)]
    alias: Option<String>,
}

/// Runs `hotcold serve` until Ctrl-C.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.parallel > 0, "--parallel must be at least 1");
    let default = DefaultModel::Qwen25Coder05bInstruct;
    let path = model_arg::resolve(args.model.model.clone(), default)?;
    let model_name = args.alias.clone().unwrap_or_else(|| {
        path.file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_owned())
            .unwrap_or_else(|| "model".into())
    });
    let loaded = args.model.load_for_batches(default)?;
    crate::serve::serve(
        loaded,
        crate::serve::ServeConfig {
            host: args.host,
            port: args.port,
            parallel: args.parallel,
            max_queue: args.queue_size,
            api_key: args.api_key.filter(|k| !k.is_empty()),
            model_name,
        },
    )
}
