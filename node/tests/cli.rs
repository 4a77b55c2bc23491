//! The `parcae-node` command line on bad input: each mistake ends the process with a message
//! that names it, never a panic. (Being an integration test of this package also makes
//! `cargo test --workspace` build the binary with the workspace's test feature set, which the
//! multi-process harnesses then use as it is.)

use std::path::Path;
use std::process::{Command, Output};

fn node(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parcae-node"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run parcae-node")
}

fn failed_with(out: &Output, needle: &str) {
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {text}");
    assert!(!text.contains("panicked"), "no panic: {text}");
    assert!(text.contains(needle), "{needle:?} in {text}");
}

#[test]
fn keygen_writes_a_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cluster.key");
    let key_arg = key.to_str().unwrap();
    let out = node(&["keygen", "--out", key_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = std::fs::read(&key).unwrap();
    assert!(!first.is_empty());
    failed_with(&node(&["keygen", "--out", key_arg]), "cluster.key");
    assert_eq!(
        std::fs::read(&key).unwrap(),
        first,
        "the key is not overwritten"
    );
}

fn run_with(dir: &Path, key: &str, config: &str) -> Output {
    let data = dir.join("data");
    node(&[
        "run",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--status-addr",
        "127.0.0.1:0",
        "--cluster-key",
        key,
        "--config",
        config,
    ])
}

#[test]
fn run_names_a_missing_key_and_a_malformed_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "[raft]\n").unwrap();
    let missing = dir.path().join("no-such.key");
    failed_with(
        &run_with(
            dir.path(),
            missing.to_str().unwrap(),
            config.to_str().unwrap(),
        ),
        "no-such.key",
    );
    let key = dir.path().join("cluster.key");
    assert!(
        node(&["keygen", "--out", key.to_str().unwrap()])
            .status
            .success()
    );
    std::fs::write(&config, "[train]\nglobal_batch = \"many\"\n").unwrap();
    failed_with(
        &run_with(dir.path(), key.to_str().unwrap(), config.to_str().unwrap()),
        "global_batch",
    );
}

#[test]
fn status_of_a_node_that_is_not_there_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    failed_with(
        &node(&["status", "--addr", &format!("127.0.0.1:{port}")]),
        &format!("127.0.0.1:{port}"),
    );
}

#[test]
fn run_names_a_device_it_cannot_train_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "").unwrap();
    let run_on = |device: &str| {
        node(&[
            "run",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--status-addr",
            "127.0.0.1:0",
            "--cluster-key",
            dir.path().join("no-such.key").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--device",
            device,
        ])
    };
    failed_with(&run_on("tpu:0"), "expected cpu, cube-cpu, cuda or cuda:N");
    if !cfg!(feature = "cuda") {
        // Refused before anything else is read (the key file is missing too).
        let out = run_on("cuda:1");
        failed_with(&out, "--features cuda");
        failed_with(&out, "`cuda` feature");
        std::fs::write(&config, "[device]\nkind = \"cuda\"\n").unwrap();
        failed_with(
            &run_with(dir.path(), "no-such.key", config.to_str().unwrap()),
            "--features cuda",
        );
    }
    // The CPU is always there: the run goes on to the missing key.
    std::fs::write(&config, "").unwrap();
    failed_with(&run_on("cpu"), "no-such.key");
}
