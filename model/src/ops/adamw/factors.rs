//! What one AdamW step computes with: its hyper-parameters, and the factors every element's
//! update reads, computed once on the host (by the Flex pass and the Cube kernel alike).

/// One AdamW step's hyper-parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWStep {
    /// Learning rate.
    pub lr: f64,
    /// The factor the gradient is scaled by first (clipping).
    pub grad_scale: f32,
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
}

/// A step's factors as Burn's `AdamW::step` computes them (`f32`; the decay factor and the
/// learning rate rounded from `f64` as Burn's scalar operations round them): what every
/// element's update reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Factors {
    pub(crate) grad_scale: f32,
    pub(crate) beta_1: f32,
    pub(crate) beta_2: f32,
    /// `1 - beta_1`.
    pub(crate) f1: f32,
    /// `1 - beta_2`.
    pub(crate) f2: f32,
    /// The bias corrections, `1 - beta^t`.
    pub(crate) c1: f32,
    pub(crate) c2: f32,
    pub(crate) epsilon: f32,
    /// `1 - lr * weight_decay` (exactly 1 without decay, so that `p * keep` is `p`).
    pub(crate) keep: f32,
    pub(crate) lr: f32,
}

impl Factors {
    pub(crate) fn of(time: usize, h: AdamWStep) -> Self {
        let t = i32::try_from(time).unwrap_or(i32::MAX);
        Self {
            grad_scale: h.grad_scale,
            beta_1: h.beta_1,
            beta_2: h.beta_2,
            f1: 1.0 - h.beta_1,
            f2: 1.0 - h.beta_2,
            c1: 1f32 - h.beta_1.powi(t),
            c2: 1f32 - h.beta_2.powi(t),
            epsilon: h.epsilon,
            keep: (1.0 - h.lr * f64::from(h.weight_decay)) as f32,
            lr: h.lr as f32,
        }
    }
}
