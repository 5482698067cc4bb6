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
    #[cfg(target_arch = "wasm32")]
    gpu: std::cell::RefCell<Option<webgpu::WebGpu>>,
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
            #[cfg(target_arch = "wasm32")]
            gpu: Default::default(),
        })
    }

    /// Opens the browser's WebGPU device (a promise); resolves to the adapter's description as
    /// JSON (see `AdapterReport`), rejects when the browser offers no WebGPU adapter.
    #[cfg(target_arch = "wasm32")]
    pub async fn init_gpu(&self) -> Result<String, JsError> {
        let gpu = webgpu::open().await.map_err(|m| JsError::new(&m))?;
        let report = to_json(&gpu.report);
        *self.gpu.borrow_mut() = Some(gpu);
        Ok(report)
    }

    /// The model's description as JSON (see `ModelInfo`).
    pub fn info(&self) -> String {
        to_json(self.runner.info())
    }

    /// Which compute path runs the model: the wasm CPU kernels (the WebGPU path is not wired yet).
    pub fn backend(&self) -> String {
        format!("cpu ({})", self.runner.info().simd)
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
        let opts = StartOptions {
            max_tokens: max_tokens as usize,
            temperature,
            seed: u64::from(seed),
            ffn: parse_ffn_mode(ffn).map_err(|m| JsError::new(&m))?,
        };
        let n = self.runner.start(prompt, &opts).map_err(js_error)?;
        Ok(n as u32)
    }

    /// The next token's text (possibly empty), or `undefined` once the generation has stopped.
    pub fn next_token(&mut self) -> Result<Option<String>, JsError> {
        self.runner.next_token().map_err(js_error)
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
