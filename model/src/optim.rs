//! The per-stage optimizer: Burn's AdamW, a warmup + cosine schedule, and global-norm clipping.
//!
//! Burn's `ModuleOptimizer` keys its state by `ParamId`, which is random per process, and clips
//! per parameter. A pipeline stage needs state keyed by (layer, parameter) so that it can be
//! exported layer by layer, and clipping by the norm over *all* stages and replicas, which only
//! the caller can compute. So this module drives Burn's [`AdamW`] through its per-tensor
//! [`Optimizer::step`] and keeps the per-parameter [`AdamWState`] in visit order; with the
//! native operations the same arithmetic runs as one pass a parameter (`ops::adamw`).

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::{AdamW, AdamWConfig, AdamWState, Optimizer};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::ops::OpSet;
use crate::ops::adamw::{self, AdamWStep};
use crate::params::Leaf;

/// Hyper-parameters of AdamW, the learning-rate schedule and clipping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Learning rate at the end of warmup.
    pub peak_lr: f64,
    /// Learning rate at the end of the cosine decay (and after).
    pub min_lr: f64,
    /// Steps of linear warmup from `peak_lr / warmup_steps`.
    pub warmup_steps: u64,
    /// Step at which the cosine decay reaches `min_lr`.
    pub total_steps: u64,
    /// AdamW beta 1.
    pub beta_1: f32,
    /// AdamW beta 2.
    pub beta_2: f32,
    /// AdamW epsilon. With very small values (1e-8) AdamW turns rounding noise in gradients
    /// that are zero in exact arithmetic (the GPT's attention key bias) into full-size steps, so
    /// runs that split a batch differently drift apart there (measured: 2e-3 after 10 steps);
    /// 1e-5 keeps such runs within 1e-4.
    pub epsilon: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value; `None` disables clipping.
    pub max_grad_norm: Option<f32>,
}

impl Default for OptimizerConfig {
    /// GPT-2-style settings (PyTorch's epsilon and weight decay, not Burn's defaults).
    fn default() -> Self {
        Self {
            peak_lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            total_steps: 10_000,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

impl OptimizerConfig {
    /// Checks the values are usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ModelError::InvalidConfig(m.to_string()));
        if !(self.peak_lr.is_finite() && self.peak_lr >= 0.0) {
            return bad("peak_lr must be finite and non-negative");
        }
        if !(self.min_lr.is_finite() && self.min_lr >= 0.0 && self.min_lr <= self.peak_lr) {
            return bad("min_lr must be in 0..=peak_lr");
        }
        if !(0.0..1.0).contains(&self.beta_1) || !(0.0..1.0).contains(&self.beta_2) {
            return bad("betas must be in [0, 1)");
        }
        if !(self.epsilon > 0.0 && self.weight_decay >= 0.0) {
            return bad("epsilon must be positive and weight_decay non-negative");
        }
        if self
            .max_grad_norm
            .is_some_and(|n| !(n > 0.0 && n.is_finite()))
        {
            return bad("max_grad_norm must be positive");
        }
        Ok(())
    }

    /// Learning rate of step `step` (0-based): linear warmup to `peak_lr`, then cosine decay
    /// to `min_lr` at `total_steps`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.peak_lr - self.min_lr) * cosine
    }

    /// The factor that scales gradients so that their global norm is at most `max_grad_norm`,
    /// given the squared global norm summed over every stage and replica.
    pub fn clip_scale(&self, global_sq_norm: f64) -> Result<f32> {
        if !global_sq_norm.is_finite() || global_sq_norm < 0.0 {
            return Err(ModelError::NotFinite("global squared gradient norm"));
        }
        Ok(match self.max_grad_norm {
            Some(max) => {
                let norm = global_sq_norm.sqrt();
                if norm > max as f64 {
                    (max as f64 / (norm + 1e-6)) as f32
                } else {
                    1.0
                }
            }
            None => 1.0,
        })
    }

    /// Burn's AdamW configuration with these hyper-parameters: what a plain Burn training loop
    /// needs to train exactly as a [`crate::Stage`] does (reference runs, benchmarks).
    pub fn adamw_config(&self) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_weight_decay(self.weight_decay)
    }

    /// One step's update at learning rate `lr` with gradients scaled by `scale`: AdamW as one
    /// operation per parameter where `ops` is native and the device has it, else Burn's.
    pub(crate) fn update(&self, lr: f64, scale: f32, ops: OpSet) -> LayerUpdate {
        LayerUpdate {
            adamw: self.adamw_config().build(),
            lr,
            scale,
            fused: (ops == OpSet::Native).then_some(AdamWStep {
                lr,
                grad_scale: scale,
                beta_1: self.beta_1,
                beta_2: self.beta_2,
                epsilon: self.epsilon,
                weight_decay: self.weight_decay,
            }),
        }
    }
}

/// How one step updates each parameter.
pub(crate) struct LayerUpdate {
    adamw: AdamW,
    lr: f64,
    scale: f32,
    /// The one-pass AdamW's settings, where it runs.
    fused: Option<AdamWStep>,
}

/// AdamW state of one parameter (flattened): `None` before its first update.
pub(crate) type ParamState = Option<AdamWState<1>>;

/// Applies one AdamW update to every parameter of a layer that has a gradient.
struct StepMapper<'a> {
    update: &'a LayerUpdate,
    grads: std::vec::IntoIter<Option<Tensor<1>>>,
    states: std::slice::IterMut<'a, ParamState>,
}

impl ModuleMapper for StepMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (Some(Some(grad)), Some(state)) = (self.grads.next(), self.states.next()) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let leaf = Leaf::of(&tensor);
        let dims = tensor.dims();
        let flat = tensor.inner().reshape([dims.iter().product::<usize>()]);
        let u = self.update;
        let updated = match u.fused {
            Some(h) if adamw::fits(&flat, &grad, state.as_ref()) => {
                let (updated, new_state) = adamw::step(flat, &grad, state.take(), h);
                *state = Some(new_state);
                updated
            }
            _ => {
                let grad = if u.scale == 1.0 {
                    grad
                } else {
                    grad.mul_scalar(u.scale)
                };
                let (updated, new_state) = u.adamw.step(u.lr, flat, grad, state.take());
                *state = new_state;
                updated
            }
        };
        Param::from_mapped_value(id, leaf.wrap(updated.reshape(dims)), mapper)
    }
}

/// `layer` after one AdamW step `update` with `grads` (visit order, flattened); `states` holds
/// the layer's per-parameter states and is updated in place.
pub(crate) fn step_layer<L: Module>(
    update: &LayerUpdate,
    layer: L,
    grads: Vec<Option<Tensor<1>>>,
    states: &mut [ParamState],
) -> L {
    layer.map(&mut StepMapper {
        update,
        grads: grads.into_iter(),
        states: states.iter_mut(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_min() {
        let c = OptimizerConfig {
            peak_lr: 1.0,
            min_lr: 0.1,
            warmup_steps: 4,
            total_steps: 104,
            ..OptimizerConfig::default()
        };
        assert_eq!(c.lr_at(0), 0.25);
        assert_eq!(c.lr_at(3), 1.0);
        assert_eq!(c.lr_at(4), 1.0);
        assert!((c.lr_at(54) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(104) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(10_000) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn clipping_scales_only_above_the_limit() {
        let c = OptimizerConfig {
            max_grad_norm: Some(2.0),
            ..OptimizerConfig::default()
        };
        assert_eq!(c.clip_scale(1.0).unwrap(), 1.0);
        assert!((c.clip_scale(16.0).unwrap() - 0.5).abs() < 1e-6);
        assert!(c.clip_scale(f64::NAN).is_err());
        let off = OptimizerConfig {
            max_grad_norm: None,
            ..c
        };
        assert_eq!(off.clip_scale(1e12).unwrap(), 1.0);
    }

    #[test]
    fn validate_rejects_bad_values() {
        let bad = OptimizerConfig {
            beta_1: 1.0,
            ..OptimizerConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(OptimizerConfig::default().validate().is_ok());
    }
}
