//! Opt-in benchmark (`bash benches/web_cpu.sh` runs it): the page's wasm CPU path in headless
//! Chromium, greedy decode speed with the scalar kernels and with the simd128 kernels, on the
//! tiny synthetic model built with the page and on the default real model (Gemma 3 270M), side by
//! side in one browser, with the simd128/scalar ratio.
//!
//! Needs `bash web/build.sh` first and chromium + chromedriver; `HOTCOLD_WEB_BENCH_TOKENS`
//! overrides the tokens generated per run (default 64 on the tiny model, 24 on Gemma).

mod support;

use std::path::Path;
use std::time::Duration;

use hotcold_core::models::DefaultModel;
use serde_json::Value;
use support::find_program;
use support::http::serve_dir;
use support::webdriver::Browser;

/// One greedy generation of `n_tokens` on the page with the `simd` kernels; returns the page's
/// timings (`Timings` of hotcold-web as JSON) after checking that it ran on those kernels.
fn run_page(browser: &Browser, port: u16, model_url: &str, n_tokens: usize, simd: &str) -> Value {
    browser.goto(&format!(
        "http://127.0.0.1:{port}/?model={model_url}&n={n_tokens}&run=1&compute=cpu&simd={simd}\
         &prompt=The%20capital%20of%20France%20is"
    ));
    let state = browser.wait_for(
        "const s = document.body.dataset.state; return s === 'done' || s === 'error' ? s : null;",
        Duration::from_secs(600),
    );
    let error = browser.eval("return document.body.dataset.error || '';");
    assert_eq!(state, "done", "{model_url} with {simd}: {error}");
    let backend = browser.eval("return document.body.dataset.backend;");
    assert_eq!(backend, format!("cpu ({simd})"), "{model_url}");
    let timings = browser.eval("return document.body.dataset.timings;");
    serde_json::from_str(timings.as_str().expect("the page shows its timings")).unwrap()
}

/// Runs of each model and kernel set; the best is shown.
const REPS: usize = 3;

#[test]
#[ignore = "a benchmark: run `bash benches/web_cpu.sh`"]
fn wasm_cpu_decode_speed_scalar_vs_simd128() {
    let (Some(chromium), Some(chromedriver)) =
        (find_program("chromium"), find_program("chromedriver"))
    else {
        panic!(
            "chromium and chromedriver are needed (apt-get install -y chromium chromium-driver)"
        );
    };
    let www = Path::new(env!("CARGO_MANIFEST_DIR")).join("www");
    assert!(
        www.join("pkg/hotcold_web_bg.wasm").is_file() && www.join("models/tiny.gguf").is_file(),
        "the page is not built: run `bash web/build.sh` first"
    );
    let gemma = DefaultModel::Gemma3_270m
        .locate()
        .unwrap_or_else(|e| panic!("{e} (run bash scripts/fetch-models.sh)"));
    let tokens = |default: usize| {
        std::env::var("HOTCOLD_WEB_BENCH_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let port = serve_dir(www, vec![("cache/gemma.gguf".into(), gemma)]);
    let browser = Browser::start(&chromedriver, &chromium);
    for (model, n_tokens) in [
        ("models/tiny.gguf", tokens(64)),
        ("cache/gemma.gguf", tokens(24)),
    ] {
        // the best of REPS runs of each, alternating (the machine may be busy with other work)
        let mut speeds = [(0f64, 0f64); 2];
        let mut shown = [String::new(), String::new()];
        for _ in 0..REPS {
            for (i, simd) in ["scalar", "simd128"].into_iter().enumerate() {
                let t = run_page(&browser, port, model, n_tokens, simd);
                let prompt_tok_s =
                    t["prompt_tokens"].as_f64().unwrap() / t["prompt_secs"].as_f64().unwrap();
                let decode = t["decode_tok_per_s"].as_f64().unwrap();
                speeds[i] = (speeds[i].0.max(decode), speeds[i].1.max(prompt_tok_s));
                shown[i] = format!(
                    "wasm cpu {model} {simd:>7}: decode {:8.2} tok/s ({} tokens), prompt {:8.2} \
                     tok/s ({} tokens), best of {REPS}",
                    speeds[i].0, t["generated_tokens"], speeds[i].1, t["prompt_tokens"]
                );
            }
        }
        for line in &shown {
            println!("{line}");
        }
        println!(
            "wasm cpu {model} simd128/scalar: decode {:.2}x, prompt {:.2}x",
            speeds[1].0 / speeds[0].0,
            speeds[1].1 / speeds[0].1
        );
    }
}
