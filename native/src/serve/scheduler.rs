//! The model thread: continuous batching of many requests over one [`Batch`].
//!
//! Requests arrive as [`Job`]s on a channel. Each step the thread admits waiting jobs into free
//! slots, drops the ones whose client went away, and runs one batched forward step holding one
//! token of every decoding sequence and a chunk of the prompts still being read (a bounded number
//! of prompt tokens per step while others decode, so running streams keep flowing). It then
//! samples, detokenises, applies stop strings and sends each job its text as [`Event`]s. The HTTP
//! side never touches the model: it submits jobs and reads events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hotcold_core::engine::{Batch, SeqId, Work};
use hotcold_core::sample::{Sampler, SamplerConfig};
use hotcold_core::tokenizer::StreamDecoder;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use super::stop::StopMatcher;
use crate::cmd::common::Loaded;

/// Prompt tokens evaluated per step while other sequences are decoding.
const PREFILL_WITH_DECODE: usize = 64;
/// Prompt tokens evaluated per step when no sequence is decoding.
const PREFILL_ALONE: usize = 512;
/// The window of the tokens-per-second gauge.
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// How to generate for one job.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Sampler settings (seed included).
    pub sampling: SamplerConfig,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// One generation: a tokenised prompt, its parameters and where its events go.
pub struct Job {
    /// The prompt's tokens (at least one, fewer than the context).
    pub prompt: Vec<u32>,
    /// How to generate.
    pub params: GenParams,
    /// The choice index this job answers (for `n > 1`).
    pub index: usize,
    /// Events, tagged with `index`; a closed receiver cancels the job at the next step.
    pub events: UnboundedSender<(usize, Event)>,
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl FinishReason {
    /// OpenAI's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a job.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// Whether a stop string (rather than an end-of-generation token) ended it.
    pub stopped_by_string: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the end-of-generation token included).
    pub completion_tokens: usize,
}

/// What the model thread tells a job.
#[derive(Clone, Debug)]
pub enum Event {
    /// New text (complete UTF-8, never part of a stop string).
    Text(String),
    /// The job ended.
    Done(Finish),
    /// The job failed.
    Failed(String),
}

/// Sizes of the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// Sequences decoded together.
    pub parallel: usize,
    /// Context of each sequence.
    pub n_ctx: usize,
    /// Jobs that may wait for a slot beyond those running.
    pub max_queue: usize,
}

/// The queue is full.
#[derive(Debug)]
pub struct Busy;

/// The HTTP side's handle on the model thread.
pub struct Scheduler {
    tx: mpsc::Sender<Job>,
    outstanding: Arc<AtomicUsize>,
    capacity: usize,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// Starts the model thread; fails (before serving anything) when the batch cannot be set up,
    /// e.g. `--ffn sparse` on a file without predictors.
    pub fn start(
        loaded: Arc<Loaded>,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<(Scheduler, JoinHandle<()>)> {
        anyhow::ensure!(config.parallel > 0, "--parallel must be at least 1");
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let outstanding = Arc::new(AtomicUsize::new(0));
        metrics
            .slots_total
            .store(config.parallel as u64, Ordering::Relaxed);
        let thread = {
            let (outstanding, metrics) = (outstanding.clone(), metrics.clone());
            std::thread::Builder::new()
                .name("hotcold-scheduler".into())
                .spawn(move || {
                    let mut batch = Batch::new(
                        &loaded.model,
                        config.parallel,
                        config.n_ctx,
                        loaded.pool.clone(),
                    );
                    if let Some(mode) = loaded.ffn {
                        if let Err(e) = batch.set_ffn_mode(mode) {
                            let _ = ready_tx.send(Err(anyhow::Error::from(e)));
                            return;
                        }
                    }
                    if let Some(teal) = &loaded.teal {
                        batch.set_teal(teal.clone());
                    }
                    batch.set_sparse_prefill(loaded.sparse_prefill);
                    let _ = ready_tx.send(Ok(()));
                    let mut thread = ModelThread {
                        loaded: &loaded,
                        batch,
                        waiting: VecDeque::new(),
                        active: Vec::new(),
                        outstanding,
                        metrics,
                        rate: VecDeque::new(),
                    };
                    thread.run(rx);
                })?
        };
        ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the model thread died while starting"))??;
        Ok((
            Scheduler {
                tx,
                outstanding,
                capacity: config.parallel + config.max_queue,
                metrics,
            },
            thread,
        ))
    }

    /// Queues `jobs` (all or none): [`Busy`] when they would exceed the slots plus the queue.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), Busy> {
        let n = jobs.len();
        let taken = self
            .outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| {
                (o + n <= self.capacity).then_some(o + n)
            });
        if taken.is_err() {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Busy);
        }
        for job in jobs {
            if self.tx.send(job).is_err() {
                // The model thread is gone; the job's receiver sees its sender dropped.
                self.outstanding.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// A job holding a slot.
struct Active<'t> {
    seq: SeqId,
    job: Job,
    sampler: Sampler,
    /// Prompt tokens evaluated so far.
    read: usize,
    /// Tokens generated so far.
    generated: usize,
    /// The last sampled token (fed at the next step).
    last: u32,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
}

impl Active<'_> {
    fn decoding(&self) -> bool {
        self.read == self.job.prompt.len()
    }

    fn send(&self, event: Event) {
        let _ = self.job.events.send((self.job.index, event));
    }
}

/// The model thread's state.
struct ModelThread<'l> {
    loaded: &'l Loaded,
    batch: Batch<'l>,
    waiting: VecDeque<Job>,
    active: Vec<Active<'l>>,
    outstanding: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    /// Tokens generated per recent step, for the rate gauge.
    rate: VecDeque<(Instant, usize)>,
}

impl<'l> ModelThread<'l> {
    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        while self.intake(&rx) {
            self.drop_cancelled();
            self.admit();
            if !self.active.is_empty() {
                self.step();
            }
            self.update_gauges();
        }
    }

    /// Moves submitted jobs into the waiting queue, blocking when there is nothing to do.
    /// Returns `false` when the server is shutting down and nothing is left.
    fn intake(&mut self, rx: &mpsc::Receiver<Job>) -> bool {
        if self.active.is_empty() && self.waiting.is_empty() {
            match rx.recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(_) => return false,
            }
        }
        while let Ok(job) = rx.try_recv() {
            self.waiting.push_back(job);
        }
        true
    }

    /// Forgets jobs whose client went away, freeing their slots.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.events.is_closed());
        let mut gone = before - self.waiting.len();
        let batch = &mut self.batch;
        self.active.retain(|a| {
            let closed = a.job.events.is_closed();
            if closed {
                batch.release(a.seq);
                gone += 1;
            }
            !closed
        });
        self.finished(gone);
    }

    fn finished(&self, n: usize) {
        if n > 0 {
            self.outstanding.fetch_sub(n, Ordering::SeqCst);
            self.metrics.requests.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Gives waiting jobs the free slots, first come first served.
    fn admit(&mut self) {
        while !self.waiting.is_empty() {
            let Some(seq) = self.batch.acquire() else {
                break;
            };
            let job = self.waiting.pop_front().expect("checked non-empty");
            let mut sampler = Sampler::new(job.params.sampling.clone());
            job.prompt.iter().for_each(|&t| sampler.accept(t));
            let stop = StopMatcher::new(job.params.stop.clone());
            self.active.push(Active {
                seq,
                job,
                sampler,
                read: 0,
                generated: 0,
                last: 0,
                decoder: self.loaded.tokenizer.stream_decoder(false),
                stop,
            });
        }
    }

    /// One batched forward step over every active job, then sampling and streaming.
    fn step(&mut self) {
        let any_decoding = self.active.iter().any(Active::decoding);
        let mut budget = if any_decoding {
            PREFILL_WITH_DECODE
        } else {
            PREFILL_ALONE
        };
        // (index in `active`, tokens evaluated) of each entry of the step.
        let mut entries = Vec::with_capacity(self.active.len());
        let result = {
            let mut work = Vec::with_capacity(self.active.len());
            for (i, a) in self.active.iter().enumerate() {
                let tokens = if a.decoding() {
                    std::slice::from_ref(&a.last)
                } else if budget > 0 {
                    let n = (a.job.prompt.len() - a.read).min(budget);
                    budget -= n;
                    &a.job.prompt[a.read..a.read + n]
                } else {
                    continue;
                };
                let logits = a.decoding() || a.read + tokens.len() == a.job.prompt.len();
                entries.push((i, tokens.len()));
                work.push(Work {
                    seq: a.seq,
                    tokens,
                    logits,
                });
            }
            self.batch.step(&work)
        };
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                let failed: Vec<usize> = entries.iter().map(|&(i, _)| i).collect();
                self.end(&failed, |a| a.send(Event::Failed(e.to_string())));
                return;
            }
        };
        let mut ended = Vec::new();
        let mut generated = 0;
        for (&(i, n), logits) in entries.iter().zip(logits) {
            let a = &mut self.active[i];
            if !a.decoding() {
                a.read += n;
                self.metrics
                    .prompt_tokens
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            let Some(logits) = logits else { continue };
            generated += 1;
            let n_past = self.batch.n_past(a.seq).unwrap_or(usize::MAX);
            if let Some(finish) = advance(a, &logits, self.loaded, n_past, self.batch.n_ctx()) {
                a.send(Event::Done(finish));
                ended.push(i);
            }
        }
        self.metrics
            .generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        self.rate.push_back((Instant::now(), generated));
        self.end(&ended, |_| {});
    }

    /// Releases the jobs at `indices` of `active` after calling `last` on each.
    fn end(&mut self, indices: &[usize], last: impl Fn(&Active)) {
        for &i in indices.iter().rev() {
            let a = self.active.swap_remove(i);
            last(&a);
            self.batch.release(a.seq);
        }
        self.finished(indices.len());
    }

    fn update_gauges(&mut self) {
        let m = &self.metrics;
        let busy = self.active.len();
        m.slots_busy.store(busy as u64, Ordering::Relaxed);
        let outstanding = self.outstanding.load(Ordering::SeqCst);
        m.queued
            .store(outstanding.saturating_sub(busy) as u64, Ordering::Relaxed);
        m.set_density(self.batch.ffn_density().mean());
        m.set_union_density(self.batch.ffn_density().union_mean());
        let now = Instant::now();
        while self
            .rate
            .front()
            .is_some_and(|&(t, _)| now.duration_since(t) > RATE_WINDOW)
        {
            self.rate.pop_front();
        }
        // Tokens of the steps after the window's first one, over the time since it.
        let tokens: usize = self.rate.iter().skip(1).map(|&(_, n)| n).sum();
        let span = self
            .rate
            .front()
            .map_or(0.0, |&(t, _)| now.duration_since(t).as_secs_f64());
        m.set_tokens_per_s(if span > 0.0 {
            tokens as f64 / span
        } else {
            0.0
        });
    }
}

/// Samples a job's next token from `logits`, streams its text, and says whether the job is over.
/// `n_past` is the job's position count (the next token would go at `n_past`).
fn advance(
    a: &mut Active,
    logits: &[f32],
    loaded: &Loaded,
    n_past: usize,
    n_ctx: usize,
) -> Option<Finish> {
    let next = a.sampler.sample(logits);
    a.generated += 1;
    a.last = next;
    let (prompt_tokens, completion_tokens) = (a.job.prompt.len(), a.generated);
    let finish = move |stopped_by_string: bool, reason| Finish {
        reason: if stopped_by_string {
            FinishReason::Stop
        } else {
            reason
        },
        stopped_by_string,
        prompt_tokens,
        completion_tokens,
    };
    if !a.job.params.ignore_eos && loaded.tokenizer.is_eog(next) {
        return Some(finish(flush(a), FinishReason::Stop));
    }
    let released = a.stop.push(&a.decoder.push(next));
    if !released.text.is_empty() {
        a.send(Event::Text(released.text));
    }
    if released.stopped {
        return Some(finish(true, FinishReason::Stop));
    }
    if a.generated >= a.job.params.max_tokens || n_past >= n_ctx {
        return Some(finish(flush(a), FinishReason::Length));
    }
    None
}

/// Sends what the decoder and the stop matcher still hold at the end of a job; returns whether
/// that completed a stop string.
fn flush(a: &mut Active) -> bool {
    let released = a.stop.push(&a.decoder.finish());
    let mut text = released.text;
    if !released.stopped {
        text.push_str(&a.stop.finish());
    }
    if !text.is_empty() {
        a.send(Event::Text(text));
    }
    released.stopped
}
