//! TEAL calibration: the magnitudes of every matrix's inputs on the calibration text (histograms
//! weighted by the output error their zeroing adds, see `hotcold_core::engine::TealRecorder`), then
//! per-layer, per-matrix thresholds for the model-wide target, written as `hotcold.teal.*`.

use std::path::Path;
use std::sync::Arc;

use hotcold_core::engine::{
    block_errors, measured_allocation, Allocation, Proj, TealCalibration, TealCriterion,
    TealRecorder, TEAL_CRITERION_KEY, TEAL_SPARSITY_KEY, TEAL_TARGET_KEY, TEAL_THRESHOLDS_KEY,
};
use hotcold_core::gguf::{GgufWriter, MetaArray, MetaValue};

use super::{progress, trace_with};
use crate::cmd::common::Loaded;

/// Longest sample sequence of the measured allocation.
const SAMPLE_SEQUENCE: usize = 128;

/// How a block's target is shared among its matrices.
#[derive(Clone, Copy, Debug)]
pub(super) enum How {
    /// From the histograms alone (`greedy` estimate or `uniform`); the block errors are reported
    /// on the first `.1` tokens.
    Estimate(Allocation, usize),
    /// TEAL's greedy steps measured on the block outputs of the first `.0` tokens.
    Measured(usize),
}

impl How {
    /// Tokens of the text the blocks run on.
    fn sample_tokens(self) -> usize {
        match self {
            How::Estimate(_, n) | How::Measured(n) => n,
        }
    }
}

/// Records the inputs' histograms over `tokens`, allocates `sparsity` in every block as `how`
/// says, and writes the model with the thresholds to `output`.
pub(super) fn calibrate(
    loaded: &Loaded,
    tokens: &[u32],
    sparsity: f64,
    how: How,
    criterion: TealCriterion,
    output: &Path,
) -> anyhow::Result<()> {
    let recorder = Arc::new(
        loaded
            .pool
            .install(|| TealRecorder::new(&loaded.model, criterion))?,
    );
    trace_with(loaded, tokens, |session| {
        session.set_linear(recorder.clone());
        session.set_ffn_offload(recorder.clone());
        // calibration text is processed in prompt-sized batches: record them all
        session.set_sparse_prefill(true);
    })?;
    let samples = sample_sequences(loaded, tokens, how.sample_tokens())?;
    let cal = match how {
        How::Estimate(a, _) => recorder.thresholds(sparsity, a)?,
        How::Measured(_) => measured(loaded, &recorder, &samples, sparsity)?,
    };
    let errors = loaded
        .pool
        .install(|| block_errors(&loaded.model, &samples, &cal.thresholds, recorder.rule()))?;
    eprintln!(
        "mean block output error on the sample (relative to the block's update): {:.5}",
        errors.iter().sum::<f64>() / errors.len().max(1) as f64
    );
    for (il, (t, s)) in cal.thresholds.iter().zip(&cal.sparsity).enumerate() {
        let each: Vec<String> = Proj::ALL
            .iter()
            .map(|p| format!("{} {:.3}@{:.4}", p.name(), s[p.index()], t[p.index()]))
            .collect();
        eprintln!("layer {il:>3}: sparsity@threshold {}", each.join(" "));
    }
    let mut writer = GgufWriter::from_file(loaded.model.file());
    writer.set(
        TEAL_THRESHOLDS_KEY,
        MetaValue::Array(MetaArray::F32(
            cal.thresholds.iter().flatten().copied().collect(),
        )),
    );
    writer.set(
        TEAL_SPARSITY_KEY,
        MetaValue::Array(MetaArray::F32(
            cal.sparsity.iter().flatten().map(|&s| s as f32).collect(),
        )),
    );
    writer.set(TEAL_TARGET_KEY, MetaValue::F32(sparsity as f32));
    writer.set(
        TEAL_CRITERION_KEY,
        MetaValue::String(criterion.name().to_owned()),
    );
    writer.write_file(output)?;
    println!(
        "teal thresholds ({how:?} allocation, {} criterion) for target sparsity {sparsity} written to {}",
        criterion.name(),
        output.display()
    );
    Ok(())
}

/// The first `sample_tokens` tokens in sequences of at most [`SAMPLE_SEQUENCE`] (and the context
/// size).
fn sample_sequences<'t>(
    loaded: &Loaded,
    tokens: &'t [u32],
    sample_tokens: usize,
) -> anyhow::Result<Vec<&'t [u32]>> {
    let sample = &tokens[..sample_tokens.min(tokens.len())];
    let len = SAMPLE_SEQUENCE.min(loaded.n_ctx);
    let samples: Vec<&[u32]> = sample.chunks(len).filter(|s| s.len() >= 4).collect();
    anyhow::ensure!(
        !samples.is_empty(),
        "--teal-sample-tokens {sample_tokens} leaves no sample sequence of 4 tokens or more"
    );
    Ok(samples)
}

/// The measured greedy allocation on `samples`.
fn measured(
    loaded: &Loaded,
    recorder: &TealRecorder,
    samples: &[&[u32]],
    sparsity: f64,
) -> anyhow::Result<TealCalibration> {
    let model = &loaded.model;
    let bar = progress(model.hp.n_layer as u64, "measuring blocks");
    let cal = loaded.pool.install(|| {
        measured_allocation(model, recorder, samples, sparsity, |il, a| {
            bar.suspend(|| {
                eprintln!(
                    "layer {il:>3}: block output error {:.5} relative ({} evaluations)",
                    a.error, a.evaluations
                )
            });
            bar.inc(1);
        })
    })?;
    bar.finish_and_clear();
    Ok(cal)
}
