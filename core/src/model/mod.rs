//! A model's hyper-parameters from GGUF metadata, per architecture, and its weights by role.
//!
//! The engine never looks tensors up by string: [`Model::load`] resolves every role of every
//! layer once, checks its shape, and fails with the tensor's name when something is off.

mod hparams;
mod weights;

pub use hparams::{
    Arch, FfnActivation, HyperParams, NormKind, TealCriterion, CATS_THRESHOLDS_KEY,
    PREDICTOR_THRESHOLDS_KEY, TEAL_CRITERION_KEY, TEAL_THRESHOLDS_KEY,
};
pub(crate) use weights::transposed_as;
pub use weights::{HotRows, LayerWeights, Model, Norm, Predictor, PredictorTypes, Weight};
