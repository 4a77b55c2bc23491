//! What one pipeline stage costs on its device.

/// Sums of the layer costs of one stage, on the device it runs on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StageCost {
    pub(crate) forward_ms: f64,
    pub(crate) backward_ms: f64,
    pub(crate) optimizer_ms: f64,
    pub(crate) params: f64,
}

impl StageCost {
    /// The time the stage holds its device for one micro-batch, forward and backward: what
    /// paces a pipeline.
    pub(crate) fn pace_ms(&self) -> f64 {
        self.forward_ms + self.backward_ms
    }
}
