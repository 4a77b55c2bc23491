//! A stage at its boundary with the others: forward and backward from and to wire bytes.

use super::{Stage, StageOutput, Upstream, WireOutput};
use crate::activation::Activation;
use crate::error::Result;
use crate::pipeline_model::PipelineModel;

impl<M: PipelineModel> Stage<M> {
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

    /// [`Stage::evaluate`] with the input as wire bytes (the previous stage's output).
    pub fn evaluate_wire(&self, input: &[u8], targets: Option<&Activation>) -> Result<WireOutput> {
        let input = Activation::from_wire(input, &self.config.wire_limits, &self.device)?;
        let out = self.evaluate(input, targets)?;
        self.encode_output(out)
    }

    /// Encodes a forward result for the wire with the configured dtype.
    pub fn encode_output(&self, out: StageOutput) -> Result<WireOutput> {
        Ok(match out {
            StageOutput::Activation(a) => {
                WireOutput::Activation(a.to_wire(self.config.wire_dtype)?)
            }
            StageOutput::Loss(l) => WireOutput::Loss(l),
            StageOutput::LossKept => WireOutput::LossKept,
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
}
