//! [`Stage`]: a contiguous range of layers that trains micro-batch by micro-batch.
//!
//! A stage keeps the autodiff graph of every micro-batch in flight between its forward and its
//! backward (the stage-boundary idiom of `notes/burn-0.22.md`: the received activation is a leaf
//! that requires a gradient; the backward is that of `sum(y * dL/dy)`), accumulates parameter
//! gradients in (layer, parameter) order, and steps AdamW once per training step with a clipping
//! factor computed from the global norm the caller supplies.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::tensor::{Device, Tensor};

use crate::activation::Activation;
use crate::codec::{extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::lanes::{DEFAULT_LANE_MIN_FLOPS, Lanes, default_lanes, split_sizes};
use crate::optim::{OptimizerConfig, ParamState, step_layer};
use crate::params::{ParamInfo, param_infos, param_values, take_grads, with_fresh_leaves};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;
use crate::wire::{WireDType, WireLimits, tensor_values};

/// Serialises seeding + initialisation: the backend RNG is process-global, so two stages built at
/// once on different threads would interleave their draws.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// How a stage runs.
#[derive(Debug, Clone, PartialEq)]
pub struct StageConfig {
    /// AdamW, schedule and clipping.
    pub optimizer: OptimizerConfig,
    /// Element type of activations and gradients this stage sends.
    pub wire_dtype: WireDType,
    /// Bounds on what this stage accepts from the wire.
    pub wire_limits: WireLimits,
    /// Slices of every micro-batch that train at the same time, each on a CPU thread of its own
    /// (Burn's CPU kernels use a second core poorly; a slice per core uses it fully). 1 runs the
    /// micro-batch whole, on as many threads as the caller's rayon pool has; devices other than
    /// the CPU always do.
    /// Default: [`default_lanes`]; at most [`crate::MAX_LANES`].
    pub lanes: usize,
    /// Smallest estimated forward work of a slice (FLOPs, `2 x parameters x positions`) worth a
    /// lane: smaller micro-batches are cut into fewer slices, or none. Default:
    /// [`DEFAULT_LANE_MIN_FLOPS`].
    pub lane_min_flops: f64,
}

impl Default for StageConfig {
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::default(),
            wire_dtype: WireDType::default(),
            wire_limits: WireLimits::default(),
            lanes: default_lanes(),
            lane_min_flops: DEFAULT_LANE_MIN_FLOPS,
        }
    }
}

/// What a forward produced.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "a short-lived value returned once per micro-batch; boxing buys nothing"
)]
pub enum StageOutput {
    /// The activation to send to the next stage (cut from this stage's graph).
    Activation(Activation),
    /// The micro-batch loss (last stage).
    Loss(f32),
}

/// What starts a backward.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "a short-lived value passed once per micro-batch; boxing buys nothing"
)]
pub enum Upstream {
    /// At the last stage: backpropagate the loss multiplied by `scale` (1 / micro-batches per
    /// step, so that the accumulated gradient is that of the mean loss).
    Loss {
        /// Loss multiplier.
        scale: f32,
    },
    /// Elsewhere: the gradient of the loss with respect to this stage's output.
    Grad(Activation),
}

/// Wall-clock time spent in each phase since the last optimizer step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Forward passes, ms.
    pub forward_ms: f64,
    /// Backward passes including gradient accumulation, ms.
    pub backward_ms: f64,
    /// Optimizer steps, ms.
    pub optimizer_ms: f64,
}

/// Size of one layer's slice of the flat gradient buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpan {
    /// Layer index in the model.
    pub layer: usize,
    /// First element (f32) of the layer in the flat buffer.
    pub offset: usize,
    /// Number of f32 elements.
    pub len: usize,
}

/// What an optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step that was applied (0-based).
    pub step: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient multiplier from clipping.
    pub clip_scale: f32,
    /// Time spent in forward, backward and this optimizer step during the finished step.
    pub times: PhaseTimes,
}

enum Produced {
    Activation(Activation),
    Loss(Tensor<1>),
}

/// One lane's slice of a micro-batch between its forward and its backward.
struct LaneFlight<L> {
    input: Activation,
    produced: Produced,
    examples: usize,
    /// The stage's layers as this lane ran them (over parameter leaves of its own when the
    /// micro-batch was cut, see [`with_fresh_leaves`]): its gradients are found through them.
    layers: Vec<L>,
}

/// What one lane's backward hands back: the input gradient and, per layer, the parameter
/// gradients in visit order.
type LaneGrads = (Option<Activation>, Vec<Vec<Option<Tensor<1>>>>);

/// One pipeline stage: layers `range` of `model` on `device`.
pub struct Stage<M: PipelineModel> {
    model: Arc<M>,
    range: Range<usize>,
    device: Device,
    config: StageConfig,
    pub(crate) layers: Vec<M::Layer>,
    pub(crate) infos: Vec<Vec<ParamInfo>>,
    grads: Vec<Vec<Option<Tensor<1>>>>,
    accumulated: usize,
    pub(crate) states: Vec<Vec<ParamState>>,
    pub(crate) step: u64,
    pub(crate) rngs: Vec<StageRng>,
    in_flight: HashMap<u64, Vec<LaneFlight<M::Layer>>>,
    lanes: Lanes,
    times: PhaseTimes,
}

/// Builds layers `range` of `model` on `device`, layer `i` from the backend RNG seeded with
/// [`layer_seed`]`(seed, i)`, and materialises every (lazily initialised) parameter before the
/// next layer is seeded. Stages and reference models built this way agree weight for weight, in
/// any process. Serialised by a process-wide lock because the backend RNG is global.
pub fn init_layers<M: PipelineModel + ?Sized>(
    model: &M,
    range: Range<usize>,
    seed: u64,
    device: &Device,
) -> Vec<M::Layer> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    range
        .map(|index| {
            device.seed(layer_seed(seed, index));
            let layer = model.init_layer(index, device);
            param_infos(&layer);
            layer
        })
        .collect()
}

/// The initial random stream of layer `index`: travels with the layer in its state.
fn layer_rng(seed: u64, index: usize) -> StageRng {
    StageRng::from_seed_u64(layer_seed(!seed, index))
}

/// The seed of layer `index` of a model seeded with `seed`: the same in every process, so that
/// stages built on their own hold the weights of the unsplit model.
pub fn layer_seed(seed: u64, index: usize) -> u64 {
    // splitmix64 of the pair, so neighbouring layers get unrelated streams.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<M: PipelineModel> Stage<M> {
    /// Builds layers `range` of `model` on `device` (made autodiff if it is not), every layer
    /// initialised from [`layer_seed`]`(seed, layer)`.
    pub fn new(
        model: Arc<M>,
        range: Range<usize>,
        seed: u64,
        device: &Device,
        config: StageConfig,
    ) -> Result<Self> {
        let n = model.num_layers();
        if range.start >= range.end || range.end > n {
            return Err(ModelError::InvalidLayerRange {
                start: range.start,
                end: range.end,
                num_layers: n,
            });
        }
        config.optimizer.validate()?;
        let device = if device.is_autodiff() {
            device.clone()
        } else {
            device.clone().autodiff()
        };
        let lanes = Lanes::new(
            if device.clone().inner() == Device::flex() {
                config.lanes
            } else {
                1
            },
            default_lanes(),
        )?;
        let layers = init_layers(model.as_ref(), range.clone(), seed, &device);
        let infos: Vec<Vec<ParamInfo>> = layers.iter().map(param_infos).collect();
        let grads = infos.iter().map(|i| vec![None; i.len()]).collect();
        let states = infos.iter().map(|i| vec![None; i.len()]).collect();
        Ok(Self {
            rngs: range.clone().map(|i| layer_rng(seed, i)).collect(),
            model,
            range,
            device,
            config,
            layers,
            infos,
            grads,
            accumulated: 0,
            states,
            step: 0,
            in_flight: HashMap::new(),
            lanes,
            times: PhaseTimes::default(),
        })
    }

    /// Moves the learning-rate schedule to `step` without touching weights or moments: a stage
    /// restored from an older checkpoint rejoins a job that went on without it, and layers
    /// fetched from live holders must then agree with the job's step.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// The layers this stage runs.
    pub fn layer_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The model description.
    pub fn model(&self) -> &Arc<M> {
        &self.model
    }

    /// The (autodiff) device the stage runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stage's configuration.
    pub fn config(&self) -> &StageConfig {
        &self.config
    }

    /// Whether the stage holds layer 0 (its input comes from the sampler).
    pub fn is_first(&self) -> bool {
        self.range.start == 0
    }

    /// Whether the stage holds the last layer (it computes the loss).
    pub fn is_last(&self) -> bool {
        self.range.end == self.model.num_layers()
    }

    /// Optimizer steps applied so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The random stream of layer `layer` (a model index).
    pub fn layer_rng(&self, layer: usize) -> Option<&StageRng> {
        self.local(layer).map(|k| &self.rngs[k])
    }

    /// Names and shapes of the parameters of layer `layer` (a model index), in visit order.
    pub fn param_infos(&self, layer: usize) -> Option<&[ParamInfo]> {
        self.local(layer).map(|k| self.infos[k].as_slice())
    }

    /// The parameter values of layer `layer` (a model index), in visit order, read back from
    /// the device: for inspection and tests.
    pub fn param_values(&self, layer: usize) -> Result<Vec<Vec<f32>>> {
        let k = self.local(layer).ok_or(ModelError::LayerOutOfRange {
            layer,
            expected: self.range.clone(),
        })?;
        param_values(&self.layers[k])
            .into_iter()
            .map(|t| tensor_values(t.into_data()))
            .collect()
    }

    /// Number of parameters (scalars) in the stage.
    pub fn num_params(&self) -> usize {
        self.infos.iter().flatten().map(ParamInfo::numel).sum()
    }

    /// Micro-batches whose backward has not run yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Micro-batches whose gradients are accumulated since the last step.
    pub fn accumulated_micro_batches(&self) -> usize {
        self.accumulated
    }

    /// Time spent in forward and backward since the last optimizer step.
    pub fn phase_times(&self) -> PhaseTimes {
        self.times
    }

    pub(crate) fn local(&self, layer: usize) -> Option<usize> {
        self.range
            .contains(&layer)
            .then(|| layer - self.range.start)
    }

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
        let examples: Vec<usize> = flights.iter().map(|f| f.examples).collect();
        let output = join_outputs(outputs, &examples)?;
        self.in_flight.insert(mb, flights);
        self.times.forward_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(output)
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

    /// [`Stage::forward`] from and to wire bytes, for every stage but the first (whose input is
    /// the batch: call [`Stage::forward`] and [`Stage::encode_output`]): decodes the input and
    /// encodes the output activation.
    pub fn forward_wire(
        &mut self,
        mb: u64,
        input: &[u8],
        targets: Option<&Activation>,
    ) -> Result<WireOutput> {
        let input = Activation::from_wire(input, &self.config.wire_limits, &self.device)?;
        let out = self.forward(mb, input, targets)?;
        self.encode_output(out)
    }

    /// Encodes a forward result for the wire with the configured dtype.
    pub fn encode_output(&self, out: StageOutput) -> Result<WireOutput> {
        Ok(match out {
            StageOutput::Activation(a) => {
                WireOutput::Activation(a.to_wire(self.config.wire_dtype)?)
            }
            StageOutput::Loss(l) => WireOutput::Loss(l),
        })
    }

    /// [`Stage::backward`] with the upstream gradient as wire bytes (`None` at the last stage,
    /// which uses `loss_scale`); returns the input gradient as wire bytes.
    pub fn backward_wire(
        &mut self,
        mb: u64,
        upstream: Option<&[u8]>,
        loss_scale: f32,
    ) -> Result<Option<Vec<u8>>> {
        let upstream = match upstream {
            Some(bytes) => Upstream::Grad(Activation::from_wire(
                bytes,
                &self.config.wire_limits,
                &self.device,
            )?),
            None => Upstream::Loss { scale: loss_scale },
        };
        self.backward(mb, upstream)?
            .map(|g| g.to_wire(self.config.wire_dtype))
            .transpose()
    }

    /// Where each layer's gradients lie in [`Stage::export_grads`], in f32 elements.
    pub fn grad_layout(&self) -> Vec<LayerSpan> {
        let mut offset = 0;
        self.infos
            .iter()
            .enumerate()
            .map(|(k, infos)| {
                let len = infos.iter().map(ParamInfo::numel).sum();
                let span = LayerSpan {
                    layer: self.range.start + k,
                    offset,
                    len,
                };
                offset += len;
                span
            })
            .collect()
    }

    /// The squared L2 norm of this stage's accumulated gradients. Sum it over all stages of a
    /// pipeline (after the data-parallel reduction) and pass it to [`Stage::optimizer_step`].
    pub fn grad_sq_norm(&self) -> f64 {
        let grads: Vec<Tensor<1>> = self.grads.iter().flatten().flatten().cloned().collect();
        self.per_layer_lanes()
            .map(grads, |g| g.square().sum().into_scalar::<f32>() as f64)
            .into_iter()
            .sum()
    }

    /// The accumulated gradients as one little-endian f32 buffer, layer by layer, parameters in
    /// visit order (zeros where a parameter got no gradient): the unit of the data-parallel
    /// all-reduce, identical in layout on every replica.
    pub fn export_grads(&self) -> Result<Vec<u8>> {
        let total: usize = self.grad_layout().iter().map(|s| s.len).sum();
        let mut out = Vec::with_capacity(total * 4);
        for (grads, infos) in self.grads.iter().zip(&self.infos) {
            for (g, info) in grads.iter().zip(infos) {
                match g {
                    Some(g) => extend_f32_le(&mut out, &tensor_values(g.to_data())?),
                    None => out.resize(out.len() + info.numel() * 4, 0),
                }
            }
        }
        Ok(out)
    }

    /// Replaces the accumulated gradients by `bytes` (the reduced result of the all-reduce, in
    /// the layout of [`Stage::export_grads`]).
    pub fn import_grads(&mut self, bytes: &[u8]) -> Result<()> {
        let expected = self.num_params() * 4;
        if bytes.len() != expected {
            return Err(ModelError::GradLength {
                expected,
                found: bytes.len(),
            });
        }
        let inner = self.device.clone().inner();
        let mut offset = 0;
        for (grads, infos) in self.grads.iter_mut().zip(&self.infos) {
            for (g, info) in grads.iter_mut().zip(infos) {
                let n = info.numel();
                let values = f32_from_le(&bytes[offset..offset + n * 4]);
                offset += n * 4;
                *g = Some(Tensor::from_data(
                    burn::tensor::TensorData::new(values, [n]),
                    &inner,
                ));
            }
        }
        Ok(())
    }

    /// Drops accumulated gradients (for example after a failed step that will be retried).
    pub fn clear_grads(&mut self) {
        self.grads.iter_mut().flatten().for_each(|g| *g = None);
        self.accumulated = 0;
    }

    /// Drops every micro-batch in flight (their graphs are freed), for example when a step is
    /// abandoned because a neighbour was lost.
    pub fn abort_in_flight(&mut self) {
        self.in_flight.clear();
    }

    /// Drops micro-batch `mb` if it is in flight (a forward-only evaluation).
    pub fn abort_micro_batch(&mut self, mb: u64) {
        self.in_flight.remove(&mb);
    }

    /// Applies one AdamW step with the accumulated gradients, clipped by `global_sq_norm` (the
    /// sum of [`Stage::grad_sq_norm`] over all stages, after the data-parallel reduction), then
    /// clears the gradients.
    pub fn optimizer_step(&mut self, global_sq_norm: f64) -> Result<StepReport> {
        if !self.in_flight.is_empty() {
            return Err(ModelError::MicroBatchesInFlight(self.in_flight.len()));
        }
        let started = Instant::now();
        let opt = &self.config.optimizer;
        let clip_scale = opt.clip_scale(global_sq_norm)?;
        let lr = opt.lr_at(self.step);
        let adamw = opt.adamw();
        let fresh: Vec<_> = self.infos.iter().map(|i| vec![None; i.len()]).collect();
        let work: Vec<_> = std::mem::take(&mut self.layers)
            .into_iter()
            .zip(std::mem::replace(&mut self.grads, fresh))
            .zip(std::mem::take(&mut self.states))
            .collect();
        // Layers are independent: each lane steps some of them on its own thread.
        (self.layers, self.states) = self
            .per_layer_lanes()
            .map(work, |((layer, grads), mut states)| {
                let layer = step_layer(&adamw, lr, clip_scale, layer, grads, &mut states);
                (layer, states)
            })
            .into_iter()
            .unzip();
        let times = PhaseTimes {
            optimizer_ms: started.elapsed().as_secs_f64() * 1e3,
            ..self.times
        };
        let report = StepReport {
            step: self.step,
            lr,
            clip_scale,
            times,
        };
        self.step += 1;
        self.accumulated = 0;
        self.times = PhaseTimes::default();
        Ok(report)
    }

    /// The lanes for work spread by layer or parameter (norms, optimizer updates: about ten
    /// FLOPs per parameter): all of them when that is worth a lane, else one.
    fn per_layer_lanes(&self) -> Lanes {
        let worth = 10.0 * self.num_params() as f64 >= self.config.lane_min_flops;
        self.lanes
            .at_most(if worth { self.lanes.count() } else { 1 })
    }

    /// Marks imported layers as carrying no accumulated gradient.
    pub(crate) fn reset_layer_grads(&mut self, local: usize) {
        self.grads[local] = vec![None; self.infos[local].len()];
    }

    /// Fails while a micro-batch is in flight: state may only change between micro-batches.
    pub(crate) fn ensure_idle(&self) -> Result<()> {
        if !self.in_flight.is_empty() {
            return Err(ModelError::MicroBatchesInFlight(self.in_flight.len()));
        }
        Ok(())
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
    for (k, (layer, rng)) in layers.iter().zip(rngs.iter_mut()).enumerate() {
        x = model.forward(start + k, layer, x, rng)?;
    }
    let (produced, output) = match targets {
        Some(targets) => {
            let loss = model.loss(x, &targets)?;
            let value = loss.clone().into_scalar::<f32>();
            if !value.is_finite() {
                return Err(ModelError::NotFinite("loss"));
            }
            (Produced::Loss(loss), StageOutput::Loss(value))
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

/// One output from the lanes' outputs: their losses weighted by their shares of the examples,
/// or their activations joined in order.
fn join_outputs(outputs: Vec<StageOutput>, examples: &[usize]) -> Result<StageOutput> {
    let total: usize = examples.iter().sum();
    let mut loss = 0.0f32;
    let mut activations = Vec::new();
    for (output, &n) in outputs.into_iter().zip(examples) {
        match output {
            StageOutput::Loss(l) => loss += l * n as f32 / total as f32,
            StageOutput::Activation(a) => activations.push(a),
        }
    }
    if activations.is_empty() {
        Ok(StageOutput::Loss(loss))
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

/// A forward result encoded for the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum WireOutput {
    /// Activation bytes for the next stage.
    Activation(Vec<u8>),
    /// The micro-batch loss (last stage).
    Loss(f32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::{Gpt, GptConfig};

    #[test]
    fn a_stage_can_move_to_a_trainer_thread() {
        fn assert_send<T: Send + 'static>() {}
        assert_send::<Stage<Gpt>>();
        let model = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
        let stage = Stage::new(model, 1..3, 0, &Device::flex(), StageConfig::default()).unwrap();
        let handle = std::thread::spawn(move || stage.num_params());
        assert_eq!(handle.join().unwrap(), 2 * 12_704);
    }

    #[test]
    fn layer_seeds_differ_between_layers_and_seeds() {
        assert_ne!(layer_seed(1, 0), layer_seed(1, 1));
        assert_ne!(layer_seed(1, 0), layer_seed(2, 0));
        assert_eq!(layer_seed(7, 3), layer_seed(7, 3));
    }

    #[test]
    fn invalid_ranges_are_refused() {
        let model = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
        for r in [2..2, 3..5] {
            assert!(matches!(
                Stage::new(model.clone(), r, 0, &Device::flex(), StageConfig::default()),
                Err(ModelError::InvalidLayerRange { .. })
            ));
        }
    }
}
