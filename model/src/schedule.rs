//! The 1F1B schedule and the one driver that runs it, whoever the neighbours are.
//!
//! [`one_f_one_b`] is the per-stage operation order; [`run_one_f_one_b`] executes it on a
//! [`Stage`], reaching the previous and next stage through [`Neighbours`]. The in-process
//! [`crate::Pipeline`] gives it channels, a node gives it its data-plane links; a decorator
//! (pacing, fault injection, tracing) wraps the trait without touching the driver.

use crate::error::ModelError;
use crate::pipeline_model::{Batch, PipelineModel};
use crate::stage::{Stage, WireOutput};

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

/// Where a stage sits in its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePosition {
    /// Index of this stage, from 0.
    pub stage: usize,
    /// Stages in the pipeline.
    pub stages: usize,
}

impl StagePosition {
    /// Whether this stage takes the pipeline's inputs.
    pub fn is_first(&self) -> bool {
        self.stage == 0
    }

    /// Whether this stage computes the loss.
    pub fn is_last(&self) -> bool {
        self.stage + 1 == self.stages
    }
}

/// A stage's neighbours in its pipeline as the 1F1B driver sees them: activations come from
/// the previous stage and go to the next, gradients come back from the next and go to the
/// previous. Messages of one direction arrive in schedule order; an implementation checks
/// that the micro-batch is the one asked for.
pub trait Neighbours {
    /// What a failed exchange reports; a model error converts into it.
    type Error: From<ModelError>;
    /// The activation of micro-batch `mb` from the previous stage.
    fn recv_activation(&mut self, mb: usize) -> Result<Vec<u8>, Self::Error>;
    /// Hands the activation of micro-batch `mb` to the next stage.
    fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error>;
    /// The gradient of micro-batch `mb` from the next stage.
    fn recv_grad(&mut self, mb: usize) -> Result<Vec<u8>, Self::Error>;
    /// Hands the gradient of micro-batch `mb` to the previous stage.
    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error>;
}

/// Runs forward and backward of `micro_batches` micro-batches of one step at `position` in
/// 1F1B order and accumulates gradients in `stage`. `batch(i)` gives micro-batch `i` (asked for
/// only by the first stage, for inputs, and the last, for targets); micro-batch `i`'s loss and
/// gradient are scaled by `weight(i)`. Returns the weighted loss sum at the last stage, 0
/// elsewhere.
pub fn run_one_f_one_b<M: PipelineModel, N: Neighbours>(
    stage: &mut Stage<M>,
    neighbours: &mut N,
    position: StagePosition,
    micro_batches: usize,
    mut batch: impl FnMut(usize) -> Result<Batch, N::Error>,
    weight: impl Fn(usize) -> f32,
) -> Result<f64, N::Error> {
    let (first, last) = (position.is_first(), position.is_last());
    let mut loss = 0.0f64;
    for op in one_f_one_b(position.stages, position.stage, micro_batches) {
        match op {
            Op::Forward(i) => {
                let given = if first || last { Some(batch(i)?) } else { None };
                let targets = given.as_ref().filter(|_| last).map(|b| &b.targets);
                let out = match given.as_ref().filter(|_| first) {
                    Some(b) => {
                        let out = stage.forward(i as u64, b.inputs.clone(), targets)?;
                        stage.encode_output(out)?
                    }
                    None => {
                        let bytes = neighbours.recv_activation(i)?;
                        stage.forward_wire(i as u64, &bytes, targets)?
                    }
                };
                match out {
                    WireOutput::Activation(bytes) => neighbours.send_activation(i, bytes)?,
                    WireOutput::Loss(l) => loss += f64::from(l) * f64::from(weight(i)),
                }
            }
            Op::Backward(i) => {
                let upstream = if last {
                    None
                } else {
                    Some(neighbours.recv_grad(i)?)
                };
                if let Some(g) = stage.backward_wire(i as u64, upstream.as_deref(), weight(i))?
                    && !first
                {
                    neighbours.send_grad(i, g)?;
                }
            }
        }
    }
    Ok(loss)
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
}
