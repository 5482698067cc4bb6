//! One module per subcommand.

pub mod bench;
pub mod calibrate;
pub mod chat;
pub mod common;
pub mod device;
pub mod inspect;
pub mod model_arg;
pub mod perplexity;
pub mod run;
pub mod synth;
