//! A micro-batch between its forward and its backward: what each lane keeps.

use burn::tensor::Tensor;

use crate::activation::Activation;

/// What a lane's forward produced: an activation for the next stage, or the loss.
pub(super) enum Produced {
    Activation(Activation),
    Loss(Tensor<1>),
}

/// One lane's slice of a micro-batch between its forward and its backward.
pub(super) struct LaneFlight<L> {
    pub(super) input: Activation,
    pub(super) produced: Produced,
    pub(super) examples: usize,
    /// The stage's layers as this lane ran them (over parameter leaves of its own when the
    /// micro-batch was cut, see `params::with_fresh_leaves`): its gradients are found
    /// through them.
    pub(super) layers: Vec<L>,
}
