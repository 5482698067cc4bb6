//! `cargo test --test relabel_tool -- --ignored` with `RELABEL_SRC`, `RELABEL_ARCH`, `RELABEL_DST`
//! writes a relabelled copy of a model (used by `tests/reference/make_llama_refs.sh`).

mod common;

#[test]
#[ignore = "a tool, run by the reference script"]
fn relabel_model() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
    common::relabel::relabel(
        std::path::Path::new(&var("RELABEL_SRC")),
        &var("RELABEL_ARCH"),
        std::path::Path::new(&var("RELABEL_DST")),
    );
}
