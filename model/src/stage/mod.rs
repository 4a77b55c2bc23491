//! [`Stage`]: a contiguous range of layers that trains micro-batch by micro-batch.
//!
//! A stage keeps the autodiff graph of every micro-batch in flight between its forward and its
//! backward (the stage-boundary idiom of `notes/burn-0.22.md`: the received activation is a leaf
//! that requires a gradient; the backward is that of `sum(y * dL/dy)`), accumulates parameter
//! gradients in (layer, parameter) order, and steps AdamW once per training step with a clipping
//! factor computed from the global norm the caller supplies.
//!
//! The stage's work is cut by job: [`init`] builds layers from per-layer seeds, `execute` runs
//! micro-batches forward and backward on lanes, `wire_io` is the same at the wire-bytes
//! boundary between stages, `grads` lays out, exchanges and measures the accumulated gradients
//! for the data-parallel all-reduce and clipping, `optimize` applies AdamW, and `params_io`
//! reads and writes the parameter values alone (for an outer optimizer between groups), `outer`
//! keeps the DiLoCo outer state that travels with each layer. The stage's
//! state export and import are `crate::state`'s; its cost probe is `crate::costs`'.

mod execute;
mod flight;
mod grads;
mod init;
mod optimize;
mod outer;
mod params_io;
mod wire_io;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::{Device, Tensor};

use crate::activation::Activation;
use crate::error::{ModelError, Result};
use crate::host::read_data;
use crate::lanes::{DEFAULT_LANE_MIN_FLOPS, Lanes, default_lanes};
use crate::ops::OpSet;
use crate::optim::{OptimizerConfig, ParamState};
use crate::params::{ParamInfo, param_infos, param_values};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;
use crate::wire::{WireDType, WireLimits, tensor_values};

use flight::LaneFlight;
pub use init::{init_layers, layer_seed};

/// A forward result encoded for the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum WireOutput {
    /// Activation bytes for the next stage.
    Activation(Vec<u8>),
    /// An evaluated micro-batch's loss (last stage).
    Loss(f32),
    /// A trained micro-batch's loss, kept on the device (last stage; see
    /// [`StageOutput::LossKept`]).
    LossKept,
}

/// How a stage runs.
#[derive(Debug, Clone, PartialEq)]
pub struct StageConfig {
    /// AdamW, schedule and clipping.
    pub optimizer: OptimizerConfig,
    /// The stage's own operations (the optimizer's update): native (AdamW in one pass a
    /// parameter, where the device has it) or Burn's. The model's are its own configuration's.
    pub ops: OpSet,
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
            ops: OpSet::Native,
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
    /// An evaluated micro-batch's loss (last stage), read back.
    Loss(f32),
    /// A trained micro-batch's loss (last stage), left on the device: its backward adds it to
    /// the step's loss, which [`Stage::step_totals`] reads with the gradient norm, once a step.
    /// A read per micro-batch would drain a GPU's stream M times a step.
    LossKept,
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

/// What a step's one read-back says at a stage.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepTotals {
    /// [`Stage::grad_sq_norm`].
    pub grad_sq_norm: f64,
    /// [`Stage::step_loss`].
    pub loss: Option<f64>,
}

/// One layer's DiLoCo outer state ([`outer`]), in the order of the layer's parameter values.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerOuter {
    /// The round's outer weights.
    pub anchor: Vec<f32>,
    /// The outer optimizer's momentum.
    pub velocity: Vec<f32>,
}

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
    /// The step's training loss so far, on the device (last stage): the sum of the backward
    /// seeds, each micro-batch's loss times its scale.
    step_loss: Option<Tensor<1>>,
    pub(crate) states: Vec<Vec<ParamState>>,
    pub(crate) step: u64,
    pub(crate) rngs: Vec<StageRng>,
    /// Each layer's DiLoCo outer state, once the outer loop has begun ([`outer`]).
    pub(crate) outer: Vec<Option<LayerOuter>>,
    in_flight: HashMap<u64, Vec<LaneFlight<M::Layer>>>,
    lanes: Lanes,
    times: PhaseTimes,
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
            outer: vec![None; infos.len()],
            rngs: range.clone().map(|i| init::layer_rng(seed, i)).collect(),
            model,
            range,
            device,
            config,
            layers,
            infos,
            grads,
            accumulated: 0,
            step_loss: None,
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
            .map(|t| tensor_values(read_data(t, "parameter values")?))
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

    /// Drops every micro-batch in flight (their graphs are freed), for example when a step is
    /// abandoned because a neighbour was lost.
    pub fn abort_in_flight(&mut self) {
        self.in_flight.clear();
    }

    /// Drops micro-batch `mb` if it is in flight (a forward-only evaluation).
    pub fn abort_micro_batch(&mut self, mb: u64) {
        self.in_flight.remove(&mb);
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
