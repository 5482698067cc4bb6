//! GGUF v2/v3 files (and PowerInfer's `PWRI` variant): reader and writer.
