//! The request and response shapes: OpenAI's `/v1/completions` and `/v1/chat/completions`
//! (whole responses and streamed chunks) and llama.cpp's `/completion`, `/tokenize`,
//! `/detokenize`. Requests are parsed leniently about fields they do not use (clients send many)
//! and strictly about the types of the fields they do.

use serde::Deserialize;
use serde_json::{json, Value};

use super::scheduler::{Finish, FinishReason};

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    /// A single stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopField {
    /// The stop strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// The generation fields shared by every completion endpoint (OpenAI's names, with llama.cpp's
/// extras).
#[derive(Deserialize, Debug, Default)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// OpenAI's newer name for `max_tokens` (chat).
    pub max_completion_tokens: Option<u64>,
    /// llama.cpp's name for `max_tokens` (`-1` = until the context is full).
    pub n_predict: Option<i64>,
    /// Temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    pub top_k: Option<u64>,
    /// Min-p (0 = off).
    pub min_p: Option<f32>,
    /// Repetition penalty (llama.cpp's `repeat_penalty`, 1 = off).
    pub repeat_penalty: Option<f32>,
    /// Seed of the sampler.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Choices to generate.
    pub n: Option<u64>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Keep going past end-of-generation tokens (llama.cpp).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// A prompt: text, a list of one text, or token ids.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum PromptField {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of texts (only one is accepted).
    Texts(Vec<String>),
}

/// `POST /v1/completions` and llama.cpp's `POST /completion`.
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    /// The model name (must be the served one when given).
    pub model: Option<String>,
    /// The prompt.
    pub prompt: PromptField,
    /// Generation settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A chat message's content: text, or parts of which the text ones are used.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum ContentField {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": …}, …]`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Deserialize, Debug)]
pub struct ContentPart {
    /// Part type (only `text` is supported).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Deserialize, Debug)]
pub struct MessageIn {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// The content (`null` for none).
    pub content: Option<ContentField>,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// The model name (must be the served one when given).
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<MessageIn>,
    /// Generation settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `POST /tokenize` (llama.cpp).
#[derive(Deserialize, Debug)]
pub struct TokenizeRequest {
    /// Text to tokenise.
    pub content: String,
    /// Add BOS and the like.
    #[serde(default)]
    pub add_special: bool,
    /// Also return each token's text.
    #[serde(default)]
    pub with_pieces: bool,
}

/// `POST /detokenize` (llama.cpp).
#[derive(Deserialize, Debug)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// Which API a response is shaped for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// llama.cpp `/completion`.
    Llama,
}

/// What every response of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// The API.
    pub api: Api,
    /// `cmpl-…` / `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
}

/// OpenAI's `usage` object.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Chat, false) => "chat.completion",
            _ => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A streamed piece of text of choice `index` (the first chat chunk also names the role).
    pub fn text_chunk(&self, index: usize, text: &str, first: bool) -> Value {
        match self.api {
            Api::Llama => json!({"index": index, "content": text, "stop": false}),
            Api::Completions => self.wrap(
                true,
                vec![
                    json!({"index": index, "text": text, "logprobs": null, "finish_reason": null}),
                ],
            ),
            Api::Chat => {
                let delta = match first {
                    true => json!({"role": "assistant", "content": text}),
                    false => json!({"content": text}),
                };
                self.wrap(
                    true,
                    vec![json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})],
                )
            }
        }
    }

    /// The last streamed chunk of choice `index`.
    pub fn finish_chunk(&self, index: usize, finish: &Finish) -> Value {
        let reason = finish.reason.as_str();
        match self.api {
            Api::Llama => self.llama_response(index, "", finish),
            Api::Completions => self.wrap(
                true,
                vec![
                    json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason}),
                ],
            ),
            Api::Chat => self.wrap(
                true,
                vec![
                    json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason}),
                ],
            ),
        }
    }

    /// The chunk with the token counts (`stream_options.include_usage`).
    pub fn usage_chunk(&self, prompt_tokens: usize, completion_tokens: usize) -> Value {
        let mut v = self.wrap(true, Vec::new());
        v["usage"] = usage(prompt_tokens, completion_tokens);
        v
    }

    /// A whole (non-streamed) response with one choice per `(text, finish)`.
    pub fn response(&self, choices: &[(String, Finish)]) -> Value {
        if self.api == Api::Llama {
            let (text, finish) = &choices[0];
            return self.llama_response(0, text, finish);
        }
        let list = choices
            .iter()
            .enumerate()
            .map(|(i, (text, f))| {
                let reason = f.reason.as_str();
                match self.api {
                    Api::Chat => json!({
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": reason,
                    }),
                    _ => {
                        json!({"index": i, "text": text, "logprobs": null, "finish_reason": reason})
                    }
                }
            })
            .collect();
        let mut v = self.wrap(false, list);
        let prompt = choices.first().map_or(0, |(_, f)| f.prompt_tokens);
        let completion = choices.iter().map(|(_, f)| f.completion_tokens).sum();
        v["usage"] = usage(prompt, completion);
        v
    }

    /// llama.cpp's `/completion` answer (and last streamed chunk).
    fn llama_response(&self, index: usize, text: &str, f: &Finish) -> Value {
        let stop_type = match (f.reason, f.stopped_by_string) {
            (_, true) => "word",
            (FinishReason::Stop, false) => "eos",
            (FinishReason::Length, false) => "limit",
        };
        json!({
            "index": index,
            "content": text,
            "model": self.model,
            "stop": true,
            "stop_type": stop_type,
            "tokens_predicted": f.completion_tokens,
            "tokens_evaluated": f.prompt_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish() -> Finish {
        Finish {
            reason: FinishReason::Length,
            stopped_by_string: false,
            prompt_tokens: 3,
            completion_tokens: 2,
        }
    }

    fn envelope(api: Api) -> Envelope {
        Envelope {
            api,
            id: "x".into(),
            created: 1,
            model: "m".into(),
        }
    }

    #[test]
    fn chat_chunks_carry_the_role_first_then_content() {
        let e = envelope(Api::Chat);
        let first = e.text_chunk(0, "Hi", true);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            e.text_chunk(0, "!", false)["choices"][0]["delta"],
            json!({"content": "!"})
        );
        assert_eq!(
            e.finish_chunk(0, &finish())["choices"][0]["finish_reason"],
            "length"
        );
    }

    #[test]
    fn whole_responses_count_usage_over_choices() {
        let e = envelope(Api::Completions);
        let v = e.response(&[("a".into(), finish()), ("b".into(), finish())]);
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
        );
        assert_eq!(v["choices"][1]["text"], "b");
        let v = envelope(Api::Llama).response(&[("a".into(), finish())]);
        assert_eq!(v["stop_type"], "limit");
        assert_eq!(v["tokens_predicted"], 2);
    }

    #[test]
    fn requests_parse_with_unknown_fields_and_reject_wrong_types() {
        let r: CompletionRequest =
            serde_json::from_str(r#"{"prompt": "x", "max_tokens": 4, "user": "u", "stop": "\n"}"#)
                .unwrap();
        assert_eq!(r.sampling.max_tokens, Some(4));
        assert_eq!(r.sampling.stop.unwrap().into_vec(), vec!["\n"]);
        assert!(
            serde_json::from_str::<CompletionRequest>(r#"{"prompt": "x", "max_tokens": "4"}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<CompletionRequest>(r#"{"max_tokens": 4}"#).is_err());
    }
}
