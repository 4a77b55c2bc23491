//! What replays one window: the job as the cluster trained it, the model at the window's
//! start, a committed step trained as a node trains its share, and the comparison with the
//! checkpoint the window ends at.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use parcae_api::StepRecord;
use parcae_consensus::state::{Cut, CutPart};
use parcae_model::{
    Dataset, Pipeline, PipelineModel, Stage, StageConfig, WeightSource, token_batch,
};

use super::windows::Window;
use crate::job::JobSpec;
use crate::store::JobStore;
use crate::train::samples::{DataSource, micro_batches};

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

/// What one window found.
pub(super) struct WindowResult {
    pub(super) max_abs_diff: f64,
    pub(super) max_loss_diff: f64,
}

/// What every window needs.
pub(super) struct Replayer<'a, M: PipelineModel> {
    pub(super) job: &'a ReplayJob<M>,
    pub(super) data: DataSource,
    pub(super) store: JobStore,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) max_bytes: u64,
    pub(super) stage_config: StageConfig,
    pub(super) device: burn::tensor::Device,
}

impl<M: PipelineModel> Replayer<'_, M> {
    /// Trains `records` from the window's start and compares with its end (`before`: the
    /// step before the window, whose groups a DiLoCo window starts from).
    pub(super) fn window(
        &self,
        w: &Window,
        records: &[StepRecord],
        before: Option<&StepRecord>,
    ) -> anyhow::Result<WindowResult> {
        if self.job.spec.sync.inner_steps().is_some() {
            return self.window_by_groups(w, records, before);
        }
        let mut pipe = self.start(w)?;
        let mut max_loss_diff = 0.0f64;
        for r in records {
            let shares = [self.samples_of(r)?];
            let loss = self.train(&mut pipe, r, &shares, 1.0)?;
            max_loss_diff = max_loss_diff.max((f64::from(loss) - r.loss).abs());
        }
        Ok(WindowResult {
            max_abs_diff: self.compare(&pipe, w)?,
            max_loss_diff,
        })
    }

    /// The model at the window's start, as one stage: the stored checkpoint it starts from, or
    /// the job's seeded (or given) weights.
    pub(super) fn start(&self, w: &Window) -> anyhow::Result<Pipeline<M>> {
        self.model_from(
            w.from.as_ref().map(|c| (c, c.parts.as_slice())),
            w.steps.start,
        )
    }

    /// The model as the stored `parts` of a cut hold it (as a checkpoint the cluster wrote;
    /// `None`: the job's seeded or given weights), which must be the state after `steps` steps.
    pub(super) fn model_from(
        &self,
        parts: Option<(&Cut, &[CutPart])>,
        steps: u64,
    ) -> anyhow::Result<Pipeline<M>> {
        let layers = 0..self.job.model.num_layers();
        let mut pipe = Pipeline::new(
            self.job.model.clone(),
            std::slice::from_ref(&layers),
            self.job.spec.seed,
            &self.device,
            self.stage_config.clone(),
        )?;
        let stage = &mut pipe.stages_mut()[0];
        match parts {
            None => {
                if let Some(weights) = &self.job.initial_weights {
                    stage.load_weights(weights.as_ref())?;
                }
            }
            Some((cut, parts)) => {
                for (range, bytes) in self.parts(cut, parts)? {
                    stage.import_state(&bytes, range)?;
                }
            }
        }
        ensure!(
            stage.step() == steps,
            "the checkpoint holds the state after {} steps, not {steps}",
            stage.step(),
        );
        Ok(pipe)
    }

    /// The largest difference between `pipe`'s weights and those of the checkpoint the window
    /// ends at.
    pub(super) fn compare(&self, pipe: &Pipeline<M>, w: &Window) -> anyhow::Result<f64> {
        let mut max_abs_diff = 0.0f64;
        for (range, bytes) in self.parts(&w.to, &w.to.parts)? {
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
                let ours = pipe
                    .stages()
                    .iter()
                    .find(|s| s.layer_range().contains(&layer))
                    .with_context(|| format!("the replay holds no layer {layer}"))?
                    .param_values(layer)?;
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
        Ok(max_abs_diff)
    }

    /// The samples of committed step `r`, checked against the job's batch.
    pub(super) fn samples_of(&self, r: &StepRecord) -> anyhow::Result<Range<u64>> {
        let batch = self.job.spec.global_batch;
        ensure!(
            r.samples == u64::from(batch),
            "step {} trained {} samples, the job's batch is {batch}",
            r.step,
            r.samples,
        );
        let end = r.sample_start.checked_add(r.samples).with_context(|| {
            format!("step {}: sample {} is out of range", r.step, r.sample_start)
        })?;
        Ok(r.sample_start..end)
    }

    /// Step `r`'s samples `shares` trained on `pipe` as a node trains its share: in
    /// micro-batches, each weighted by its share of the global batch times `scale` (a group's
    /// replicas average their gradients: `D / (G n)` for `n` of the step's `D` pipelines in
    /// its group, 1 where one all-reduce spans them all). Returns the loss.
    pub(super) fn accumulate(
        &self,
        pipe: &mut Pipeline<M>,
        r: &StepRecord,
        shares: &[Range<u64>],
        scale: f64,
    ) -> anyhow::Result<()> {
        let spec = &self.job.spec;
        let ranges: Vec<Range<u64>> = shares
            .iter()
            .flat_map(|share| micro_batches(share.clone(), spec.micro_batch))
            .collect();
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
            .map(|m| ((m.end - m.start) as f64 * scale / f64::from(spec.global_batch)) as f32)
            .collect();
        pipe.forward_backward_weighted(&batches, &weights)?;
        Ok(())
    }

    /// [`Self::accumulate`], then the optimizer's step. Returns the loss.
    pub(super) fn train(
        &self,
        pipe: &mut Pipeline<M>,
        r: &StepRecord,
        shares: &[Range<u64>],
        scale: f64,
    ) -> anyhow::Result<f32> {
        self.accumulate(pipe, r, shares, scale)?;
        let totals = pipe.step_totals()?;
        pipe.optimizer_step(totals.grad_sq_norm)?;
        Ok(totals.loss.unwrap_or_default() as f32)
    }

    /// The stored `parts` of `cut` (its own, or a group's), each checked against its digest.
    fn parts(&self, cut: &Cut, parts: &[CutPart]) -> anyhow::Result<Vec<(Range<usize>, Vec<u8>)>> {
        let steps = cut.steps_trained();
        parts
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
