//! A static file server for the page (one thread, `Connection: close`) and a minimal JSON HTTP
//! client for WebDriver, both on 127.0.0.1 and std only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// Serves the files under `root`, and each `(url path, file)` of `extra`, on an ephemeral port of
/// 127.0.0.1 until the process ends; returns the port.
pub fn serve_dir(root: PathBuf, extra: Vec<(String, PathBuf)>) -> u16 {
    let extra = std::sync::Arc::new(extra);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (root, extra) = (root.clone(), extra.clone());
            std::thread::spawn(move || {
                let _ = serve_one(&root, &extra, stream);
            });
        }
    });
    port
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

fn serve_one(
    root: &Path,
    extra: &[(String, PathBuf)],
    mut stream: TcpStream,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let path = target
        .split('?')
        .next()
        .unwrap_or("/")
        .trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    let relative = Path::new(path);
    let safe = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    let file = extra
        .iter()
        .find(|(url, _)| url == path)
        .map_or_else(|| root.join(relative), |(_, file)| file.clone());
    match std::fs::read(&file) {
        Ok(body) if safe => {
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                content_type(&file),
                body.len()
            )?;
            stream.write_all(&body)
        }
        _ => stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    }
}

/// Sends `method path` with an optional JSON body to 127.0.0.1:`port`; returns the status and
/// the parsed JSON body.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> std::io::Result<(u16, serde_json::Value)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    // chromedriver keeps the connection open whatever the request says: read the headers, then
    // exactly the body they announce.
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let payload = if let Some(len) = header("content-length").and_then(|v| v.parse().ok()) {
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body)?;
        body
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        read_chunked(&mut reader)?
    } else {
        let mut body = Vec::new();
        reader.read_to_end(&mut body)?;
        body
    };
    let json = if payload.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&payload).map_err(std::io::Error::other)?
    };
    Ok((status, json))
}

/// Reads a chunked transfer-encoded body.
fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| std::io::Error::other(format!("bad chunk size {line:?}: {e}")))?;
        let mut chunk = vec![0u8; size + 2];
        reader.read_exact(&mut chunk)?;
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..size]);
    }
}
