//! The accumulated gradients as the data-parallel all-reduce and clipping see them: one flat
//! little-endian f32 buffer of the same layout on every replica, and its squared norm.

use burn::tensor::{Float, Tensor};

use super::{LayerSpan, Stage, StepTotals};
use crate::codec::{extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::host::{read_data, read_scalar};
use crate::params::ParamInfo;
use crate::pipeline_model::PipelineModel;
use crate::wire::tensor_values;

impl<M: PipelineModel> Stage<M> {
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
    /// Summed on the device (each lane its layers') and read back once.
    pub fn grad_sq_norm(&self) -> Result<f64> {
        match self.grad_sq_norm_on_device() {
            Some(total) => Ok(f64::from(read_scalar::<f32, 1, Float>(
                total,
                "gradient norm",
            )?)),
            None => Ok(0.0),
        }
    }

    /// The step's training loss so far at the last stage (`None` elsewhere, or before any
    /// backward): the sum of each micro-batch's loss times its scale, read back once.
    pub fn step_loss(&self) -> Result<Option<f64>> {
        self.step_loss
            .clone()
            .map(|loss| finite_loss(read_scalar::<f32, 1, Float>(loss, "loss")?))
            .transpose()
    }

    /// [`Stage::grad_sq_norm`] and [`Stage::step_loss`] in one read-back: where no gradient
    /// crosses a data-parallel ring, the only blocking read of a step.
    pub fn step_totals(&self) -> Result<StepTotals> {
        Self::read_totals(self.totals_on_device(), self.step_loss_kept())
    }

    /// Whether the stage holds a step's loss (the last stage, after a backward).
    pub(crate) fn step_loss_kept(&self) -> bool {
        self.step_loss.is_some()
    }

    /// The squared gradient norm and the step's loss (0 where there is none) as one tensor of
    /// two values on the device; `None` without either.
    pub(crate) fn totals_on_device(&self) -> Option<Tensor<1>> {
        let (norm, loss) = (self.grad_sq_norm_on_device(), self.step_loss.clone());
        if norm.is_none() && loss.is_none() {
            return None;
        }
        let zero = || Tensor::<1>::zeros([1], &self.device.clone().inner());
        Some(Tensor::cat(
            vec![norm.unwrap_or_else(zero), loss.unwrap_or_else(zero)],
            0,
        ))
    }

    /// Reads [`Stage::totals_on_device`] (summed over stages, perhaps) once; `has_loss` says
    /// whether a last stage contributed its loss.
    pub(crate) fn read_totals(totals: Option<Tensor<1>>, has_loss: bool) -> Result<StepTotals> {
        let Some(totals) = totals else {
            return Ok(StepTotals::default());
        };
        let values = tensor_values(read_data(totals, "gradient norm and loss")?)?;
        let [norm, loss] = values[..] else {
            return Err(ModelError::ReadBack(format!(
                "gradient norm and loss: {} values",
                values.len()
            )));
        };
        Ok(StepTotals {
            grad_sq_norm: f64::from(norm),
            loss: has_loss.then(|| finite_loss(loss)).transpose()?,
        })
    }

    /// The squared norm of the accumulated gradients, summed on the device (`None` without
    /// gradients).
    fn grad_sq_norm_on_device(&self) -> Option<Tensor<1>> {
        let grads: Vec<Tensor<1>> = self.grads.iter().flatten().flatten().cloned().collect();
        let sums = self.per_layer_lanes().map(grads, |g| g.square().sum());
        sums.into_iter().reduce(|a, b| a + b)
    }

    /// The accumulated gradients as one little-endian f32 buffer, layer by layer, parameters in
    /// visit order (zeros where a parameter got no gradient): the unit of the data-parallel
    /// all-reduce, identical in layout on every replica.
    /// Joined on the device and read back once (a read a parameter would drain a GPU's stream
    /// as often).
    pub fn export_grads(&self) -> Result<Vec<u8>> {
        let inner = self.device.clone().inner();
        let parts: Vec<Tensor<1>> = self
            .grads
            .iter()
            .zip(&self.infos)
            .flat_map(|(grads, infos)| grads.iter().zip(infos))
            .map(|(g, info)| {
                g.clone()
                    .unwrap_or_else(|| Tensor::zeros([info.numel()], &inner))
            })
            .collect();
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let flat = read_data(Tensor::cat(parts, 0), "gradients")?;
        let mut out = Vec::with_capacity(self.num_params() * 4);
        extend_f32_le(&mut out, &tensor_values(flat)?);
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
        self.step_loss = None;
    }
}

/// A step's loss, refused when it is not finite (a diverged step must not be applied).
fn finite_loss(loss: f32) -> Result<f64> {
    if loss.is_finite() {
        Ok(f64::from(loss))
    } else {
        Err(ModelError::NotFinite("loss"))
    }
}
