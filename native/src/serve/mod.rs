//! `hotcold serve`: an OpenAI-compatible HTTP server (plus llama.cpp's native endpoints) with
//! continuous batching.
//!
//! - `routes`: handlers (parsing, validation, whole and streamed answers), the API-key check.
//! - `openai`: request and response shapes.
//! - `scheduler`: the model thread that batches every running request into shared decode steps.
//! - `stop`: stop strings over streamed text.
//! - `metrics`: counters and their Prometheus form.
//! - `error`: OpenAI-style error answers.
//!
//! The model runs on its own OS thread; the tokio runtime only moves bytes.

mod error;
mod metrics;
mod openai;
mod routes;
pub mod scheduler;
mod stop;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use hotcold_core::tokenizer::ChatTemplate;

pub use metrics::Metrics;
use routes::AppState;
use scheduler::{Scheduler, SchedulerConfig};

use crate::cmd::common::Loaded;

/// Largest request body accepted (larger ones get a 413).
pub const BODY_LIMIT: usize = 1 << 20;

/// What `hotcold serve` was asked for, beyond the model.
pub struct ServeConfig {
    /// Address to bind.
    pub host: String,
    /// Port (0 = any free one; the bound address is printed).
    pub port: u16,
    /// Requests decoded together.
    pub parallel: usize,
    /// Requests that may wait beyond those.
    pub max_queue: usize,
    /// Required bearer key.
    pub api_key: Option<String>,
    /// The model's name in the API.
    pub model_name: String,
}

/// Loads nothing more: starts the model thread on `loaded`, binds, and serves until Ctrl-C.
pub fn serve(loaded: Loaded, config: ServeConfig) -> anyhow::Result<()> {
    let loaded = Arc::new(loaded);
    let template =
        ChatTemplate::from_gguf(loaded.model.file()).context("cannot build the chat template")?;
    let metrics = Arc::new(Metrics::default());
    let sched_config = SchedulerConfig {
        parallel: config.parallel,
        n_ctx: loaded.n_ctx,
        max_queue: config.max_queue,
    };
    let (scheduler, _thread) = Scheduler::start(loaded.clone(), sched_config, metrics.clone())?;
    let state = Arc::new(AppState {
        loaded: loaded.clone(),
        template,
        scheduler,
        metrics,
        model_name: config.model_name.clone(),
        api_key: config.api_key.clone(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hotcold-http")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        eprintln!(
            "hotcold serve: {} on http://{addr} ({} slots of {} tokens, {} threads, {})",
            config.model_name,
            config.parallel,
            loaded.n_ctx,
            loaded.pool.current_num_threads(),
            hotcold_core::cpu::simd_level()
        );
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("the server failed")
    })
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/models", get(routes::models))
        .route("/v1/completions", post(routes::completions))
        .route("/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/chat/completions", post(routes::chat))
        .route("/completion", post(routes::llama_completion))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .fallback(routes::fallback)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::require_key,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(routes::reject_oversized))
        .with_state(state)
}
