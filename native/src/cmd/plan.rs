//! `hotcold plan`: the hot/cold placement of a model for a VRAM budget, its predicted decode
//! speed, PowerInfer's GPU index file, and the cost model's figures for PowerInfer's published
//! setups.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use hotcold_core::gguf::GgufFile;
use hotcold_core::gpu::forward::segment_costs;
use hotcold_core::model::Model;
use hotcold_core::models::DefaultModel;
use hotcold_core::placement::cost::{predict, Devices};
use hotcold_core::placement::gpuidx::GpuIndex;
use hotcold_core::placement::segment::dense_segment;
use hotcold_core::placement::{known, solve, stats, Plan, Problem};

use super::size_arg::{format_size, parse_size};

/// Arguments of `hotcold plan`.
#[derive(clap::Args)]
pub struct Args {
    /// Model file (default: the default model from the cache).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Bytes of weights the GPU may hold: 24MiB, 8GiB, 512MB, … (required unless only
    /// --known-setups is asked for).
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    vram_budget: Option<u64>,
    /// A `hotcold calibrate` output whose activation frequencies to use (default: the model's
    /// own statistics).
    #[arg(long, value_name = "CAL.gguf")]
    stats: Option<PathBuf>,
    /// GPU memory bandwidth, GB/s.
    #[arg(long, default_value_t = 1008.0, value_name = "GB/s")]
    gpu_bandwidth: f64,
    /// CPU memory bandwidth the kernels reach, GB/s.
    #[arg(long, default_value_t = 60.0, value_name = "GB/s")]
    cpu_bandwidth: f64,
    /// Host↔GPU bus bandwidth, GB/s.
    #[arg(long, default_value_t = 25.0, value_name = "GB/s")]
    bus_bandwidth: f64,
    /// Latency of one host↔GPU transfer, microseconds.
    #[arg(long, default_value_t = 10.0, value_name = "µs")]
    bus_latency: f64,
    /// Write PowerInfer's GPU index (default path: `<model>.generated.gpuidx`).
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    write_gpuidx: Option<Option<PathBuf>>,
    /// Print the cost model's predictions for PowerInfer's published setups.
    #[arg(long)]
    known_setups: bool,
    /// Context size the KV cache of a dense model's GPU layers is planned for (default: the
    /// model's training context, at most 4096, as `run` uses).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
}

/// Runs `hotcold plan`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.known_setups {
        print_known_setups()?;
    }
    let Some(budget) = args.vram_budget else {
        anyhow::ensure!(
            args.known_setups,
            "give the GPU's budget with --vram-budget SIZE (e.g. 8GiB), or ask for --known-setups"
        );
        return Ok(());
    };
    let devices = Devices {
        gpu_bandwidth: args.gpu_bandwidth * 1e9,
        cpu_bandwidth: args.cpu_bandwidth * 1e9,
        bus_bandwidth: args.bus_bandwidth * 1e9,
        bus_latency: args.bus_latency * 1e-6,
    };
    devices.validate()?;
    let path = super::model_arg::resolve(args.model, DefaultModel::Gemma3_270m)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let (frequencies, source) = match &args.stats {
        Some(stats_path) => {
            let stats_file = GgufFile::open(stats_path)
                .with_context(|| format!("cannot open {}", stats_path.display()))?;
            let (f, source) = stats::frequencies(&stats_file)
                .with_context(|| format!("statistics of {}", stats_path.display()))?;
            anyhow::ensure!(
                f.iter().map(Vec::len).eq(stats::ffn_widths(&file)?),
                "{} has statistics for other FFN shapes than {}",
                stats_path.display(),
                path.display()
            );
            (
                f,
                format!("{} ({})", source.describe(), stats_path.display()),
            )
        }
        None => {
            let (f, source) = stats::frequencies(&file)
                .with_context(|| format!("statistics of {}", path.display()))?;
            (f, source.describe().to_string())
        }
    };
    let problem = Problem::from_gguf(&file, frequencies, budget)?;
    let started = Instant::now();
    let plan = solve(&problem)?;
    let solve_time = started.elapsed();
    print_plan(&path, &source, &problem, &plan);

    let n_embd = file
        .require_tensor("blk.0.ffn_up.weight")?
        .shape
        .first()
        .copied()
        .unwrap_or(0);
    let hybrid = predict(&problem, &plan, &devices, 4 * n_embd)?;
    let cpu_problem = Problem {
        budget: 0,
        ..problem.clone()
    };
    let cpu_only = predict(&cpu_problem, &solve(&cpu_problem)?, &devices, 4 * n_embd)?;
    println!(
        "predicted decode: {:.2} tok/s with this plan, {:.2} tok/s CPU only ({:.2}x) \
         [cost model: GPU {} GB/s, CPU {} GB/s, bus {} GB/s + {} µs]",
        hybrid.tokens_per_second,
        cpu_only.tokens_per_second,
        hybrid.tokens_per_second / cpu_only.tokens_per_second,
        args.gpu_bandwidth,
        args.cpu_bandwidth,
        args.bus_bandwidth,
        args.bus_latency
    );
    println!("solved in {:.3} ms", solve_time.as_secs_f64() * 1e3);

    if file.tensor("blk.0.ffn_down_t.weight").is_none() {
        print_segment(&path, budget, args.ctx_size)?;
    }

    if let Some(out) = args.write_gpuidx {
        let out = out.unwrap_or_else(|| GpuIndex::side_file_path(&path));
        let index = GpuIndex {
            n_neurons: problem.layers.iter().map(|l| l.frequencies.len()).collect(),
            hot: plan.hot.clone(),
            vram_capacity: budget,
        };
        std::fs::write(&out, index.to_bytes()?)
            .with_context(|| format!("cannot write {}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// A dense model's plan as `run --device gpu --vram-budget` places it: its last layers whole
/// (attention, FFN, KV cache) on the GPU ([`dense_segment`]).
fn print_segment(
    path: &std::path::Path,
    budget: u64,
    ctx_size: Option<usize>,
) -> anyhow::Result<()> {
    let model = Model::open(path).with_context(|| format!("cannot load {}", path.display()))?;
    let n_ctx = ctx_size.unwrap_or(model.hp.n_ctx_train.min(4096));
    anyhow::ensure!(n_ctx > 0, "-c must be at least 1");
    let (costs, scratch) = segment_costs(&model, n_ctx);
    let plan = dense_segment(&costs, scratch, budget);
    let n_layer = model.hp.n_layer;
    println!(
        "dense model: the hybrid pass places whole layers (no neuron split without ffn_down_t): \
         layers {}..{} ({} of {n_layer}) on the GPU with their KV cache for {n_ctx} positions",
        plan.layers.start,
        plan.layers.end,
        plan.layers.len(),
    );
    println!(
        "dense GPU bytes: {} = weights {} + KV cache {} + working vectors {} (a layer: weights {}, KV cache {})",
        format_size(plan.bytes()),
        format_size(plan.weights),
        format_size(plan.kv_cache),
        format_size(plan.scratch),
        format_size(costs.first().map_or(0, |c| c.weights)),
        format_size(costs.first().map_or(0, |c| c.kv_cache)),
    );
    Ok(())
}

fn print_plan(path: &std::path::Path, source: &str, problem: &Problem, plan: &Plan) {
    let total = problem.total_bytes();
    println!("model: {}", path.display());
    println!("statistics: {source}");
    println!(
        "budget: {} ({} bytes); weights: {} ({total} bytes)",
        format_size(problem.budget),
        problem.budget,
        format_size(total)
    );
    let globals: Vec<&str> = problem
        .globals
        .iter()
        .zip(&plan.globals_on_gpu)
        .filter(|(_, &on)| on)
        .map(|(g, _)| g.name.as_str())
        .collect();
    let dense_layers = plan.dense_on_gpu.iter().filter(|&&d| d).count();
    println!(
        "on GPU: {} bytes ({}, {:.1}% of the weights): FFN neurons {}, dense tensors of {dense_layers}/{} layers, globals [{}]",
        plan.gpu_bytes,
        format_size(plan.gpu_bytes),
        100.0 * plan.gpu_bytes as f64 / total.max(1) as f64,
        format_size(plan.neuron_bytes(problem)),
        problem.layers.len(),
        globals.join(", ")
    );
    let shares = plan.layer_gpu_share(problem);
    for (il, ((l, hot), share)) in problem
        .layers
        .iter()
        .zip(&plan.hot)
        .zip(&shares)
        .enumerate()
    {
        println!(
            "layer {il}: hot {}/{} neurons, GPU share of activations {share:.4}, dense on {}",
            hot.len(),
            l.frequencies.len(),
            if plan.dense_on_gpu[il] { "GPU" } else { "CPU" }
        );
    }
    println!(
        "GPU share of all activations: {:.4}",
        plan.gpu_share(problem)
    );
}

fn print_known_setups() -> anyhow::Result<()> {
    println!(
        "PowerInfer's published setups, predicted by the cost model (FFN density {}, Zipf exponent \
         {}; hardware and assumptions: hotcold_core::placement::known)",
        known::KNOWN_DENSITY,
        known::KNOWN_ZIPF_EXPONENT
    );
    println!(
        "{:<22} {:<52} {:>10} {:>9} {:>12} {:>11} {:>9} {:>9}  published vs llama.cpp",
        "model",
        "machine",
        "weights",
        "GPU share",
        "hybrid tok/s",
        "dense tok/s",
        "speed-up",
        "solve ms"
    );
    let mut sources = Vec::new();
    for setup in known::setups() {
        let problem = setup.problem()?;
        let started = Instant::now();
        let plan = solve(&problem)?;
        let took = started.elapsed();
        let r = known::predict_setup(&setup, &problem, &plan)?;
        if !sources.contains(&setup.source) {
            sources.push(setup.source);
        }
        let note = sources.iter().position(|&s| s == setup.source).unwrap_or(0) + 1;
        println!(
            "{:<22} {:<52} {:>10} {:>9.3} {:>12.2} {:>11.2} {:>8.2}x {:>9.1}  {} [{note}]",
            setup.model.name,
            setup.machine,
            format_size(r.model_bytes),
            r.gpu_share,
            r.sparse.tokens_per_second,
            r.dense.tokens_per_second,
            r.sparse.tokens_per_second / r.dense.tokens_per_second,
            took.as_secs_f64() * 1e3,
            setup.published,
        );
    }
    for (i, s) in sources.iter().enumerate() {
        println!("[{}] {s}", i + 1);
    }
    println!(
        "PowerInfer paper (arXiv:2312.12456, abstract): 13.20 tok/s on average, 29.08 peak, up to \
         11.69x llama.cpp on one RTX 4090"
    );
    Ok(())
}
