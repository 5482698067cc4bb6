//! Helpers of the browser test: a static file server, a minimal HTTP/1.1 client and a WebDriver
//! session over it.
#![allow(dead_code)]

/// Static file server and JSON HTTP client.
pub mod http;
/// chromedriver and a browser session.
pub mod webdriver;
