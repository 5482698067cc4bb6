#!/usr/bin/env bash
# The whole test suite: fetches the default models if missing, then formatting, lints and every
# test of the workspace. Run from anywhere inside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-models.sh >/dev/null
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The core crate also serves the browser: keep it building (and lint-clean) for wasm32.
cargo clippy -p hotcold-core -p hotcold-web --target wasm32-unknown-unknown --locked -- -D warnings
# ... and with simd128 as the page is built (web/build.sh), which compiles in the simd128 kernels.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
    cargo clippy -p hotcold-core -p hotcold-web --target wasm32-unknown-unknown --locked -- -D warnings
# The wasm simd128 kernels against the scalar ones, in wasm: the CPU kernel tests built for WASI
# with simd128 and run in Node (the sparse FFN's thread-count tests need threads wasm lacks).
CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-C target-feature=+simd128" \
CARGO_TARGET_WASM32_WASIP1_RUNNER="node $PWD/scripts/wasi-run.mjs" \
    cargo test -p hotcold-core --no-default-features --target wasm32-wasip1 --lib --locked \
    -- cpu:: --skip cpu::sparse_ffn::
# The browser demo (wasm module and tiny model) for web/tests/browser.rs.
bash web/build.sh
# Windows and macOS on Apple M: the core and the CLI must build there (checked, not linked).
for target in x86_64-pc-windows-gnu aarch64-apple-darwin; do
    cargo check -p hotcold-core -p hotcold-native --target "$target" --locked
done
cargo test --workspace --locked
