//! Hyper-parameters read from `{arch}.*` metadata keys, with each architecture's conventions.

use crate::cpu::ops::RopeStyle;
use crate::gguf::{GgufFile, MetaArray};
use crate::{Error, Result};

/// The architectures the dense engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral-style GQA (`llama`).
    Llama,
    /// Qwen2: the Llama graph with biases on Q, K and V, NEOX RoPE (`qwen2`).
    Qwen2,
    /// Gemma 3: GeGLU, Q/K norms, post-norms, sliding-window layers (`gemma3`).
    Gemma3,
    /// PowerInfer's Bamboo / TurboSparse-Mistral: the Llama graph with a dReLU FFN (`bamboo`).
    Bamboo,
    /// Falcon (`falcon`): parallel attention (attention and FFN both read the layer's input),
    /// LayerNorm with bias, fused QKV, NEOX RoPE, an FFN without gate (`down(act(up·h))`).
    Falcon,
    /// OPT (`opt`): LayerNorm with bias, learned positional embeddings, biases on every linear
    /// layer, no RoPE, an FFN without gate (`down(relu(up·h + b) ) + b`), tied LM head.
    Opt,
}

impl Arch {
    /// Every supported architecture name, for error messages.
    pub const SUPPORTED: &'static str = "llama, qwen2, gemma3, bamboo, falcon, opt";

    /// The architecture named by `general.architecture`.
    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "gemma3" => Ok(Arch::Gemma3),
            "bamboo" => Ok(Arch::Bamboo),
            "falcon" => Ok(Arch::Falcon),
            "opt" => Ok(Arch::Opt),
            other => Err(Error::Metadata {
                key: "general.architecture".into(),
                message: format!(
                    "unsupported architecture {other:?} (supported: {})",
                    Arch::SUPPORTED
                ),
            }),
        }
    }

    /// Whether attention and FFN both read the block's input and add to it together (Falcon).
    pub fn parallel_attention(self) -> bool {
        self == Arch::Falcon
    }

    /// The normalisation the architecture uses everywhere.
    pub fn norm(self) -> NormKind {
        match self {
            Arch::Falcon | Arch::Opt => NormKind::Layer,
            _ => NormKind::Rms,
        }
    }
}

/// Which normalisation a model uses (its weights and biases live in [`crate::model::Norm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / rms(x) · w` (ggml's `rms_norm`).
    Rms,
    /// `(x − mean(x)) / std(x) · w + b` (ggml's `norm`).
    Layer,
}

/// The FFN's activation, which also decides which neurons can be skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (GeGLU).
    Gelu,
    /// `relu(gate) * up` (ReLU Llama-2, ProSparse): a neuron is zero when its gate is not positive.
    /// In an FFN without gate (Falcon, OPT) the up projection takes the gate's place:
    /// `relu(up)`.
    Relu,
    /// `relu(gate) * relu(up)` (dReLU: Bamboo, TurboSparse): zero unless both are positive.
    DRelu,
}

impl FfnActivation {
    /// The metadata key that names the activation explicitly (written by `synth`).
    pub const KEY: &'static str = "hotcold.ffn_activation";

    /// The activation named `name` (`silu`, `gelu`, `relu`, `drelu`).
    pub fn from_name(name: &str) -> Result<FfnActivation> {
        Ok(match name {
            "silu" => FfnActivation::Silu,
            "gelu" => FfnActivation::Gelu,
            "relu" => FfnActivation::Relu,
            "drelu" => FfnActivation::DRelu,
            other => {
                return Err(Error::Metadata {
                    key: FfnActivation::KEY.into(),
                    message: format!(
                        "unknown FFN activation {other:?} (known: silu, gelu, relu, drelu)"
                    ),
                })
            }
        })
    }

    /// Whether neurons whose gate pre-activation is not positive are exactly zero.
    pub fn is_relu(self) -> bool {
        matches!(self, FfnActivation::Relu | FfnActivation::DRelu)
    }

    /// The activation applied to the gate pre-activation alone.
    pub fn gate(self, gate: f32) -> f32 {
        match self {
            FfnActivation::Silu => crate::cpu::ops::silu(gate),
            FfnActivation::Gelu => crate::cpu::ops::gelu_ggml(gate),
            FfnActivation::Relu | FfnActivation::DRelu => gate.max(0.0),
        }
    }

    /// Whether a neuron whose gate product is not positive outputs zero whatever its up product
    /// (ReLU, dReLU).
    pub fn gate_decides(self) -> bool {
        matches!(self, FfnActivation::Relu | FfnActivation::DRelu)
    }

    /// The neuron's output from its gate and up projections.
    pub fn combine(self, gate: f32, up: f32) -> f32 {
        match self {
            FfnActivation::Silu => crate::cpu::ops::silu(gate) * up,
            FfnActivation::Gelu => crate::cpu::ops::gelu_ggml(gate) * up,
            FfnActivation::Relu => gate.max(0.0) * up,
            FfnActivation::DRelu => gate.max(0.0) * up.max(0.0),
        }
    }
}

/// Everything the forward pass needs to know about the model's shape.
#[derive(Clone, Debug)]
pub struct HyperParams {
    /// Architecture.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// FFN hidden width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Size of one head (keys and queries).
    pub head_dim: usize,
    /// Size of one value head.
    pub head_dim_v: usize,
    /// Vocabulary size (rows of the embedding).
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// Epsilon of the model's norms (RMSNorm, or LayerNorm for falcon and opt).
    pub rms_eps: f32,
    /// RMSNorm or LayerNorm.
    pub norm: NormKind,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE base of global layers.
    pub rope_base: f32,
    /// RoPE base of sliding-window layers.
    pub rope_base_swa: f32,
    /// Linear RoPE scale (1 / scaling factor).
    pub rope_freq_scale: f32,
    /// Sliding window size, when the model has sliding-window layers.
    pub sliding_window: Option<usize>,
    /// Which layers use the sliding window.
    pub swa_layers: Vec<bool>,
    /// Multiplier of the attention scores (`1/sqrt(head_dim)` unless the family says otherwise).
    pub attn_scale: f32,
    /// Multiplier of the token embeddings (`sqrt(n_embd)` for Gemma, 1 otherwise).
    pub embed_scale: f32,
    /// FFN activation.
    pub ffn_act: FfnActivation,
    /// `tanh` soft-capping of the final logits, when set.
    pub final_logit_softcap: Option<f32>,
    /// Predictor thresholds per layer: neuron i is predicted active unless its predictor logit is
    /// below this. `hotcold.predictor.thresholds` (one per layer, written by `calibrate`), else
    /// PowerInfer's single `powerinfer.sparse_threshold` (default 0).
    pub sparse_thresholds: Vec<f32>,
    /// Training-free (CATS) thresholds per layer on `|act(gate)|`, from `hotcold.cats.thresholds`.
    pub cats_thresholds: Option<Vec<f32>>,
    /// Training-free (TEAL) input thresholds per layer, in `engine::Proj::ALL` order (q, k, v, o,
    /// gate, up, down), from `hotcold.teal.thresholds` (`n_layer × 7` floats, layer-major).
    pub teal_thresholds: Option<Vec<[f32; 7]>>,
    /// What the TEAL thresholds compare, from `hotcold.teal.criterion` (default: magnitude).
    pub teal_criterion: TealCriterion,
}

/// What a TEAL threshold `t` compares for input channel `i` of a matrix `W`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TealCriterion {
    /// TEAL's `|x_i|`.
    #[default]
    Magnitude,
    /// WINA's (Chen et al. 2025, "Weight Informed Neuron Activation") `|x_i| · ‖W[:, i]‖₂`: the
    /// norm of the output the channel adds.
    Wina,
}

impl TealCriterion {
    /// The name written under [`TEAL_CRITERION_KEY`].
    pub fn name(self) -> &'static str {
        match self {
            TealCriterion::Magnitude => "magnitude",
            TealCriterion::Wina => "wina",
        }
    }
}

/// Metadata key of the [`TealCriterion`] the TEAL thresholds were calibrated for (a string;
/// absent means magnitude).
pub const TEAL_CRITERION_KEY: &str = "hotcold.teal.criterion";

/// The file's [`TEAL_CRITERION_KEY`].
fn teal_criterion(file: &GgufFile) -> Result<TealCriterion> {
    match file.get_str(TEAL_CRITERION_KEY)? {
        None | Some("magnitude") => Ok(TealCriterion::Magnitude),
        Some("wina") => Ok(TealCriterion::Wina),
        Some(other) => Err(Error::Metadata {
            key: TEAL_CRITERION_KEY.into(),
            message: format!("unknown criterion {other:?} (expected magnitude or wina)"),
        }),
    }
}

/// Metadata key of the per-layer CATS thresholds written by `calibrate --target-sparsity`.
pub const CATS_THRESHOLDS_KEY: &str = "hotcold.cats.thresholds";

/// Metadata key of the TEAL thresholds (`n_layer × 7` f32, layer-major; see `engine::teal`).
pub const TEAL_THRESHOLDS_KEY: &str = "hotcold.teal.thresholds";

/// The TEAL thresholds of `file`, when it has them: `n_layer` rows of seven non-negative floats.
fn teal_thresholds(file: &GgufFile, n_layer: usize) -> Result<Option<Vec<[f32; 7]>>> {
    let Some(a) = file.get_array(TEAL_THRESHOLDS_KEY)? else {
        return Ok(None);
    };
    let bad = |message: String| Error::Metadata {
        key: TEAL_THRESHOLDS_KEY.into(),
        message,
    };
    let t = a
        .to_f32_vec()
        .ok_or_else(|| bad("expected an array of floats".into()))?;
    if t.len() != n_layer * 7 {
        return Err(bad(format!(
            "{} values, expected {n_layer} layers × 7 matrices = {}",
            t.len(),
            n_layer * 7
        )));
    }
    if let Some(v) = t.iter().find(|v| v.is_nan() || **v < 0.0) {
        return Err(bad(format!("threshold {v} is not a non-negative number")));
    }
    Ok(Some(
        t.chunks_exact(7)
            .map(|c| c.try_into().expect("chunks of 7"))
            .collect(),
    ))
}

/// Metadata key of the per-layer predictor thresholds written by `calibrate`.
pub const PREDICTOR_THRESHOLDS_KEY: &str = "hotcold.predictor.thresholds";

impl HyperParams {
    /// Reads the hyper-parameters of `file` (its vocabulary size is checked against the embedding
    /// by the weight loader).
    pub fn from_gguf(file: &GgufFile) -> Result<HyperParams> {
        let arch_name = file.architecture()?;
        let arch = Arch::from_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> { to_usize(&key(k), file.require_u64(&key(k))?) };
        let opt = |k: &str| -> Result<Option<usize>> {
            file.get_u64(&key(k))?
                .map(|v| to_usize(&key(k), v))
                .transpose()
        };
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_layer == 0 || n_embd == 0 || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::Metadata {
                key: key("attention.head_count_kv"),
                message: format!(
                    "inconsistent shape: {n_layer} layers, width {n_embd}, {n_head} heads, {n_head_kv} KV heads"
                ),
            });
        }
        let head_dim = opt("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length")?.unwrap_or(head_dim);
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim);
        if head_dim == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(Error::Metadata {
                key: key("rope.dimension_count"),
                message: format!("{n_rot} rotated dimensions for heads of {head_dim}"),
            });
        }
        let eps_key = match arch {
            Arch::Falcon | Arch::Opt => key("attention.layer_norm_epsilon"),
            _ => key("attention.layer_norm_rms_epsilon"),
        };
        // PowerInfer's OPT converter writes no epsilon; OPT was trained with 1e-5.
        let rms_eps = match (file.get_f32(&eps_key)?, arch) {
            (Some(eps), _) => eps,
            (None, Arch::Opt) => 1e-5,
            (None, _) => {
                return Err(Error::Metadata {
                    key: eps_key,
                    message: "missing".into(),
                })
            }
        };
        let rope_base = file.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rope_freq_scale = match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / file.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            Some(other) => {
                return Err(Error::Metadata {
                    key: key("rope.scaling.type"),
                    message: format!(
                        "RoPE scaling {other:?} is not supported (supported: none, linear)"
                    ),
                })
            }
        };
        let n_ctx_train = opt("context_length")?.unwrap_or(4096);
        let sliding_window = opt("attention.sliding_window")?.filter(|&w| w > 0);
        let swa_layers = match (arch, sliding_window) {
            (Arch::Gemma3, Some(_)) => {
                swa_pattern(file, &key("attention.sliding_window_pattern"), n_layer, 6)?
            }
            (_, Some(_)) => {
                swa_pattern(file, &key("attention.sliding_window_pattern"), n_layer, 0)?
            }
            _ => vec![false; n_layer],
        };
        let (rope_style, attn_scale, embed_scale, ffn_act) = match arch {
            Arch::Llama | Arch::Bamboo => (
                RopeStyle::Normal,
                1.0 / (head_dim as f32).sqrt(),
                1.0,
                FfnActivation::Silu,
            ),
            Arch::Qwen2 => (
                RopeStyle::Neox,
                1.0 / (head_dim as f32).sqrt(),
                1.0,
                FfnActivation::Silu,
            ),
            Arch::Gemma3 => (
                RopeStyle::Neox,
                1.0 / (head_dim as f32).sqrt(),
                (n_embd as f32).sqrt(),
                FfnActivation::Gelu,
            ),
            // Dense Falcon is GELU; PowerInfer's ReluFalcon (PWRI) is ReLU (below).
            Arch::Falcon => (
                RopeStyle::Neox,
                1.0 / (head_dim as f32).sqrt(),
                1.0,
                FfnActivation::Gelu,
            ),
            Arch::Opt => (
                RopeStyle::Normal,
                1.0 / (head_dim as f32).sqrt(),
                1.0,
                FfnActivation::Relu,
            ),
        };
        // OPT has no RoPE (learned positions instead).
        let n_rot = if arch == Arch::Opt { 0 } else { n_rot };
        // The activation: named explicitly, else PowerInfer's convention (a PWRI `llama` file is a
        // ReLU Llama, `bamboo` is dReLU), else the architecture's own.
        let ffn_act = match file.get_str(FfnActivation::KEY)? {
            Some(name) => FfnActivation::from_name(name)?,
            None if arch == Arch::Bamboo => FfnActivation::DRelu,
            None if file.magic() == crate::gguf::Magic::PowerInfer
                && matches!(arch, Arch::Llama | Arch::Falcon) =>
            {
                FfnActivation::Relu
            }
            None => ffn_act,
        };
        let final_logit_softcap = file
            .get_f32(&key("final_logit_softcapping"))?
            .filter(|&c| c != 0.0);
        Ok(HyperParams {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_vocab: 0,
            n_ctx_train,
            rms_eps,
            norm: arch.norm(),
            rope_style,
            n_rot,
            rope_base,
            rope_base_swa: file
                .get_f32(&key("rope.freq_base_swa"))?
                .unwrap_or(10_000.0),
            rope_freq_scale,
            sliding_window,
            swa_layers,
            attn_scale,
            embed_scale,
            ffn_act,
            final_logit_softcap,
            sparse_thresholds: sparse_thresholds(file, n_layer)?,
            cats_thresholds: file
                .get_array(CATS_THRESHOLDS_KEY)?
                .map(|a| match a.to_f32_vec() {
                    Some(t) if t.len() == n_layer => Ok(t),
                    _ => Err(Error::Metadata {
                        key: CATS_THRESHOLDS_KEY.into(),
                        message: format!("expected {n_layer} floats"),
                    }),
                })
                .transpose()?,
            teal_thresholds: teal_thresholds(file, n_layer)?,
            teal_criterion: teal_criterion(file)?,
        })
    }

    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key heads together.
    pub fn k_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of all value heads together.
    pub fn v_width(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
}

fn sparse_thresholds(file: &GgufFile, n_layer: usize) -> Result<Vec<f32>> {
    if let Some(array) = file.get_array(PREDICTOR_THRESHOLDS_KEY)? {
        return match array.to_f32_vec() {
            Some(t) if t.len() == n_layer => Ok(t),
            _ => Err(Error::Metadata {
                key: PREDICTOR_THRESHOLDS_KEY.into(),
                message: format!("expected {n_layer} floats"),
            }),
        };
    }
    let global = file.get_f32("powerinfer.sparse_threshold")?.unwrap_or(0.0);
    Ok(vec![global; n_layer])
}

fn to_usize(key: &str, v: u64) -> Result<usize> {
    Some(v)
        .filter(|&v| v < (1u64 << 32))
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| Error::Metadata {
            key: key.into(),
            message: format!("value {v} is out of range"),
        })
}

/// Sliding-window layers: an explicit per-layer bool array, or a period `n` where every `n`-th
/// layer is global (llama.cpp's `set_swa_pattern`; 0 means all layers slide).
fn swa_pattern(
    file: &GgufFile,
    key: &str,
    n_layer: usize,
    default_period: usize,
) -> Result<Vec<bool>> {
    match file.get(key) {
        Some(v) => match v.as_array() {
            Some(MetaArray::Bool(b)) if b.len() == n_layer => Ok(b.clone()),
            _ => match v.as_u64() {
                Some(period) => Ok(periodic(n_layer, period as usize)),
                None => Err(Error::Metadata {
                    key: key.into(),
                    message: format!("expected a period or {n_layer} bools"),
                }),
            },
        },
        None => Ok(periodic(n_layer, default_period)),
    }
}

fn periodic(n_layer: usize, period: usize) -> Vec<bool> {
    (0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect()
}
