//! The page in headless Chromium: loads a model from the site, generates greedily, and must print
//! exactly the native engine's text (hotcold-core's `generate`, what `hotcold run --temp 0` prints
//! after the prompt): the tiny synthetic ReLU model built with the page on the wasm CPU path and
//! on WebGPU (Chromium's SwiftShader adapter), then the default real model (Gemma 3 270M, from the
//! model cache) on the CPU path (on SwiftShader its prompt alone takes minutes). Saves a
//! screenshot of the page after each and prints the load times and speed.
//!
//! Needs `bash web/build.sh` first (the wasm module and the tiny model under web/www) and the
//! default model (`bash scripts/fetch-models.sh`). Skipped, with a message, only when chromium or
//! chromedriver is not installed (CI installs both); the WebGPU case only when the browser offers
//! no adapter.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use hotcold_core::engine::{generate, thread_pool, GenerateOptions, Session};
use hotcold_core::model::Model;
use hotcold_core::models::DefaultModel;
use hotcold_core::sample::{Sampler, SamplerConfig};
use hotcold_core::tokenizer::Tokenizer;
use support::find_program;
use support::http::serve_dir;
use support::webdriver::Browser;

const PROMPT: &str = "The capital of France is";

/// What `hotcold run -m MODEL -p PROMPT -n N --temp 0` prints after the prompt.
fn native_greedy_text(model_path: &Path, n_tokens: usize) -> String {
    let model = Model::open(model_path).unwrap();
    let tokenizer = Tokenizer::from_gguf(model.file()).unwrap();
    let n_ctx = model.hp.n_ctx_train.min(4096);
    let mut session = Session::new(&model, n_ctx, thread_pool(0).unwrap());
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    });
    let prompt = tokenizer.encode(PROMPT, true, true).unwrap();
    let opts = GenerateOptions {
        max_tokens: n_tokens,
        ignore_eos: false,
    };
    let mut text = String::new();
    generate(&mut session, &tokenizer, &mut sampler, &prompt, opts, |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    text
}

/// Percent-encodes `s` for a query string.
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The page's compute choices.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Compute {
    Cpu,
    WebGpu,
    /// WebGPU unless the adapter is a software one (then the CPU path).
    Auto,
}

impl Compute {
    /// The page's `compute` parameter.
    fn name(self) -> &'static str {
        match self {
            Compute::Cpu => "cpu",
            Compute::WebGpu => "webgpu",
            Compute::Auto => "auto",
        }
    }
}

/// Opens the page on `model_url` with `compute`, waits for `n_tokens` greedy tokens, saves a
/// screenshot and checks the text against the native engine on `model_path`.
fn check_page(
    browser: &Browser,
    port: u16,
    model_url: &str,
    model_path: &Path,
    n_tokens: usize,
    compute: Compute,
) {
    let want = native_greedy_text(model_path, n_tokens);
    assert!(!want.is_empty());
    let url = format!(
        "http://127.0.0.1:{port}/?model={model_url}&n={n_tokens}&run=1&compute={}&prompt={}",
        compute.name(),
        query_escape(PROMPT)
    );
    let start = Instant::now();
    browser.goto(&url);
    let state = browser.wait_for(
        "const s = document.body.dataset.state; return s === 'done' || s === 'error' ? s : null;",
        Duration::from_secs(60),
    );
    let elapsed = start.elapsed();
    let screenshot = browser.screenshot();
    let stem = Path::new(model_url).file_stem().unwrap().to_string_lossy();
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("web-page-{stem}-{}.png", compute.name()));
    std::fs::write(&shot, &screenshot).unwrap();
    eprintln!("{model_url}: screenshot {}", shot.display());
    let error = browser.eval("return document.body.dataset.error || '';");
    assert_eq!(state, "done", "the page failed on {model_url}: {error}");

    let data = browser.eval(
        "const d = document.body.dataset; return {out: document.getElementById('output').textContent, \
         page: d.pageLoadMs, model: d.modelLoadMs, stop: d.stop, webgpu: d.webgpu, \
         backend: d.backend, gpu: d.gpuLimits || '', \
         speed: document.getElementById('speed').textContent, \
         split: document.getElementById('split-text').textContent};",
    );
    eprintln!(
        "{model_url} on {}: page ready in {} ms, model parsed in {} ms, {:.0} ms from opening the \
         page to the last of {n_tokens} tokens; WebGPU adapter: {}; {}",
        data["backend"],
        data["page"],
        data["model"],
        elapsed.as_secs_f64() * 1000.0,
        data["webgpu"],
        data["speed"]
    );
    if compute == Compute::WebGpu {
        eprintln!("WebGPU device: {}", data["gpu"]);
    }
    let backend = data["backend"].as_str().unwrap_or("");
    let adapter = data["webgpu"].as_str().unwrap_or("");
    let expected = match compute {
        Compute::Auto if adapter.starts_with("none") || adapter.ends_with("(software)") => "cpu",
        Compute::Auto => "webgpu",
        other => other.name(),
    };
    assert!(
        backend.starts_with(expected),
        "{compute:?} ran on {backend} ({adapter})"
    );
    assert_eq!(data["out"].as_str().unwrap(), want, "{model_url}");
    assert_eq!(data["stop"], "MaxTokens");
    assert!(data["webgpu"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(
        data["split"].as_str().unwrap_or("").contains("neurons hot"),
        "no hot/cold split shown: {}",
        data["split"]
    );
    assert!(screenshot.starts_with(b"\x89PNG"));
}

#[test]
fn page_generates_the_native_greedy_text() {
    let (Some(chromium), Some(chromedriver)) =
        (find_program("chromium"), find_program("chromedriver"))
    else {
        eprintln!(
            "SKIPPED: chromium and chromedriver are not installed \
             (apt-get install -y chromium chromium-driver)"
        );
        return;
    };
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    let tiny = www.join("models/tiny.gguf");
    assert!(
        www.join("pkg/hotcold_web_bg.wasm").is_file() && tiny.is_file(),
        "the page is not built: run `bash web/build.sh` first"
    );
    let gemma = DefaultModel::Gemma3_270m
        .locate()
        .unwrap_or_else(|e| panic!("{e} (run bash scripts/fetch-models.sh)"));
    let port = serve_dir(www, vec![("cache/gemma.gguf".into(), gemma.clone())]);
    let browser = Browser::start(&chromedriver, &chromium);
    check_page(&browser, port, "models/tiny.gguf", &tiny, 48, Compute::Cpu);
    let adapter = webgpu_adapter(&browser);
    if adapter.starts_with("none") {
        eprintln!("SKIPPED the WebGPU case: the browser offers no WebGPU adapter ({adapter})");
    } else {
        check_page(
            &browser,
            port,
            "models/tiny.gguf",
            &tiny,
            16,
            Compute::WebGpu,
        );
    }
    check_page(&browser, port, "models/tiny.gguf", &tiny, 8, Compute::Auto);
    check_page(&browser, port, "cache/gemma.gguf", &gemma, 8, Compute::Cpu);
    check_stop_button(&browser, &gemma);
}

/// The WebGPU adapter the open page reports (`none…` when the browser offers none).
fn webgpu_adapter(browser: &Browser) -> String {
    let name = browser.wait_for(
        "return document.body.dataset.webgpu || null;",
        Duration::from_secs(10),
    );
    name.as_str().unwrap_or("none").to_string()
}

/// On the loaded page: a longer generation, stopped with the Stop button once text has appeared,
/// ends between tokens with a prefix of the native text.
fn check_stop_button(browser: &Browser, model_path: &Path) {
    let n_tokens = 64;
    let want = native_greedy_text(model_path, n_tokens);
    browser.eval(&format!(
        "document.getElementById('max-tokens').value = '{n_tokens}'; \
         document.getElementById('run').click();"
    ));
    browser.wait_for(
        "return document.getElementById('output').textContent.length > 0 ? true : null;",
        Duration::from_secs(30),
    );
    browser.eval("document.getElementById('stop').click();");
    browser.wait_for(
        "const s = document.body.dataset.state; return s === 'done' || s === 'error' ? s : null;",
        Duration::from_secs(30),
    );
    let data = browser.eval(
        "return {out: document.getElementById('output').textContent, stop: document.body.dataset.stop, \
         error: document.body.dataset.error || ''};",
    );
    assert_eq!(data["stop"], "Callback", "{data}");
    let out = data["out"].as_str().unwrap();
    assert!(
        !out.is_empty() && want.starts_with(out) && out.len() < want.len(),
        "{out:?} vs {want:?}"
    );
    eprintln!("stopped after {out:?}");
}
