//! Starting weights from outside the cluster: a [`WeightSource`] gives the values of any layer
//! (a published checkpoint, an export of an earlier run), and [`Stage::load_weights`] puts them
//! in place of the seeded initialisation, so every replica of a layer starts from the same file.

use burn::tensor::{Tensor, TensorData};

use crate::error::{ModelError, Result};
use crate::params::{ParamInfo, with_values};
use crate::pipeline_model::PipelineModel;
use crate::stage::Stage;

/// Initial parameter values by layer.
pub trait WeightSource: Send + Sync {
    /// The values of layer `layer`, one flat vector per parameter in the visit order and with
    /// the sizes `infos` lists.
    fn layer_values(&self, layer: usize, infos: &[ParamInfo]) -> Result<Vec<Vec<f32>>>;

    /// What identifies these weights in the cluster's replicated job (for a file, the
    /// SHA-256 of its bytes), so that every node starts from the same ones.
    fn identity(&self) -> Result<String>;
}

impl<M: PipelineModel> Stage<M> {
    /// Replaces the values of every layer of the stage by `source`'s, with fresh optimizer
    /// moments; the step count and random streams stay. All layers are read and checked before
    /// any changes.
    pub fn load_weights(&mut self, source: &dyn WeightSource) -> Result<()> {
        self.ensure_idle()?;
        let range = self.layer_range();
        let mut loaded = Vec::with_capacity(range.len());
        for (local, layer) in range.clone().enumerate() {
            let infos = &self.infos[local];
            let values = source.layer_values(layer, infos)?;
            if values.len() != infos.len() {
                return Err(ModelError::ParamMismatch {
                    layer,
                    index: values.len().min(infos.len()),
                    detail: format!(
                        "the weights give {} parameters, the layer has {}",
                        values.len(),
                        infos.len()
                    ),
                });
            }
            for (index, (v, info)) in values.iter().zip(infos).enumerate() {
                if v.len() != info.numel() {
                    return Err(ModelError::ParamMismatch {
                        layer,
                        index,
                        detail: format!(
                            "{}: the weights give {} values, its shape {:?} needs {}",
                            info.path,
                            v.len(),
                            info.shape,
                            info.numel()
                        ),
                    });
                }
            }
            loaded.push(values);
        }
        let inner = self.device().clone().inner();
        for (local, values) in loaded.into_iter().enumerate() {
            let tensors = values
                .into_iter()
                .map(|v| {
                    let n = v.len();
                    Tensor::from_data(TensorData::new(v, [n]), &inner)
                })
                .collect();
            self.layers[local] = with_values(self.layers[local].clone(), tensors);
            self.states[local] = vec![None; self.infos[local].len()];
            self.reset_layer_grads(local);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gpt::{Gpt, GptConfig};
    use crate::stage::StageConfig;
    use burn::tensor::Device;

    /// Every value of layer `l`'s parameter `p` is `l * 100 + p`.
    struct Numbered;

    impl WeightSource for Numbered {
        fn layer_values(&self, layer: usize, infos: &[ParamInfo]) -> Result<Vec<Vec<f32>>> {
            Ok(infos
                .iter()
                .enumerate()
                .map(|(p, i)| vec![(layer * 100 + p) as f32; i.numel()])
                .collect())
        }

        fn identity(&self) -> Result<String> {
            Ok("numbered".into())
        }
    }

    struct Short;

    impl WeightSource for Short {
        fn layer_values(&self, _: usize, infos: &[ParamInfo]) -> Result<Vec<Vec<f32>>> {
            Ok(infos.iter().map(|i| vec![0.0; i.numel() - 1]).collect())
        }

        fn identity(&self) -> Result<String> {
            Ok("short".into())
        }
    }

    #[test]
    fn loaded_weights_replace_the_seeded_ones_and_a_wrong_size_changes_nothing() {
        let model = Arc::new(Gpt::new(GptConfig::tiny()).unwrap());
        let mut stage =
            Stage::new(model, 1..3, 5, &Device::flex(), StageConfig::default()).unwrap();
        let before = stage.param_values(1).unwrap();
        assert!(matches!(
            stage.load_weights(&Short),
            Err(ModelError::ParamMismatch {
                layer: 1,
                index: 0,
                ..
            })
        ));
        assert_eq!(stage.param_values(1).unwrap(), before);
        stage.load_weights(&Numbered).unwrap();
        for layer in 1..3 {
            for (p, v) in stage.param_values(layer).unwrap().iter().enumerate() {
                assert!(v.iter().all(|x| *x == (layer * 100 + p) as f32));
            }
        }
    }
}
