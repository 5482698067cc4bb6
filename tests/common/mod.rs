//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod mutate;
pub mod relabel;

use std::path::PathBuf;

use hotcold::models::DefaultModel;

/// The cached path of a default model; fails the test (never skips it) when it is missing.
pub fn model_path(model: DefaultModel) -> PathBuf {
    match model.locate() {
        Ok(path) => path,
        Err(e) => panic!("{e} (the tests need both default models: bash scripts/fetch-models.sh)"),
    }
}

/// A file under `tests/data/`.
pub fn data_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(relative)
}
