//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::process::{Command, Output};

use hotcold_core::models::DefaultModel;

/// Runs the `hotcold` binary with `args`.
pub fn hotcold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hotcold"))
        .args(args)
        .output()
        .unwrap()
}

/// The cached path of a default model; fails the test (never skips it) when it is missing.
pub fn model(m: DefaultModel) -> String {
    match m.locate() {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(e) => panic!("{e} (run bash scripts/fetch-models.sh)"),
    }
}

/// A calibrated training-free-sparsity file and its held-out text, in a temporary folder removed
/// on drop.
pub struct HeldOut {
    /// The folder.
    pub dir: std::path::PathBuf,
    /// The calibration text (the Declaration of Independence).
    pub calibration: String,
    /// The held-out text (the Gettysburg Address that follows it in the same file).
    pub held_out: String,
    /// The file `calibrate` wrote.
    pub calibrated: String,
}

impl HeldOut {
    /// Calibrates the default Gemma model with `--target-sparsity target` and `flags` on the
    /// calibration text; fails the test when `calibrate` fails.
    pub fn calibrate(name: &str, target: f64, flags: &[&str]) -> HeldOut {
        let dir = std::env::temp_dir().join(format!("hotcold-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/data/text/declaration.txt"),
        )
        .unwrap();
        let (calibration, held_out) = text.split_at(text.find("Four score").unwrap());
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let files = HeldOut {
            calibration: path("cal.txt"),
            held_out: path("held.txt"),
            calibrated: path(&format!("{name}.gguf")),
            dir: dir.clone(),
        };
        std::fs::write(&files.calibration, calibration).unwrap();
        std::fs::write(&files.held_out, held_out).unwrap();
        let gemma = model(DefaultModel::Gemma3_270m);
        let target = target.to_string();
        let mut args = vec!["calibrate", "-m", &gemma, "-f", &files.calibration];
        args.extend([
            "--target-sparsity",
            &target,
            "-o",
            &files.calibrated,
            "-t",
            "2",
        ]);
        args.extend(flags);
        let o = hotcold(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        files
    }

    /// `hotcold perplexity` of the calibrated file on the held-out text with `flags`; returns its
    /// stderr (the sparsity summaries) and fails the test when it fails.
    pub fn perplexity(&self, flags: &[&str]) -> String {
        let mut args = vec!["perplexity", "-m", &self.calibrated, "-f", &self.held_out];
        args.extend(["-c", "128", "--sparse-prefill", "-t", "2"]);
        args.extend(flags);
        let o = hotcold(&args);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        stderr
    }
}

impl Drop for HeldOut {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
