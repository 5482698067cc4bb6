//! `hotcold serve` end to end: the real binary on a free loopback port, driven by a real HTTP
//! client. Most cases run on a tiny synthetic model (fast); chat runs on Qwen2.5-Coder Instruct
//! and the slot tests (disconnect, full queue) on Gemma 3 270M, slow enough to interrupt.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{hotcold, model};
use hotcold_core::models::DefaultModel;
use serde_json::{json, Value};

/// A running server, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    /// Starts `hotcold serve --port 0 ARGS` and waits for the address it prints.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hotcold"))
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let base = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("the server exited before listening: {seen}");
            };
            if let Some(at) = line.find("http://") {
                let addr = line[at..].split_whitespace().next().unwrap().to_owned();
                break addr;
            }
            seen.push_str(&line);
            seen.push('\n');
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs JSON; returns the status and the parsed body.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, &body.to_string(), None)
    }

    /// Sends only the head of a POST announcing `length` bytes of body; returns the status and
    /// the parsed body of the answer.
    fn post_headers_only(&self, path: &str, length: usize) -> (u16, Value) {
        use std::io::{Read, Write};
        let url = self.url(path);
        let addr = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status: u16 = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {body:?} (status {status})"));
        (status, value)
    }

    /// The metric `name`, read again for up to 2 s until it equals `want`.
    fn metric_settled(&self, name: &str, want: f64) -> f64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let v = self.metric(name);
            if v == want || std::time::Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn post_raw(&self, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
        let mut req = agent()
            .post(&self.url(path))
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        let mut resp = req.send(body).unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} (status {status})"));
        (status, value)
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut resp = agent().get(&self.url(path)).call().unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap())
    }

    /// Opens a streamed request and returns its event reader.
    fn stream(&self, path: &str, body: &Value) -> Events {
        open_stream(&self.url(path), body)
    }

    /// A metric's value from `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("hotcold_{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
            .parse()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs `body` to `url` and returns the `data:` payloads of the event stream it answers.
fn open_stream(url: &str, body: &Value) -> Events {
    let resp = agent()
        .post(url)
        .header("content-type", "application/json")
        .send(body.to_string().as_str())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let reader = resp.into_body().into_reader();
    Events {
        lines: Box::new(BufReader::new(reader).lines().map(|l| l.unwrap())),
    }
}

/// The `data:` payloads of a server-sent event stream.
struct Events {
    lines: Box<dyn Iterator<Item = String>>,
}

impl Iterator for Events {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        for line in self.lines.by_ref() {
            if let Some(data) = line.strip_prefix("data: ") {
                return Some(data.to_owned());
            }
        }
        None
    }
}

/// Reads a whole OpenAI stream: the concatenated text of choice 0, the finish reason, the usage
/// chunk (if any); asserts it ends with `[DONE]`.
fn read_stream(events: Events, chat: bool) -> (String, String, Option<Value>) {
    let (mut text, mut finish, mut usage, mut done) = (String::new(), String::new(), None, false);
    for data in events {
        assert!(!done, "data after [DONE]");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        if let Some(u) = v.get("usage") {
            usage = Some(u.clone());
            continue;
        }
        let choice = &v["choices"][0];
        let piece = if chat {
            &choice["delta"]["content"]
        } else {
            &choice["text"]
        };
        text.push_str(piece.as_str().unwrap_or(""));
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    assert!(done, "the stream did not end with [DONE]");
    (text, finish, usage)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// A tiny synthetic model, written once per test run.
fn tiny() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hotcold-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path: PathBuf = dir.join("tiny.gguf");
        let out = hotcold(&["synth", "--preset", "tiny", "-o", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        path.to_string_lossy().into_owned()
    })
}

fn greedy(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

#[test]
fn whole_and_streamed_completions_agree_and_count_usage() {
    let s = Server::start(&["-m", tiny(), "--parallel", "2"]);
    let (status, whole) = s.post("/v1/completions", &greedy("The sky is", 12));
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 12);
    let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    let text = whole["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());

    let mut body = greedy("The sky is", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (streamed, finish, usage) = read_stream(s.stream("/v1/completions", &body), false);
    assert_eq!(streamed, text);
    assert_eq!(finish, "length");
    assert_eq!(usage.unwrap()["total_tokens"], prompt_tokens + 12);

    // llama.cpp's /completion gives the same text, streamed or not.
    let llama =
        json!({"prompt": "The sky is", "n_predict": 12, "temperature": 0, "ignore_eos": true});
    let (status, v) = s.post("/completion", &llama);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["content"], text.as_str());
    assert_eq!(
        (v["stop"].clone(), v["stop_type"].clone()),
        (json!(true), json!("limit"))
    );
    assert_eq!(v["tokens_predicted"], 12);
    let mut body = llama.clone();
    body["stream"] = json!(true);
    let chunks: Vec<Value> = s
        .stream("/completion", &body)
        .map(|d| serde_json::from_str(&d).unwrap())
        .collect();
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["content"].as_str())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(chunks.last().unwrap()["stop"], true);

    // /tokenize and /detokenize round-trip; /v1/models names the file; /metrics counts.
    let (_, t) = s.post(
        "/tokenize",
        &json!({"content": "The sky is", "with_pieces": true}),
    );
    let ids: Vec<u64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    let pieces: String = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(pieces.trim_start(), "The sky is");
    let (_, d) = s.post("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(d["content"], "The sky is");
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    // The counters are updated by the model thread right after the last token is sent.
    assert_eq!(s.metric_settled("generated_tokens_total", 48.0), 48.0);
    assert_eq!(s.metric_settled("requests_total", 4.0), 4.0);
    assert!(
        (s.metric("ffn_active_density") - 0.1).abs() < 0.1,
        "synth's tiny model is ~10% dense"
    );
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let s = Server::start(&["-m", tiny()]);
    let (_, v) = s.post("/v1/completions", &greedy("Once upon", 24));
    let text = v["choices"][0]["text"].as_str().unwrap().to_owned();
    // A stop string from the middle of the greedy text: the answer is what precedes its first
    // occurrence.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    let mut body = greedy("Once upon", 24);
    body["stop"] = json!(["\u{1F600}never", stop]);
    let (_, v) = s.post("/v1/completions", &body);
    assert_eq!(v["choices"][0]["text"], expected);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let (streamed, finish, _) = read_stream(s.stream("/v1/completions", &body), false);
    assert_eq!((streamed.as_str(), finish.as_str()), (expected, "stop"));
}

#[test]
fn the_same_seed_gives_the_same_text() {
    let s = Server::start(&["-m", tiny(), "--parallel", "3"]);
    let body = |seed: u64, n: u64| {
        json!({"prompt": "Random words:", "max_tokens": 16, "temperature": 1.5, "top_k": 0,
               "top_p": 1.0, "min_p": 0.0, "seed": seed, "n": n, "ignore_eos": true})
    };
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().unwrap().to_owned();
    let (_, a) = s.post("/v1/completions", &body(7, 1));
    let (_, b) = s.post("/v1/completions", &body(7, 1));
    assert_eq!(text(&a, 0), text(&b, 0));
    // n = 3 runs the choices together in one batch; choice i uses seed + i.
    let (_, three) = s.post("/v1/completions", &body(7, 3));
    assert_eq!(three["choices"].as_array().unwrap().len(), 3);
    assert_eq!(three["usage"]["completion_tokens"], 48);
    assert_eq!(text(&three, 0), text(&a, 0));
    let (_, eight) = s.post("/v1/completions", &body(8, 1));
    assert_eq!(text(&three, 1), text(&eight, 0));
}

#[test]
fn thirty_two_concurrent_streams_equal_their_lone_runs() {
    let s = Server::start(&["-m", tiny(), "--parallel", "8", "--queue-size", "32"]);
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("Story {i}: {}", "and then ".repeat(i % 5)))
        .collect();
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (_, v) = s.post("/v1/completions", &greedy(p, 12));
            v["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    let url = s.url("/v1/completions");
    let together: Vec<(String, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let url = &url;
                scope.spawn(move || {
                    let mut body = greedy(p, 12);
                    body["stream"] = json!(true);
                    let (text, finish, _) = read_stream(open_stream(url, &body), false);
                    (text, finish)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, ((text, finish), lone)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(finish, "length", "stream {i}");
        assert_eq!(text, lone, "stream {i} differs from its lone run");
    }
    assert!(s.metric("decode_steps_total") > 0.0);
    assert_eq!(s.metric_settled("slots_busy", 0.0), 0.0);
}

#[test]
fn bad_input_gets_openai_style_errors_and_the_server_keeps_serving() {
    let s = Server::start(&["-m", tiny(), "-c", "64"]);
    let cases: Vec<(&str, String, u16)> = vec![
        ("/v1/completions", "{\"prompt\": \"x\",".into(), 400),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": "many"}"#.into(),
            400,
        ),
        ("/v1/completions", r#"{"max_tokens": 3}"#.into(), 400),
        (
            "/v1/completions",
            json!({"prompt": "word ".repeat(200)}).to_string(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 1000000000}"#.into(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 0}"#.into(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "temperature": -1}"#.into(),
            400,
        ),
        ("/v1/completions", r#"{"prompt": [99999]}"#.into(), 400),
        (
            "/v1/completions",
            r#"{"prompt": "x", "n": 1000}"#.into(),
            400,
        ),
        ("/v1/chat/completions", r#"{"messages": []}"#.into(), 400),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user"}], "max_tokens": "x"}"#.into(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "model": "gpt-4"}"#.into(),
            404,
        ),
        ("/detokenize", r#"{"tokens": [1, 5000]}"#.into(), 400),
        ("/v1/nothing", "{}".into(), 404),
    ];
    for (path, body, want) in cases {
        let (status, v) = s.post_raw(path, &body, None);
        let shown = &body[..body.len().min(80)];
        assert_eq!(status, want, "{path} {shown}: {v}");
        let err = &v["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()) && err["type"].is_string(),
            "{path} {shown}: not an OpenAI error body: {v}"
        );
    }
    // A body over the limit is refused from its length, before it is sent (a client that wrote
    // it all first could see the connection closed under it).
    let (status, v) = s.post_headers_only("/v1/completions", 2 << 20);
    assert_eq!(status, 413, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    let (status, v) = s.post("/v1/completions", &greedy("still alive", 4));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

#[test]
fn the_api_key_is_required_when_set() {
    let s = Server::start(&["-m", tiny(), "--api-key", "sesame"]);
    let body = greedy("x", 2).to_string();
    let (status, v) = s.post_raw("/v1/completions", &body, None);
    assert_eq!(status, 401);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(s.post_raw("/v1/completions", &body, Some("wrong")).0, 401);
    assert_eq!(s.get("/v1/models").0, 401);
    assert_eq!(s.post_raw("/v1/completions", &body, Some("sesame")).0, 200);
    assert_eq!(s.get("/health").0, 200, "/health stays open for probes");
}

#[test]
fn a_disconnected_stream_frees_its_slot_and_a_full_queue_gets_503() {
    let gemma = model(DefaultModel::Gemma3_270m);
    let s = Server::start(&[
        "-m",
        &gemma,
        "-c",
        "1024",
        "--parallel",
        "1",
        "--queue-size",
        "1",
    ]);
    let long = json!({"prompt": "Count:", "max_tokens": 1000, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let mut first = s.stream("/v1/completions", &long);
    first.next().expect("a first chunk");
    // The slot is taken and the queue holds one more: a third request is refused.
    let queued = s.stream("/v1/completions", &long);
    let (status, v) = s.post("/v1/completions", &greedy("x", 2));
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "server_busy");
    assert_eq!(s.metric("requests_rejected_total"), 1.0);
    // Both clients hang up: their slots free within a few steps, long before 1000 tokens.
    drop(first);
    drop(queued);
    let start = Instant::now();
    while s.metric("slots_busy") + s.metric("queue_length") > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the slot was not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.metric("generated_tokens_total") < 500.0);
    let (status, v) = s.post("/v1/completions", &greedy("The capital of France is", 3));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn chat_renders_the_models_template_like_run_on_qwen() {
    let qwen = model(DefaultModel::Qwen25Coder05bInstruct);
    let s = Server::start(&["-m", &qwen, "-c", "512"]);
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}]}
    ]);
    let body = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    // Qwen2.5's template renders this conversation as ChatML; `hotcold run` on that text must
    // continue the same way.
    let rendered = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n";
    let (_, t) = s.post(
        "/tokenize",
        &json!({"content": rendered, "add_special": true}),
    );
    assert_eq!(
        v["usage"]["prompt_tokens"],
        t["tokens"].as_array().unwrap().len()
    );
    let out = hotcold(&[
        "run", "-m", &qwen, "-c", "512", "-p", rendered, "-n", "8", "--temp", "0",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let continuation = stdout
        .strip_prefix(rendered)
        .unwrap()
        .trim_end_matches('\n');
    assert_eq!(content, continuation);
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (streamed, _, _) = read_stream(s.stream("/v1/chat/completions", &body), true);
    assert_eq!(streamed, content);
}

#[test]
fn serve_refuses_bad_flags() {
    let out = hotcold(&["serve", "-m", tiny(), "--parallel", "0", "--port", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--parallel"));
    let out = hotcold(&["serve", "-m", "/nonexistent.gguf", "--port", "0"]);
    assert!(!out.status.success());
}
