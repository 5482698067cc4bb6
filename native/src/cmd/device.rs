//! `--device` and `--vram-budget`: where the forward pass runs. On a GPU without a budget (or with
//! one that holds every weight) the whole pass is resident there; with a smaller budget the FFN's
//! hot neurons go to the GPU and the rest runs on the CPU, or, for a dense model, its last layers
//! whole (attention, FFN and KV cache: a GPU segment). The hot neurons
//! come from PowerInfer's side file `<model>.generated.gpuidx` when there is one that fits the
//! budget (`hotcold plan --write-gpuidx` writes it), else from the planner.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use hotcold_core::engine::{
    ffn_bytes, hot_from_index, hot_neurons, layer_fits_kernels, CpuFfn, FfnMode, FfnOffload, GpuFfn,
};
use hotcold_core::gguf::GgufFile;
use hotcold_core::gpu::forward::{check_supported, resident_bytes, segment_costs, GpuModel};
use hotcold_core::gpu::{AdapterChoice, GpuContext};
use hotcold_core::model::Model;
use hotcold_core::placement::gpuidx::GpuIndex;
use hotcold_core::placement::segment::dense_segment;

/// `--device` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// A hardware GPU when wgpu finds one, else the CPU.
    Auto,
    /// The CPU only.
    Cpu,
    /// A GPU, software adapters (Mesa's lavapipe) included; an error when there is none.
    Gpu,
}

/// `--device`, `--vram-budget`.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Where the model runs (`gpu`: all of it without --vram-budget, else the FFN's hot part, or
    /// a dense model's last layers).
    #[arg(long = "device", value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// FFN weights to place on the GPU: a size (`512MiB`, `8GiB`, `300MB`, bytes) or a share of
    /// the model's FFN (`50%`); for a dense model, the bytes its GPU layers take (weights, KV
    /// cache and working vectors). Default: the whole model, resident on the GPU (a size that holds
    /// every weight does the same).
    #[arg(long = "vram-budget", value_parser = parse_budget)]
    pub vram_budget: Option<Budget>,
}

/// A `--vram-budget` value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// Bytes.
    Bytes(u64),
    /// A share of the FFN's bytes (0..=1).
    Share(f64),
}

impl Budget {
    /// The budget in bytes for `model`.
    pub fn bytes(self, model: &Model) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::Share(s) => (ffn_bytes(model) as f64 * s) as u64,
        }
    }
}

/// Parses a size as [`super::size_arg::parse_size`] does (`24MiB`, `8GiB`, `1.5GB`, `0`), or a
/// share of the FFN (`50%`).
pub fn parse_budget(s: &str) -> Result<Budget, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("bad percentage {s:?}"))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("{s:?}: a share must be between 0% and 100%"));
        }
        return Ok(Budget::Share(v / 100.0));
    }
    super::size_arg::parse_size(t).map(Budget::Bytes)
}

/// Where a model runs: the FFN offload of the CPU pass, or the whole model on the GPU.
pub struct Placement {
    /// Where the CPU pass's FFN products run (used when `gpu_model` is `None`, and by batches).
    pub offload: Arc<dyn FfnOffload>,
    /// The model resident on the GPU, when the whole forward pass runs there.
    pub gpu_model: Option<Arc<GpuModel>>,
    /// A line describing the placement, for stderr.
    pub note: String,
}

impl Placement {
    /// Whether everything runs on the CPU (no neuron index is tied to a GPU copy).
    pub fn cpu_only(&self) -> bool {
        self.gpu_model.is_none() && self.offload.all_on_cpu()
    }

    /// Everything on the CPU, with `note` for stderr.
    pub fn cpu(note: &str) -> Placement {
        Placement {
            offload: Arc::new(CpuFfn),
            gpu_model: None,
            note: note.into(),
        }
    }
}

impl DeviceArgs {
    /// Where these flags put `model` (read from `path`) in FFN mode `mode`, for sessions of up
    /// to `n_ctx` positions. With `resident` false (batched decoding, which the resident pass does
    /// not run) a GPU only ever takes the FFN. A dense model (no `ffn_down_t`) under a smaller
    /// budget gets a GPU segment: its last layers whole, with their KV cache, within the budget.
    pub fn place(
        &self,
        path: &Path,
        model: &Model,
        mode: FfnMode,
        resident: bool,
        n_ctx: usize,
    ) -> anyhow::Result<Placement> {
        let ctx = match self.device {
            DeviceArg::Cpu => None,
            DeviceArg::Gpu => Some(GpuContext::new(AdapterChoice::Any).context("--device gpu")?),
            DeviceArg::Auto => GpuContext::new(AdapterChoice::Hardware).ok(),
        };
        let Some(ctx) = ctx else {
            anyhow::ensure!(
                self.vram_budget.is_none() || self.device != DeviceArg::Cpu,
                "--vram-budget needs --device gpu or auto"
            );
            let note = match self.vram_budget {
                Some(_) => "device: cpu (no hardware GPU found; --vram-budget unused)",
                None => "device: cpu",
            };
            return Ok(Placement::cpu(note));
        };
        let software = if ctx.is_software() {
            " [software: timings mean nothing]"
        } else {
            ""
        };
        let whole = match self.vram_budget {
            None => true,
            Some(Budget::Bytes(b)) => b >= resident_bytes(model),
            Some(Budget::Share(_)) => false,
        };
        let mut fallback = String::new();
        if resident && whole {
            match check_supported(model, mode) {
                Ok(()) => {
                    let gpu = GpuModel::upload(ctx.clone(), model, mode)?;
                    let note = format!(
                        "device: {}{software}: the whole model on the GPU ({:.1} MiB of weights, one read-back per step)",
                        ctx.describe(),
                        gpu.bytes() as f64 / (1 << 20) as f64,
                    );
                    return Ok(Placement {
                        offload: Arc::new(CpuFfn),
                        gpu_model: Some(Arc::new(gpu)),
                        note,
                    });
                }
                Err(e) => fallback = format!("{e}; hybrid instead. "),
            }
        }
        let budget = self.vram_budget.map_or(u64::MAX, |b| b.bytes(model));
        let dense = model.layers.iter().any(|l| l.down_t.is_none());
        if resident && dense && fallback.is_empty() && check_supported(model, mode).is_ok() {
            return segment(&ctx, model, mode, budget, n_ctx, software);
        }
        let (hot, source) = hot_set(path, model, budget)?;
        let gpu = GpuFfn::new(ctx.clone(), model, &hot)?;
        let total = ffn_bytes(model);
        let hot: usize = gpu.hot_counts().iter().sum();
        let note = format!(
            "{fallback}device: {}{software}: {:.1} MiB of FFN weights on the GPU ({:.1}% of the FFN, {hot} of {} neurons{source})",
            ctx.describe(),
            gpu.bytes() as f64 / (1 << 20) as f64,
            100.0 * gpu.bytes() as f64 / total.max(1) as f64,
            model.hp.n_layer * model.hp.n_ff,
        );
        Ok(Placement {
            offload: Arc::new(gpu),
            gpu_model: None,
            note,
        })
    }
}

/// A dense model's last layers on the GPU within `budget` bytes (weights, KV cache of `n_ctx`
/// positions, working vectors), the CPU running the rest.
fn segment(
    ctx: &Arc<GpuContext>,
    model: &Model,
    mode: FfnMode,
    budget: u64,
    n_ctx: usize,
    software: &str,
) -> anyhow::Result<Placement> {
    let (costs, scratch) = segment_costs(model, n_ctx);
    let plan = dense_segment(&costs, scratch, budget);
    let n_layer = model.hp.n_layer;
    let device = format!("device: {}{software}", ctx.describe());
    if plan.layers.is_empty() {
        let note = format!("{device}: no layer of this dense model fits the budget with its KV cache: all on the CPU");
        return Ok(Placement::cpu(&note));
    }
    let gpu = GpuModel::upload_segment(ctx.clone(), model, mode, plan.layers.clone())?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let note = format!(
        "{device}: layers {}..{} of {n_layer} on the GPU ({:.1} MiB: weights {:.1} + KV cache {:.1} + working vectors {:.1}; the residual crosses the bus once each way per step)",
        plan.layers.start,
        plan.layers.end,
        mib(plan.bytes()),
        mib(plan.weights),
        mib(plan.kv_cache),
        mib(plan.scratch),
    );
    Ok(Placement {
        offload: Arc::new(CpuFfn),
        gpu_model: Some(Arc::new(gpu)),
        note,
    })
}

/// The hot neurons for `budget` bytes of FFN weights: those of the GPU index next to `path` when
/// there is one and it fits (a warning says why not when it does not), else the planner's; and
/// the note's mention of the index.
fn hot_set(path: &Path, model: &Model, budget: u64) -> anyhow::Result<(Vec<Vec<u32>>, String)> {
    let usable = |il| layer_fits_kernels(model, il);
    let index_path = GpuIndex::side_file_path(path);
    if index_path.exists() {
        let index = GgufFile::open(&index_path).and_then(|f| GpuIndex::read(&f));
        let hot = index
            .map_err(|e| e.to_string())
            .and_then(|index| hot_from_index(model, &index, budget, usable));
        match hot {
            Ok(hot) => return Ok((hot, format!("; hot set from {}", index_path.display()))),
            Err(why) => eprintln!(
                "warning: {} not used ({why}): the planner chooses the hot neurons",
                index_path.display()
            ),
        }
    }
    Ok((hot_neurons(model, budget, usable)?, String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("24MiB"), Ok(Budget::Bytes(24 << 20)));
        assert_eq!(parse_budget("8GiB"), Ok(Budget::Bytes(8 << 30)));
        assert_eq!(parse_budget("1.5GB"), Ok(Budget::Bytes(1_500_000_000)));
        assert_eq!(parse_budget("4096B"), Ok(Budget::Bytes(4096)));
        assert!(
            parse_budget("4096").is_err(),
            "a bare number is ambiguous (GiB or bytes?)"
        );
        assert_eq!(parse_budget("50%"), Ok(Budget::Share(0.5)));
        assert!(parse_budget("12XB").is_err());
        assert!(parse_budget("150%").is_err());
        assert!(parse_budget("MiB").is_err());
    }
}
