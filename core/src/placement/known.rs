//! PowerInfer's published setups, rebuilt from the models' shapes, for the [`cost`] model's
//! prediction next to PowerInfer's own figures.
//!
//! Shapes come from the models' `config.json` (Falcon-40B: 60 layers, width 8192, FFN 32768, 128
//! query and 8 KV heads of 64, vocabulary 65024, no gate; Llama-2-70B: 80 layers, width 8192, FFN
//! 28672, 64 query and 8 KV heads of 128, vocabulary 32000, gated). Hardware is the PowerInfer
//! paper's (arXiv:2312.12456): PC-High, an i9-13900K with an RTX 4090 (24 GB, 1008 GB/s, PCIe 4.0),
//! and PC-Low, an i7-12700K with an RTX 2080 Ti (11 GB, 616 GB/s, PCIe 3.0). The CPU bandwidths,
//! effective bus speeds, the share of VRAM left for weights and the activation statistics (a Zipf
//! law, see [`KNOWN_DENSITY`]) are this module's assumptions, not measurements.
//!
//! [`cost`]: super::cost

use super::cost::{predict, Devices, Prediction};
use super::problem::{GlobalTensor, Layer, Problem};
use super::solve::{solve, Plan};
use crate::quant::GgmlType;
use crate::Result;

/// Mean FFN density assumed for the ReLU models (90% of neurons inactive per token).
pub const KNOWN_DENSITY: f64 = 0.1;
/// Zipf exponent assumed for the per-neuron frequencies (`hotcold synth`'s default).
pub const KNOWN_ZIPF_EXPONENT: f32 = 1.2;

/// A transformer's shape, enough to size every tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    /// Name for reports.
    pub name: &'static str,
    /// Blocks.
    pub n_layer: usize,
    /// Residual width.
    pub n_embd: usize,
    /// FFN neurons per block.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Whether the FFN has a gate (`gate`, `up`, `down`) or not (`up`, `down`).
    pub gated: bool,
    /// Type of the matrices (norms are F32).
    pub ty: GgmlType,
}

impl ModelShape {
    /// The placement problem of this shape with power-law frequencies of mean `density`.
    pub fn problem(&self, density: f64, zipf_exponent: f32, budget: u64) -> Result<Problem> {
        let row = self.ty.row_bytes(self.n_embd as u64)?;
        let (e, q, kv) = (
            self.n_embd as u64,
            (self.n_head * self.head_dim) as u64,
            (self.n_head_kv * self.head_dim) as u64,
        );
        let attention = self.ty.row_bytes(e)? * (q + 2 * kv) + self.ty.row_bytes(q)? * e;
        let norms = 2 * GgmlType::F32.row_bytes(e)?;
        let frequencies: Vec<f32> =
            crate::synth::target_frequencies(0, 0, self.n_ff, density, zipf_exponent)
                .into_iter()
                .map(|f| f as f32)
                .collect();
        let layer = Layer {
            neuron_bytes: row * if self.gated { 3 } else { 2 },
            frequencies,
            dense_bytes: attention + norms,
        };
        let table = row * self.n_vocab as u64;
        let problem = Problem {
            layers: vec![layer; self.n_layer],
            globals: vec![
                GlobalTensor {
                    name: "token_embd.weight".into(),
                    bytes: table,
                    read_bytes: row,
                },
                GlobalTensor {
                    name: "output_norm.weight".into(),
                    bytes: norms / 2,
                    read_bytes: norms / 2,
                },
                GlobalTensor {
                    name: "output.weight".into(),
                    bytes: table,
                    read_bytes: table,
                },
            ],
            budget,
        };
        problem.validate()?;
        Ok(problem)
    }
}

/// One published PowerInfer setup.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    /// The model.
    pub model: ModelShape,
    /// The machine, in words.
    pub machine: &'static str,
    /// The machine's speeds (see the module docs for which are assumptions).
    pub devices: Devices,
    /// VRAM assumed free for weights (bytes).
    pub budget: u64,
    /// PowerInfer's published speed-up over llama.cpp on this setup.
    pub published: &'static str,
    /// Where that figure is published.
    pub source: &'static str,
}

const GIB: u64 = 1 << 30;
const README: &str =
    "PowerInfer README, evaluation section (input length 64 on the 4090, 8 on the 2080 Ti)";

fn falcon_40b(ty: GgmlType) -> ModelShape {
    ModelShape {
        name: if ty == GgmlType::F16 {
            "Falcon(ReLU)-40B F16"
        } else {
            "Falcon(ReLU)-40B Q4_0"
        },
        n_layer: 60,
        n_embd: 8192,
        n_ff: 32768,
        n_head: 128,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 65024,
        gated: false,
        ty,
    }
}

fn llama2_70b(ty: GgmlType) -> ModelShape {
    ModelShape {
        name: if ty == GgmlType::F16 {
            "LLaMA(ReLU)-2-70B F16"
        } else {
            "LLaMA(ReLU)-2-70B Q4_0"
        },
        n_layer: 80,
        n_embd: 8192,
        n_ff: 28672,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 32000,
        gated: true,
        ty,
    }
}

/// PC-High: i9-13900K (DDR5, 60 GB/s assumed) + RTX 4090 (1008 GB/s, PCIe 4.0 x16 at 25 GB/s).
pub const PC_HIGH: Devices = Devices {
    gpu_bandwidth: 1008e9,
    cpu_bandwidth: 60e9,
    bus_bandwidth: 25e9,
    bus_latency: 10e-6,
};

/// PC-Low: i7-12700K (DDR4, 40 GB/s assumed) + RTX 2080 Ti (616 GB/s, PCIe 3.0 x16 at 12 GB/s).
pub const PC_LOW: Devices = Devices {
    gpu_bandwidth: 616e9,
    cpu_bandwidth: 40e9,
    bus_bandwidth: 12e9,
    bus_latency: 10e-6,
};

/// The setups PowerInfer published speed-ups for.
pub fn setups() -> Vec<Setup> {
    let high = "i9-13900K + RTX 4090 24 GB (22 GiB for weights)";
    let low = "i7-12700K + RTX 2080 Ti 11 GB (9.5 GiB for weights)";
    vec![
        Setup {
            model: falcon_40b(GgmlType::F16),
            machine: high,
            devices: PC_HIGH,
            budget: 22 * GIB,
            published: "up to 11x",
            source: README,
        },
        Setup {
            model: llama2_70b(GgmlType::F16),
            machine: high,
            devices: PC_HIGH,
            budget: 22 * GIB,
            published: "up to 3x",
            source: README,
        },
        Setup {
            model: falcon_40b(GgmlType::Q4_0),
            machine: low,
            devices: PC_LOW,
            budget: 19 * GIB / 2,
            published: "up to 8x",
            source: README,
        },
        Setup {
            model: llama2_70b(GgmlType::Q4_0),
            machine: low,
            devices: PC_LOW,
            budget: 19 * GIB / 2,
            published: "up to 3x",
            source: README,
        },
    ]
}

/// The cost model's predictions for a setup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SetupPrediction {
    /// The hybrid plan on the sparse model (PowerInfer's way).
    pub sparse: Prediction,
    /// Every neuron computed, the same budget filled (llama.cpp's way).
    pub dense: Prediction,
    /// Bytes of the model.
    pub model_bytes: u64,
    /// Expected share of all activated neurons that the GPU serves.
    pub gpu_share: f64,
}

impl Setup {
    /// The setup's placement problem, with the assumed statistics ([`KNOWN_DENSITY`],
    /// [`KNOWN_ZIPF_EXPONENT`]).
    pub fn problem(&self) -> Result<Problem> {
        self.model
            .problem(KNOWN_DENSITY, KNOWN_ZIPF_EXPONENT, self.budget)
    }
}

/// Predicts `setup` with `plan` (an optimal plan of `setup.problem()`), and with every neuron
/// firing and the same budget filled (llama.cpp's dense offload) for comparison.
pub fn predict_setup(setup: &Setup, problem: &Problem, plan: &Plan) -> Result<SetupPrediction> {
    let activation = 4 * setup.model.n_embd as u64;
    let sparse = predict(problem, plan, &setup.devices, activation)?;
    let mut dense_problem = problem.clone();
    for l in &mut dense_problem.layers {
        l.frequencies.fill(1.0);
    }
    let dense_plan = solve(&dense_problem)?;
    let dense = predict(&dense_problem, &dense_plan, &setup.devices, activation)?;
    Ok(SetupPrediction {
        sparse,
        dense,
        model_bytes: problem.total_bytes(),
        gpu_share: plan.gpu_share(problem),
    })
}
