//! The optimizer step: AdamW on every layer (layers spread over the lanes), clipped by the
//! global norm the caller summed over stages, with the phase times of the finished step.

use std::time::Instant;

use super::{PhaseTimes, Stage, StepReport};
use crate::error::{ModelError, Result};
use crate::optim::step_layer;
use crate::pipeline_model::PipelineModel;

impl<M: PipelineModel> Stage<M> {
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
        let update = opt.update(lr, clip_scale, self.config.ops);
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
                let layer = step_layer(&update, layer, grads, &mut states);
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
        self.step_loss = None;
        self.times = PhaseTimes::default();
        Ok(report)
    }
}
