//! `hotcold calibrate`: run the dense FFN over a text, record every layer's (input, active
//! neurons) pairs, train a PowerInfer-shape predictor per layer, and write a PowerInfer-readable
//! file with the predictors and the per-neuron activation frequencies.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use hotcold_core::engine::{FfnMode, Logits};
use hotcold_core::gguf::{GgufWriter, Magic, MetaArray, MetaValue};
use hotcold_core::model::{Model, Weight, PREDICTOR_THRESHOLDS_KEY};
use hotcold_core::models::DefaultModel;
use hotcold_core::predictor::{evaluate, train, PredictorMetrics, Samples, TrainConfig};
use hotcold_core::quant::{self, GgmlType};
use indicatif::{ProgressBar, ProgressStyle};

use super::common::ModelArgs;

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
}

/// Metadata key prefix of the per-neuron activation frequencies (`{prefix}.{layer}`, f32 arrays).
pub const FREQUENCY_KEY_PREFIX: &str = "hotcold.activation_frequency";

/// Runs `hotcold calibrate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut model_args = args.model.clone();
    model_args.ctx_size = Some(model_args.ctx_size.unwrap_or(512));
    let loaded = model_args.load(DefaultModel::Gemma3_270m)?;
    let model = &loaded.model;
    let hp = &model.hp;
    anyhow::ensure!(
        hp.ffn_act.is_relu(),
        "calibrate trains predictors for ReLU / dReLU models; {:?} activations are never exactly zero",
        hp.ffn_act
    );
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let tokens = loaded.tokenizer.encode(&text, true, false)?;
    anyhow::ensure!(
        tokens.len() >= 16,
        "the calibration text has only {} tokens",
        tokens.len()
    );

    // 1. Traces: every layer's FFN input and activations on the dense path.
    let samples: Arc<Mutex<Vec<Samples>>> = Arc::new(Mutex::new(
        (0..hp.n_layer)
            .map(|_| Samples::new(hp.n_embd, hp.n_ff))
            .collect(),
    ));
    let mut session = loaded.session()?;
    session.set_ffn_mode(FfnMode::Dense)?;
    let sink = samples.clone();
    let (n_embd, n_ff) = (hp.n_embd, hp.n_ff);
    session.set_ffn_observer(Some(Box::new(move |il, x, a| {
        let mut all = sink.lock().expect("trace lock");
        for (xr, ar) in x.chunks_exact(n_embd).zip(a.chunks_exact(n_ff)) {
            all[il].push(xr, ar);
        }
    })));
    let bar = progress(tokens.len() as u64, "tracing");
    for chunk in tokens.chunks(loaded.n_ctx) {
        session.truncate(0);
        session.eval(chunk, Logits::Last)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    drop(session);
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
        if model.layers[il].down_t.is_none() {
            let down = model.layers[il]
                .down
                .as_ref()
                .expect("a layer without down_t has down");
            let (ty, bytes) = transpose(model, down)?;
            writer.add_tensor(
                format!("blk.{il}.ffn_down_t.weight"),
                ty,
                &[hp.n_embd as u64, hp.n_ff as u64],
                bytes,
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

fn progress(len: u64, what: &'static str) -> ProgressBar {
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

/// `w` (rows × cols) stored transposed (cols rows of `rows`), in a type the sparse axpy reads:
/// the same type when it is F16, Q8_0 or Q4_0, else F16.
fn transpose(model: &Model, w: &Weight) -> anyhow::Result<(GgmlType, Vec<u8>)> {
    let m = model.matrix(w);
    let mut dense = vec![0f32; w.rows * w.cols];
    for (r, row) in dense.chunks_exact_mut(w.cols).enumerate() {
        hotcold_core::cpu::dequantize_row(&m, r, row)?;
    }
    let mut t = vec![0f32; w.rows * w.cols];
    for r in 0..w.rows {
        for c in 0..w.cols {
            t[c * w.rows + r] = dense[r * w.cols + c];
        }
    }
    let ty = match w.ty {
        GgmlType::F16 | GgmlType::Q8_0 | GgmlType::Q4_0
            if w.rows.is_multiple_of(w.ty.block_size()) =>
        {
            w.ty
        }
        _ => GgmlType::F16,
    };
    let mut bytes = vec![0u8; ty.row_bytes(w.rows as u64)? as usize * w.cols];
    quant::quantize(ty, &t, &mut bytes)?;
    Ok((ty, bytes))
}
