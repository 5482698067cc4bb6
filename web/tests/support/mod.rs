//! Helpers of the browser test: a static file server, a minimal HTTP/1.1 client and a WebDriver
//! session over it.
#![allow(dead_code)]

pub mod http;
pub mod webdriver;
