//! The replay check of a finished run: `parcae-node replay` on the run's directory trains the
//! final history again in one process, from each checkpoint the job's store kept to the next,
//! and compares the weights (see the node's `replay` module for why it goes window by window).
//! Its verdict joins the history check's ([`crate::history::with_replay`]).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use parcae_api::{ReplayReport, StepRecord};

use crate::process::STORE;

/// The final history, as the node's replay reads it.
const STEPS_FILE: &str = "final_steps.json";
/// The node's report.
const REPORT_FILE: &str = "replay.json";
/// The node whose configuration names the job (every node's does; node0 always exists).
const CONFIG_FILE: &str = "node0.toml";

/// Whether `dir` holds what a replay needs: a node's configuration and the job's store.
pub fn possible(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file() && dir.join(STORE).is_dir()
}

/// Runs `bin replay` on the run directory `dir` against `final_seq`, training on `device`
/// (`cpu`, `cuda:N`).
pub fn run(bin: &Path, dir: &Path, final_seq: &[StepRecord], device: &str) -> Result<ReplayReport> {
    let steps = dir.join(STEPS_FILE);
    let report = dir.join(REPORT_FILE);
    std::fs::write(&steps, serde_json::to_vec(final_seq)?)
        .with_context(|| format!("writing {}", steps.display()))?;
    let _ = std::fs::remove_file(&report);
    let out = Command::new(bin)
        .arg("replay")
        .arg("--config")
        .arg(dir.join(CONFIG_FILE))
        .arg("--store")
        .arg(dir.join(STORE))
        .arg("--steps")
        .arg(&steps)
        .arg("--json")
        .arg(&report)
        .arg("--device")
        .arg(device)
        .output()
        .with_context(|| format!("starting {} replay", bin.display()))?;
    let Ok(text) = std::fs::read(&report) else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!(
            "{} replay wrote no report ({}): {}",
            bin.display(),
            out.status,
            stderr.lines().last().unwrap_or("")
        );
    };
    serde_json::from_slice(&text).with_context(|| format!("reading {}", report.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_a_store_cannot_be_replayed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!possible(dir.path()));
        std::fs::write(dir.path().join(CONFIG_FILE), "").unwrap();
        std::fs::create_dir(dir.path().join(STORE)).unwrap();
        assert!(possible(dir.path()));
    }
}
