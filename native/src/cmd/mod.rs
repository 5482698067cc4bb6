//! One module per subcommand.

pub mod batch;
pub mod bench;
pub mod calibrate;
pub mod chat;
pub mod common;
pub mod device;
pub mod inspect;
pub mod model_arg;
pub mod perplexity;
pub mod plan;
pub mod run;
pub mod serve;
pub mod size_arg;
pub mod synth;
