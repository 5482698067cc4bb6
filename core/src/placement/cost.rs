//! A bandwidth cost model of one decode step, to predict the tokens/s of a [`Plan`].
//!
//! Decoding one token is memory-bound: each device's time is the bytes it reads over its
//! bandwidth. Per layer `l`, with the residual stream kept on the CPU:
//!
//! ```text
//! t_l = d_l / B_dense                                  (attention, norms, predictor: CPU or GPU)
//!     + max( Σ_{i hot}  f_i·c_l / B_gpu,               (hot neurons on the GPU …
//!            Σ_{i cold} f_i·c_l / B_cpu )               … concurrently with cold ones on the CPU)
//!     + [layer has GPU work] · 2 · (a / B_bus + λ)      (activation to the GPU and back)
//! ```
//!
//! plus, for each global tensor, `r_g / B` on its device (and two transfers when on the GPU).
//! `a` is the activation size (n_embd f32 values), `λ` the latency of one transfer and
//! synchronisation. The predicted speed is `1 / Σ t`. Not modelled: compute limits, the KV cache
//! (short contexts), kernel launch overheads beyond `λ`, and sparse reads being slower than
//! streaming reads; so read the figure as an upper bound for the plan.

use super::problem::Problem;
use super::solve::Plan;
use crate::{Error, Result};

/// The device speeds the model takes, in bytes per second and seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Devices {
    /// GPU memory bandwidth (bytes/s).
    pub gpu_bandwidth: f64,
    /// CPU memory bandwidth (bytes/s) that the CPU kernels reach.
    pub cpu_bandwidth: f64,
    /// Host↔GPU bus bandwidth (bytes/s).
    pub bus_bandwidth: f64,
    /// Latency of one host↔GPU transfer including its synchronisation (s).
    pub bus_latency: f64,
}

impl Devices {
    /// Checks that every speed is positive and finite and the latency is non-negative.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("GPU bandwidth", self.gpu_bandwidth),
            ("CPU bandwidth", self.cpu_bandwidth),
            ("bus bandwidth", self.bus_bandwidth),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "{name} must be positive, got {v}"
                )));
            }
        }
        if !(self.bus_latency.is_finite() && self.bus_latency >= 0.0) {
            return Err(Error::InvalidArgument(format!(
                "bus latency must be non-negative, got {}",
                self.bus_latency
            )));
        }
        Ok(())
    }
}

/// What [`predict`] expects of a plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Seconds per decoded token.
    pub seconds_per_token: f64,
    /// Decoded tokens per second.
    pub tokens_per_second: f64,
    /// Expected bytes the GPU reads per token.
    pub gpu_read_bytes: f64,
    /// Expected bytes the CPU reads per token.
    pub cpu_read_bytes: f64,
    /// Host↔GPU transfers per token.
    pub transfers: usize,
}

/// The predicted decode speed of `plan` for `problem` on `devices`; `activation_bytes` is the
/// size of one activation vector crossing the bus.
pub fn predict(
    problem: &Problem,
    plan: &Plan,
    devices: &Devices,
    activation_bytes: u64,
) -> Result<Prediction> {
    devices.validate()?;
    if plan.hot.len() != problem.layers.len()
        || plan.dense_on_gpu.len() != problem.layers.len()
        || plan.globals_on_gpu.len() != problem.globals.len()
    {
        return Err(Error::InvalidArgument(
            "the plan was made for another problem".into(),
        ));
    }
    let (g, c) = (devices.gpu_bandwidth, devices.cpu_bandwidth);
    let transfer = activation_bytes as f64 / devices.bus_bandwidth + devices.bus_latency;
    let mut t = 0.0;
    let (mut gpu_read, mut cpu_read) = (0.0, 0.0);
    let mut transfers = 0;
    for ((l, hot), &dense_gpu) in problem.layers.iter().zip(&plan.hot).zip(&plan.dense_on_gpu) {
        let cost = l.neuron_bytes as f64;
        let mut hot_bytes = 0.0;
        for &i in hot {
            let f = l
                .frequencies
                .get(i as usize)
                .ok_or_else(|| Error::InvalidArgument(format!("hot neuron {i} out of range")))?;
            hot_bytes += f64::from(*f) * cost;
        }
        let all_bytes = super::problem::frequency_sum(l) * cost;
        let cold_bytes = (all_bytes - hot_bytes).max(0.0);
        let dense = l.dense_bytes as f64;
        if dense_gpu {
            gpu_read += dense;
            t += dense / g;
        } else {
            cpu_read += dense;
            t += dense / c;
        }
        gpu_read += hot_bytes;
        cpu_read += cold_bytes;
        t += (hot_bytes / g).max(cold_bytes / c);
        if dense_gpu || !hot.is_empty() {
            transfers += 2;
        }
    }
    for (gt, &on_gpu) in problem.globals.iter().zip(&plan.globals_on_gpu) {
        let r = gt.read_bytes as f64;
        if on_gpu {
            gpu_read += r;
            t += r / g;
            transfers += 2;
        } else {
            cpu_read += r;
            t += r / c;
        }
    }
    t += transfers as f64 * transfer;
    Ok(Prediction {
        seconds_per_token: t,
        tokens_per_second: if t > 0.0 { 1.0 / t } else { f64::INFINITY },
        gpu_read_bytes: gpu_read,
        cpu_read_bytes: cpu_read,
        transfers,
    })
}
