//! An in-process pipeline: all stages of one pipeline in this process (tests, single-machine
//! runs), each stage driven by the same 1F1B driver as a node's ([`OneFOneB`]) with an
//! in-process mailbox for neighbours, passing activations and gradients between stages as
//! wire bytes exactly as the network would, and
//! [`data_parallel_step`] averages gradients of several pipelines through the same byte
//! interface a ring all-reduce uses.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::Device;

use crate::codec::{extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::pipeline_model::{Batch, PipelineModel};
use crate::schedule::{MicroBatches, Neighbours, OneFOneB, StagePosition};
use crate::stage::{Stage, StageConfig, StageOutput, StepReport, StepTotals};

/// `num_layers` layers cut into `stages` contiguous ranges of near-equal length.
pub fn even_ranges(num_layers: usize, stages: usize) -> Result<Vec<Range<usize>>> {
    if stages == 0 || stages > num_layers {
        return Err(ModelError::InvalidConfig(format!(
            "cannot cut {num_layers} layers into {stages} stages"
        )));
    }
    let (base, extra) = (num_layers / stages, num_layers % stages);
    let mut start = 0;
    Ok((0..stages)
        .map(|s| {
            let len = base + usize::from(s < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect())
}

/// All stages of one pipeline in this process.
pub struct Pipeline<M: PipelineModel> {
    stages: Vec<Stage<M>>,
}

impl<M: PipelineModel> Pipeline<M> {
    /// Builds one stage per range; the ranges must cover the model's layers in order.
    pub fn new(
        model: Arc<M>,
        ranges: &[Range<usize>],
        seed: u64,
        device: &Device,
        config: StageConfig,
    ) -> Result<Self> {
        let mut next = 0;
        for r in ranges {
            if r.start != next || r.end <= r.start {
                return Err(ModelError::InvalidLayerRange {
                    start: r.start,
                    end: r.end,
                    num_layers: model.num_layers(),
                });
            }
            next = r.end;
        }
        if next != model.num_layers() || ranges.is_empty() {
            return Err(ModelError::InvalidConfig(format!(
                "stage ranges end at layer {next}, the model has {}",
                model.num_layers()
            )));
        }
        let stages = ranges
            .iter()
            .map(|r| Stage::new(model.clone(), r.clone(), seed, device, config.clone()))
            .collect::<Result<_>>()?;
        Ok(Self { stages })
    }

    /// The stages, first to last.
    pub fn stages(&self) -> &[Stage<M>] {
        &self.stages
    }

    /// The stages, mutably (to export or import state, or gradients).
    pub fn stages_mut(&mut self) -> &mut [Stage<M>] {
        &mut self.stages
    }

    /// Runs forward and backward of every micro-batch in 1F1B order and accumulates gradients
    /// (and, on the device, the mean loss: [`Pipeline::step_totals`]). Every stage runs the
    /// node's 1F1B driver ([`OneFOneB`]) in this thread, in turns, each going as far as its
    /// neighbours' messages allow; activations and gradients cross stage boundaries as wire
    /// bytes, exactly as they cross the network.
    pub fn forward_backward(&mut self, micro_batches: &[Batch]) -> Result<()> {
        let weights = vec![1.0 / micro_batches.len().max(1) as f32; micro_batches.len()];
        self.forward_backward_weighted(micro_batches, &weights)
    }

    /// [`Pipeline::forward_backward`] with micro-batch `i`'s loss scaled by `weights[i]` (its
    /// share of the batch, where micro-batches differ in size, as a node weights them).
    pub fn forward_backward_weighted(
        &mut self,
        micro_batches: &[Batch],
        weights: &[f32],
    ) -> Result<()> {
        let p = self.stages.len();
        let m = micro_batches.len();
        if m == 0 || weights.len() != m {
            return Err(ModelError::InvalidConfig(format!(
                "{m} micro-batches with {} weights",
                weights.len()
            )));
        }
        let mut data = MicroBatches {
            count: m,
            evaluate: 0,
            batch: |i: usize| Ok(micro_batches[i].clone()),
            weight: |i: usize| weights[i],
        };
        let mut drivers: Vec<OneFOneB> = (0..p)
            .map(|stage| OneFOneB::new(StagePosition { stage, stages: p }, m, 0))
            .collect();
        let mut mailbox = Mailbox::default();
        while drivers.iter().any(|d| !d.done()) {
            let mut progressed = false;
            for (s, (driver, stage)) in drivers.iter_mut().zip(&mut self.stages).enumerate() {
                let mut neighbours = MailboxNeighbours {
                    stage: s,
                    mailbox: &mut mailbox,
                };
                progressed |= driver.advance(stage, &mut neighbours, &mut data)?;
            }
            if !progressed {
                return Err(ModelError::InvalidConfig(
                    "pipeline schedule cannot progress".into(),
                ));
            }
        }
        Ok(())
    }

    /// Sum of the stages' squared gradient norms.
    pub fn grad_sq_norm(&self) -> Result<f64> {
        self.stages.iter().map(Stage::grad_sq_norm).sum()
    }

    /// The step's squared gradient norm over every stage and its weighted training loss
    /// ([`Stage::step_totals`] of every stage, summed on the device): one read-back.
    pub fn step_totals(&self) -> Result<StepTotals> {
        let sums = self.stages.iter().filter_map(Stage::totals_on_device);
        let has_loss = self.stages.last().is_some_and(|s| s.step_loss_kept());
        Stage::<M>::read_totals(sums.reduce(|a, b| a + b), has_loss)
    }

    /// Steps every stage with the given global squared norm.
    pub fn optimizer_step(&mut self, global_sq_norm: f64) -> Result<Vec<StepReport>> {
        self.stages
            .iter_mut()
            .map(|s| s.optimizer_step(global_sq_norm))
            .collect()
    }

    /// One training step on `micro_batches`: 1F1B forward/backward, clipping by this pipeline's
    /// global norm, AdamW. Returns the mean loss.
    pub fn train_step(&mut self, micro_batches: &[Batch]) -> Result<f32> {
        self.forward_backward(micro_batches)?;
        let totals = self.step_totals()?;
        self.optimizer_step(totals.grad_sq_norm)?;
        Ok(totals.loss.unwrap_or_default() as f32)
    }

    /// The loss of `batch` without training (no gradient is kept, no random stream moves).
    pub fn evaluate(&self, batch: &Batch) -> Result<f32> {
        let p = self.stages.len();
        let mut act = batch.inputs.clone();
        for (s, stage) in self.stages.iter().enumerate() {
            let targets = (s + 1 == p).then_some(&batch.targets);
            match stage.evaluate(act.clone(), targets)? {
                StageOutput::Activation(a) => act = a,
                StageOutput::Loss(l) => return Ok(l),
                StageOutput::LossKept => break,
            }
        }
        Err(ModelError::InvalidConfig(
            "pipeline has no last stage".into(),
        ))
    }
}

/// The element-wise mean of little-endian f32 buffers of equal length: the reduction of a
/// data-parallel gradient all-reduce.
pub fn mean_f32_le(buffers: &[&[u8]]) -> Result<Vec<u8>> {
    let Some(first) = buffers.first() else {
        return Err(ModelError::InvalidConfig("nothing to reduce".into()));
    };
    if first.len() % 4 != 0 {
        return Err(ModelError::GradLength {
            expected: first.len() / 4 * 4,
            found: first.len(),
        });
    }
    let mut sum: Vec<f32> = f32_from_le(first);
    for b in &buffers[1..] {
        if b.len() != first.len() {
            return Err(ModelError::GradLength {
                expected: first.len(),
                found: b.len(),
            });
        }
        for (acc, v) in sum.iter_mut().zip(f32_from_le(b)) {
            *acc += v;
        }
    }
    let inv = 1.0 / buffers.len() as f32;
    sum.iter_mut().for_each(|v| *v *= inv);
    let mut out = Vec::with_capacity(first.len());
    extend_f32_le(&mut out, &sum);
    Ok(out)
}

/// One data-parallel step of `replicas` identical pipelines, replica `d` on `shards[d]`:
/// forward/backward everywhere, gradients of each stage averaged across replicas as bytes
/// ([`Stage::export_grads`] / [`mean_f32_le`] / [`Stage::import_grads`]), the global norm summed
/// over stages, and AdamW on every replica. Returns the mean loss over replicas.
pub fn data_parallel_step<M: PipelineModel>(
    replicas: &mut [Pipeline<M>],
    shards: &[Vec<Batch>],
) -> Result<f32> {
    if replicas.is_empty() || replicas.len() != shards.len() {
        return Err(ModelError::InvalidConfig(format!(
            "{} replicas for {} shards",
            replicas.len(),
            shards.len()
        )));
    }
    let mut loss = 0.0;
    for (pipe, shard) in replicas.iter_mut().zip(shards) {
        pipe.forward_backward(shard)?;
        let stages = pipe.stages.iter();
        loss += stages
            .filter_map(|s| s.step_loss().transpose())
            .sum::<Result<f64>>()? as f32;
    }
    let stages = replicas[0].stages.len();
    for s in 0..stages {
        let exported = replicas
            .iter()
            .map(|r| r.stages[s].export_grads())
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<&[u8]> = exported.iter().map(Vec::as_slice).collect();
        let reduced = mean_f32_le(&views)?;
        for r in replicas.iter_mut() {
            r.stages[s].import_grads(&reduced)?;
        }
    }
    let norm = replicas[0].grad_sq_norm()?;
    for r in replicas.iter_mut() {
        r.optimizer_step(norm)?;
    }
    Ok(loss / replicas.len() as f32)
}

/// Messages between the stages of an in-process pipeline: (receiving stage, micro-batch) ->
/// bytes, one map per direction.
#[derive(Default)]
struct Mailbox {
    activations: HashMap<(usize, usize), Vec<u8>>,
    grads: HashMap<(usize, usize), Vec<u8>>,
}

/// Stage `stage`'s view of the mailbox: a message not yet sent is "not here yet".
struct MailboxNeighbours<'a> {
    stage: usize,
    mailbox: &'a mut Mailbox,
}

impl Neighbours for MailboxNeighbours<'_> {
    type Error = ModelError;

    fn recv_activation(&mut self, mb: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.mailbox.activations.remove(&(self.stage, mb)))
    }

    fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<()> {
        self.mailbox.activations.insert((self.stage + 1, mb), bytes);
        Ok(())
    }

    fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.mailbox.grads.remove(&(self.stage, mb)))
    }

    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<()> {
        let to = self.stage.checked_sub(1).ok_or_else(|| {
            ModelError::InvalidConfig("the first stage has no previous stage".into())
        })?;
        self.mailbox.grads.insert((to, mb), bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_ranges_cover_in_order() {
        assert_eq!(even_ranges(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert!(even_ranges(2, 3).is_err());
    }

    #[test]
    fn mean_rejects_unequal_lengths() {
        let a = [0u8; 8];
        let b = [0u8; 4];
        assert!(mean_f32_le(&[&a, &b]).is_err());
        let one = 1.0f32.to_le_bytes();
        let three = 3.0f32.to_le_bytes();
        assert_eq!(mean_f32_le(&[&one, &three]).unwrap(), 2.0f32.to_le_bytes());
    }
}
