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

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use parcae_api::{ReplayReport, StepRecord};
use parcae_consensus::state::Cut;
use parcae_model::{
    Dataset, Pipeline, PipelineModel, Stage, StageConfig, WeightSource, token_batch,
};

use crate::config::DeviceChoice;
use crate::job::{Identity, JobSpec};
use crate::store::{JobStore, max_part_bytes};
use crate::train::launch::data_source;
use crate::train::samples::{DataSource, micro_batches};

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

/// The job as the cluster trained it.
pub struct ReplayJob<M: PipelineModel> {
    /// The model.
    pub model: Arc<M>,
    /// The samples (the whole dataset: the validation split is made here as the nodes make it).
    pub dataset: Arc<dyn Dataset>,
    /// The job's spec.
    pub spec: JobSpec,
    /// The weights the job started from, if not seeded.
    pub initial_weights: Option<Arc<dyn WeightSource>>,
    /// The job's program settings (they are part of its identity, hence of its store's name).
    pub program_settings: Vec<(String, String)>,
    /// The device the replay trains on.
    pub device: burn::tensor::Device,
}

/// A stretch of the history trained again: from a stored checkpoint (`None`: the seeded start)
/// through the steps `steps` to the checkpoint `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The checkpoint the replay starts from.
    pub from: Option<Cut>,
    /// The checkpoint the replay is compared with.
    pub to: Cut,
    /// The steps trained.
    pub steps: Range<u64>,
}

/// The windows of a history.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// What is replayed.
    pub windows: Vec<Window>,
    /// Committed steps no window covers.
    pub not_replayed: u64,
    /// Why checkpoints were not windows of their own, one line each.
    pub skipped: Vec<String>,
    /// The first steps of histories that no stored checkpoint anchors: a rollback must resume
    /// from a complete checkpoint of the state its first step starts from (only steps after
    /// the store's oldest checkpoint are judged; older ones may have been pruned).
    pub unanchored: Vec<u64>,
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

/// The windows of `steps` (one consecutive history) between the cuts of `cuts` that belong to
/// it (a cut of a history a rollback gave up is not one of them), none longer than
/// `max_window` steps.
pub fn plan(cuts: &[Cut], steps: &[StepRecord], max_window: u64) -> Plan {
    let Some(first) = steps.first() else {
        return Plan::default();
    };
    let record = |step: u64| {
        step.checked_sub(first.step)
            .and_then(|i| steps.get(usize::try_from(i).ok()?))
    };
    let mut ours: Vec<&Cut> = cuts
        .iter()
        .filter(|c| record(c.end.step).is_some_and(|r| r.history == c.history))
        .collect();
    ours.sort_by_key(|c| c.end.step);
    ours.dedup_by_key(|c| c.end.step);
    let mut plan = Plan::default();
    let mut start: Option<(Option<&Cut>, u64)> = (first.step == 0).then_some((None, 0));
    let mut covered = 0;
    for cut in ours {
        let end = cut.steps_trained();
        if let Some((from, trained)) = start {
            if end - trained <= max_window {
                plan.windows.push(Window {
                    from: from.cloned(),
                    to: cut.clone(),
                    steps: trained..end,
                });
                covered += end - trained;
            } else {
                plan.skipped.push(format!(
                    "steps {trained}..{end}: {} steps between checkpoints, more than the longest \
                     window ({max_window})",
                    end - trained
                ));
            }
        }
        start = Some((Some(cut), end));
    }
    plan.not_replayed = steps.len() as u64 - covered;
    let oldest = cuts.iter().map(Cut::steps_trained).min();
    plan.unanchored = steps
        .windows(2)
        .filter(|w| w[1].history != w[0].history)
        .map(|w| (w[0].history, w[1].step))
        .filter(|&(before, first)| {
            oldest.is_some_and(|o| o <= first)
                && !cuts
                    .iter()
                    .any(|c| c.history == before && c.steps_trained() == first)
        })
        .map(|(_, first)| first)
        .collect();
    plan
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
        job.spec.sync.inner_steps().is_none(),
        "the job synchronises by DiLoCo rounds (sync = {}): its groups train apart between \
         rounds, which a replay in one pipeline does not reproduce yet",
        job.spec.sync
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
    let plan = plan(&cuts, steps, max_window);
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
        let records = &steps[(w.steps.start - first) as usize..(w.steps.end - first) as usize];
        let done = replayer
            .window(w, records)
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

/// What one window found.
struct WindowResult {
    max_abs_diff: f64,
    max_loss_diff: f64,
}

/// What every window needs.
struct Replayer<'a, M: PipelineModel> {
    job: &'a ReplayJob<M>,
    data: DataSource,
    store: JobStore,
    rt: tokio::runtime::Runtime,
    max_bytes: u64,
    stage_config: StageConfig,
    device: burn::tensor::Device,
}

impl<M: PipelineModel> Replayer<'_, M> {
    /// Trains `records` from the window's start and compares with its end.
    fn window(&self, w: &Window, records: &[StepRecord]) -> anyhow::Result<WindowResult> {
        let layers = 0..self.job.model.num_layers();
        let mut pipe = Pipeline::new(
            self.job.model.clone(),
            std::slice::from_ref(&layers),
            self.job.spec.seed,
            &self.device,
            self.stage_config.clone(),
        )?;
        let stage = &mut pipe.stages_mut()[0];
        match &w.from {
            None => {
                if let Some(weights) = &self.job.initial_weights {
                    stage.load_weights(weights.as_ref())?;
                }
            }
            Some(cut) => {
                for (range, bytes) in self.parts(cut)? {
                    stage.import_state(&bytes, range)?;
                }
            }
        }
        ensure!(
            stage.step() == w.steps.start,
            "the checkpoint holds the state after {} steps, not {}",
            stage.step(),
            w.steps.start
        );
        let mut max_loss_diff = 0.0f64;
        for r in records {
            let loss = self.train(&mut pipe, r)?;
            max_loss_diff = max_loss_diff.max((f64::from(loss) - r.loss).abs());
        }
        let mut max_abs_diff = 0.0f64;
        for (range, bytes) in self.parts(&w.to)? {
            let mut theirs = Stage::new(
                self.job.model.clone(),
                range.clone(),
                0,
                &self.device,
                self.stage_config.clone(),
            )?;
            theirs.import_state(&bytes, range.clone())?;
            ensure!(
                theirs.step() == w.steps.end,
                "the checkpoint of layers {range:?} holds the state after {} steps, not {}",
                theirs.step(),
                w.steps.end
            );
            for layer in range {
                let ours = pipe.stages()[0].param_values(layer)?;
                let cluster = theirs.param_values(layer)?;
                let diff = ours
                    .iter()
                    .flatten()
                    .zip(cluster.iter().flatten())
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .fold(0.0, f64::max);
                max_abs_diff = max_abs_diff.max(diff);
            }
        }
        Ok(WindowResult {
            max_abs_diff,
            max_loss_diff,
        })
    }

    /// One committed step, as a node of a one-pipeline cluster trains it: the step's samples
    /// in micro-batches, each weighted by its share of the global batch. Returns the loss.
    fn train(&self, pipe: &mut Pipeline<M>, r: &StepRecord) -> anyhow::Result<f32> {
        let spec = &self.job.spec;
        ensure!(
            r.samples == u64::from(spec.global_batch),
            "step {} trained {} samples, the job's batch is {}",
            r.step,
            r.samples,
            spec.global_batch
        );
        let end = r.sample_start.checked_add(r.samples).with_context(|| {
            format!("step {}: sample {} is out of range", r.step, r.sample_start)
        })?;
        let ranges = micro_batches(r.sample_start..end, spec.micro_batch);
        let batches = ranges
            .iter()
            .map(|m| {
                token_batch(
                    self.data.dataset.as_ref(),
                    &self.data.sampler,
                    m.start,
                    (m.end - m.start) as usize,
                    &self.device,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("the samples of step {}", r.step))?;
        let weights: Vec<f32> = ranges
            .iter()
            .map(|m| ((m.end - m.start) as f64 / f64::from(spec.global_batch)) as f32)
            .collect();
        pipe.forward_backward_weighted(&batches, &weights)?;
        let totals = pipe.step_totals()?;
        pipe.optimizer_step(totals.grad_sq_norm)?;
        Ok(totals.loss.unwrap_or_default() as f32)
    }

    /// A stored cut's parts, each checked against its digest.
    fn parts(&self, cut: &Cut) -> anyhow::Result<Vec<(Range<usize>, Vec<u8>)>> {
        let steps = cut.steps_trained();
        cut.parts
            .iter()
            .map(|part| {
                let range = part.layers.start as usize..part.layers.end as usize;
                let bytes =
                    self.rt
                        .block_on(self.store.get_verified_part(steps, part, self.max_bytes))?;
                Ok((range, bytes))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
