//! The 1F1B schedule and the one driver that runs it, whoever the neighbours are.
//!
//! [`one_f_one_b`] is the per-stage operation order; [`OneFOneB`] executes it on a [`Stage`],
//! reaching the previous and next stage through [`Neighbours`]. A node runs a step at once
//! ([`run_one_f_one_b`]) over its data-plane links; the in-process [`crate::Pipeline`] advances
//! every stage's driver in turns over a mailbox, in one thread. A decorator (pacing, fault
//! injection, tracing) wraps the trait without touching the driver; [`Collective`] is the same
//! seam for the gradient reduction across replicas.

use std::time::{Duration, Instant};

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
    /// Forward of held-out micro-batch `.0` (numbered after the step's training micro-batches)
    /// for the validation loss: nothing kept for a backward.
    Evaluate(usize),
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
/// previous. Messages of one direction arrive in schedule order; an implementation checks that
/// the micro-batch is the one asked for.
///
/// A receive may answer `None`, "not here yet", when waiting would block a caller that drives
/// several stages in one thread (the in-process [`crate::Pipeline`]); the driver then stops
/// before the operation and resumes it later. Neighbours in other processes wait instead.
pub trait Neighbours {
    /// What a failed exchange reports; a model error converts into it.
    type Error: From<ModelError>;
    /// The activation of micro-batch `mb` from the previous stage.
    fn recv_activation(&mut self, mb: usize) -> Result<Option<Vec<u8>>, Self::Error>;
    /// Hands the activation of micro-batch `mb` to the next stage.
    fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error>;
    /// The gradient of micro-batch `mb` from the next stage.
    fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>, Self::Error>;
    /// Hands the gradient of micro-batch `mb` to the previous stage.
    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), Self::Error>;
    /// The stage finished the computation of `op`, which took `real`, and is about to hand
    /// its result on: where an emulated accelerator waits out the rest of the operation's
    /// emulated time. Real neighbours have nothing to do.
    fn computed(&mut self, op: Op, real: Duration) -> Result<(), Self::Error> {
        let _ = (op, real);
        Ok(())
    }
}

/// A stage's replicas in the other pipelines, as a step sees them: the data-parallel reduction
/// of the accumulated gradients. A node reduces over its ring links; a decorator (pacing,
/// fault injection) wraps it like [`Neighbours`].
pub trait Collective {
    /// What a failed reduction reports.
    type Error;
    /// Replaces `values` by their element-wise mean over every replica (each replica ends with
    /// identical values).
    fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), Self::Error>;

    /// The same reduction, entered at `entered` on an emulated accelerator's timeline: returns
    /// the latest entry of any replica, where the emulated reduction starts (a replica that
    /// arrives last holds up the others). Replicas that cannot tell answer their own entry.
    fn all_reduce_mean_entered(
        &mut self,
        values: &mut [f32],
        entered: u64,
    ) -> Result<u64, Self::Error> {
        self.all_reduce_mean(values)?;
        Ok(entered)
    }
}

/// What one step of a stage trains on: micro-batch `i` is `batch(i)` (asked for only by the
/// first stage, for inputs, and the last, for targets), its loss and gradient scaled by
/// `weight(i)`. After the `count` training micro-batches come `evaluate` held-out ones
/// (`batch(count..count + evaluate)`), run forward only after the step's last backward; their
/// weighted losses sum to the validation loss.
pub struct MicroBatches<B, W> {
    /// Micro-batches in the step.
    pub count: usize,
    /// Held-out micro-batches evaluated after them.
    pub evaluate: usize,
    /// Micro-batch `i`.
    pub batch: B,
    /// The scale of micro-batch `i`'s loss and gradient.
    pub weight: W,
}

/// The 1F1B driver of one stage in one step: where it is in [`one_f_one_b`]'s order and the
/// held-out micro-batches' weighted loss so far (at the last stage; the training loss stays on
/// the device, in the stage: [`Stage::step_totals`]).
#[derive(Debug)]
pub struct OneFOneB {
    position: StagePosition,
    ops: Vec<Op>,
    next: usize,
    validation_loss: f64,
}

impl OneFOneB {
    /// The driver of a step of `micro_batches` micro-batches at `position`, followed by
    /// `evaluate` held-out ones.
    pub fn new(position: StagePosition, micro_batches: usize, evaluate: usize) -> Self {
        let mut ops = one_f_one_b(position.stages, position.stage, micro_batches);
        ops.extend((micro_batches..micro_batches + evaluate).map(Op::Evaluate));
        Self {
            position,
            ops,
            next: 0,
            validation_loss: 0.0,
        }
    }

    /// Whether every operation of the step ran.
    pub fn done(&self) -> bool {
        self.next == self.ops.len()
    }

    /// The weighted loss sum of the held-out micro-batches at the last stage (0 elsewhere).
    pub fn validation_loss(&self) -> f64 {
        self.validation_loss
    }

    /// Runs operations in order until the step is done or one waits on a neighbour; returns
    /// whether any ran. Gradients accumulate in `stage`.
    pub fn advance<M, N, B, W>(
        &mut self,
        stage: &mut Stage<M>,
        neighbours: &mut N,
        data: &mut MicroBatches<B, W>,
    ) -> Result<bool, N::Error>
    where
        M: PipelineModel,
        N: Neighbours,
        B: FnMut(usize) -> Result<Batch, N::Error>,
        W: Fn(usize) -> f32,
    {
        let (first, last) = (self.position.is_first(), self.position.is_last());
        let start = self.next;
        while let Some(&op) = self.ops.get(self.next) {
            match op {
                Op::Forward(i) | Op::Evaluate(i) => {
                    // A held-out micro-batch runs forward like a training one, keeping
                    // nothing for a backward; its loss sums apart.
                    let training = matches!(op, Op::Forward(_));
                    let started;
                    let out = if first {
                        let b = (data.batch)(i)?;
                        let targets = last.then_some(&b.targets);
                        started = Instant::now();
                        let out = if training {
                            stage.forward(i as u64, b.inputs, targets)?
                        } else {
                            stage.evaluate(b.inputs, targets)?
                        };
                        stage.encode_output(out)?
                    } else {
                        let Some(bytes) = neighbours.recv_activation(i)? else {
                            break;
                        };
                        let b = if last { Some((data.batch)(i)?) } else { None };
                        let targets = b.as_ref().map(|b| &b.targets);
                        started = Instant::now();
                        if training {
                            stage.forward_wire(i as u64, &bytes, targets)?
                        } else {
                            stage.evaluate_wire(&bytes, targets)?
                        }
                    };
                    neighbours.computed(op, started.elapsed())?;
                    match out {
                        WireOutput::Activation(bytes) => neighbours.send_activation(i, bytes)?,
                        WireOutput::Loss(l) => {
                            self.validation_loss += f64::from(l) * f64::from((data.weight)(i));
                        }
                        WireOutput::LossKept => {}
                    }
                }
                Op::Backward(i) => {
                    let upstream = if last {
                        None
                    } else {
                        match neighbours.recv_grad(i)? {
                            Some(bytes) => Some(bytes),
                            None => break,
                        }
                    };
                    let scale = (data.weight)(i);
                    let started = Instant::now();
                    let grad = stage.backward_wire(i as u64, upstream.as_deref(), scale)?;
                    neighbours.computed(op, started.elapsed())?;
                    if let Some(g) = grad
                        && !first
                    {
                        neighbours.send_grad(i, g)?;
                    }
                }
            }
            self.next += 1;
        }
        Ok(self.next > start)
    }
}

/// Runs a whole step of one stage with neighbours that wait (a node's links): every operation
/// of [`one_f_one_b`] in order, then the held-out forwards. Returns the held-out micro-batches'
/// weighted loss sum at the last stage (0 elsewhere, or without held-out micro-batches); the
/// training loss is the stage's ([`Stage::step_totals`]).
pub fn run_one_f_one_b<M, N, B, W>(
    stage: &mut Stage<M>,
    neighbours: &mut N,
    position: StagePosition,
    data: &mut MicroBatches<B, W>,
) -> Result<f64, N::Error>
where
    M: PipelineModel,
    N: Neighbours,
    B: FnMut(usize) -> Result<Batch, N::Error>,
    W: Fn(usize) -> f32,
{
    let mut driver = OneFOneB::new(position, data.count, data.evaluate);
    while !driver.done() {
        if !driver.advance(stage, neighbours, data)? {
            return Err(ModelError::InvalidConfig(
                "a neighbour answered that its message is not here yet".into(),
            )
            .into());
        }
    }
    Ok(driver.validation_loss())
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
                            Op::Evaluate(_) => unreachable!("1F1B has no evaluation"),
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

    /// Neighbours of a one-stage pipeline: nothing is ever sent; every computed operation is
    /// recorded.
    #[derive(Default)]
    struct Recording(Vec<Op>);

    impl Neighbours for Recording {
        type Error = ModelError;
        fn recv_activation(&mut self, mb: usize) -> Result<Option<Vec<u8>>, ModelError> {
            unreachable!("a single stage receives no activation ({mb})")
        }
        fn send_activation(&mut self, mb: usize, _: Vec<u8>) -> Result<(), ModelError> {
            unreachable!("a single stage sends no activation ({mb})")
        }
        fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>, ModelError> {
            unreachable!("a single stage receives no gradient ({mb})")
        }
        fn send_grad(&mut self, mb: usize, _: Vec<u8>) -> Result<(), ModelError> {
            unreachable!("a single stage sends no gradient ({mb})")
        }
        fn computed(&mut self, op: Op, _: Duration) -> Result<(), ModelError> {
            self.0.push(op);
            Ok(())
        }
    }

    #[test]
    fn the_driver_reports_every_computed_operation_in_order() {
        use crate::data::{Dataset, Sampler, SyntheticTask, token_batch};
        use crate::gpt::{Gpt, GptConfig};
        use crate::{StageConfig, default_device};
        use std::sync::Arc;

        let config = GptConfig::tiny();
        let model = Arc::new(Gpt::new(config.clone()).unwrap());
        let device = default_device();
        let mut stage = Stage::new(model, 0..4, 0, &device, StageConfig::default()).unwrap();
        let task = SyntheticTask::new(1, config.vocab_size, config.seq_len, 64, 0.0).unwrap();
        let sampler = Sampler::new(1, task.len()).unwrap();
        let batch = |i: usize| token_batch(&task, &sampler, 2 * i as u64, 2, &device);
        let mut data = MicroBatches {
            count: 3,
            evaluate: 2,
            batch,
            weight: |i| if i < 3 { 1.0 / 3.0 } else { 0.5 },
        };
        let mut neighbours = Recording::default();
        let position = StagePosition {
            stage: 0,
            stages: 1,
        };
        let before = stage.param_values(1).unwrap();
        let validation = run_one_f_one_b(&mut stage, &mut neighbours, position, &mut data).unwrap();
        assert!(stage.step_loss().unwrap().is_some_and(|l| l > 0.0));
        let mut ops = one_f_one_b(1, 0, 3);
        ops.extend([Op::Evaluate(3), Op::Evaluate(4)]);
        assert_eq!(neighbours.0, ops);
        // The held-out micro-batches were evaluated, not trained: nothing in flight, three
        // micro-batches of gradients, and their loss is what evaluating them says.
        assert_eq!(stage.in_flight(), 0);
        assert_eq!(stage.accumulated_micro_batches(), 3);
        assert_eq!(stage.param_values(1).unwrap(), before);
        let held_out: f64 = (3..5)
            .map(|i| {
                let b = batch(i).unwrap();
                match stage.evaluate(b.inputs, Some(&b.targets)).unwrap() {
                    crate::StageOutput::Loss(l) => 0.5 * f64::from(l),
                    other => panic!("a one-stage pipeline evaluates to a loss, not {other:?}"),
                }
            })
            .sum();
        assert!(
            (validation - held_out).abs() < 1e-6,
            "{validation} vs {held_out}"
        );
    }
}
