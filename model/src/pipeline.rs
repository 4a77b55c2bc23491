//! The 1F1B schedule and an in-process pipeline that runs it.
//!
//! [`one_f_one_b`] is the per-stage operation order a distributed trainer follows; [`Pipeline`]
//! runs all stages of one pipeline in this process (tests, single-machine runs), passing
//! activations and gradients between stages as wire bytes exactly as the network would, and
//! [`data_parallel_step`] averages gradients of several pipelines through the same byte
//! interface a ring all-reduce uses.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::Device;

use crate::codec::{extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::pipeline_model::{Batch, PipelineModel};
use crate::stage::{Stage, StageConfig, StageOutput, StepReport, WireOutput};

/// One operation of a stage in a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Forward of micro-batch `.0`.
    Forward(usize),
    /// Backward of micro-batch `.0`.
    Backward(usize),
}

/// The 1F1B order of stage `stage` of `stages` with `micro_batches` micro-batches: `stages -
/// stage - 1` warm-up forwards, then alternating forward and backward, then the remaining
/// backwards. At most `stages - stage` micro-batches are in flight at the stage.
pub fn one_f_one_b(stages: usize, stage: usize, micro_batches: usize) -> Vec<Op> {
    let warmup = stages.saturating_sub(stage + 1).min(micro_batches);
    let mut ops = Vec::with_capacity(2 * micro_batches);
    ops.extend((0..warmup).map(Op::Forward));
    let mut next_backward = 0;
    for f in warmup..micro_batches {
        ops.push(Op::Forward(f));
        ops.push(Op::Backward(next_backward));
        next_backward += 1;
    }
    ops.extend((next_backward..micro_batches).map(Op::Backward));
    ops
}

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

    /// Runs forward and backward of every micro-batch in 1F1B order and accumulates gradients;
    /// returns the mean loss. Activations and gradients cross stage boundaries as wire bytes.
    pub fn forward_backward(&mut self, micro_batches: &[Batch]) -> Result<f32> {
        let p = self.stages.len();
        let m = micro_batches.len();
        if m == 0 {
            return Err(ModelError::InvalidConfig("no micro-batches".into()));
        }
        let scale = 1.0 / m as f32;
        let schedules: Vec<Vec<Op>> = (0..p).map(|s| one_f_one_b(p, s, m)).collect();
        let mut cursor = vec![0usize; p];
        // (stage, micro-batch) -> bytes waiting for that stage.
        let mut activations: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
        let mut gradients: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
        let mut loss_sum = 0.0f64;
        while cursor.iter().zip(&schedules).any(|(c, s)| *c < s.len()) {
            let mut progressed = false;
            for s in 0..p {
                let Some(&op) = schedules[s].get(cursor[s]) else {
                    continue;
                };
                let stage = &mut self.stages[s];
                let last = s + 1 == p;
                match op {
                    Op::Forward(i) => {
                        let targets = last.then_some(&micro_batches[i].targets);
                        let out = if s == 0 {
                            let out = stage.forward(
                                i as u64,
                                micro_batches[i].inputs.clone(),
                                targets,
                            )?;
                            stage.encode_output(out)?
                        } else {
                            let Some(bytes) = activations.remove(&(s, i)) else {
                                continue;
                            };
                            stage.forward_wire(i as u64, &bytes, targets)?
                        };
                        match out {
                            WireOutput::Activation(bytes) => {
                                activations.insert((s + 1, i), bytes);
                            }
                            WireOutput::Loss(l) => loss_sum += l as f64,
                        }
                    }
                    Op::Backward(i) => {
                        let upstream = if last {
                            None
                        } else {
                            let Some(bytes) = gradients.remove(&(s, i)) else {
                                continue;
                            };
                            Some(bytes)
                        };
                        if let Some(g) =
                            stage.backward_wire(i as u64, upstream.as_deref(), scale)?
                        {
                            gradients.insert((s - 1, i), g);
                        }
                    }
                }
                cursor[s] += 1;
                progressed = true;
            }
            if !progressed {
                return Err(ModelError::InvalidConfig(
                    "pipeline schedule cannot progress".into(),
                ));
            }
        }
        Ok((loss_sum / m as f64) as f32)
    }

    /// Sum of the stages' squared gradient norms.
    pub fn grad_sq_norm(&self) -> f64 {
        self.stages.iter().map(Stage::grad_sq_norm).sum()
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
        let loss = self.forward_backward(micro_batches)?;
        let norm = self.grad_sq_norm();
        self.optimizer_step(norm)?;
        Ok(loss)
    }

    /// The loss of `batch` without training (no gradient is kept).
    pub fn evaluate(&mut self, batch: &Batch) -> Result<f32> {
        let p = self.stages.len();
        let mut act = batch.inputs.clone();
        for (s, stage) in self.stages.iter_mut().enumerate() {
            let targets = (s + 1 == p).then_some(&batch.targets);
            let out = stage.forward(u64::MAX, act.clone(), targets);
            stage.abort_micro_batch(u64::MAX);
            match out? {
                StageOutput::Activation(a) => act = a,
                StageOutput::Loss(l) => return Ok(l),
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
        loss += pipe.forward_backward(shard)?;
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
    let norm = replicas[0].grad_sq_norm();
    for r in replicas.iter_mut() {
        r.optimizer_step(norm)?;
    }
    Ok(loss / replicas.len() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_bounds_in_flight_and_covers_everything() {
        for p in 1..5 {
            for m in 1..7 {
                for s in 0..p {
                    let ops = one_f_one_b(p, s, m);
                    assert_eq!(ops.len(), 2 * m);
                    let mut in_flight = 0usize;
                    let mut peak = 0;
                    for op in &ops {
                        match op {
                            Op::Forward(_) => in_flight += 1,
                            Op::Backward(_) => in_flight -= 1,
                        }
                        peak = peak.max(in_flight);
                    }
                    assert!(peak <= (p - s).min(m), "p{p} s{s} m{m} peak {peak}");
                }
            }
        }
        assert_eq!(
            one_f_one_b(2, 0, 3),
            vec![
                Op::Forward(0),
                Op::Forward(1),
                Op::Backward(0),
                Op::Forward(2),
                Op::Backward(1),
                Op::Backward(2)
            ]
        );
    }

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
