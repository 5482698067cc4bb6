//! Per-neuron activation frequencies: where the planner gets them from a file.
//!
//! In order of preference:
//! 1. [`FREQUENCY_KEY_PREFIX`]`.N` metadata arrays (f32, one per FFN neuron of layer `N`), which
//!    `hotcold calibrate` measures on a text;
//! 2. the targets a `hotcold synth` file was built with (`hotcold.synth.seed`,
//!    `hotcold.synth.sparsity`, `hotcold.synth.zipf_exponent`), regenerated exactly;
//! 3. for a dense (SiLU / GELU) model, 1 for every neuron: each one is computed every token.
//!
//! A ReLU model with none of these has no statistics to plan from.

use crate::gguf::GgufFile;
use crate::model::{FfnActivation, HyperParams};
use crate::{Error, Result};

/// Metadata key prefix of the per-neuron activation frequencies (`{prefix}.{layer}`, f32 arrays)
/// that `hotcold calibrate` writes.
pub const FREQUENCY_KEY_PREFIX: &str = "hotcold.activation_frequency";

/// The seed `synth` wrote its model with: with its sparsity and Zipf exponent, the targets.
const SYNTH_SEED_KEY: &str = "hotcold.synth.seed";

/// Where a file's frequencies came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrequencySource {
    /// Measured by `hotcold calibrate` ([`FREQUENCY_KEY_PREFIX`] keys).
    Calibrated,
    /// The targets of a `hotcold synth` model.
    SynthTargets,
    /// A dense FFN: every neuron fires every token.
    Dense,
}

impl FrequencySource {
    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            FrequencySource::Calibrated => "measured by calibrate",
            FrequencySource::SynthTargets => "synth's targets",
            FrequencySource::Dense => "dense FFN (every neuron, every token)",
        }
    }
}

/// The FFN width of each block of `file` (rows of `blk.N.ffn_up.weight`, N = 0, 1, … while it
/// exists).
pub fn ffn_widths(file: &GgufFile) -> Result<Vec<usize>> {
    let widths: Vec<usize> = (0..)
        .map_while(|il| file.tensor(&format!("blk.{il}.ffn_up.weight")))
        .map(|t| t.n_rows() as usize)
        .collect();
    if widths.is_empty() {
        return Err(Error::Tensor {
            tensor: "blk.0.ffn_up.weight".into(),
            message: "missing: the file has no FFN blocks to place".into(),
        });
    }
    Ok(widths)
}

/// Whether `file` records how often its neurons fire (sources 1 and 2 of the module docs).
pub fn records_frequencies(file: &GgufFile) -> bool {
    file.get(&format!("{FREQUENCY_KEY_PREFIX}.0")).is_some() || file.get(SYNTH_SEED_KEY).is_some()
}

/// Per layer, the firing frequency of each FFN neuron of `file`, and where it came from.
pub fn frequencies(file: &GgufFile) -> Result<(Vec<Vec<f32>>, FrequencySource)> {
    let widths = ffn_widths(file)?;
    if file.get(&format!("{FREQUENCY_KEY_PREFIX}.0")).is_some() {
        let layers = widths
            .iter()
            .enumerate()
            .map(|(il, &n)| calibrated(file, il, n))
            .collect::<Result<_>>()?;
        return Ok((layers, FrequencySource::Calibrated));
    }
    if let Some(seed) = file.get_u64(SYNTH_SEED_KEY)? {
        let sparsity = require_f32(file, "hotcold.synth.sparsity")?;
        let exponent = require_f32(file, "hotcold.synth.zipf_exponent")?;
        let density = 1.0 - f64::from(sparsity);
        let layers = widths
            .iter()
            .enumerate()
            .map(|(il, &n)| {
                crate::synth::target_frequencies(seed, il, n, density, exponent)
                    .into_iter()
                    .map(|f| f as f32)
                    .collect()
            })
            .collect();
        return Ok((layers, FrequencySource::SynthTargets));
    }
    let act = HyperParams::from_gguf(file).map(|hp| hp.ffn_act);
    match act {
        Ok(FfnActivation::Silu | FfnActivation::Gelu) => Ok((
            widths.iter().map(|&n| vec![1.0; n]).collect(),
            FrequencySource::Dense,
        )),
        _ => Err(Error::Metadata {
            key: format!("{FREQUENCY_KEY_PREFIX}.0"),
            message: "the file has no activation statistics: run `hotcold calibrate` on it \
                      (or pass its output with --stats)"
                .into(),
        }),
    }
}

fn calibrated(file: &GgufFile, il: usize, n_ff: usize) -> Result<Vec<f32>> {
    let key = format!("{FREQUENCY_KEY_PREFIX}.{il}");
    let bad = |message: String| Error::Metadata {
        key: key.clone(),
        message,
    };
    let f = file
        .get_array(&key)?
        .ok_or_else(|| bad("missing (the other layers have statistics)".into()))?
        .to_f32_vec()
        .ok_or_else(|| bad("not an array of numbers".into()))?;
    if f.len() != n_ff {
        return Err(bad(format!(
            "{} frequencies for {n_ff} FFN neurons",
            f.len()
        )));
    }
    Ok(f)
}

fn require_f32(file: &GgufFile, key: &str) -> Result<f32> {
    file.get_f32(key)?.ok_or_else(|| Error::Metadata {
        key: key.into(),
        message: "missing".into(),
    })
}
