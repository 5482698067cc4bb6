//! Writes a copy of a GGUF file under another architecture name (`{old}.*` keys renamed to
//! `{new}.*`), sharing the tensor data: how the tests get a real `llama`-architecture file from
//! Qwen2 weights (the Llama graph; the Q/K/V biases stay, which llama.cpp's `llama` loader also
//! accepts).

use std::path::Path;

use hotcold::gguf::{GgufFile, GgufWriter, MetaValue};

pub fn relabel(src: &Path, new_arch: &str, dst: &Path) {
    let file = GgufFile::open(src).unwrap();
    let old_arch = file.architecture().unwrap().to_string();
    let mut w = GgufWriter::from_file(&file);
    let prefix = format!("{old_arch}.");
    for (key, value) in file.metadata() {
        if let Some(rest) = key.strip_prefix(&prefix) {
            w.remove(key);
            w.set(format!("{new_arch}.{rest}"), value.clone());
        }
    }
    w.set("general.architecture", MetaValue::String(new_arch.into()));
    w.write_file(dst).unwrap();
}
