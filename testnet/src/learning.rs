//! `parcae-testnet plot-learning`: draws the report `parcae-node learn` wrote.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use parcae_api::LearnReport;

use crate::plot;

/// The largest report read: a run's curve has a point per validation.
const MAX_REPORT_BYTES: u64 = 64 << 20;

/// What `parcae-testnet plot-learning` is asked to draw.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The report of `parcae-node learn --out`.
    pub report: PathBuf,
    /// Where to write the PNG.
    #[arg(long)]
    pub out: PathBuf,
}

/// Reads the report and writes its plot.
pub fn run(args: Args) -> Result<()> {
    let path = &args.report;
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    ensure!(
        size <= MAX_REPORT_BYTES,
        "{}: {size} bytes, more than a learning report's {MAX_REPORT_BYTES}",
        path.display()
    );
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let report: LearnReport = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a report of parcae-node learn", path.display()))?;
    let title = format!(
        "{} d{} x {} blocks, seq {} ({} parameters, {}): {} groups x {} replicas, batch {}",
        report.model,
        report.d_model,
        report.n_blocks,
        report.seq_len,
        report.params,
        report.data,
        report.groups,
        report.replicas,
        report.global_batch
    );
    plot::learning::learning(&args.out, &title, &report)?;
    println!("wrote {}", args.out.display());
    Ok(())
}
