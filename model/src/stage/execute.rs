//! Running micro-batches through a stage: forward on lanes (slices of the micro-batch, each on a
//! thread of its own), the autodiff graph kept until the backward, and the backward that
//! accumulates parameter gradients in (layer, parameter) order.

use std::time::Instant;

use burn::tensor::{Float, Tensor};

use super::flight::{LaneFlight, Produced};
use super::{Stage, StageOutput, Upstream};
use crate::activation::Activation;
use crate::error::{ModelError, Result};
use crate::host::read_scalar;
use crate::lanes::split_sizes;
use crate::params::{take_grads, with_fresh_leaves};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;

/// What one lane's backward hands back: the input gradient and, per layer, the parameter
/// gradients in visit order.
type LaneGrads = (Option<Activation>, Vec<Vec<Option<Tensor<1>>>>);

impl<M: PipelineModel> Stage<M> {
    /// Runs micro-batch `mb` forward. `input` is the batch input at the first stage and the
    /// previous stage's output elsewhere; `targets` is required at the last stage.
    pub fn forward(
        &mut self,
        mb: u64,
        input: Activation,
        targets: Option<&Activation>,
    ) -> Result<StageOutput> {
        if self.in_flight.contains_key(&mb) {
            return Err(ModelError::DuplicateMicroBatch(mb));
        }
        if self.is_last() && targets.is_none() {
            return Err(ModelError::MissingTargets);
        }
        let started = Instant::now();
        let input = input.into_device(&self.device);
        let batch = input.batch_size();
        let sizes = split_sizes(
            batch,
            self.lanes.count(),
            self.num_params(),
            input.positions_per_example(),
            self.config.lane_min_flops,
        );
        let targets = match targets {
            Some(t) if self.is_last() => {
                let t = t.clone().into_device(&self.device);
                if sizes.len() > 1 && t.batch_size() != batch {
                    return Err(ModelError::ShapeMismatch {
                        what: "targets".into(),
                        expected: format!("{batch} examples, as many as the input"),
                        found: t.dims(),
                    });
                }
                t.split(&sizes).into_iter().map(Some).collect()
            }
            _ => vec![None; sizes.len()],
        };
        let rngs = self.lane_rngs(sizes.len());
        let sliced = sizes.len() > 1;
        let jobs: Vec<_> = input
            .split(&sizes)
            .into_iter()
            .zip(targets)
            .zip(rngs)
            .map(|((input, targets), mut rngs)| {
                let (model, layers) = (self.model.clone(), self.layers.clone());
                let (start, first) = (self.range.start, self.is_first());
                move || {
                    let layers = if sliced {
                        layers.into_iter().map(with_fresh_leaves).collect()
                    } else {
                        layers
                    };
                    let out =
                        lane_forward(&*model, start, first, layers, input, targets, &mut rngs);
                    (rngs, out)
                }
            })
            .collect();
        let mut outs = Vec::with_capacity(sizes.len());
        for (rngs, out) in self.lanes.run(jobs) {
            if !sliced {
                self.rngs = rngs;
            }
            outs.push(out);
        }
        let (flights, outputs): (Vec<_>, Vec<_>) = outs
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let output = join_outputs(outputs)?;
        self.in_flight.insert(mb, flights);
        self.times.forward_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(output)
    }

    /// Runs `input` through the stage's layers keeping nothing for a backward and leaving the
    /// layers' random streams where they are: evaluation and inference. At the last stage the
    /// output is the model's own (a language model's logits), not a loss.
    pub fn infer(&self, input: Activation) -> Result<Activation> {
        let mut x = input.into_device(&self.device);
        for (k, layer) in self.layers.iter().enumerate() {
            let mut rng = self.rngs[k].clone();
            x = self
                .model
                .forward(self.range.start + k, layer, x, &mut rng)?;
        }
        Ok(x)
    }

    /// [`Stage::infer`] of a held-out micro-batch, with its loss at the last stage (where
    /// `targets` are required): validation, which trains nothing and changes nothing.
    pub fn evaluate(&self, input: Activation, targets: Option<&Activation>) -> Result<StageOutput> {
        let out = self.infer(input)?;
        if !self.is_last() {
            return Ok(StageOutput::Activation(out.detached()));
        }
        let targets = targets
            .ok_or(ModelError::MissingTargets)?
            .clone()
            .into_device(&self.device);
        let loss =
            read_scalar::<f32, 1, Float>(self.model.loss(out, &targets)?, "validation loss")?;
        if !loss.is_finite() {
            return Err(ModelError::NotFinite("validation loss"));
        }
        Ok(StageOutput::Loss(loss))
    }

    /// The random streams of each lane: the layers' own streams when there is one lane, else
    /// streams forked from them (so that the layers' streams advance the same way whatever the
    /// lanes do).
    fn lane_rngs(&mut self, lanes: usize) -> Vec<Vec<StageRng>> {
        if lanes == 1 {
            return vec![std::mem::take(&mut self.rngs)];
        }
        let seeds: Vec<Vec<u64>> = self
            .rngs
            .iter_mut()
            .map(|r| (0..lanes).map(|_| r.next_u64()).collect())
            .collect();
        (0..lanes)
            .map(|k| {
                seeds
                    .iter()
                    .map(|s| StageRng::from_seed_u64(s[k]))
                    .collect()
            })
            .collect()
    }

    /// Runs micro-batch `mb` backward, accumulates its parameter gradients, and returns the
    /// gradient with respect to the stage input (`None` at the first stage).
    pub fn backward(&mut self, mb: u64, upstream: Upstream) -> Result<Option<Activation>> {
        let started = Instant::now();
        let flights = self
            .in_flight
            .get(&mb)
            .ok_or(ModelError::UnknownMicroBatch(mb))?;
        // The seeds are made before the micro-batch leaves `in_flight`: a wrong upstream
        // leaves it there.
        let seeds = lane_seeds(flights, upstream)?;
        if self.is_last() {
            // Each seed is its lane's share of the step's loss: summed on the device, read once
            // a step with the gradient norm.
            let total = seeds.iter().map(|s| s.clone().inner()).reduce(|a, b| a + b);
            self.step_loss = match (self.step_loss.take(), total) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        }
        let flights = self
            .in_flight
            .remove(&mb)
            .ok_or(ModelError::UnknownMicroBatch(mb))?;
        let first = self.is_first();
        let jobs: Vec<_> = flights
            .into_iter()
            .zip(seeds)
            .map(|(flight, seed)| {
                move || -> LaneGrads {
                    let mut grads = seed.backward();
                    let input_grad = if first {
                        None
                    } else {
                        flight.input.grad_remove(&mut grads)
                    };
                    let params = flight
                        .layers
                        .iter()
                        .map(|l| take_grads(l, &mut grads))
                        .collect();
                    (input_grad, params)
                }
            })
            .collect();
        let (input_grads, lane_params): (Vec<_>, Vec<_>) = self.lanes.run(jobs).into_iter().unzip();
        let lane_count = lane_params.len();
        // Per layer: the accumulator and every lane's gradients, summed on the lanes.
        let mut per_layer: Vec<_> = std::mem::take(&mut self.grads)
            .into_iter()
            .map(|acc| (acc, Vec::with_capacity(lane_params.len())))
            .collect();
        for params in lane_params {
            for ((_, lanes), grads) in per_layer.iter_mut().zip(params) {
                lanes.push(grads);
            }
        }
        let lanes = self.lanes.at_most(lane_count);
        self.grads = lanes.map(per_layer, |(mut acc, lanes)| {
            for grads in lanes {
                for (acc, g) in acc.iter_mut().zip(grads) {
                    *acc = match (acc.take(), g) {
                        (Some(a), Some(g)) => Some(a + g),
                        (a, g) => a.or(g),
                    };
                }
            }
            acc
        });
        let input_grad = input_grads
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .map(Activation::concat)
            .transpose()?;
        self.accumulated += 1;
        self.times.backward_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(input_grad)
    }
}

/// Runs one lane's slice of a micro-batch through the stage's layers (and the loss, given
/// targets).
fn lane_forward<M: PipelineModel>(
    model: &M,
    start: usize,
    first: bool,
    layers: Vec<M::Layer>,
    input: Activation,
    targets: Option<Activation>,
    rngs: &mut [StageRng],
) -> Result<(LaneFlight<M::Layer>, StageOutput)> {
    let examples = input.batch_size();
    let input = if first { input } else { input.into_leaf() };
    let mut x = input.clone();
    // With targets the last layer runs into the loss (`forward_loss`).
    let through = layers.len().saturating_sub(usize::from(targets.is_some()));
    for (k, (layer, rng)) in layers[..through].iter().zip(rngs.iter_mut()).enumerate() {
        x = model.forward(start + k, layer, x, rng)?;
    }
    let (produced, output) = match targets {
        Some(targets) => {
            let (k, last) = (through, layers.get(through));
            let (Some(layer), Some(rng)) = (last, rngs.get_mut(k)) else {
                return Err(ModelError::InvalidConfig(
                    "a stage of no layers has no loss".into(),
                ));
            };
            let loss = model.forward_loss(start + k, layer, x, &targets, rng)?;
            (Produced::Loss(loss), StageOutput::LossKept)
        }
        None => {
            let out = x.detached();
            (Produced::Activation(x), StageOutput::Activation(out))
        }
    };
    let flight = LaneFlight {
        input,
        produced,
        examples,
        layers,
    };
    Ok((flight, output))
}

/// One output from the lanes' outputs: their activations joined in order, or the loss they
/// keep on the device.
fn join_outputs(outputs: Vec<StageOutput>) -> Result<StageOutput> {
    let activations: Vec<Activation> = outputs
        .into_iter()
        .filter_map(|output| match output {
            StageOutput::Activation(a) => Some(a),
            StageOutput::Loss(_) | StageOutput::LossKept => None,
        })
        .collect();
    if activations.is_empty() {
        Ok(StageOutput::LossKept)
    } else {
        Activation::concat(activations).map(StageOutput::Activation)
    }
}

/// Why a loss cannot start the backward of a stage that is not the last.
const LOSS_ONLY_AT_LAST: &str = "only the last stage backpropagates a loss";
/// Why a gradient cannot start the backward of the last stage.
const LAST_TAKES_LOSS: &str = "the last stage backpropagates its loss, not a gradient";

/// The scalar each lane backpropagates: its loss weighted by its share of the examples (times
/// `scale`) at the last stage, else `sum(y * dL/dy)` with its slice of the upstream gradient.
fn lane_seeds<L>(flights: &[LaneFlight<L>], upstream: Upstream) -> Result<Vec<Tensor<1>>> {
    let examples: Vec<usize> = flights.iter().map(|f| f.examples).collect();
    let total: usize = examples.iter().sum();
    let last = flights
        .first()
        .is_some_and(|f| matches!(f.produced, Produced::Loss(_)));
    match (last, upstream) {
        (true, Upstream::Loss { scale }) => flights
            .iter()
            .map(|f| match &f.produced {
                Produced::Loss(loss) => Ok(loss
                    .clone()
                    .mul_scalar(scale * f.examples as f32 / total as f32)),
                Produced::Activation(_) => Err(ModelError::WrongUpstream(LOSS_ONLY_AT_LAST)),
            })
            .collect(),
        (false, Upstream::Grad(dy)) => {
            if flights.len() > 1 && dy.batch_size() != total {
                return Err(ModelError::ShapeMismatch {
                    what: "upstream gradient".into(),
                    expected: format!("{total} examples, as many as the output"),
                    found: dy.dims(),
                });
            }
            flights
                .iter()
                .zip(dy.split(&examples))
                .map(|(f, dy)| match &f.produced {
                    Produced::Activation(y) => y.vjp_seed(dy),
                    Produced::Loss(_) => Err(ModelError::WrongUpstream(LAST_TAKES_LOSS)),
                })
                .collect()
        }
        (true, Upstream::Grad(_)) => Err(ModelError::WrongUpstream(LAST_TAKES_LOSS)),
        (false, Upstream::Loss { .. }) => Err(ModelError::WrongUpstream(LOSS_ONLY_AT_LAST)),
    }
}
