//! `hotcold inspect`: a readable (or JSON) dump of a GGUF file's header, metadata and tensors.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use hotcold_core::gguf::{GgufFile, MetaArray, MetaValue};
use hotcold_core::models::DefaultModel;
use hotcold_core::quant::GgmlType;
use serde_json::{json, Value};

use super::model_arg;

/// Arguments of `hotcold inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF (or PowerInfer) file; the default model when omitted.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// The file, llama.cpp style (same as the positional FILE).
    #[arg(short = 'm', long = "model", conflicts_with = "file")]
    model: Option<PathBuf>,
    /// Print one JSON object (`format`, `version`, `metadata`, `tensors`, …) instead of text.
    #[arg(long)]
    json: bool,
    /// With `--json`, include the full contents of metadata arrays (the vocabulary, …).
    #[arg(long, requires = "json")]
    json_array: bool,
}

/// Runs `hotcold inspect`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = model_arg::resolve(args.file.or(args.model), DefaultModel::Gemma3_270m)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let out = if args.json {
        serde_json::to_string_pretty(&to_json(&file, args.json_array))? + "\n"
    } else {
        to_text(&file, &path)
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn to_text(file: &GgufFile, path: &std::path::Path) -> String {
    let mut s = String::new();
    let arch = file
        .get_str("general.architecture")
        .ok()
        .flatten()
        .unwrap_or("?");
    let _ = writeln!(s, "file:          {}", path.display());
    let _ = writeln!(
        s,
        "format:        {} v{}, {} metadata keys, {} tensors, alignment {}, data at offset {}, {} bytes",
        file.magic().format_name(),
        file.version(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment(),
        file.data_offset(),
        file.file_size()
    );
    let _ = writeln!(s, "architecture:  {arch}");
    if let Ok(Some(name)) = file.get_str("general.name") {
        let _ = writeln!(s, "name:          {name}");
    }

    let _ = writeln!(s, "\nhyper-parameters ({arch}.*):");
    let prefix = format!("{arch}.");
    for (key, value) in file
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
    {
        let _ = writeln!(s, "  {:<44} {}", &key[prefix.len()..], short_value(value));
    }

    let _ = writeln!(s, "\ntokenizer:");
    let _ = write!(s, "{}", tokenizer_summary(file));

    let _ = writeln!(s, "\nmetadata:");
    for (i, (key, value)) in file.metadata().iter().enumerate() {
        let _ = writeln!(
            s,
            "  {:>3}: {:<8} {:<48} = {}",
            i + 1,
            value.meta_type().name(),
            key,
            short_value(value)
        );
    }

    let _ = writeln!(s, "\ntensors:");
    let _ = writeln!(
        s,
        "  {:>4}  {:<40} {:<8} {:<22} {:>12} {:>12}",
        "#", "name", "type", "shape", "bytes", "offset"
    );
    let mut per_type: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for (i, t) in file.tensors().iter().enumerate() {
        let shape = t
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" x ");
        let _ = writeln!(
            s,
            "  {:>4}  {:<40} {:<8} {:<22} {:>12} {:>12}",
            i + 1,
            t.name,
            t.ty.name().to_uppercase(),
            shape,
            t.n_bytes,
            file.data_offset() + t.offset
        );
        let e = per_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.n_bytes;
    }
    let _ = writeln!(s, "\ntotals per type:");
    let (mut n, mut elems, mut bytes) = (0, 0, 0);
    for (ty, (count, e, b)) in &per_type {
        let _ = writeln!(
            s,
            "  {:<8} {:>5} tensors {:>14} elements {:>14} bytes ({:.2} bits/weight)",
            ty.to_uppercase(),
            count,
            e,
            b,
            *b as f64 * 8.0 / (*e).max(1) as f64
        );
        n += count;
        elems += e;
        bytes += b;
    }
    let _ = writeln!(
        s,
        "  {:<8} {:>5} tensors {:>14} elements {:>14} bytes",
        "total", n, elems, bytes
    );
    s
}

fn tokenizer_summary(file: &GgufFile) -> String {
    let mut s = String::new();
    let str_key = |k: &str| file.get_str(k).ok().flatten();
    let int_key = |k: &str| file.get_u64(k).ok().flatten();
    let array_len = |k: &str| file.get_array(k).ok().flatten().map(MetaArray::len);
    let _ = writeln!(
        s,
        "  model:         {}",
        str_key("tokenizer.ggml.model").unwrap_or("(none)")
    );
    if let Some(pre) = str_key("tokenizer.ggml.pre") {
        let _ = writeln!(s, "  pre-tokenizer: {pre}");
    }
    let _ = writeln!(
        s,
        "  vocabulary:    {} tokens",
        array_len("tokenizer.ggml.tokens").unwrap_or(0)
    );
    if let Some(merges) = array_len("tokenizer.ggml.merges") {
        let _ = writeln!(s, "  merges:        {merges}");
    }
    for name in [
        "bos",
        "eos",
        "eot",
        "unknown",
        "padding",
        "seperator",
        "mask",
    ] {
        if let Some(id) = int_key(&format!("tokenizer.ggml.{name}_token_id")) {
            let _ = writeln!(s, "  {:<14} {id}", format!("{name} id:"));
        }
    }
    for flag in ["add_bos_token", "add_eos_token"] {
        if let Ok(Some(b)) = file.get_bool(&format!("tokenizer.ggml.{flag}")) {
            let _ = writeln!(s, "  {:<14} {b}", format!("{flag}:"));
        }
    }
    let template = str_key("tokenizer.chat_template");
    let _ = writeln!(
        s,
        "  chat template: {}",
        template.map_or("no".to_string(), |t| format!("yes ({} bytes)", t.len()))
    );
    s
}

/// A one-line rendering of a value: scalars in full (long strings cut), arrays as type, length and
/// their first elements.
fn short_value(value: &MetaValue) -> String {
    match value {
        MetaValue::String(s) => quote_cut(s, 60),
        MetaValue::F32(x) => x.to_string(),
        MetaValue::Array(a) => {
            let items = array_to_json(a, Some(5));
            let shown = items.as_array().map_or(0, Vec::len);
            let mut list = items
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| match v {
                    Value::String(s) => quote_cut(s, 20),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            if a.len() > shown {
                list.push_str(", …");
            }
            format!("[{}; {}] [{list}]", a.elem_type().name(), a.len())
        }
        other => scalar_to_json(other).to_string(),
    }
}

fn quote_cut(s: &str, max_chars: usize) -> String {
    let mut cut: String = s.chars().take(max_chars).collect();
    if cut.len() < s.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

fn to_json(file: &GgufFile, full_arrays: bool) -> Value {
    let metadata: serde_json::Map<String, Value> = file
        .metadata()
        .iter()
        .map(|(k, v)| {
            let value = match v {
                MetaValue::Array(a) if !full_arrays => json!({
                    "type": "ARRAY",
                    "element_type": a.elem_type().name(),
                    "length": a.len(),
                    "head": array_to_json(a, Some(8)),
                }),
                MetaValue::Array(a) => json!({
                    "type": "ARRAY",
                    "element_type": a.elem_type().name(),
                    "length": a.len(),
                    "value": array_to_json(a, None),
                }),
                other => {
                    json!({ "type": other.meta_type().name(), "value": scalar_to_json(other) })
                }
            };
            (k.clone(), value)
        })
        .collect();
    let tensors: Vec<Value> = file
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name().to_uppercase(),
                "type_id": t.ty as u32,
                "shape": t.shape,
                "offset": file.data_offset() + t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    let mut per_type: BTreeMap<String, Value> = BTreeMap::new();
    for ty in GgmlType::ALL {
        let (count, bytes) = file
            .tensors()
            .iter()
            .filter(|t| t.ty == *ty)
            .fold((0u64, 0u64), |(c, b), t| (c + 1, b + t.n_bytes));
        if count > 0 {
            per_type.insert(
                ty.name().to_uppercase(),
                json!({ "tensors": count, "bytes": bytes }),
            );
        }
    }
    json!({
        "format": match file.magic() { hotcold_core::gguf::Magic::Gguf => "GGUF", hotcold_core::gguf::Magic::PowerInfer => "PWRI" },
        "version": file.version(),
        "alignment": file.alignment(),
        "data_offset": file.data_offset(),
        "file_size": file.file_size(),
        "metadata": metadata,
        "tensors": tensors,
        "totals_per_type": per_type,
    })
}

fn scalar_to_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::F32(x) => json!(x),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        MetaValue::Array(a) => array_to_json(a, None),
    }
}

/// The elements of `a` as JSON, the first `limit` of them when given.
fn array_to_json(a: &MetaArray, limit: Option<usize>) -> Value {
    fn list<T: serde::Serialize>(v: &[T], limit: Option<usize>) -> Value {
        json!(&v[..limit.unwrap_or(v.len()).min(v.len())])
    }
    match a {
        MetaArray::U8(v) => list(v, limit),
        MetaArray::I8(v) => list(v, limit),
        MetaArray::U16(v) => list(v, limit),
        MetaArray::I16(v) => list(v, limit),
        MetaArray::U32(v) => list(v, limit),
        MetaArray::I32(v) => list(v, limit),
        MetaArray::F32(v) => list(v, limit),
        MetaArray::Bool(v) => list(v, limit),
        MetaArray::String(v) => list(v, limit),
        MetaArray::U64(v) => list(v, limit),
        MetaArray::I64(v) => list(v, limit),
        MetaArray::F64(v) => list(v, limit),
        MetaArray::Array(v) => Value::Array(
            v[..limit.unwrap_or(v.len()).min(v.len())]
                .iter()
                .map(|inner| array_to_json(inner, limit))
                .collect(),
        ),
    }
}
