//! The HTTP routes: request parsing and validation, job submission, and the answer (whole or as
//! server-sent events). Nothing here runs the model; tokenising and template rendering run on
//! tokio's blocking pool.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hotcold_core::sample::SamplerConfig;
use hotcold_core::tokenizer::{ChatMessage, ChatTemplate};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::error::ApiError;
use super::metrics::Metrics;
use super::openai::{
    Api, ChatRequest, CompletionRequest, ContentField, DetokenizeRequest, Envelope, PromptField,
    Sampling, StopField, TokenizeRequest,
};
use super::scheduler::{Event, Finish, GenParams, Job, Scheduler};
use crate::cmd::common::Loaded;

/// Most choices (`n`) per request.
const MAX_N: u64 = 8;
/// Most stop strings per request.
const MAX_STOPS: usize = 16;
/// OpenAI's default `max_tokens` for `/v1/completions`.
const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// Everything the handlers share.
pub struct AppState {
    /// Model, tokenizer, threads, context size.
    pub loaded: Arc<Loaded>,
    /// The chat template.
    pub template: ChatTemplate,
    /// The model thread.
    pub scheduler: Scheduler,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The name the model is served under.
    pub model_name: String,
    /// The key every request must bear, if any.
    pub api_key: Option<String>,
}

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// Refuses requests without `Authorization: Bearer KEY` when a key is set (`/health` stays open
/// for probes, as in llama.cpp).
pub async fn require_key(State(st): Shared, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if req.uri().path() != "/health" && given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Answers 413 at once to a request whose `Content-Length` is over [`super::BODY_LIMIT`], before
/// its body is read (a body without a length is cut off at the limit while it is read).
pub async fn reject_oversized(req: Request, next: Next) -> Response {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|n| n > super::BODY_LIMIT as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is larger than the limit of {} bytes",
                super::BODY_LIMIT
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// `GET /health`.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /v1/models`.
pub async fn models(State(st): Shared) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "hotcold",
        }],
    }))
}

/// `GET /metrics` (Prometheus text format).
pub async fn metrics(State(st): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// Any other path.
pub async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

/// `POST /tokenize` (llama.cpp).
pub async fn tokenize(State(st): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = parse(body)?;
    let loaded = st.loaded.clone();
    let tokens = blocking(move || {
        loaded
            .tokenizer
            .encode(&req.content, req.add_special, true)
            .map(|ids| (ids, req.with_pieces))
    })
    .await?;
    let (ids, with_pieces) = tokens;
    if !with_pieces {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let tok = &st.loaded.tokenizer;
    let pieces: Vec<Value> = ids
        .iter()
        .map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(tok.token_to_piece(id))}))
        .collect();
    Ok(Json(json!({ "tokens": pieces })))
}

/// `POST /detokenize` (llama.cpp).
pub async fn detokenize(State(st): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = parse(body)?;
    let n_vocab = st.loaded.tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::bad_request(format!(
            "token id {bad} is outside the vocabulary of {n_vocab}"
        )));
    }
    Ok(Json(
        json!({ "content": st.loaded.tokenizer.decode(&req.tokens) }),
    ))
}

/// `POST /v1/completions`.
pub async fn completions(State(st): Shared, body: Body) -> Result<Response, ApiError> {
    complete(st, body, Api::Completions).await
}

/// `POST /completion` (llama.cpp).
pub async fn llama_completion(State(st): Shared, body: Body) -> Result<Response, ApiError> {
    complete(st, body, Api::Llama).await
}

async fn complete(st: Arc<AppState>, body: Body, api: Api) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body)?;
    check_model(&st, req.model.as_deref())?;
    let prompt = match req.prompt {
        PromptField::Tokens(ids) => {
            let n_vocab = st.loaded.tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(ApiError::bad_request(format!(
                    "prompt token id {bad} is outside the vocabulary of {n_vocab}"
                )));
            }
            ids
        }
        PromptField::Text(text) => encode(&st, text).await?,
        PromptField::Texts(mut texts) if texts.len() == 1 => encode(&st, texts.remove(0)).await?,
        PromptField::Texts(_) => {
            return Err(ApiError::bad_request(
                "`prompt` must be one string (use `n` for several completions)",
            ))
        }
    };
    let default_max = match api {
        Api::Llama => st.loaded.n_ctx,
        _ => DEFAULT_COMPLETION_TOKENS,
    };
    generate(st, api, prompt, req.sampling, default_max).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): Shared, body: Body) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(body)?;
    check_model(&st, req.model.as_deref())?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(ContentField::Text(t)) => t,
            Some(ContentField::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::bad_request(format!(
                                "messages[{i}]: content part of type `{kind}` is not supported (only text)"
                            )))
                        }
                    }
                }
                text
            }
        };
        messages.push(ChatMessage::new(m.role, content));
    }
    let state = st.clone();
    let prompt = blocking(move || {
        let tok = &state.loaded.tokenizer;
        let text = state.template.render_for(tok, &messages, true)?;
        tok.encode(&text, true, true)
    })
    .await?;
    let default_max = st.loaded.n_ctx;
    generate(st, Api::Chat, prompt, req.sampling, default_max).await
}

/// Validates, submits one job per choice, and answers whole or streamed.
async fn generate(
    st: Arc<AppState>,
    api: Api,
    prompt: Vec<u32>,
    sampling: Sampling,
    default_max: usize,
) -> Result<Response, ApiError> {
    let n_ctx = st.loaded.n_ctx;
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt.len() >= n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens, more than fit the context of {n_ctx} tokens",
            prompt.len()
        )));
    }
    let n = sampling.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) || (api == Api::Llama && n != 1) {
        return Err(ApiError::bad_request(format!(
            "`n` must be between 1 and {MAX_N} (1 for /completion)"
        )));
    }
    let n = n as usize;
    let params = gen_params(&sampling, default_max, n_ctx)?;
    let (tx, rx) = unbounded_channel();
    let jobs = (0..n)
        .map(|index| {
            let mut params = params.clone();
            params.sampling.seed = params.sampling.seed.wrapping_add(index as u64);
            Job {
                prompt: prompt.clone(),
                params,
                index,
                events: tx.clone(),
            }
        })
        .collect();
    drop(tx);
    st.scheduler.submit(jobs).map_err(|_| ApiError::busy())?;
    let envelope = Envelope {
        api,
        id: new_id(api),
        created: unix_now(),
        model: st.model_name.clone(),
    };
    if sampling.stream {
        let include_usage = sampling.stream_options.is_some_and(|o| o.include_usage);
        Ok(stream(envelope, rx, n, include_usage).into_response())
    } else {
        collect(envelope, rx, n).await
    }
}

/// The generation settings of a request, validated.
fn gen_params(s: &Sampling, default_max: usize, n_ctx: usize) -> Result<GenParams, ApiError> {
    let asked = s
        .max_tokens
        .or(s.max_completion_tokens)
        .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
        .or(s.n_predict);
    let max_tokens = match asked {
        None => default_max,
        Some(-1) => n_ctx,
        Some(v) if v < 1 => {
            return Err(ApiError::bad_request(format!(
                "max_tokens must be at least 1 (got {v})"
            )))
        }
        Some(v) if v as u64 > n_ctx as u64 => {
            return Err(ApiError::bad_request(format!(
                "max_tokens {v} is more than the context size of {n_ctx} tokens"
            )))
        }
        Some(v) => v as usize,
    };
    let defaults = SamplerConfig::default();
    let unit = |name: &str, v: Option<f32>, default: f32| match v {
        Some(x) if !(0.0..=1.0).contains(&x) => Err(ApiError::bad_request(format!(
            "{name} must be between 0 and 1 (got {x})"
        ))),
        _ => Ok(v.unwrap_or(default)),
    };
    let temperature = s.temperature.unwrap_or(defaults.temperature);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::bad_request(format!(
            "temperature must be a number ≥ 0 (got {temperature})"
        )));
    }
    let repeat_penalty = s.repeat_penalty.unwrap_or(defaults.repeat_penalty);
    if !(repeat_penalty.is_finite() && repeat_penalty > 0.0) {
        return Err(ApiError::bad_request(format!(
            "repeat_penalty must be > 0 (got {repeat_penalty})"
        )));
    }
    let stop = s.stop.clone().map_or(Vec::new(), StopField::into_vec);
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_STOPS} stop strings"
        )));
    }
    Ok(GenParams {
        sampling: SamplerConfig {
            temperature,
            top_k: s.top_k.map_or(defaults.top_k, |k| k as usize),
            top_p: unit("top_p", s.top_p, defaults.top_p)?,
            min_p: unit("min_p", s.min_p, defaults.min_p)?,
            repeat_penalty,
            repeat_last_n: defaults.repeat_last_n,
            seed: s.seed.unwrap_or_else(random_seed),
        },
        max_tokens,
        stop,
        ignore_eos: s.ignore_eos,
    })
}

/// Waits for every choice and answers in one JSON body.
async fn collect(
    envelope: Envelope,
    mut rx: UnboundedReceiver<(usize, Event)>,
    n: usize,
) -> Result<Response, ApiError> {
    let mut texts = vec![String::new(); n];
    let mut finishes: Vec<Option<Finish>> = vec![None; n];
    while let Some((i, event)) = rx.recv().await {
        match event {
            Event::Text(t) => texts[i].push_str(&t),
            Event::Done(f) => finishes[i] = Some(f),
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    let choices = texts
        .into_iter()
        .zip(finishes)
        .map(|(t, f)| f.map(|f| (t, f)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ApiError::internal("the model thread stopped"))?;
    Ok(Json(envelope.response(&choices)).into_response())
}

/// The state of one streamed answer.
struct Streaming {
    envelope: Envelope,
    rx: UnboundedReceiver<(usize, Event)>,
    started: Vec<bool>,
    done: usize,
    include_usage: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
    outbox: VecDeque<String>,
    ended: bool,
}

impl Streaming {
    /// Turns one event into the `data:` payloads it causes.
    fn on(&mut self, event: Option<(usize, Event)>) {
        let env = &self.envelope;
        match event {
            Some((i, Event::Text(t))) => {
                let first = !std::mem::replace(&mut self.started[i], true);
                self.outbox
                    .push_back(env.text_chunk(i, &t, first).to_string());
            }
            Some((i, Event::Done(f))) => {
                self.outbox.push_back(env.finish_chunk(i, &f).to_string());
                self.done += 1;
                self.prompt_tokens = f.prompt_tokens;
                self.completion_tokens += f.completion_tokens;
                if self.done == self.started.len() {
                    if self.include_usage && env.api != Api::Llama {
                        let usage = env.usage_chunk(self.prompt_tokens, self.completion_tokens);
                        self.outbox.push_back(usage.to_string());
                    }
                    self.end();
                }
            }
            Some((_, Event::Failed(message))) => {
                self.outbox
                    .push_back(ApiError::internal(message).body().to_string());
                self.end();
            }
            None => {
                let e = ApiError::internal("the model thread stopped");
                self.outbox.push_back(e.body().to_string());
                self.end();
            }
        }
    }

    fn end(&mut self) {
        if self.envelope.api != Api::Llama {
            self.outbox.push_back("[DONE]".into());
        }
        self.ended = true;
    }
}

/// Server-sent events for the answer; dropping it (the client went away) closes the channel,
/// which frees the jobs' slots at the next step.
fn stream(
    envelope: Envelope,
    rx: UnboundedReceiver<(usize, Event)>,
    n: usize,
    include_usage: bool,
) -> impl IntoResponse {
    let state = Streaming {
        envelope,
        rx,
        started: vec![false; n],
        done: 0,
        include_usage,
        prompt_tokens: 0,
        completion_tokens: 0,
        outbox: VecDeque::new(),
        ended: false,
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(data) = st.outbox.pop_front() {
                let event = SseEvent::default().data(data);
                return Some((Ok::<_, Infallible>(event), st));
            }
            if st.ended {
                return None;
            }
            let event = st.rx.recv().await;
            st.on(event);
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Parses a JSON body (size limit and JSON errors become 4xx answers).
fn parse<T: DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes =
        body.map_err(|r| ApiError::new(r.status(), "invalid_request_error", r.body_text()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

fn check_model(st: &AppState, asked: Option<&str>) -> Result<(), ApiError> {
    match asked {
        Some(name) if !name.is_empty() && name != st.model_name => {
            Err(ApiError::unknown_model(name, &st.model_name))
        }
        _ => Ok(()),
    }
}

async fn encode(st: &Arc<AppState>, text: String) -> Result<Vec<u32>, ApiError> {
    let loaded = st.loaded.clone();
    blocking(move || loaded.tokenizer.encode(&text, true, true)).await
}

/// Runs CPU work (tokenising, templates) off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> hotcold_core::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A seed for requests without one: the clock mixed with a counter.
fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn new_id(api: Api) -> String {
    let prefix = match api {
        Api::Chat => "chatcmpl",
        _ => "cmpl",
    };
    format!("{prefix}-{:016x}", random_seed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn sampling(json: &str) -> Sampling {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn max_tokens_is_checked_against_the_context() {
        let p = gen_params(&sampling(r#"{"max_tokens": 5, "seed": 1}"#), 16, 64).unwrap();
        assert_eq!((p.max_tokens, p.sampling.seed), (5, 1));
        assert_eq!(gen_params(&sampling("{}"), 16, 64).unwrap().max_tokens, 16);
        assert_eq!(
            gen_params(&sampling(r#"{"n_predict": -1}"#), 16, 64)
                .unwrap()
                .max_tokens,
            64
        );
        for bad in [
            r#"{"max_tokens": 0}"#,
            r#"{"max_tokens": 65}"#,
            r#"{"n_predict": -5}"#,
        ] {
            let e = gen_params(&sampling(bad), 16, 64).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn sampling_ranges_are_checked() {
        for bad in [
            r#"{"top_p": 1.5}"#,
            r#"{"min_p": -0.1}"#,
            r#"{"temperature": -1}"#,
            r#"{"repeat_penalty": 0}"#,
        ] {
            assert!(gen_params(&sampling(bad), 16, 64).is_err(), "{bad}");
        }
        let p = gen_params(
            &sampling(r#"{"temperature": 0, "stop": ["a", "b"]}"#),
            16,
            64,
        )
        .unwrap();
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.stop, vec!["a", "b"]);
    }
}
