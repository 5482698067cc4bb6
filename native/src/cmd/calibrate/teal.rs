//! TEAL calibration: the magnitudes of every matrix's inputs on the calibration text (histograms
//! weighted by the output error their zeroing adds, see `hotcold_core::engine::TealRecorder`), then
//! per-layer, per-matrix thresholds for the model-wide target, written as `hotcold.teal.*`.

use std::path::Path;
use std::sync::Arc;

use hotcold_core::engine::{
    Allocation, Proj, TealRecorder, TEAL_SPARSITY_KEY, TEAL_TARGET_KEY, TEAL_THRESHOLDS_KEY,
};
use hotcold_core::gguf::{GgufWriter, MetaArray, MetaValue};

use super::trace_with;
use crate::cmd::common::Loaded;

/// Records the inputs' histograms over `tokens`, allocates `sparsity` in every block as `how`
/// says, and writes the model with the thresholds to `output`.
pub(super) fn calibrate(
    loaded: &Loaded,
    tokens: &[u32],
    sparsity: f64,
    how: Allocation,
    output: &Path,
) -> anyhow::Result<()> {
    let recorder = Arc::new(loaded.pool.install(|| TealRecorder::new(&loaded.model))?);
    trace_with(loaded, tokens, |session| {
        session.set_linear(recorder.clone());
        session.set_ffn_offload(recorder.clone());
        // calibration text is processed in prompt-sized batches: record them all
        session.set_sparse_prefill(true);
    })?;
    let cal = recorder.thresholds(sparsity, how)?;
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
    writer.write_file(output)?;
    println!(
        "teal thresholds ({how:?} allocation) for target sparsity {sparsity} written to {}",
        output.display()
    );
    Ok(())
}
