//! The default models and where the local cache keeps them.
