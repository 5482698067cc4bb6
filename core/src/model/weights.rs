//! The weights of a dense model, resolved by role and shape-checked at load time.

use std::sync::Arc;

use super::hparams::{Arch, HyperParams};
use crate::cpu::Matrix;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, GgmlType};
use crate::{Error, Result};

/// A weight matrix inside the mapped file: `rows` outputs of `cols` inputs each.
#[derive(Clone, Debug)]
pub struct Weight {
    /// The tensor's name, for messages.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Output dimension (ggml `ne[1]`).
    pub rows: usize,
    /// Input dimension (ggml `ne[0]`).
    pub cols: usize,
    data: WeightData,
}

/// Where a weight's bytes live.
#[derive(Clone, Debug)]
enum WeightData {
    /// A tensor of the mapped file.
    File(TensorInfo),
    /// Repacked at load time (e.g. a neuron-major copy of the down projection).
    Owned(Arc<[u8]>),
}

impl Weight {
    /// Size of the weight's data in bytes.
    pub fn n_bytes(&self) -> u64 {
        match &self.data {
            WeightData::File(info) => info.n_bytes,
            WeightData::Owned(bytes) => bytes.len() as u64,
        }
    }
}

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub wq: Weight,
    /// Key projection.
    pub wk: Weight,
    /// Value projection.
    pub wv: Weight,
    /// Query bias (Qwen2).
    pub bq: Option<Vec<f32>>,
    /// Key bias (Qwen2).
    pub bk: Option<Vec<f32>>,
    /// Value bias (Qwen2).
    pub bv: Option<Vec<f32>>,
    /// Per-head RMSNorm of queries (Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// Per-head RMSNorm of keys (Gemma 3).
    pub k_norm: Option<Vec<f32>>,
    /// Output projection.
    pub wo: Weight,
    /// RMSNorm of the attention output before the residual add (Gemma 3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// RMSNorm before the FFN.
    pub ffn_norm: Vec<f32>,
    /// FFN gate projection.
    pub gate: Weight,
    /// FFN up projection.
    pub up: Weight,
    /// FFN down projection (`n_embd` rows of `n_ff`), when the file has it.
    pub down: Option<Weight>,
    /// FFN down projection stored neuron-major (`n_ff` rows of `n_embd`: PowerInfer's
    /// `ffn_down_t`), for the sparse axpy; when the file has it.
    pub down_t: Option<Weight>,
    /// PowerInfer's activation predictor, when the file has one.
    pub predictor: Option<Predictor>,
    /// RMSNorm of the FFN output before the residual add (Gemma 3).
    pub post_ffn_norm: Option<Vec<f32>>,
}

impl LayerWeights {
    /// The down projection in whichever layout the file has (row-major preferred).
    pub fn down_weight(&self) -> &Weight {
        self.down
            .as_ref()
            .or(self.down_t.as_ref())
            .expect("the loader requires ffn_down or ffn_down_t")
    }
}

/// PowerInfer's per-layer predictor: neuron `i` is predicted active unless
/// `(fc2 · relu(fc1 · x))[i]` is below the model's threshold.
#[derive(Clone, Debug)]
pub struct Predictor {
    /// `R` rows of `n_embd` (ggml shape {n_embd, R}).
    pub fc1: Weight,
    /// `n_ff` rows of `R` (ggml shape {R, n_ff}).
    pub fc2: Weight,
}

/// A loaded model: the mapped file, its hyper-parameters and its weights by role.
pub struct Model {
    file: Arc<GgufFile>,
    /// Hyper-parameters.
    pub hp: HyperParams,
    /// Token embedding (`n_vocab` rows of `n_embd`).
    pub token_embd: Weight,
    /// Blocks, in order.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub output_norm: Vec<f32>,
    /// LM head (the token embedding when tied).
    pub output: Weight,
}

impl Model {
    /// Maps and loads the model at `path`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Model> {
        Model::from_file(Arc::new(GgufFile::open(path)?))
    }

    /// Loads the model from an opened file.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Model> {
        let mut hp = HyperParams::from_gguf(&file)?;
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(Error::Tensor {
                tensor: "rope_freqs.weight".into(),
                message: "per-dimension RoPE frequency factors are not supported yet".into(),
            });
        }
        hp.n_vocab = file.require_tensor("token_embd.weight")?.n_rows() as usize;
        let loader = Loader {
            file: &file,
            hp: &hp,
        };
        let token_embd = loader.matrix("token_embd.weight", Some(hp.n_vocab), hp.n_embd)?;
        let output = match file.tensor("output.weight") {
            Some(_) => loader.matrix("output.weight", Some(hp.n_vocab), hp.n_embd)?,
            None => token_embd.clone(),
        };
        let layers = (0..hp.n_layer)
            .map(|il| loader.layer(il))
            .collect::<Result<_>>()?;
        let output_norm = loader.vector("output_norm.weight", hp.n_embd)?;
        Ok(Model {
            file: file.clone(),
            hp,
            token_embd,
            layers,
            output_norm,
            output,
        })
    }

    /// The file the weights live in.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// A kernel view of `w`'s data.
    pub fn matrix<'a>(&'a self, w: &'a Weight) -> Matrix<'a> {
        Matrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: match &w.data {
                WeightData::File(info) => self.file.tensor_data(info),
                WeightData::Owned(bytes) => bytes,
            },
        }
    }

    /// Gives every layer without one a neuron-major F16 copy of its down projection (`ffn_down_t`),
    /// so that the sparse axpy can skip
    /// neurons of dense files. Costs the copies' memory; does nothing for layers that have one.
    pub fn repack_down_t(&mut self) -> Result<()> {
        for (il, layer) in self.layers.iter_mut().enumerate() {
            if layer.down_t.is_some() {
                continue;
            }
            let down = layer
                .down
                .as_ref()
                .expect("a layer without ffn_down_t has ffn_down");
            let m = Matrix {
                ty: down.ty,
                rows: down.rows,
                cols: down.cols,
                data: match &down.data {
                    WeightData::File(info) => self.file.tensor_data(info),
                    WeightData::Owned(bytes) => bytes,
                },
            };
            let (ty, bytes) = transposed(&m)?;
            layer.down_t = Some(Weight {
                name: format!("blk.{il}.ffn_down_t.weight (repacked)"),
                ty,
                rows: down.cols,
                cols: down.rows,
                data: WeightData::Owned(bytes.into()),
            });
        }
        Ok(())
    }

    /// Bytes of all weight matrices read for one decoded token (every layer's matrices and the
    /// LM head; the embedding row is negligible).
    pub fn bytes_per_token(&self) -> u64 {
        let layer: u64 = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, l.down_weight()])
            .map(Weight::n_bytes)
            .sum();
        layer + self.output.n_bytes()
    }
}

/// `m` (rows × cols) stored transposed (cols rows of `rows` values), as F16: re-quantising to a
/// block format would regroup the values into new blocks and round them a second time (a Q8_0
/// repack of Gemma's Q6_K down moved its logits by up to 1.20 from the dense path, F16 by 1.04,
/// most of it the different rounding of the activations); F16 rounds each value once.
pub(crate) fn transposed(m: &Matrix) -> Result<(GgmlType, Vec<u8>)> {
    let mut dense = vec![0f32; m.rows * m.cols];
    for (r, row) in dense.chunks_exact_mut(m.cols).enumerate() {
        crate::cpu::dequantize_row(m, r, row)?;
    }
    let mut t = vec![0f32; m.rows * m.cols];
    for r in 0..m.rows {
        for c in 0..m.cols {
            t[c * m.rows + r] = dense[r * m.cols + c];
        }
    }
    let ty = GgmlType::F16;
    let mut bytes = vec![0u8; ty.row_bytes(m.rows as u64)? as usize * m.cols];
    quant::quantize(ty, &t, &mut bytes)?;
    Ok((ty, bytes))
}

struct Loader<'a> {
    file: &'a GgufFile,
    hp: &'a HyperParams,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.file.require_tensor(name)
    }

    /// A 2-D weight of `cols` inputs and (when given) `rows` outputs.
    fn matrix(&self, name: &str, rows: Option<usize>, cols: usize) -> Result<Weight> {
        let info = self.info(name)?;
        let bad = |message: String| Error::Tensor {
            tensor: name.into(),
            message,
        };
        if info.shape.len() != 2
            || info.shape[0] as usize != cols
            || rows.is_some_and(|r| info.shape[1] as usize != r)
        {
            return Err(bad(format!(
                "shape {:?}, expected [{cols}, {}]",
                info.shape,
                rows.map_or("n".to_string(), |r| r.to_string())
            )));
        }
        Matrix::new(
            info.ty,
            info.shape[1] as usize,
            cols,
            self.file.tensor_data(info),
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(Weight {
            name: name.into(),
            ty: info.ty,
            rows: info.shape[1] as usize,
            cols,
            data: WeightData::File(info.clone()),
        })
    }

    /// A 1-D tensor of `len` elements, dequantised to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.info(name)?;
        if info.n_elements() as usize != len {
            return Err(Error::Tensor {
                tensor: name.into(),
                message: format!("shape {:?}, expected {len} elements", info.shape),
            });
        }
        let mut out = vec![0f32; len];
        quant::dequantize(info.ty, self.file.tensor_data(info), &mut out).map_err(|e| {
            Error::Tensor {
                tensor: name.into(),
                message: e.to_string(),
            }
        })?;
        Ok(out)
    }

    fn optional_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Weight>> {
        match self.file.tensor(name) {
            Some(_) => self.matrix(name, Some(rows), cols).map(Some),
            None => Ok(None),
        }
    }

    fn predictor(&self, il: usize) -> Result<Option<Predictor>> {
        let (fc1, fc2) = (
            format!("blk.{il}.fc1.weight"),
            format!("blk.{il}.fc2.weight"),
        );
        match (self.file.tensor(&fc1), self.file.tensor(&fc2)) {
            (None, None) => Ok(None),
            (Some(info), Some(_)) => {
                let rank = info.n_rows() as usize;
                Ok(Some(Predictor {
                    fc1: self.matrix(&fc1, Some(rank), self.hp.n_embd)?,
                    fc2: self.matrix(&fc2, Some(self.hp.n_ff), rank)?,
                }))
            }
            _ => Err(Error::Tensor {
                tensor: fc1,
                message: "a predictor needs both fc1 and fc2".into(),
            }),
        }
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        match self.file.tensor(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }

    fn layer(&self, il: usize) -> Result<LayerWeights> {
        let layer = self.layer_tensors(il)?;
        if layer.down.is_none() && layer.down_t.is_none() {
            return Err(Error::Tensor {
                tensor: format!("blk.{il}.ffn_down.weight"),
                message: "missing (and no ffn_down_t either)".into(),
            });
        }
        Ok(layer)
    }

    fn layer_tensors(&self, il: usize) -> Result<LayerWeights> {
        let hp = self.hp;
        let n = |role: &str| format!("blk.{il}.{role}");
        let gemma = hp.arch == Arch::Gemma3;
        let required_if = |cond: bool, role: &str, len: usize| -> Result<Option<Vec<f32>>> {
            if cond {
                self.vector(&n(role), len).map(Some)
            } else {
                self.optional_vector(&n(role), len)
            }
        };
        Ok(LayerWeights {
            attn_norm: self.vector(&n("attn_norm.weight"), hp.n_embd)?,
            wq: self.matrix(&n("attn_q.weight"), Some(hp.q_width()), hp.n_embd)?,
            wk: self.matrix(&n("attn_k.weight"), Some(hp.k_width()), hp.n_embd)?,
            wv: self.matrix(&n("attn_v.weight"), Some(hp.v_width()), hp.n_embd)?,
            bq: required_if(hp.arch == Arch::Qwen2, "attn_q.bias", hp.q_width())?,
            bk: required_if(hp.arch == Arch::Qwen2, "attn_k.bias", hp.k_width())?,
            bv: required_if(hp.arch == Arch::Qwen2, "attn_v.bias", hp.v_width())?,
            q_norm: required_if(gemma, "attn_q_norm.weight", hp.head_dim)?,
            k_norm: required_if(gemma, "attn_k_norm.weight", hp.head_dim)?,
            wo: self.matrix(
                &n("attn_output.weight"),
                Some(hp.n_embd),
                hp.n_head * hp.head_dim_v,
            )?,
            post_attn_norm: required_if(gemma, "post_attention_norm.weight", hp.n_embd)?,
            ffn_norm: self.vector(&n("ffn_norm.weight"), hp.n_embd)?,
            gate: self.matrix(&n("ffn_gate.weight"), Some(hp.n_ff), hp.n_embd)?,
            up: self.matrix(&n("ffn_up.weight"), Some(hp.n_ff), hp.n_embd)?,
            down: self.optional_matrix(&n("ffn_down.weight"), hp.n_embd, hp.n_ff)?,
            down_t: self.optional_matrix(&n("ffn_down_t.weight"), hp.n_ff, hp.n_embd)?,
            predictor: self.predictor(il)?,
            post_ffn_norm: required_if(gemma, "post_ffw_norm.weight", hp.n_embd)?,
        })
    }
}
