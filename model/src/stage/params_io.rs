//! The stage's parameter values alone, as one flat f32 vector in the layout of its gradients
//! ([`Stage::grad_layout`]): what an outer optimizer between groups (DiLoCo) reads, averages
//! and writes back. The optimizer's moments and the random streams are not part of it: each
//! group keeps its own inner optimizer, as DiLoCo does.

use burn::tensor::{Tensor, TensorData};

use super::Stage;
use crate::error::{ModelError, Result};
use crate::host::read_data;
use crate::params::{param_values, with_values};
use crate::pipeline_model::PipelineModel;
use crate::wire::tensor_values;

impl<M: PipelineModel> Stage<M> {
    /// Every parameter value of the stage, layer by layer in visit order, read back once.
    pub fn export_params(&self) -> Result<Vec<f32>> {
        let parts: Vec<Tensor<1>> = self.layers.iter().flat_map(param_values).collect();
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        tensor_values(read_data(Tensor::cat(parts, 0), "parameter values")?)
    }

    /// Replaces every parameter value by `values` ([`Stage::export_params`]'s layout); the
    /// optimizer's moments and the random streams stay, accumulated gradients are dropped.
    /// Refused while a micro-batch is in flight, or when the length is not the stage's.
    pub fn import_params(&mut self, values: &[f32]) -> Result<()> {
        self.ensure_idle()?;
        let expected = self.num_params();
        if values.len() != expected {
            return Err(ModelError::InvalidConfig(format!(
                "{} parameter values for a stage of {expected}",
                values.len()
            )));
        }
        let inner = self.device.clone().inner();
        let mut offset = 0;
        for local in 0..self.layers.len() {
            let tensors = self.infos[local]
                .iter()
                .map(|info| {
                    let n = info.numel();
                    let part = values[offset..offset + n].to_vec();
                    offset += n;
                    Tensor::from_data(TensorData::new(part, [n]), &inner)
                })
                .collect();
            self.layers[local] = with_values(self.layers[local].clone(), tensors);
            self.reset_layer_grads(local);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::params::ParamInfo;
    use crate::{Dataset, Sampler, token_batch};
    use crate::{Gpt, GptConfig, Pipeline, StageConfig, SyntheticTask, default_device};

    /// Elements of `infos`' parameters.
    fn numel(infos: &[ParamInfo]) -> usize {
        infos.iter().map(ParamInfo::numel).sum()
    }

    fn pipeline(seed: u64) -> Pipeline<Gpt> {
        let gpt = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
        let ranges = crate::even_ranges(4, 2).unwrap();
        Pipeline::new(
            gpt,
            &ranges,
            seed,
            &default_device(),
            StageConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn parameters_move_between_stages_and_set_what_they_compute() {
        let task = SyntheticTask::default_for(1, 64, 16).unwrap();
        let sampler = Sampler::new(1, task.len()).unwrap();
        let batch = token_batch(&task, &sampler, 0, 4, &default_device()).unwrap();
        let from = pipeline(1);
        let mut to = pipeline(2);
        assert_ne!(from.evaluate(&batch).unwrap(), to.evaluate(&batch).unwrap());
        for s in 0..2 {
            let values = from.stages()[s].export_params().unwrap();
            let layout: usize = (from.stages()[s].layer_range())
                .map(|l| numel(from.stages()[s].param_infos(l).unwrap()))
                .sum();
            assert_eq!(values.len(), layout);
            to.stages_mut()[s].import_params(&values).unwrap();
            assert_eq!(to.stages()[s].export_params().unwrap(), values);
        }
        assert_eq!(from.evaluate(&batch).unwrap(), to.evaluate(&batch).unwrap());
        let short = vec![0.0; 3];
        assert!(to.stages_mut()[0].import_params(&short).is_err());
    }

    #[test]
    fn importing_keeps_the_optimizer_moments() {
        let task = SyntheticTask::default_for(1, 64, 16).unwrap();
        let sampler = Sampler::new(1, task.len()).unwrap();
        let device = default_device();
        let batch = token_batch(&task, &sampler, 0, 4, &device).unwrap();
        let mut a = pipeline(1);
        let mut b = pipeline(1);
        for p in [&mut a, &mut b] {
            p.train_step(std::slice::from_ref(&batch)).unwrap();
        }
        // Writing back a stage's own values changes nothing: the next step (which reads the
        // moments the first left) is the same on both.
        for s in 0..2 {
            let values = b.stages()[s].export_params().unwrap();
            b.stages_mut()[s].import_params(&values).unwrap();
        }
        let next = token_batch(&task, &sampler, 4, 4, &device).unwrap();
        let la = a.train_step(std::slice::from_ref(&next)).unwrap();
        let lb = b.train_step(std::slice::from_ref(&next)).unwrap();
        assert_eq!(la, lb);
        for s in 0..2 {
            assert_eq!(
                a.stages()[s].export_params().unwrap(),
                b.stages()[s].export_params().unwrap()
            );
        }
    }
}
