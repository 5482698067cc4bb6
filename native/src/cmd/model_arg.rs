//! Resolving the model file of a subcommand: `-m FILE`, or the default model from the cache.

use std::path::PathBuf;

use hotcold_core::models::DefaultModel;

/// The file given with `-m`, or `default`'s cached path (with a hint to fetch it when absent).
pub fn resolve(model: Option<PathBuf>, default: DefaultModel) -> anyhow::Result<PathBuf> {
    match model {
        Some(path) => Ok(path),
        None => Ok(default.locate()?),
    }
}
