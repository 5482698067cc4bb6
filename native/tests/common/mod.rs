//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::process::{Command, Output};

use hotcold_core::models::DefaultModel;

/// Runs the `hotcold` binary with `args`.
pub fn hotcold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hotcold"))
        .args(args)
        .output()
        .unwrap()
}

/// The cached path of a default model; fails the test (never skips it) when it is missing.
pub fn model(m: DefaultModel) -> String {
    match m.locate() {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(e) => panic!("{e} (run bash scripts/fetch-models.sh)"),
    }
}
