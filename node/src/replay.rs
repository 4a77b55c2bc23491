//! `parcae-node replay`: does the model a cluster trained equal what one honest process trains
//! on the same committed steps?
//!
//! The cluster's committed history (`GET /steps`, or the final history a testnet run kept) is
//! trained again in this process, window by window: each window starts from a complete
//! checkpoint the job's store holds for that history (or from the seeded start at step 0),
//! trains every committed step up to the next stored checkpoint with the step's own samples,
//! and compares every weight with that checkpoint's. A step trained on the wrong samples, a
//! stage that trained on stale state, or a checkpoint mixed from two histories moves weights by
//! far more than the tolerance.
//!
//! Why windows and not one replay from step 0: the cluster sums gradients in a ring all-reduce
//! and the replay in one pipeline, so the two differ by rounding from the first step, and
//! training amplifies rounding: on the `tiny` GPT, runs that split the batch differently drift
//! apart by 2e-5 after 250 steps and by 5e-2 after 500. A window of one checkpoint interval
//! (20 steps by default) keeps the replay within 1e-5 of the cluster while one step on wrong
//! samples moves the weights by 1e-3 and more (the tests pin both). A run checked this way
//! keeps every checkpoint in its store (`[train] keep_checkpoints = 0`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use parcae_api::{ReplayReport, StepRecord};
use parcae_model::{PipelineModel, StageConfig};
use parcae_outer::Wire;

use crate::config::DeviceChoice;
use crate::job::Identity;
use crate::store::{JobStore, max_part_bytes};
use crate::train::launch::data_source;

pub use replayer::ReplayJob;
pub use windows::{Plan, Window, plan};

use replayer::Replayer;

/// Largest steps file read (a record is about 150 bytes of JSON).
const MAX_STEPS_FILE_BYTES: u64 = 1 << 30;

/// What `parcae-node replay` is asked to do.
#[derive(Debug, clap::Args)]
pub struct ReplayOptions {
    /// The nodes' TOML configuration (the job's `[train]`); the defaults without it.
    #[arg(long, env = "PARCAE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The job's checkpoint store (a directory or an `s3://`, `gs://`, `az://` URL); default:
    /// the configuration's `[train] checkpoint_store`.
    #[arg(long)]
    pub store: Option<String>,
    /// The committed steps as JSON (a node's `GET /steps` answer, or a testnet run's
    /// `final_steps.json`): one consecutive history.
    #[arg(long)]
    pub steps: PathBuf,
    /// Largest difference allowed between a checkpoint's weights and the replay's.
    #[arg(long, default_value_t = 1e-4)]
    pub tolerance: f64,
    /// Longest window replayed, in steps: farther apart checkpoints are skipped (rounding
    /// differences grow with the window: 1.2e-4 over a 180-step window where full disks had
    /// kept the checkpoints between from the store).
    #[arg(long, default_value_t = 60)]
    pub max_window: u64,
    /// The device the replay trains on: cpu, cube-cpu, cuda or cuda:N (a cluster of GPUs is replayed
    /// on one, in the time the cluster took).
    #[arg(long, env = "PARCAE_DEVICE", default_value = "cpu")]
    pub device: DeviceChoice,
    /// Where to write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Reads a steps file: one consecutive history of committed steps.
pub fn read_steps(path: &Path) -> anyhow::Result<Vec<StepRecord>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("--steps {}", path.display()))?
        .len();
    ensure!(
        len <= MAX_STEPS_FILE_BYTES,
        "--steps {}: {len} bytes (at most {MAX_STEPS_FILE_BYTES})",
        path.display()
    );
    let bytes = std::fs::read(path).with_context(|| format!("--steps {}", path.display()))?;
    let steps: Vec<StepRecord> = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "--steps {}: not a JSON array of committed steps",
            path.display()
        )
    })?;
    if let Some(pair) = steps.windows(2).find(|w| w[1].step != w[0].step + 1) {
        bail!(
            "--steps {}: not one consecutive history (step {} follows step {})",
            path.display(),
            pair[1].step,
            pair[0].step
        );
    }
    Ok(steps)
}

/// Replays `steps` against the checkpoints of `job` in the store at `location`.
pub fn replay<M: PipelineModel>(
    job: &ReplayJob<M>,
    location: &str,
    steps: &[StepRecord],
    tolerance: f64,
    max_window: u64,
) -> anyhow::Result<ReplayReport> {
    ensure!(
        job.spec.sync.inner_steps().is_none() || job.spec.outer.wire == Wire::F32,
        "the job's rounds send pseudo-gradients as {} between zones: the cluster rounds each \
         zone's partial sums to that form hop by hop, which a replay in one process does not \
         reproduce (only f32 rounds are replayed)",
        job.spec.outer.wire
    );
    let what = Identity::of(
        job.model.as_ref(),
        job.dataset.as_ref(),
        job.initial_weights.as_deref(),
    )?;
    let digest = job.spec.job(&what, &job.program_settings)?.digest();
    let store = JobStore::open(location, &digest)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cuts = rt.block_on(store.stored_cuts())?;
    ensure!(
        !cuts.is_empty(),
        "no complete checkpoint of this job in {location} (is the configuration the job's?)"
    );
    let mut plan = plan(&cuts, steps, max_window);
    if job.spec.sync.inner_steps().is_some() {
        groups::keep_replayable(&mut plan, steps);
    }
    let replayer = Replayer {
        job,
        data: data_source(job.dataset.clone(), &job.spec)?,
        store,
        rt,
        max_bytes: max_part_bytes(job.model.num_params()),
        stage_config: StageConfig {
            optimizer: job.spec.optimizer.clone(),
            ..StageConfig::default()
        },
        device: job.device.clone(),
    };
    let mut report = ReplayReport {
        passed: true,
        tolerance,
        windows: plan.windows.len() as u64,
        steps_replayed: 0,
        steps_not_replayed: plan.not_replayed,
        max_abs_diff: 0.0,
        max_loss_diff: 0.0,
        last_checkpoint_step: plan.windows.last().map(|w| w.to.end.step),
        problems: Vec::new(),
    };
    let first = steps.first().map_or(0, |r| r.step);
    for w in &plan.windows {
        let at = (w.steps.start - first) as usize;
        let records = &steps[at..(w.steps.end - first) as usize];
        let before = at.checked_sub(1).map(|i| &steps[i]);
        let done = replayer
            .window(w, records, before)
            .with_context(|| format!("replaying steps {:?}", w.steps))?;
        report.steps_replayed += records.len() as u64;
        report.max_abs_diff = report.max_abs_diff.max(done.max_abs_diff);
        report.max_loss_diff = report.max_loss_diff.max(done.max_loss_diff);
        if done.max_abs_diff > tolerance {
            report.problems.push(format!(
                "the checkpoint after step {} (history {}) differs from the replay of steps \
                 {:?} by {:.3e} (tolerance {tolerance:.0e})",
                w.to.end.step, w.to.history, w.steps, done.max_abs_diff
            ));
        }
    }
    for first in &plan.unanchored {
        report.problems.push(format!(
            "the history that begins at step {first} resumed from no stored checkpoint of the \
             state after {first} steps"
        ));
    }
    if plan.windows.is_empty() {
        report
            .problems
            .push("no window to replay: no stored checkpoint belongs to these steps".into());
    }
    report.passed = report.problems.is_empty();
    Ok(report)
}

mod groups;
mod replayer;
#[cfg(test)]
mod tests;
mod windows;
