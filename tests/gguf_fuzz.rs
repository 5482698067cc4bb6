//! Property test: mutated and truncated real GGUF files give a typed error or a valid file, never
//! a panic, a hang or an out-of-bounds slice. `HOTCOLD_FUZZ_ITERS=1000000 cargo test --release
//! --test gguf_fuzz -- --ignored` runs the long loop by hand.

mod common;

use common::model_path;
use common::mutate::{fuzz, shrink_real_file};
use hotcold::gguf::GgufFile;
use hotcold::models::DefaultModel;

fn seeds() -> Vec<Vec<u8>> {
    DefaultModel::ALL
        .iter()
        .map(|&m| shrink_real_file(&GgufFile::open(model_path(m)).unwrap(), 64 << 10))
        .collect()
}

#[test]
fn seeds_are_valid_files() {
    for s in seeds() {
        let f = GgufFile::from_bytes(s).unwrap();
        assert!(f.tensors().len() > 10);
    }
}

#[test]
fn mutated_real_files_never_panic() {
    let (ok, rejected) = fuzz(&seeds(), 20_000, 1);
    assert!(
        rejected > 10_000,
        "most mutations should be rejected ({ok} parsed, {rejected} rejected)"
    );
    assert!(
        ok > 0,
        "some mutations (e.g. in tensor data) leave a valid file"
    );
}

#[test]
fn every_header_truncation_of_a_real_file_is_an_error() {
    for seed in seeds() {
        let data_offset = GgufFile::from_bytes(seed.clone()).unwrap().data_offset() as usize;
        for len in (0..data_offset).step_by(7) {
            assert!(
                GgufFile::from_bytes(seed[..len].to_vec()).is_err(),
                "cut at {len}"
            );
        }
    }
}

#[test]
#[ignore = "long fuzz loop, run by hand"]
fn long_fuzz_loop() {
    let iters = std::env::var("HOTCOLD_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let seed = std::env::var("HOTCOLD_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(42);
    let start = std::time::Instant::now();
    let (ok, rejected) = fuzz(&seeds(), iters, seed);
    eprintln!(
        "{iters} executions in {:?}: {ok} parsed, {rejected} rejected, 0 panics",
        start.elapsed()
    );
}
