//! Finding the `parcae-node` executable.
//!
//! Order: `--node-bin`, then `PARCAE_NODE_BIN`, then `parcae-node` next to this executable
//! (cargo puts every binary of the workspace in the same `target/<profile>/` directory). The
//! README's main job is `cargo run --release -p parcae-testnet -- run` on a fresh clone, which
//! builds only this crate, so when the sibling is missing and `CARGO` is set (cargo started us)
//! the node is built with the same profile first. Anything else is a [`TestnetError::NodeBinary`]
//! naming the path and how to fix it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use parcae_testnet::error::TestnetError;

/// Name of the node executable.
const NODE_BIN: &str = "parcae-node";

/// Locates (and when started by cargo, builds) the node binary.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, TestnetError> {
    if let Some(path) = explicit {
        return check(path, "given by --node-bin");
    }
    if let Some(path) = std::env::var_os("PARCAE_NODE_BIN") {
        return check(Path::new(&path), "given by PARCAE_NODE_BIN");
    }
    let exe = std::env::current_exe().map_err(|e| TestnetError::NodeBinary {
        path: PathBuf::from(NODE_BIN),
        reason: format!("cannot find this executable's directory: {e}"),
    })?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let sibling = dir.join(NODE_BIN);
    if sibling.is_file() {
        return Ok(sibling);
    }
    match std::env::var_os("CARGO") {
        Some(_) => build(dir, &sibling),
        None => Err(TestnetError::NodeBinary {
            path: sibling,
            reason:
                "does not exist; build it with `cargo build --release -p parcae-node`, or pass \
                     --node-bin PATH or set PARCAE_NODE_BIN"
                    .into(),
        }),
    }
}

/// An explicitly named binary must be an executable file.
fn check(path: &Path, origin: &str) -> Result<PathBuf, TestnetError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| TestnetError::NodeBinary {
        path: path.to_path_buf(),
        reason: format!("{origin}: {e}"),
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(TestnetError::NodeBinary {
            path: path.to_path_buf(),
            reason: format!("{origin}: not an executable file"),
        });
    }
    Ok(path.to_path_buf())
}

/// Builds the node with the profile of `profile_dir` (`target/release` -> `--release`).
fn build(profile_dir: &Path, expected: &Path) -> Result<PathBuf, TestnetError> {
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let mut cmd = parcae_testnet::cargo::command();
    // `cargo run` sets the manifest directory of this crate: building from there finds the
    // workspace whatever the user's working directory is.
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        cmd.current_dir(dir);
    }
    cmd.args(["build", "-p", "parcae-node", "--bin", NODE_BIN]);
    if cfg!(feature = "cuda") {
        cmd.args(["--features", "parcae-node/cuda"]);
    }
    if cfg!(feature = "cube-cpu") {
        cmd.args(["--features", "parcae-node/cube-cpu"]);
    }
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    eprintln!("{NODE_BIN} is not built yet; building it ({profile} profile) ...");
    // Cargo's progress goes to our stderr; our stdout stays the report.
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .status()
        .map_err(|e| TestnetError::NodeBinary {
            path: expected.to_path_buf(),
            reason: format!("running cargo build: {e}"),
        })?;
    if !status.success() {
        return Err(TestnetError::NodeBinary {
            path: expected.to_path_buf(),
            reason: format!("`cargo build -p parcae-node` failed ({status})"),
        });
    }
    check(expected, "after cargo build")
}
