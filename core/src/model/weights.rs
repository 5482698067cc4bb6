//! The weights of a dense model, resolved by role and shape-checked at load time.

use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

use super::hparams::{Arch, FfnActivation, HyperParams, NormKind};
use crate::cpu::{self, Interleaved, Matrix};
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
    /// The 16-row interleaved copy of a weight of one of [`Interleaved::TYPES`], made on its first
    /// CPU product where this CPU runs that layout faster (see [`Model::matmul`]); shared by
    /// clones.
    interleaved: Arc<OnceLock<Option<Interleaved>>>,
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
    fn new(name: String, ty: GgmlType, rows: usize, cols: usize, data: WeightData) -> Weight {
        Weight {
            name,
            ty,
            rows,
            cols,
            data,
            interleaved: Arc::default(),
        }
    }

    /// Size of the weight's data in bytes.
    pub fn n_bytes(&self) -> u64 {
        match &self.data {
            WeightData::File(info) => info.n_bytes,
            WeightData::Owned(bytes) => bytes.len() as u64,
        }
    }
}

/// A norm's scale and, for LayerNorm, its bias (the model's [`super::NormKind`] says which).
#[derive(Clone, Debug)]
pub struct Norm {
    /// Per-channel scale.
    pub weight: Vec<f32>,
    /// Per-channel bias (LayerNorm models).
    pub bias: Option<Vec<f32>>,
}

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// Norm before attention (for Falcon also the FFN's norm: parallel attention).
    pub attn_norm: Norm,
    /// Falcon-40B's separate norm of the attention input (`attn_norm_2`; `attn_norm` then feeds
    /// only the FFN).
    pub attn_norm_2: Option<Norm>,
    /// Query projection.
    pub wq: Weight,
    /// Key projection.
    pub wk: Weight,
    /// Value projection.
    pub wv: Weight,
    /// Query bias (Qwen2, OPT).
    pub bq: Option<Vec<f32>>,
    /// Key bias (Qwen2, OPT).
    pub bk: Option<Vec<f32>>,
    /// Value bias (Qwen2, OPT).
    pub bv: Option<Vec<f32>>,
    /// Per-head RMSNorm of queries (Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// Per-head RMSNorm of keys (Gemma 3).
    pub k_norm: Option<Vec<f32>>,
    /// Output projection.
    pub wo: Weight,
    /// Output projection bias (OPT).
    pub bo: Option<Vec<f32>>,
    /// RMSNorm of the attention output before the residual add (Gemma 3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Norm before the FFN (Falcon: a copy of `attn_norm`, which the FFN reads).
    pub ffn_norm: Norm,
    /// FFN gate projection; `None` for FFNs without gate (Falcon, OPT: `act(up·h)`).
    pub gate: Option<Weight>,
    /// FFN up projection.
    pub up: Weight,
    /// FFN up bias (OPT), added before the activation.
    pub up_b: Option<Vec<f32>>,
    /// FFN down bias (OPT: `ffn_down.bias`, or `ffn_down_t.bias` in PowerInfer's files).
    pub down_b: Option<Vec<f32>>,
    /// FFN down projection (`n_embd` rows of `n_ff`), when the file has it.
    pub down: Option<Weight>,
    /// FFN down projection stored neuron-major (`n_ff` rows of `n_embd`: PowerInfer's
    /// `ffn_down_t`), for the sparse axpy; when the file has it.
    pub down_t: Option<Weight>,
    /// PowerInfer's activation predictor, when the file has one.
    pub predictor: Option<Predictor>,
    /// RMSNorm of the FFN output before the residual add (Gemma 3).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Interleaved copies of the neurons that fire most often, in a layer ordered hottest first
    /// ([`Model::order_neurons_by_frequency`]).
    pub hot: Option<Arc<HotRows>>,
}

/// The first rows of a layer's gate and up (its hottest neurons) in the 16-row interleaved layout:
/// the fused sparse FFN computes them all together instead of gathering them one by one.
#[derive(Debug)]
pub struct HotRows {
    /// Gate's first rows.
    pub gate: Interleaved,
    /// Up's first rows, as many.
    pub up: Interleaved,
}

/// A group of 16 neurons is hot when its mean firing frequency is at least this: computing all
/// 16 rows in the interleaved layout then costs less than gathering the chosen ones.
const HOT_GROUP_MIN_FREQUENCY: f32 = 0.4;

impl LayerWeights {
    /// The down projection in whichever layout the file has (row-major preferred).
    pub fn down_weight(&self) -> &Weight {
        self.down
            .as_ref()
            .or(self.down_t.as_ref())
            .expect("the loader requires ffn_down or ffn_down_t")
    }

    /// The projection whose pre-activation decides whether a neuron fires: the gate, or up in an
    /// FFN without gate.
    pub fn decider(&self) -> &Weight {
        self.gate.as_ref().unwrap_or(&self.up)
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

/// The weight types of a predictor's two layers (in-memory copies, [`Model::quantize_predictors`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PredictorTypes {
    /// `fc1`'s type.
    pub fc1: GgmlType,
    /// `fc2`'s type.
    pub fc2: GgmlType,
}

impl PredictorTypes {
    /// Both layers as `ty`.
    pub fn both(ty: GgmlType) -> PredictorTypes {
        PredictorTypes { fc1: ty, fc2: ty }
    }

    /// The default copies of float predictors: Q8_0, except `fc2` (4/5 of a predictor's bytes
    /// at rank 128 and n_embd 1024) as Q4_0 in a model whose FFN weights are all Q4_0
    /// (`q4_0_ffn`). PowerInfer's `quantize` stores both layers of a Q4_0 model's predictors as
    /// Q4_0; on `synth`'s Q4_0 models (layer 0 on text) that costs recall: 0.987 on tiny (under
    /// the 0.99 target) and 0.990–0.992 on `small`, against 0.998 with Q8_0, while Q4_0 `fc2`
    /// alone keeps 0.991–0.993 on tiny and 0.994 on `small`, every architecture, and decodes the
    /// `small` Q4_0 model about 5% faster than Q8_0 predictors (2 threads, AVX2; both layers as
    /// Q4_0, `--predictor-type q4_0`: 9–13%).
    pub fn default_for(q4_0_ffn: bool) -> PredictorTypes {
        PredictorTypes {
            fc1: GgmlType::Q8_0,
            fc2: match q4_0_ffn {
                true => GgmlType::Q4_0,
                false => GgmlType::Q8_0,
            },
        }
    }
}

/// A loaded model: the mapped file, its hyper-parameters and its weights by role.
pub struct Model {
    file: Arc<GgufFile>,
    /// Hyper-parameters.
    pub hp: HyperParams,
    /// Token embedding (`n_vocab` rows of `n_embd`).
    pub token_embd: Weight,
    /// Learned positional embedding (OPT: position `p` is row `p + 2`).
    pub pos_embd: Option<Weight>,
    /// Blocks, in order.
    pub layers: Vec<LayerWeights>,
    /// Final norm.
    pub output_norm: Norm,
    /// LM head (the token embedding when tied).
    pub output: Weight,
    /// Whether [`Model::order_neurons_by_frequency`] renumbered the neurons.
    renumbered: bool,
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
        let pos_embd = match hp.arch {
            Arch::Opt => Some(loader.matrix("position_embd.weight", None, hp.n_embd)?),
            _ => None,
        };
        let layers = (0..hp.n_layer)
            .map(|il| loader.layer(il))
            .collect::<Result<_>>()?;
        let output_norm = loader.norm("output_norm")?;
        if let Some(pos) = &pos_embd {
            // OPT's table has two extra rows (HF's position offset).
            hp.n_ctx_train = pos.rows.saturating_sub(crate::engine::OPT_POSITION_OFFSET);
        }
        Ok(Model {
            file: file.clone(),
            hp,
            token_embd,
            pos_embd,
            layers,
            output_norm,
            output,
            renumbered: false,
        })
    }

    /// The file the weights live in.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// A kernel view of `w`'s data.
    pub fn matrix<'a>(&'a self, w: &'a Weight) -> Matrix<'a> {
        view(&self.file, w)
    }

    /// `W · x` for `n` token rows of `x` on the CPU, as [`cpu::matmul`] computes it; a Q4_0, Q5_0,
    /// Q8_0, Q4_K or Q6_K weight goes through its 16-row interleaved copy ([`Interleaved`], made on
    /// first use) where this CPU runs that layout faster: the same integer block sums, another
    /// float accumulation order.
    pub fn matmul(&self, w: &Weight, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; n * w.rows];
        match self.interleaved(w) {
            Some(il) => il.matmul(x, n, &mut y)?,
            None => cpu::matmul(&self.matrix(w), x, n, &mut y)?,
        }
        Ok(y)
    }

    /// `w`'s 16-row interleaved copy, made on first use, where this CPU runs that layout faster
    /// than the row-major one and `w` is of one of [`Interleaved::TYPES`]; else `None`.
    pub fn interleaved<'a>(&'a self, w: &'a Weight) -> Option<&'a Interleaved> {
        w.interleaved
            .get_or_init(|| {
                Interleaved::is_fast_for(w.ty)
                    .then(|| Interleaved::from_matrix(&self.matrix(w)).ok())
                    .flatten()
            })
            .as_ref()
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
            let (ty, bytes) = transposed(&view(&self.file, down))?;
            layer.down_t = Some(Weight::new(
                format!("blk.{il}.ffn_down_t.weight (repacked)"),
                ty,
                down.cols,
                down.rows,
                WeightData::Owned(bytes.into()),
            ));
        }
        Ok(())
    }

    /// The types the predictors are re-encoded as by default ([`Model::quantize_predictors`]), or
    /// `None` to keep them as stored (quantised already): for predictors stored as floats (F32,
    /// F16, BF16), [`PredictorTypes::default_for`] this model's FFN weights.
    pub fn default_predictor_types(&self) -> Option<PredictorTypes> {
        let float = |ty: GgmlType| matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let stored_as_floats = self
            .layers
            .iter()
            .flat_map(|l| l.predictor.as_ref())
            .all(|p| float(p.fc1.ty) && float(p.fc2.ty));
        let q4_0_ffn = self.layers.iter().all(|l| {
            let down = l.down_t.as_ref().or(l.down.as_ref());
            let mut ffn = l.gate.iter().chain([&l.up]).chain(down);
            ffn.all(|w| w.ty == GgmlType::Q4_0)
        });
        stored_as_floats.then(|| PredictorTypes::default_for(q4_0_ffn))
    }

    /// Re-encodes every layer's predictor (`fc1`, `fc2`) as `types` in memory, leaving the file
    /// as it is (PowerInfer-readable). The predictors are read in full for every token, so a Q8_0
    /// copy of F16 predictors reads 47% fewer of their bytes; a neuron's predicted logit moves by
    /// about Q8_0's rounding, well inside the threshold margins `synth` and `calibrate` leave.
    pub fn quantize_predictors(&mut self, types: PredictorTypes) -> Result<()> {
        for layer in &mut self.layers {
            let Some(p) = &mut layer.predictor else {
                continue;
            };
            for (w, ty) in [(&mut p.fc1, types.fc1), (&mut p.fc2, types.fc2)] {
                if w.ty == ty {
                    continue;
                }
                let m = view(&self.file, w);
                let row_bytes = ty.row_bytes(w.cols as u64).map_err(|e| Error::Tensor {
                    tensor: w.name.clone(),
                    message: format!("cannot store as {ty}: {e}"),
                })? as usize;
                let mut bytes = vec![0u8; row_bytes * w.rows];
                let mut row = vec![0f32; w.cols];
                for (r, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
                    crate::cpu::dequantize_row(&m, r, &mut row)?;
                    quant::quantize(ty, &row, dst)?;
                }
                *w = Weight::new(
                    format!("{} (as {ty})", w.name),
                    ty,
                    w.rows,
                    w.cols,
                    WeightData::Owned(bytes.into()),
                );
            }
        }
        Ok(())
    }

    /// Renumbers every layer's FFN neurons hottest first (`frequencies[layer][i]`: how often neuron
    /// `i` fires): the rows of gate, up, the neuron-major down projection and the predictor's fc2
    /// (and up's bias) move together, so the FFN computes the same sum in another order. The
    /// sparse operators then read the often-chosen neurons as long runs of consecutive rows that
    /// stream from memory, instead of scattered rows each waiting on DRAM. Layers that keep a
    /// row-major down projection (whose neurons are columns inside quantisation blocks) stay as
    /// they are; returns the number of layers renumbered.
    ///
    /// Errors: [`Error::InvalidArgument`] when `frequencies` does not give one value per neuron of
    /// every layer, or when the neurons were renumbered already (the frequencies name them by their
    /// place in the file).
    pub fn order_neurons_by_frequency(&mut self, frequencies: &[Vec<f32>]) -> Result<usize> {
        if self.renumbered {
            return Err(Error::InvalidArgument(
                "the neurons are renumbered already".into(),
            ));
        }
        if frequencies.len() != self.layers.len() {
            return Err(Error::InvalidArgument(format!(
                "neuron frequencies for {} layers, the model has {}",
                frequencies.len(),
                self.layers.len()
            )));
        }
        let mut renumbered = 0;
        for (layer, freq) in self.layers.iter_mut().zip(frequencies) {
            if layer.down.is_some() || layer.down_t.is_none() {
                continue;
            }
            if freq.len() != layer.up.rows {
                return Err(Error::InvalidArgument(format!(
                    "{} neuron frequencies for {}, which has {} rows",
                    freq.len(),
                    layer.up.name,
                    layer.up.rows
                )));
            }
            let mut order: Vec<usize> = (0..freq.len()).collect();
            order.sort_by(|&a, &b| freq[b].total_cmp(&freq[a]));
            let fc2 = layer.predictor.as_mut().map(|p| &mut p.fc2);
            for w in [
                layer.gate.as_mut(),
                Some(&mut layer.up),
                layer.down_t.as_mut(),
                fc2,
            ]
            .into_iter()
            .flatten()
            {
                let data = view(&self.file, w).data;
                let rb = data.len() / w.rows;
                let mut bytes = vec![0u8; data.len()];
                bytes
                    .par_chunks_exact_mut(rb)
                    .zip(&order)
                    .for_each(|(dst, &i)| dst.copy_from_slice(&data[i * rb..(i + 1) * rb]));
                *w = Weight::new(
                    format!("{} (hottest first)", w.name),
                    w.ty,
                    w.rows,
                    w.cols,
                    WeightData::Owned(bytes.into()),
                );
            }
            if let Some(b) = &mut layer.up_b {
                *b = order.iter().map(|&i| b[i]).collect();
            }
            let sorted: Vec<f32> = order.iter().map(|&i| freq[i]).collect();
            layer.hot = hot_rows(&self.file, layer, &sorted)?.map(Arc::new);
            renumbered += 1;
        }
        self.renumbered = renumbered > 0;
        Ok(renumbered)
    }

    /// Bytes of all weight matrices read for one decoded token (every layer's matrices and the
    /// LM head; the embedding row is negligible).
    pub fn bytes_per_token(&self) -> u64 {
        let layer: u64 = self
            .layers
            .iter()
            .flat_map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.up, l.down_weight()]
                    .into_iter()
                    .chain(&l.gate)
            })
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
    let ty = GgmlType::F16;
    Ok((ty, transposed_as(m, ty)?))
}

/// `m` transposed (`m.cols` rows of `m.rows`), re-encoded as `ty` (whose block size must divide
/// `m.rows`).
///
/// Parallel over bands of [`TRANSPOSE_BAND`] input channels: each band reads its columns of the
/// dequantised rows (contiguous runs of the band's width per row), transposes them in a local
/// buffer and quantises its output rows straight into their place, so no full transposed f32 copy
/// and no strided per-element pass over the whole matrix. Same bytes as transposing and
/// quantising row by row.
pub(crate) fn transposed_as(m: &Matrix, ty: GgmlType) -> Result<Vec<u8>> {
    let (rows, cols) = (m.rows, m.cols);
    let mut dense = vec![0f32; rows * cols];
    dense
        .par_chunks_exact_mut(cols.max(1))
        .enumerate()
        .try_for_each(|(r, row)| crate::cpu::dequantize_row(m, r, row))?;
    let out_row_bytes = ty.row_bytes(rows as u64)? as usize;
    let mut bytes = vec![0u8; out_row_bytes * cols];
    if bytes.is_empty() {
        return Ok(bytes);
    }
    bytes
        .par_chunks_mut(out_row_bytes * TRANSPOSE_BAND)
        .enumerate()
        .try_for_each(|(band, dst)| {
            let c0 = band * TRANSPOSE_BAND;
            let width = dst.len() / out_row_bytes;
            let mut t = vec![0f32; width * rows];
            for (r, src) in dense.chunks_exact(cols).enumerate() {
                for (j, &v) in src[c0..c0 + width].iter().enumerate() {
                    t[j * rows + r] = v;
                }
            }
            quant::quantize(ty, &t, dst)
        })?;
    Ok(bytes)
}

/// Input channels per parallel task of [`transposed_as`].
const TRANSPOSE_BAND: usize = 64;

struct Loader<'a> {
    file: &'a GgufFile,
    hp: &'a HyperParams,
}

/// A kernel view of `w`'s data (in the mapped `file` or held).
fn view<'a>(file: &'a GgufFile, w: &'a Weight) -> Matrix<'a> {
    Matrix {
        ty: w.ty,
        rows: w.rows,
        cols: w.cols,
        data: match &w.data {
            WeightData::File(info) => file.tensor_data(info),
            WeightData::Owned(bytes) => bytes,
        },
    }
}

/// The interleaved copies of the hot rows of `layer` (ordered hottest first: `freq` its
/// neurons' frequencies in that order): the leading 16-row groups of gate and up whose mean
/// frequency reaches [`HOT_GROUP_MIN_FREQUENCY`]. `None` without a gate, without such a group, or
/// where this CPU or the weight type has no fast interleaved product.
fn hot_rows(file: &GgufFile, layer: &LayerWeights, freq: &[f32]) -> Result<Option<HotRows>> {
    let Some(gate) = &layer.gate else {
        return Ok(None);
    };
    let up = &layer.up;
    if !Interleaved::is_fast_for(gate.ty) || !Interleaved::is_fast_for(up.ty) {
        return Ok(None);
    }
    let g = Interleaved::GROUP_ROWS;
    let groups = freq
        .chunks(g)
        .take_while(|c| c.iter().sum::<f32>() / c.len() as f32 >= HOT_GROUP_MIN_FREQUENCY)
        .count();
    let n = (groups * g).min(freq.len());
    if n == 0 {
        return Ok(None);
    }
    let first_rows = |w: &Weight| {
        let data = view(file, w).data;
        let rb = data.len() / w.rows;
        Interleaved::from_matrix(&Matrix::new(w.ty, n, w.cols, &data[..n * rb])?)
    };
    Ok(Some(HotRows {
        gate: first_rows(gate)?,
        up: first_rows(up)?,
    }))
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
        Ok(Weight::new(
            name.into(),
            info.ty,
            info.shape[1] as usize,
            cols,
            WeightData::File(info.clone()),
        ))
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

    /// The norm `{prefix}.weight`, with its `{prefix}.bias` when the model uses LayerNorm.
    fn norm(&self, prefix: &str) -> Result<Norm> {
        let len = self.hp.n_embd;
        Ok(Norm {
            weight: self.vector(&format!("{prefix}.weight"), len)?,
            bias: match self.hp.norm {
                NormKind::Layer => Some(self.vector(&format!("{prefix}.bias"), len)?),
                NormKind::Rms => None,
            },
        })
    }

    /// Q, K and V: separate tensors, or row ranges of Falcon's fused `attn_qkv` (all query
    /// heads, then the key heads, then the value heads, as llama.cpp's converter lays them out).
    fn attention_projections(&self, il: usize) -> Result<(Weight, Weight, Weight)> {
        let hp = self.hp;
        let n = |role: &str| format!("blk.{il}.{role}");
        if hp.arch != Arch::Falcon {
            return Ok((
                self.matrix(&n("attn_q.weight"), Some(hp.q_width()), hp.n_embd)?,
                self.matrix(&n("attn_k.weight"), Some(hp.k_width()), hp.n_embd)?,
                self.matrix(&n("attn_v.weight"), Some(hp.v_width()), hp.n_embd)?,
            ));
        }
        let name = n("attn_qkv.weight");
        let (q, k, v) = (hp.q_width(), hp.k_width(), hp.v_width());
        let fused = self.matrix(&name, Some(q + k + v), hp.n_embd)?;
        let info = match &fused.data {
            WeightData::File(info) => info,
            WeightData::Owned(_) => unreachable!("the loader maps file tensors"),
        };
        let row_bytes = fused.ty.row_bytes(hp.n_embd as u64)?;
        let rows = |first: usize, count: usize, part: &str| {
            Weight::new(
                format!("{name}[{part}]"),
                fused.ty,
                count,
                hp.n_embd,
                WeightData::File(TensorInfo {
                    name: format!("{name}[{part}]"),
                    ty: fused.ty,
                    shape: vec![hp.n_embd as u64, count as u64],
                    offset: info.offset + first as u64 * row_bytes,
                    n_bytes: count as u64 * row_bytes,
                }),
            )
        };
        Ok((rows(0, q, "q"), rows(q, k, "k"), rows(q + k, v, "v")))
    }

    fn layer(&self, il: usize) -> Result<LayerWeights> {
        let layer = self.layer_tensors(il)?;
        if layer.gate.is_none() && self.hp.ffn_act == FfnActivation::DRelu {
            return Err(Error::Tensor {
                tensor: format!("blk.{il}.ffn_gate.weight"),
                message: "a dReLU FFN needs a gate".into(),
            });
        }
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
        let (wq, wk, wv) = self.attention_projections(il)?;
        let attn_norm = self.norm(&n("attn_norm"))?;
        let (falcon, opt) = (hp.arch == Arch::Falcon, hp.arch == Arch::Opt);
        let down_b = match self.file.tensor(&n("ffn_down_t.bias")) {
            Some(_) => Some(self.vector(&n("ffn_down_t.bias"), hp.n_embd)?),
            None => required_if(opt, "ffn_down.bias", hp.n_embd)?,
        };
        Ok(LayerWeights {
            attn_norm_2: match self.file.tensor(&n("attn_norm_2.weight")) {
                Some(_) if falcon => Some(self.norm(&n("attn_norm_2"))?),
                _ => None,
            },
            wq,
            wk,
            wv,
            bq: required_if(hp.arch == Arch::Qwen2 || opt, "attn_q.bias", hp.q_width())?,
            bk: required_if(hp.arch == Arch::Qwen2 || opt, "attn_k.bias", hp.k_width())?,
            bv: required_if(hp.arch == Arch::Qwen2 || opt, "attn_v.bias", hp.v_width())?,
            q_norm: required_if(gemma, "attn_q_norm.weight", hp.head_dim)?,
            k_norm: required_if(gemma, "attn_k_norm.weight", hp.head_dim)?,
            wo: self.matrix(
                &n("attn_output.weight"),
                Some(hp.n_embd),
                hp.n_head * hp.head_dim_v,
            )?,
            bo: required_if(opt, "attn_output.bias", hp.n_embd)?,
            post_attn_norm: required_if(gemma, "post_attention_norm.weight", hp.n_embd)?,
            ffn_norm: match falcon {
                true => attn_norm.clone(),
                false => self.norm(&n("ffn_norm"))?,
            },
            attn_norm,
            gate: match falcon || opt {
                true => None,
                false => Some(self.matrix(&n("ffn_gate.weight"), Some(hp.n_ff), hp.n_embd)?),
            },
            up: self.matrix(&n("ffn_up.weight"), Some(hp.n_ff), hp.n_embd)?,
            up_b: required_if(opt, "ffn_up.bias", hp.n_ff)?,
            down: self.optional_matrix(&n("ffn_down.weight"), hp.n_embd, hp.n_ff)?,
            down_t: self.optional_matrix(&n("ffn_down_t.weight"), hp.n_ff, hp.n_embd)?,
            down_b,
            predictor: self.predictor(il)?,
            post_ffn_norm: required_if(gemma, "post_ffw_norm.weight", hp.n_embd)?,
            hot: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The banded parallel transpose stores exactly what quantising the plain transpose stores,
    /// for widths that are not a multiple of the band and several types.
    #[test]
    fn transposed_as_equals_the_plain_transpose_quantised() {
        for (rows, cols) in [(64usize, 1usize), (32, 131), (96, 200)] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 3.0)
                .collect();
            let mut src = vec![0u8; rows * cols * 4];
            quant::quantize(GgmlType::F32, &w, &mut src).unwrap();
            let m = Matrix::new(GgmlType::F32, rows, cols, &src).unwrap();
            let mut t = vec![0f32; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = w[r * cols + c];
                }
            }
            for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
                let mut want = vec![0u8; ty.row_bytes(rows as u64).unwrap() as usize * cols];
                quant::quantize(ty, &t, &mut want).unwrap();
                assert_eq!(transposed_as(&m, ty).unwrap(), want, "{rows}x{cols} {ty:?}");
            }
        }
    }
}
