//! A WebDriver session on a chromedriver child process: start headless Chromium, navigate, run
//! scripts, take a screenshot.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::request;

/// Chromium's flags for the test: headless, no sandbox (root in CI), WebGPU on SwiftShader, and
/// no background connections (the machine has no network), a window tall enough for the pictures.
pub const CHROMIUM_FLAGS: [&str; 10] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--enable-unsafe-webgpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1100,1400",
];

/// A running chromedriver with one browser session; both end on drop.
pub struct Browser {
    // Dropped after the session is deleted (see `Drop for Browser`).
    driver: Driver,
    port: u16,
    session: String,
    _profile: TempDir,
}

/// The chromedriver child, killed on drop (also when the session fails to start).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    /// Starts `chromedriver` and a Chromium session on `chromium` with [`CHROMIUM_FLAGS`].
    pub fn start(chromedriver: &str, chromium: &str) -> Browser {
        let port = free_port();
        let driver = Driver(
            Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start chromedriver"),
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while !matches!(request(port, "GET", "/status", None), Ok((200, _))) {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = std::env::temp_dir().join(format!("hotcold-web-chromium-{port}"));
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}
        }}});
        let (status, body) = request(port, "POST", "/session", Some(&caps)).expect("new session");
        assert_eq!(status, 200, "chromedriver refused the session: {body}");
        let session = body["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        Browser {
            driver,
            port,
            session,
            _profile: TempDir(profile),
        }
    }

    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("/session/{}{path}", self.session);
        let (status, reply) = request(self.port, method, &url, body.as_ref())
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        assert_eq!(status, 200, "WebDriver {method} {path}: {reply}");
        reply["value"].clone()
    }

    /// Opens `url` (returns when the page's load event has fired).
    pub fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page and returns its result.
    pub fn eval(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Polls `script` until it returns something other than `null`, or panics after `timeout`.
    pub fn wait_for(&self, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(script);
            if !v.is_null() {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {script}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG screenshot of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        let b64 = self.command("GET", "/screenshot", None);
        decode_base64(b64.as_str().expect("base64 screenshot"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = request(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Standard base64 (with padding) to bytes.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    for quad in clean.chunks(4) {
        let data: Vec<u8> = quad.iter().copied().filter(|&c| c != b'=').collect();
        let bits = data
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        out.extend_from_slice(&bytes[..data.len().saturating_sub(1)]);
    }
    out
}

#[test]
fn base64_decodes_padded_and_unpadded_ends() {
    assert_eq!(decode_base64("aGVsbG8="), b"hello");
    assert_eq!(decode_base64("aGk="), b"hi");
    assert_eq!(decode_base64("YWJj"), b"abc");
}
