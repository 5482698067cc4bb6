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
# The browser demo (wasm module and tiny model) for web/tests/browser.rs.
bash web/build.sh
node --test web/tests/js/
cargo test --workspace --locked
