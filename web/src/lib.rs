//! hotcold in the browser: wasm-bindgen bindings over hotcold-core.
//!
//! [`Engine`] is what the page's JavaScript sees: load a GGUF from bytes, start a generation,
//! pull tokens one at a time with [`Engine::next_token`] (so the page streams and can stop
//! between tokens), and read the per-layer FFN density and the neuron firing frequencies for its
//! pictures. The work is done by [`Runner`] (plain Rust, tested natively) over hotcold-core's
//! model, tokenizer, predictor and sampler: the same code as the native CLI.
//!
//! - `pool`: the single-threaded rayon pool wasm32 needs.
//! - `runner`: the model, its tokenizer and one step-wise generation.
//! - `stats`: neuron firing statistics from the FFN observer.
//! - `webgpu` (wasm32): the browser's WebGPU device through wgpu.

mod pool;
mod runner;
mod stats;
#[cfg(target_arch = "wasm32")]
mod webgpu;

pub use runner::{ModelInfo, Runner, Split, StartOptions, Timings, DEFAULT_N_CTX};
pub use stats::FiringStats;

use hotcold_core::engine::FfnMode;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

/// Sends Rust panics to the browser console (instead of a bare `unreachable`).
#[wasm_bindgen(start)]
pub fn init() {
    std::panic::set_hook(Box::new(|info| console_error(&info.to_string())));
}

/// Sets the wasm CPU kernels' SIMD path (`scalar` or `simd128`; see hotcold-core's
/// `cpu::set_simd_level`) before the first model runs, to compare the two in one page build;
/// returns the path that runs. Errors for an unknown name or once a kernel has run on another path.
#[wasm_bindgen]
pub fn set_simd(name: &str) -> Result<String, JsError> {
    hotcold_core::cpu::set_simd_level(name)
        .map(str::to_string)
        .map_err(js_error)
}

/// The FFN mode named `name` (`auto`/empty: the model's default).
pub fn parse_ffn_mode(name: &str) -> Result<Option<FfnMode>, String> {
    match name {
        "" | "auto" => Ok(None),
        "dense" => Ok(Some(FfnMode::Dense)),
        "sparse" => Ok(Some(FfnMode::Sparse)),
        other => Err(format!(
            "unknown FFN mode {other:?} (expected auto, dense or sparse)"
        )),
    }
}

/// A model loaded in the page, with its current generation.
#[wasm_bindgen]
pub struct Engine {
    runner: Runner,
    /// The WebGPU adapter in use, as JSON (see `AdapterReport`).
    gpu_report: Option<String>,
}

#[wasm_bindgen]
impl Engine {
    /// Loads a GGUF or PowerInfer file from its bytes, with a context of `n_ctx` tokens (0: the
    /// model's own, at most 2048).
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: &js_sys::Uint8Array, n_ctx: u32) -> Result<Engine, JsError> {
        let runner = Runner::load(copy_in(bytes), n_ctx as usize).map_err(js_error)?;
        Ok(Engine {
            runner,
            gpu_report: None,
        })
    }

    /// Opens the browser's WebGPU device and moves the model's weights there, so that later
    /// generations run on the GPU (a promise). Resolves to the adapter's description as JSON
    /// (see `AdapterReport`, plus `weight_bytes` uploaded); rejects when the browser offers no
    /// WebGPU adapter or the GPU forward pass does not run this model (the engine then stays on
    /// the CPU).
    #[cfg(target_arch = "wasm32")]
    pub async fn init_gpu(&mut self) -> Result<String, JsError> {
        self.use_cpu();
        let (ctx, report) = webgpu::open().await.map_err(|m| JsError::new(&m))?;
        let bytes = self.runner.use_gpu(ctx).map_err(js_error)?;
        let mut json = serde_json::to_value(&report).map_err(|e| JsError::new(&e.to_string()))?;
        json["weight_bytes"] = bytes.into();
        let json = json.to_string();
        self.gpu_report = Some(json.clone());
        Ok(json)
    }

    /// Runs later generations on the wasm CPU kernels.
    pub fn use_cpu(&mut self) {
        self.runner.use_cpu();
        self.gpu_report = None;
    }

    /// Whether generations run on the GPU (then use `start_async` and `next_token_async`).
    pub fn uses_gpu(&self) -> bool {
        self.runner.gpu().is_some()
    }

    /// The model's description as JSON (see `ModelInfo`).
    pub fn info(&self) -> String {
        to_json(self.runner.info())
    }

    /// Which compute path runs the model: `webgpu` (`webgpu (software adapter)` on SwiftShader)
    /// or `cpu (kernels)`.
    pub fn backend(&self) -> String {
        match self.runner.gpu() {
            Some(ctx) if ctx.is_software() => "webgpu (software adapter)".into(),
            Some(_) => "webgpu".into(),
            None => format!("cpu ({})", self.runner.info().simd),
        }
    }

    /// Token ids of `text`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        self.runner.tokenize(text).map_err(js_error)
    }

    /// Starts a generation of at most `max_tokens` tokens (`temperature <= 0`: greedy; `ffn`:
    /// `auto`, `dense` or `sparse`); evaluates the prompt and returns its token count.
    pub fn start(
        &mut self,
        prompt: &str,
        max_tokens: u32,
        temperature: f32,
        seed: u32,
        ffn: &str,
    ) -> Result<u32, JsError> {
        let opts = start_options(max_tokens, temperature, seed, ffn)?;
        let n = self.runner.start(prompt, &opts).map_err(js_error)?;
        Ok(n as u32)
    }

    /// `start` on either compute path (a promise; the GPU's prompt passes are awaited).
    pub async fn start_async(
        &mut self,
        prompt: String,
        max_tokens: u32,
        temperature: f32,
        seed: u32,
        ffn: String,
    ) -> Result<u32, JsError> {
        let opts = start_options(max_tokens, temperature, seed, &ffn)?;
        let n = self
            .runner
            .start_async(&prompt, &opts)
            .await
            .map_err(js_error)?;
        Ok(n as u32)
    }

    /// The next token's text (possibly empty), or `undefined` once the generation has stopped;
    /// CPU path only (the GPU's is `next_token_async`).
    pub fn next_token(&mut self) -> Result<Option<String>, JsError> {
        self.runner.next_token().map_err(js_error)
    }

    /// `next_token` on either compute path (a promise; the GPU's forward pass is awaited).
    pub async fn next_token_async(&mut self) -> Result<Option<String>, JsError> {
        self.runner.next_token_async().await.map_err(js_error)
    }

    /// The WebGPU adapter in use as JSON (see `init_gpu`), or `undefined` on the CPU.
    pub fn gpu_report(&self) -> Option<String> {
        self.gpu_report.clone()
    }

    /// Stops the generation; returns the text still held by the decoder.
    pub fn stop(&mut self) -> String {
        self.runner.stop()
    }

    /// Why the generation stopped (`EndOfGeneration`, `MaxTokens`, `ContextFull`, `Callback`),
    /// or `undefined` while it runs.
    pub fn stop_reason(&self) -> Option<String> {
        self.runner.stop_reason().map(|r| format!("{r:?}"))
    }

    /// Counts and timings as JSON (see `Timings`).
    pub fn timings(&self) -> String {
        to_json(&self.runner.timings())
    }

    /// Fraction of each layer's FFN neurons that fired for the last token.
    pub fn last_token_density(&self) -> Vec<f32> {
        self.runner.last_token_density()
    }

    /// FFN neurons computed per token, per layer (1 for dense).
    pub fn computed_density(&self) -> Vec<f64> {
        self.runner.computed_density()
    }

    /// `n_layer × n_ff` neuron firing frequencies over this generation's tokens.
    pub fn firing_frequencies(&self) -> Vec<f32> {
        self.runner.firing_frequencies()
    }

    /// The placement planner's hot/cold split for `budget` bytes of VRAM, as JSON (see `Split`).
    pub fn hot_cold_split(&self, budget: f64) -> Result<String, JsError> {
        let split = self
            .runner
            .hot_cold_split(budget.max(0.0) as u64)
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(to_json(&split))
    }
}

/// The generation settings the page passes.
fn start_options(
    max_tokens: u32,
    temperature: f32,
    seed: u32,
    ffn: &str,
) -> Result<StartOptions, JsError> {
    Ok(StartOptions {
        max_tokens: max_tokens as usize,
        temperature,
        seed: u64::from(seed),
        ffn: parse_ffn_mode(ffn).map_err(|m| JsError::new(&m))?,
    })
}

/// Copies a JavaScript byte array into wasm memory once, straight into the shared buffer the
/// GGUF reader keeps (a `Vec` first would briefly need the file's size twice).
fn copy_in(bytes: &js_sys::Uint8Array) -> std::sync::Arc<[u8]> {
    let mut buffer: std::sync::Arc<[u8]> =
        std::iter::repeat_n(0u8, bytes.length() as usize).collect();
    if let Some(slice) = std::sync::Arc::get_mut(&mut buffer) {
        bytes.copy_to(slice);
    }
    buffer
}

fn js_error(e: hotcold_core::Error) -> JsError {
    JsError::new(&e.to_string())
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
