//! The accumulated gradients as the data-parallel all-reduce and clipping see them: one flat
//! little-endian f32 buffer of the same layout on every replica, and its squared norm.

use burn::tensor::{Float, Tensor};

use super::{LayerSpan, Stage};
use crate::codec::{extend_f32_le, f32_from_le};
use crate::error::{ModelError, Result};
use crate::host::read_scalar;
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
        let grads: Vec<Tensor<1>> = self.grads.iter().flatten().flatten().cloned().collect();
        let sums = self.per_layer_lanes().map(grads, |g| g.square().sum());
        match sums.into_iter().reduce(|a, b| a + b) {
            Some(total) => Ok(f64::from(read_scalar::<f32, 1, Float>(
                total,
                "gradient norm",
            )?)),
            None => Ok(0.0),
        }
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
}
