//! `parcae-testnet plot-learning`: draws validation loss against samples from the report
//! `parcae-node learn` wrote, or from the JSON of `parcae-testnet run`s (one run a file, e.g.
//! `step` and `diloco:H` on the same job and seeds).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use parcae_api::{LearnReport, LearnRun};

use crate::plot;
use crate::report::RunReport;

/// The largest report read: a run's curve has a point per validation.
const MAX_REPORT_BYTES: u64 = 64 << 20;

/// What `parcae-testnet plot-learning` is asked to draw.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The report of `parcae-node learn --out`, or the JSON (`--json`) of one or more
    /// `parcae-testnet run`s.
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// Where to write the PNG.
    #[arg(long)]
    pub out: PathBuf,
}

/// One file read.
enum Read {
    Learn(Box<LearnReport>),
    Run(Box<RunReport>),
}

/// Reads the reports and writes their plot.
pub fn run(args: Args) -> Result<()> {
    let read: Vec<Read> = args
        .reports
        .iter()
        .map(|p| read(p))
        .collect::<Result<_>>()?;
    let (title, runs) = match read.as_slice() {
        [Read::Learn(report)] => (learn_title(report), report.runs.clone()),
        _ => {
            let runs = read
                .into_iter()
                .map(|r| match r {
                    Read::Run(run) => Ok(learn_run(&run)),
                    Read::Learn(_) => bail!("a report of parcae-node learn is drawn alone"),
                })
                .collect::<Result<Vec<_>>>()?;
            (
                "testnet runs: validation loss against samples".to_string(),
                runs,
            )
        }
    };
    plot::learning::learning(&args.out, &title, &runs)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// A learning report, or else a run's report, from `path`.
fn read(path: &Path) -> Result<Read> {
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
    if let Ok(report) = serde_json::from_str::<LearnReport>(&text) {
        return Ok(Read::Learn(Box::new(report)));
    }
    let run: RunReport = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a report of parcae-node learn or of a parcae-testnet run",
            path.display()
        )
    })?;
    ensure!(
        !run.val_curve.is_empty(),
        "{}: the run measured no validation loss",
        path.display()
    );
    Ok(Read::Run(Box::new(run)))
}

fn learn_title(report: &LearnReport) -> String {
    format!(
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
    )
}

/// A testnet run as a learning run (its mode with the outer step it set, where it set one):
/// its bytes between groups are those its all-reduces sent across zones.
fn learn_run(run: &RunReport) -> LearnRun {
    LearnRun {
        sync: match run.outer {
            Some([lr, momentum]) => format!("{} (outer lr {lr}, momentum {momentum})", run.sync),
            None => run.sync.clone(),
        },
        seed: run.seed,
        samples: run.samples,
        curve: run.val_curve.clone(),
        val_loss_last: run.val_loss_last.unwrap_or(f64::NAN),
        cross_group_bytes: run.allreduce_cross_zone_bytes,
        rounds: run.outer_rounds.map_or(0, |o| o.rounds),
        secs: run.wall_secs,
    }
}
