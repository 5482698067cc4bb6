//! `hotcold calibrate`: run the dense FFN over a text and record every layer's statistics.
//! - ReLU / dReLU models: (input, active neurons) pairs train a PowerInfer-shape predictor per
//!   layer; the output is a PowerInfer-readable file with the predictors and the per-neuron
//!   activation frequencies.
//! - Dense SwiGLU / GeGLU models, with `--target-sparsity S`: training-free thresholds, weights
//!   untouched: CATS ([`cats`], `--sparsity-mode cats`, the default) or TEAL ([`teal`],
//!   `--sparsity-mode teal`).

mod cats;
mod teal;

use std::sync::{Arc, Mutex};

use anyhow::Context;
use hotcold_core::engine::{
    Allocation, FfnMode, FfnObserver, FfnTrace, Logits, Session, TealCriterion,
};
use hotcold_core::gguf::{GgufWriter, Magic, MetaArray, MetaValue};
use hotcold_core::model::PREDICTOR_THRESHOLDS_KEY;
use hotcold_core::models::DefaultModel;
use hotcold_core::placement::FREQUENCY_KEY_PREFIX;
use hotcold_core::predictor::{evaluate, train, PredictorMetrics, Samples, TrainConfig};
use hotcold_core::quant::{self, GgmlType};
use indicatif::{ProgressBar, ProgressStyle};

use super::common::{Loaded, ModelArgs, SparsityModeArg};

/// Arguments of `hotcold calibrate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Calibration text.
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Output file (the model with predictors and activation statistics).
    #[arg(short = 'o', long = "output")]
    output: std::path::PathBuf,
    /// Predictor rank (hidden width of fc1); default: the training default for the model's width.
    #[arg(long)]
    rank: Option<usize>,
    /// Fraction of the tokens held out to measure recall and precision.
    #[arg(long, default_value_t = 0.1)]
    holdout: f64,
    /// Recall the per-layer threshold is chosen for.
    #[arg(long, default_value_t = 0.99)]
    target_recall: f64,
    /// Training epochs per layer.
    #[arg(long, default_value_t = 30)]
    epochs: usize,
    /// Seed of the split and the initialisation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// For dense (non-ReLU) models: the fraction to skip per token, of the FFN neurons (CATS) or
    /// of every block's weights (TEAL, `--sparsity-mode teal`).
    #[arg(long)]
    target_sparsity: Option<f64>,
    /// How TEAL shares a block's target among its matrices: `measured` (TEAL's greedy steps,
    /// each scored by running the block on a sample of the text), `greedy` (the same steps
    /// scored by an estimate from the histograms: seconds instead of minutes) or `uniform` (the
    /// target for every matrix).
    #[arg(long, value_enum, default_value = "greedy")]
    teal_allocation: AllocationArg,
    /// Tokens of the calibration text the `measured` allocation runs each block on (in
    /// sequences of at most 128); every allocation reports its block output error on them.
    #[arg(long, default_value_t = 256)]
    teal_sample_tokens: usize,
    /// What TEAL's thresholds compare: `magnitude` (TEAL's `|x_i|`) or `wina` (WINA's
    /// `|x_i| · ‖W[:, i]‖₂`, the input times the norm of the weight column it multiplies).
    #[arg(long, value_enum, default_value = "magnitude")]
    teal_criterion: CriterionArg,
}

/// `--teal-criterion` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CriterionArg {
    /// TEAL's input magnitude.
    Magnitude,
    /// WINA's input magnitude times the weight column's norm.
    Wina,
}

/// `--teal-allocation` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum AllocationArg {
    /// TEAL's greedy allocation, each step's error measured on the block's output.
    Measured,
    /// The greedy allocation with each step's error estimated from the histograms.
    Greedy,
    /// The same sparsity for every matrix.
    Uniform,
}

/// Runs `hotcold calibrate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut model_args = args.model.clone();
    model_args.ctx_size = Some(model_args.ctx_size.unwrap_or(512));
    // here --sparsity-mode picks what to calibrate; the model loads dense
    let mode = model_args.sparsity_mode.take();
    model_args.ffn = None;
    // the statistics and predictors it writes name neurons by their place in the file
    model_args.file_neuron_order = true;
    let mut loaded = model_args.load(DefaultModel::Gemma3_270m)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let tokens = loaded.tokenizer.encode(&text, true, false)?;
    anyhow::ensure!(
        tokens.len() >= 16,
        "the calibration text has only {} tokens",
        tokens.len()
    );
    if let Some(sparsity) = args.target_sparsity {
        anyhow::ensure!(
            (0.0..1.0).contains(&sparsity),
            "--target-sparsity must be in [0, 1), got {sparsity}"
        );
        return match mode {
            None | Some(SparsityModeArg::Cats) => {
                cats::calibrate(&loaded, &tokens, sparsity, &args.output)
            }
            Some(SparsityModeArg::Teal) => {
                let how = match args.teal_allocation {
                    AllocationArg::Measured => teal::How::Measured(args.teal_sample_tokens),
                    AllocationArg::Greedy => {
                        teal::How::Estimate(Allocation::Greedy, args.teal_sample_tokens)
                    }
                    AllocationArg::Uniform => {
                        teal::How::Estimate(Allocation::Uniform, args.teal_sample_tokens)
                    }
                };
                let criterion = match args.teal_criterion {
                    CriterionArg::Magnitude => TealCriterion::Magnitude,
                    CriterionArg::Wina => TealCriterion::Wina,
                };
                teal::calibrate(&loaded, &tokens, sparsity, how, criterion, &args.output)
            }
        };
    }
    anyhow::ensure!(mode.is_none(), "--sparsity-mode needs --target-sparsity");
    anyhow::ensure!(
        loaded.model.hp.ffn_act.is_relu(),
        "{:?} activations are never exactly zero: use --target-sparsity for training-free sparsity",
        loaded.model.hp.ffn_act
    );
    loaded.model.repack_down_t()?;
    let model = &loaded.model;
    let hp = &model.hp;

    // 1. Traces: every layer's FFN input and activations on the dense path.
    let samples: Arc<Mutex<Vec<Samples>>> = Arc::new(Mutex::new(
        (0..hp.n_layer)
            .map(|_| Samples::new(hp.n_embd, hp.n_ff))
            .collect(),
    ));
    let sink = samples.clone();
    let (n_embd, n_ff) = (hp.n_embd, hp.n_ff);
    trace(
        &loaded,
        &tokens,
        Box::new(move |t: &FfnTrace| {
            let mut all = sink.lock().expect("trace lock");
            for (xr, ar) in t
                .input
                .chunks_exact(n_embd)
                .zip(t.activations.chunks_exact(n_ff))
            {
                all[t.layer].push(xr, ar);
            }
        }),
    )?;
    let samples = Arc::try_unwrap(samples)
        .map_err(|_| anyhow::anyhow!("trace still shared"))?
        .into_inner()
        .expect("trace lock");

    // 2. A predictor per layer, measured on held-out tokens.
    let mut writer = GgufWriter::from_file(model.file());
    writer.set_magic(Magic::PowerInfer);
    let mut thresholds = Vec::with_capacity(hp.n_layer);
    let mut metrics: Vec<PredictorMetrics> = Vec::with_capacity(hp.n_layer);
    let bar = progress(hp.n_layer as u64, "training");
    for (il, layer_samples) in samples.iter().enumerate() {
        let (train_set, held_out) = layer_samples.split(args.holdout, args.seed + il as u64);
        let mut cfg = TrainConfig::default();
        if let Some(rank) = args.rank {
            cfg.rank = rank;
        }
        cfg.epochs = args.epochs;
        cfg.target_recall = args.target_recall;
        cfg.seed = args.seed + il as u64;
        let p = train(&train_set, &cfg, |_, _| {});
        let m = evaluate(&p, &held_out);
        bar.suspend(|| {
            eprintln!(
                "layer {il:>3}: recall {:.4} precision {:.4} predicted density {:.4} (true {:.4})",
                m.recall, m.precision, m.density, m.true_density
            )
        });
        put_f16(
            &mut writer,
            &format!("blk.{il}.fc1.weight"),
            &[hp.n_embd as u64, p.rank as u64],
            &p.fc1,
        )?;
        put_f16(
            &mut writer,
            &format!("blk.{il}.fc2.weight"),
            &[p.rank as u64, hp.n_ff as u64],
            &p.fc2,
        )?;
        let down_t = model.layers[il].down_t.as_ref().expect("repacked above");
        if model
            .file()
            .tensor(&format!("blk.{il}.ffn_down_t.weight"))
            .is_none()
        {
            // Repacked from ffn_down; PowerInfer's sparse loader reads only ffn_down_t.
            writer.remove_tensor(&format!("blk.{il}.ffn_down.weight"));
            writer.add_tensor(
                format!("blk.{il}.ffn_down_t.weight"),
                down_t.ty,
                &[hp.n_embd as u64, hp.n_ff as u64],
                model.matrix(down_t).data.to_vec(),
            )?;
        }
        writer.set(
            format!("{FREQUENCY_KEY_PREFIX}.{il}"),
            MetaValue::Array(MetaArray::F32(layer_samples.frequencies())),
        );
        thresholds.push(p.threshold);
        metrics.push(m);
        bar.inc(1);
    }
    bar.finish_and_clear();
    writer.set(
        PREDICTOR_THRESHOLDS_KEY,
        MetaValue::Array(MetaArray::F32(thresholds.clone())),
    );
    // PowerInfer reads one threshold for all layers: the lowest keeps every layer's recall.
    let global = thresholds.iter().copied().fold(f32::INFINITY, f32::min);
    writer.set("powerinfer.sparse_threshold", MetaValue::F32(global));
    writer.write_file(&args.output)?;
    let n = metrics.len() as f64;
    let mean = |f: fn(&PredictorMetrics) -> f64| metrics.iter().map(f).sum::<f64>() / n;
    println!(
        "mean recall {:.4} precision {:.4} density {:.4}",
        mean(|m| m.recall),
        mean(|m| m.precision),
        mean(|m| m.density)
    );
    Ok(())
}

pub(super) fn progress(len: u64, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what);
    bar
}

/// Adds (or replaces) an F16 tensor.
fn put_f16(w: &mut GgufWriter, name: &str, shape: &[u64], data: &[f32]) -> anyhow::Result<()> {
    let mut bytes = vec![0u8; data.len() * 2];
    quant::quantize(GgmlType::F16, data, &mut bytes)?;
    w.remove_tensor(name);
    w.add_tensor(name, GgmlType::F16, shape, bytes)?;
    Ok(())
}

/// Evaluates `tokens` chunk by chunk on the dense FFN with `observer` installed.
pub(super) fn trace(loaded: &Loaded, tokens: &[u32], observer: FfnObserver) -> anyhow::Result<()> {
    trace_with(loaded, tokens, |session| {
        session.set_ffn_observer(Some(observer))
    })
}

/// Evaluates `tokens` chunk by chunk on a dense session that `setup` first adjusts.
pub(super) fn trace_with(
    loaded: &Loaded,
    tokens: &[u32],
    setup: impl FnOnce(&mut Session),
) -> anyhow::Result<()> {
    let mut session = loaded.session()?;
    session.set_ffn_mode(FfnMode::Dense)?;
    setup(&mut session);
    let bar = progress(tokens.len() as u64, "tracing");
    for chunk in tokens.chunks(loaded.n_ctx) {
        session.truncate(0);
        session.eval(chunk, Logits::Last)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(())
}
