//! CATS calibration: per layer, the `S`-quantile of `|act(gate)|` over the text, written as
//! `hotcold.cats.thresholds` (and `hotcold.cats.target_sparsity`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use hotcold_core::engine::FfnTrace;
use hotcold_core::gguf::{GgufWriter, MetaArray, MetaValue};
use hotcold_core::model::CATS_THRESHOLDS_KEY;

use super::trace;
use crate::cmd::common::Loaded;

/// Gate activations kept per layer for the CATS quantiles (a strided subsample beyond this).
const MAX_GATE_SAMPLES: usize = 1 << 21;

/// CATS: per layer, the `sparsity`-quantile of `|act(gate)|` over the text becomes the threshold
/// below which a neuron is skipped.
pub(super) fn calibrate(
    loaded: &Loaded,
    tokens: &[u32],
    sparsity: f64,
    output: &Path,
) -> anyhow::Result<()> {
    let hp = &loaded.model.hp;
    let act = hp.ffn_act;
    let stride = (tokens.len() * hp.n_ff).div_ceil(MAX_GATE_SAMPLES).max(1);
    let magnitudes: Arc<Mutex<Vec<Vec<f32>>>> = Arc::new(Mutex::new(vec![Vec::new(); hp.n_layer]));
    let sink = magnitudes.clone();
    trace(
        loaded,
        tokens,
        Box::new(move |t: &FfnTrace| {
            let gate = t.gate.expect("the dense FFN computes the gate");
            let mut all = sink.lock().expect("trace lock");
            all[t.layer].extend(gate.iter().step_by(stride).map(|&g| act.gate(g).abs()));
        }),
    )?;
    let mut magnitudes = Arc::try_unwrap(magnitudes)
        .map_err(|_| anyhow::anyhow!("trace still shared"))?
        .into_inner()
        .expect("trace lock");
    let thresholds: Vec<f32> = magnitudes
        .iter_mut()
        .map(|m| {
            let k = ((m.len() as f64 * sparsity) as usize).min(m.len() - 1);
            *m.select_nth_unstable_by(k, f32::total_cmp).1
        })
        .collect();
    for (il, t) in thresholds.iter().enumerate() {
        eprintln!("layer {il:>3}: |act(gate)| threshold {t:.6}");
    }
    let mut writer = GgufWriter::from_file(loaded.model.file());
    writer.set(
        CATS_THRESHOLDS_KEY,
        MetaValue::Array(MetaArray::F32(thresholds)),
    );
    writer.set(
        "hotcold.cats.target_sparsity",
        MetaValue::F32(sparsity as f32),
    );
    writer.write_file(output)?;
    println!(
        "cats thresholds for target sparsity {sparsity} written to {}",
        output.display()
    );
    Ok(())
}
