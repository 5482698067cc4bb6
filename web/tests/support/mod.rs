//! Helpers of the browser test: a static file server, a minimal HTTP/1.1 client and a WebDriver
//! session over it.
#![allow(dead_code)]

/// Static file server and JSON HTTP client.
pub mod http;
/// chromedriver and a browser session.
pub mod webdriver;

/// `name` on the PATH (or the usual Debian location).
pub fn find_program(name: &str) -> Option<String> {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain([std::path::PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}
