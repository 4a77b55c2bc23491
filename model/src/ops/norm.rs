//! Layer norm over the last dimension of `[rows, d]`, with its own backward: the forward keeps
//! the input and each row's mean and reciprocal deviation, the backward recomputes the
//! normalised input from them (Burn's composed layer norm keeps each step's input instead).

use burn::tensor::Tensor;

/// `(x - mean) * rstd * gamma + beta` with the biased variance (Burn's and PyTorch's), and the
/// mean and `rstd = 1 / sqrt(var + epsilon)` of each row (`[rows, 1]` each).
pub(crate) fn forward(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    epsilon: f64,
) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    let mean = x.clone().mean_dim(1);
    let centred = x - mean.clone();
    let rstd = centred
        .clone()
        .square()
        .mean_dim(1)
        .add_scalar(epsilon)
        .sqrt()
        .recip();
    let y = centred * rstd.clone() * gamma.unsqueeze::<2>() + beta.unsqueeze::<2>();
    (y, mean, rstd)
}

/// What the backward reads.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub x: Tensor<2>,
    pub gamma: Tensor<1>,
    pub mean: Tensor<2>,
    pub rstd: Tensor<2>,
}

impl Saved {
    /// The normalised input `(x - mean) * rstd`, recomputed.
    pub(crate) fn normalised(&self) -> Tensor<2> {
        (self.x.clone() - self.mean.clone()) * self.rstd.clone()
    }
}

/// The gradients of `x`, `gamma` and `beta` given the output's gradient `dy`.
pub(crate) fn backward(s: Saved, dy: Tensor<2>) -> (Tensor<2>, Tensor<1>, Tensor<1>) {
    let xhat = s.normalised();
    let Saved { gamma, rstd, .. } = s;
    let d_beta = dy.clone().sum_dim(0).squeeze_dim::<1>(0);
    let d_gamma = (dy.clone() * xhat.clone()).sum_dim(0).squeeze_dim::<1>(0);
    let g = dy * gamma.unsqueeze::<2>();
    let correction = g.clone().mean_dim(1) + xhat.clone() * (g.clone() * xhat).mean_dim(1);
    ((g - correction) * rstd, d_gamma, d_beta)
}
