//! Chat templates: a model's `tokenizer.chat_template` (Jinja, rendered with minijinja the way
//! Hugging Face's `apply_chat_template` renders it), or its family's known format when the file
//! has none.
//!
//! Hugging Face compiles templates with `trim_blocks` and `lstrip_blocks`, gives them
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (None here),
//! `raise_exception` and `strftime_now`, a `tojson` that writes like Python's `json.dumps`, and
//! Python string methods (`.strip()`, `.startswith()`, …); all of that is set up here.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind};

use super::Tokenizer;
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat format; see the [module docs](self).
#[derive(Debug)]
pub struct ChatTemplate {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Jinja {
        source: String,
        env: Box<Environment<'static>>,
    },
    /// `<start_of_turn>user\n…<end_of_turn>\n`, assistant as `model`, the system prompt merged
    /// into the first user turn (llama.cpp's built-in `gemma` format).
    Gemma,
    /// `<|im_start|>role\n…<|im_end|>\n` (llama.cpp's built-in `chatml` format).
    ChatMl,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template of `file`: `tokenizer.chat_template` if present, else the known format of the
    /// model's family (Gemma for `gemma*` architectures or vocabularies with `<start_of_turn>`),
    /// else ChatML.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate> {
        if let Some(source) = file.get_str("tokenizer.chat_template")? {
            return ChatTemplate::jinja(source);
        }
        let arch = file.get_str("general.architecture")?.unwrap_or("");
        let has_turn_tokens = file
            .get_array("tokenizer.ggml.tokens")?
            .and_then(|a| a.as_strings())
            .is_some_and(|t| t.iter().any(|t| t == "<start_of_turn>"));
        Ok(if arch.starts_with("gemma") || has_turn_tokens {
            ChatTemplate::gemma()
        } else {
            ChatTemplate::chatml()
        })
    }

    /// Compiles a Jinja chat template (errors on a syntax error).
    pub fn jinja(source: impl Into<String>) -> Result<ChatTemplate> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            kind: Kind::Jinja {
                source,
                env: Box::new(env),
            },
        })
    }

    /// llama.cpp's built-in Gemma format.
    pub fn gemma() -> ChatTemplate {
        ChatTemplate { kind: Kind::Gemma }
    }

    /// llama.cpp's built-in ChatML format.
    pub fn chatml() -> ChatTemplate {
        ChatTemplate { kind: Kind::ChatMl }
    }

    /// The Jinja source, for a template from the file.
    pub fn source(&self) -> Option<&str> {
        match &self.kind {
            Kind::Jinja { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the opening of the
    /// assistant's turn. `bos_token`/`eos_token` are what the template sees by those names (the
    /// built-in formats use neither: BOS comes from tokenizing with `add_special`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        match &self.kind {
            Kind::Jinja { env, .. } => {
                let messages: Vec<Value> = messages
                    .iter()
                    .map(|m| {
                        let mut map = BTreeMap::new();
                        map.insert("role".to_string(), Value::from(m.role.as_str()));
                        map.insert("content".to_string(), Value::from(m.content.as_str()));
                        Value::from(map)
                    })
                    .collect();
                let ctx = minijinja::context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => bos_token,
                    eos_token => eos_token,
                    tools => Value::from(()),
                };
                env.get_template(TEMPLATE_NAME)
                    .and_then(|t| t.render(ctx))
                    .map_err(template_error)
            }
            Kind::Gemma => Ok(render_gemma(messages, add_generation_prompt)),
            Kind::ChatMl => Ok(render_chatml(messages, add_generation_prompt)),
        }
    }

    /// Renders `messages` with `tok`'s BOS and EOS texts as `bos_token` and `eos_token`.
    pub fn render_for(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let text = |id: Option<u32>| id.and_then(|id| tok.token_text(id)).unwrap_or("");
        self.render(
            messages,
            add_generation_prompt,
            text(tok.bos()),
            text(tok.eos()),
        )
    }
}

fn template_error(e: minijinja::Error) -> Error {
    let mut message = format!("chat template: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(inner) = source {
        let _ = write!(message, ": {inner}");
        source = inner.source();
    }
    Error::Tokenizer(message)
}

fn render_gemma(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let trim = |s: &str| {
        s.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\x0B')
            .to_string()
    };
    let mut out = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(&trim(&m.content));
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        let _ = writeln!(out, "<start_of_turn>{role}");
        if !system.is_empty() && role != "model" {
            out.push_str(&system);
            out.push_str("\n\n");
            system.clear();
        }
        out.push_str(&trim(&m.content));
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    out
}

fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        let _ = write!(out, "<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time, formatted with the common `strftime` fields
/// (`%Y %m %d %e %b %B %a %A %H %M %S %y %j %p %I %%`). In the browser, where the standard
/// library has no clock, it is the Unix epoch.
fn strftime_now(format: String) -> String {
    #[cfg(not(target_arch = "wasm32"))]
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    #[cfg(target_arch = "wasm32")]
    let secs = 0;
    format_time(secs, &format)
}

/// Formats `secs` since the Unix epoch (UTC) with a subset of `strftime`.
fn format_time(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (hour, minute, second) = (tod / 3600, tod % 3600 / 60, tod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUMULATIVE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUMULATIVE[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('B') => write!(out, "{month_name}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", if hour % 12 == 0 { 12 } else { hour % 12 }),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// `tojson(indent=None)`: JSON as Python's `json.dumps(value, ensure_ascii=False, indent=indent)`
/// writes it, which is what Hugging Face templates are written against.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let (item_sep, key_sep) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = value.as_i64() {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                if f.is_finite() {
                    let _ = write!(out, "{f:?}");
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                }
            }
        }
        ValueKind::String | ValueKind::Bytes | ValueKind::Invalid | ValueKind::Plain => {
            write_json_string(out, &value.to_string())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json_string(out, &key.to_string());
                out.push_str(key_sep);
                write_json(out, &value.get_item(key)?, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => write_json_string(out, &value.to_string()),
    }
    Ok(())
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_formats() {
        let msgs = [
            ChatMessage::new("system", "Be brief. "),
            ChatMessage::new("user", " hi"),
            ChatMessage::new("assistant", "hello"),
            ChatMessage::new("user", "bye"),
        ];
        assert_eq!(
            ChatTemplate::gemma().render(&msgs, true, "<bos>", "<eos>").unwrap(),
            "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nhello<end_of_turn>\n\
             <start_of_turn>user\nbye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            ChatTemplate::chatml()
                .render(&msgs[1..2], true, "", "")
                .unwrap(),
            "<|im_start|>user\n hi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn jinja_features_hf_templates_use() {
        let t = ChatTemplate::jinja(
            "{% for m in messages %}{% if m.role not in ['user', 'system'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}\n\
             {{ bos_token }}{{ m.content.strip().upper() }}{% if m.content.startswith(' ') %}!{% endif %}{% endfor %}\n\
             {{ {'a': [1, 'x\"\\n', none, true]} | tojson }}{{ loop }}",
        )
        .unwrap();
        let out = t
            .render(&[ChatMessage::new("user", " hi ")], false, "<s>", "</s>")
            .unwrap();
        assert_eq!(out, "<s>HI!{\"a\": [1, \"x\\\"\\n\", null, true]}");
        let err = t
            .render(&[ChatMessage::new("tool", "x")], false, "", "")
            .unwrap_err();
        assert!(err.to_string().contains("bad role tool"), "{err}");
        assert!(ChatTemplate::jinja("{% if %}").is_err());
    }

    /// Qwen2.5's template as stored in the real GGUF (`tokenizer.chat_template`).
    const QWEN: &str = include_str!("testdata/qwen2.5-chat-template.jinja");

    #[test]
    fn qwen_template_renders_chatml_as_hugging_face_does() {
        let t = ChatTemplate::jinja(QWEN).unwrap();
        let msgs = [
            ChatMessage::new("system", "You are a helpful coder."),
            ChatMessage::new("user", "Write hello world in Rust."),
        ];
        assert_eq!(
            t.render(&msgs, true, "<|endoftext|>", "<|im_end|>")
                .unwrap(),
            "<|im_start|>system\nYou are a helpful coder.<|im_end|>\n\
             <|im_start|>user\nWrite hello world in Rust.<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        // No system message: Qwen's default one; a finished assistant turn; tool results grouped.
        let msgs = [
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "hello"),
            ChatMessage::new("tool", "42"),
            ChatMessage::new("tool", "43"),
        ];
        assert_eq!(
            t.render(&msgs, false, "", "").unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n\
             <|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response><|im_end|>\n"
        );
    }

    #[test]
    fn time_formatting() {
        // 2024-03-01 13:05:09 UTC, a Friday, day 61 of a leap year.
        assert_eq!(
            format_time(1_709_298_309, "%d %b %Y %H:%M:%S %A %j %%"),
            "01 Mar 2024 13:05:09 Friday 061 %"
        );
        assert_eq!(format_time(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    }
}
