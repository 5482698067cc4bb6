//! `hotcold batch`: many prompts generated together (continuous batching) give exactly what
//! `hotcold run` gives for each alone, and the aggregate speed is reported.

mod common;

use common::hotcold;

#[test]
fn batch_equals_run_for_each_prompt() {
    let dir = std::env::temp_dir().join(format!("hotcold-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let model = model.to_str().unwrap();
    let out = hotcold(&["synth", "--preset", "tiny", "-o", model]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prompts = [
        "The first prompt",
        "A second, longer prompt with more words in it",
        "Third",
        "Four",
        "Five and six",
    ];
    let file = dir.join("prompts.txt");
    std::fs::write(&file, format!("{}\n\n", prompts.join("\n"))).unwrap();
    let greedy = ["-n", "10", "--temp", "0", "--ignore-eos"];
    // Three slots for five prompts: the last two join as the first ones finish.
    let mut args = vec![
        "batch",
        "-m",
        model,
        "-f",
        file.to_str().unwrap(),
        "--parallel",
        "3",
    ];
    args.extend(greedy);
    let out = hotcold(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("5 prompts")
            && stderr.contains("50 generated tokens")
            && stderr.contains("tok/s"),
        "{stderr}"
    );
    let mut expected = String::new();
    for (i, p) in prompts.iter().enumerate() {
        let mut args = vec!["run", "-m", model, "-p", p];
        args.extend(greedy);
        let run = hotcold(&args);
        assert!(run.status.success());
        expected.push_str(&format!(
            "[{}] {}",
            i + 1,
            String::from_utf8(run.stdout).unwrap()
        ));
    }
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    let out = hotcold(&["batch", "-m", model, "-f", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no prompts"));
    let out = hotcold(&["batch", "-m", model, "-f", "/nonexistent/prompts.txt"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let _ = std::fs::remove_dir_all(&dir);
}
