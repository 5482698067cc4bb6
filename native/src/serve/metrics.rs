//! Counters shared by the HTTP side and the model thread, and their Prometheus text form.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Server counters and gauges (lock-free; f64 gauges stored as bits).
#[derive(Default)]
pub struct Metrics {
    /// Requests finished (any reason, disconnects included).
    pub requests: AtomicU64,
    /// Requests refused with 503.
    pub rejected: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queued: AtomicU64,
    /// Slots holding a request.
    pub slots_busy: AtomicU64,
    /// Slots in all.
    pub slots_total: AtomicU64,
    /// Batched forward steps run.
    pub steps: AtomicU64,
    tokens_per_s: AtomicU64,
    density: AtomicU64,
    union_density: AtomicU64,
}

impl Metrics {
    /// Records the generation rate (tokens per second over the recent steps).
    pub fn set_tokens_per_s(&self, v: f64) {
        self.tokens_per_s.store(v.to_bits(), Ordering::Relaxed);
    }

    /// Records the mean fraction of FFN neurons computed per token.
    pub fn set_density(&self, v: f64) {
        self.density.store(v.to_bits(), Ordering::Relaxed);
    }

    /// The last recorded mean FFN density.
    pub fn density(&self) -> f64 {
        f64::from_bits(self.density.load(Ordering::Relaxed))
    }

    /// Records the mean fraction of FFN neurons a step reads (the union of its tokens' sets).
    pub fn set_union_density(&self, v: f64) {
        self.union_density.store(v.to_bits(), Ordering::Relaxed);
    }

    /// The last recorded mean FFN union density of a step.
    pub fn union_density(&self) -> f64 {
        f64::from_bits(self.union_density.load(Ordering::Relaxed))
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let getf = |c: &AtomicU64| f64::from_bits(c.load(Ordering::Relaxed));
        let rows: [(&str, &str, &str, String); 10] = [
            (
                "requests_total",
                "counter",
                "Requests finished.",
                get(&self.requests).to_string(),
            ),
            (
                "requests_rejected_total",
                "counter",
                "Requests refused because the queue was full.",
                get(&self.rejected).to_string(),
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens evaluated.",
                get(&self.prompt_tokens).to_string(),
            ),
            (
                "generated_tokens_total",
                "counter",
                "Tokens generated.",
                get(&self.generated_tokens).to_string(),
            ),
            (
                "decode_steps_total",
                "counter",
                "Batched forward steps.",
                get(&self.steps).to_string(),
            ),
            (
                "tokens_per_second",
                "gauge",
                "Tokens generated per second over the last seconds.",
                format!("{:.3}", getf(&self.tokens_per_s)),
            ),
            (
                "queue_length",
                "gauge",
                "Requests waiting for a slot.",
                get(&self.queued).to_string(),
            ),
            (
                "slots_busy",
                "gauge",
                "Slots holding a request.",
                get(&self.slots_busy).to_string(),
            ),
            (
                "slots_total",
                "gauge",
                "Slots (--parallel).",
                get(&self.slots_total).to_string(),
            ),
            (
                "ffn_active_density",
                "gauge",
                "Mean fraction of FFN neurons computed per token.",
                format!("{:.4}", getf(&self.density)),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP hotcold_{name} {help}");
            let _ = writeln!(out, "# TYPE hotcold_{name} {kind}");
            let _ = writeln!(out, "hotcold_{name} {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let m = Metrics::default();
        m.generated_tokens.store(42, Ordering::Relaxed);
        m.set_density(0.25);
        let text = m.render();
        assert!(text.contains(
            "# TYPE hotcold_generated_tokens_total counter\nhotcold_generated_tokens_total 42\n"
        ));
        assert!(text.contains("hotcold_ffn_active_density 0.2500\n"));
        assert_eq!(text.lines().filter(|l| l.starts_with("# HELP")).count(), 10);
    }
}
