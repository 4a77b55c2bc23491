//! Per-layer cost measurements for the throughput and migration cost models.
//!
//! The planner chooses (D, P) and a partition from per-layer costs: compute time of forward,
//! backward and the optimizer update, bytes of parameters and optimizer state (what a migration
//! moves) and bytes of the activation leaving the layer (what a pipeline boundary after it
//! sends). A stage's backward is one graph traversal, so to attribute time to layers this
//! measurement runs every layer as its own graph (the stage-boundary idiom per layer) on a probe
//! micro-batch, without touching the stage's parameters, moments or random streams.

use std::time::Instant;

use burn::tensor::Gradients;

use crate::activation::Activation;
use crate::error::{ModelError, Result};
use crate::optim::step_layer;
use crate::params::{ParamInfo, take_grads};
use crate::pipeline_model::PipelineModel;
use crate::stage::Stage;

/// Measured costs of one layer on one probe micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerCost {
    /// Layer index in the model.
    pub layer: usize,
    /// Its name ([`PipelineModel::layer_name`]).
    pub name: String,
    /// Forward time, ms (mean over repeats).
    pub forward_ms: f64,
    /// Backward time, ms (mean over repeats).
    pub backward_ms: f64,
    /// AdamW update time, ms (mean over repeats).
    pub optimizer_ms: f64,
    /// Trainable scalars.
    pub param_count: usize,
    /// Bytes of parameters (f32).
    pub param_bytes: usize,
    /// Bytes of AdamW moments (two f32 per parameter).
    pub optimizer_state_bytes: usize,
    /// Bytes of the layer's output activation for this micro-batch (f32).
    pub output_bytes: usize,
    /// Device bytes the layer's forward kept for its backward (its graph and output), where the
    /// device's allocator reports them ([`device_memory`]; `None` on Flex).
    pub activation_bytes: Option<usize>,
}

/// How many runs a measurement makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    /// Runs discarded first: kernel compilation and autotuning happen at a shape's first use.
    pub warmup: usize,
    /// Runs measured (at least 1); each time is their median.
    pub repeats: usize,
}

/// Bytes in use and reserved by the device's allocator, where it reports them (CUDA; Flex does
/// not). Reserved pages are kept for reuse, so after a measurement the reserved bytes are the
/// most it held.
pub fn device_memory(device: &burn::tensor::Device) -> Option<(u64, u64)> {
    device
        .memory_pool_usage()
        .map(|u| (u.bytes_in_use, u.bytes_reserved))
}

/// The middle of `v` (the mean of the two middle values for an even count), 0 for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl<M: PipelineModel> Stage<M> {
    /// Measures every layer of the stage on a probe micro-batch: `input` is what the stage would
    /// receive, `targets` are needed at the last stage. Each time is the median of the measured
    /// runs, after the warm-up runs.
    pub fn measure_layer_costs(
        &self,
        input: Activation,
        targets: Option<&Activation>,
        runs: Runs,
    ) -> Result<Vec<LayerCost>> {
        self.ensure_idle()?;
        if self.is_last() && targets.is_none() {
            return Err(ModelError::MissingTargets);
        }
        let repeats = runs.repeats.max(1);
        let n = self.layers.len();
        let device = self.device().clone();
        let sync = || {
            device
                .sync()
                .map_err(|e| ModelError::ReadBack(format!("{e:?}")))
        };
        let model = self.model().clone();
        let opt = &self.config().optimizer;
        let mut rngs = self.rngs.clone();
        let mut states = self.states.clone();
        let (mut fwd, mut bwd, mut upd) = (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
        let mut output_bytes = vec![0usize; n];
        let mut kept = vec![None; n];
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        for run in 0..runs.warmup + repeats {
            let measured = run >= runs.warmup;
            let mut x = input.clone().into_device(&device);
            let mut graphs = Vec::with_capacity(n);
            for k in 0..n {
                let index = self.layer_range().start + k;
                let leaf = if k == 0 && self.is_first() {
                    x
                } else {
                    x.detached().into_leaf()
                };
                let before = device_memory(&device);
                let t = Instant::now();
                let y = model.forward(index, &self.layers[k], leaf.clone(), &mut rngs[k])?;
                let loss = match targets {
                    Some(tg) if k + 1 == n && self.is_last() => {
                        Some(model.loss(y.clone(), &tg.clone().into_device(&device))?)
                    }
                    _ => None,
                };
                sync()?;
                if measured {
                    fwd[k].push(ms(t));
                    kept[k] = before
                        .zip(device_memory(&device))
                        .map(|((a, _), (b, _))| b.saturating_sub(a) as usize);
                }
                output_bytes[k] = y.dims().iter().product::<usize>() * 4;
                x = y.detached();
                graphs.push((leaf, y, loss));
            }
            let mut upstream: Option<Activation> = None;
            for k in (0..n).rev() {
                let (leaf, y, loss) = graphs.pop().ok_or(ModelError::UnknownMicroBatch(0))?;
                let t = Instant::now();
                let seed = match (loss, upstream.take()) {
                    (Some(loss), _) => loss,
                    (None, Some(dy)) => y.vjp_seed(dy)?,
                    (None, None) => y.vjp_seed(ones_like(&y))?,
                };
                let mut grads: Gradients = seed.backward();
                upstream = leaf.grad_remove(&mut grads);
                let param_grads = take_grads(&self.layers[k], &mut grads);
                sync()?;
                if measured {
                    bwd[k].push(ms(t));
                }
                let t = Instant::now();
                let lr = opt.lr_at(self.step());
                let updated = step_layer(
                    &opt.update(lr, 1.0, self.config().ops),
                    self.layers[k].clone(),
                    param_grads,
                    &mut states[k],
                );
                // Force the lazy update to run before the clock stops; the result is discarded.
                crate::params::param_infos(&updated);
                sync()?;
                if measured {
                    upd[k].push(ms(t));
                }
            }
        }
        Ok((0..n)
            .map(|k| {
                let layer = self.layer_range().start + k;
                let param_count: usize = self.infos[k].iter().map(ParamInfo::numel).sum();
                LayerCost {
                    layer,
                    name: model.layer_name(layer),
                    forward_ms: median(std::mem::take(&mut fwd[k])),
                    backward_ms: median(std::mem::take(&mut bwd[k])),
                    optimizer_ms: median(std::mem::take(&mut upd[k])),
                    param_count,
                    param_bytes: param_count * 4,
                    optimizer_state_bytes: param_count * 8,
                    output_bytes: output_bytes[k],
                    activation_bytes: kept[k],
                }
            })
            .collect())
    }
}

fn ones_like(a: &Activation) -> Activation {
    match a {
        Activation::Hidden(t) => Activation::Hidden(t.ones_like()),
        Activation::Features(t) => Activation::Features(t.ones_like()),
        Activation::Tokens(t) => Activation::Tokens(t.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_middle_run() {
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 100.0]), 3.0);
        assert_eq!(median(vec![]), 0.0);
    }
}
