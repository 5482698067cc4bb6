//! Coverage-guided fuzzing of the GGUF reader: any input gives an error or a file whose every
//! tensor slice is in bounds.
#![no_main]

use hotcold_core::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for t in file.tensors() {
            assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
        }
        for (key, _) in file.metadata() {
            assert!(file.get(key).is_some());
        }
    }
});
