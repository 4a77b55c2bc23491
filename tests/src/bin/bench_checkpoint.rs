//! Checkpoint benchmark: what a checkpoint costs the training loop. A 1 x 2 run of two real
//! `parcae-node` processes checkpoints every 4 steps: the first replica of each stage takes the
//! snapshot (the state buffer and its SHA-256) on its training loop, then writes the file with
//! fsync, copies it to a peer and uploads it to the job's store (a directory here) off the loop.
//! From one run, the nodes' `/metrics` give per checkpoint the loop's share beside the work
//! that is off the loop (which the loop paid in full when checkpoints were written on it), and
//! the mean step time for scale. Prints a table.
//!
//! `parcae-bench-checkpoint [tiny|small] [STEPS]` (defaults small and 24).

use std::time::{Duration, Instant};

use parcae_tests::{TRAIN_BASE_CONFIG, start_cluster, wait_for};

/// Steps between checkpoints.
const EVERY: u64 = 4;

/// The value of counter `name` in OpenMetrics `text` (0 when absent).
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("parcae_{name}_total ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "small".into());
    let steps: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(24);
    let (batch, micro) = if model == "small" { (8, 2) } else { (16, 2) };
    let config = format!(
        "{TRAIN_BASE_CONFIG}[planner]\ninterval_secs = 5.0\npin = [1, 2]\n[train]\nmodel = \"{model}\"\n\
         seed = 1\nglobal_batch = {batch}\nmicro_batch = {micro}\ncheckpoint_every = {EVERY}\n\
         peer_timeout_secs = 60.0\n"
    );
    let c = start_cluster(&config, 2);
    let step = || c.statuses().iter().map(|(_, s)| s.step).max();
    let start = wait_for(Duration::from_secs(600), || step().filter(|s| *s >= 2))
        .unwrap_or_else(|| panic!("no training\n{}", c.logs()));
    let t = Instant::now();
    let end = wait_for(Duration::from_secs(3600), || {
        step().filter(|s| *s >= start + steps)
    })
    .unwrap_or_else(|| panic!("training stalled\n{}", c.logs()));
    let step_ms = t.elapsed().as_secs_f64() * 1e3 / (end - start) as f64;
    // The last checkpoint's background work finishes after its step.
    std::thread::sleep(Duration::from_secs(5));
    let client = parcae_api::client::Client::with_timeout(Duration::from_secs(5));
    let texts: Vec<String> = c
        .nodes
        .iter()
        .filter_map(|n| client.metrics(n.status_addr).ok())
        .collect();
    let sum = |name: &str| texts.iter().map(|t| counter(t, name)).sum::<f64>();
    let count = sum("checkpoints");
    assert!(count > 0.0, "no checkpoint was taken\n{}", c.logs());
    let per = |name: &str| sum(name) / count;
    let (snapshot, write, upload) = (
        per("checkpoint_snapshot_ms"),
        per("checkpoint_write_ms"),
        per("checkpoint_upload_ms"),
    );
    println!(
        "| model | checkpoints | step, ms | on the loop: snapshot + digest, ms | off the loop: file + fsync + peer copy, ms | off the loop: store upload, ms | loop share of the whole checkpoint |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {model} | {count} | {step_ms:.0} | {snapshot:.0} | {write:.0} | {upload:.0} | {:.2} |",
        snapshot / (snapshot + write + upload)
    );
}
