//! Layer norm into a linear layer, `ln(x) W + b`, as one operation: it keeps the norm's input and
//! each row's mean and reciprocal deviation, and the backward recomputes the normalised rows the
//! linear layer's weight gradient needs (apart, the linear layer would keep them: a second
//! `[rows, d]` tensor per norm).

use burn::tensor::Tensor;

use super::norm;

/// `ln(x) W + b` of `x` `[rows, d]`, `W` `[d, out]`, and the norm's row statistics.
pub(crate) fn forward(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    w: Tensor<2>,
    b: Tensor<1>,
    epsilon: f64,
) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    let (n, mean, rstd) = norm::forward(x, gamma, beta, epsilon);
    (n.matmul(w) + b.unsqueeze::<2>(), mean, rstd)
}

/// What the backward reads.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub norm: norm::Saved,
    pub beta: Tensor<1>,
    pub w: Tensor<2>,
}

/// The gradients of `x`, `gamma`, `beta`, `W` and `b` given the output's gradient `dy`.
pub(crate) fn backward(
    s: Saved,
    dy: Tensor<2>,
) -> (Tensor<2>, Tensor<1>, Tensor<1>, Tensor<2>, Tensor<1>) {
    let Saved { norm, beta, w } = s;
    let n = norm.normalised() * norm.gamma.clone().unsqueeze::<2>() + beta.unsqueeze::<2>();
    let d_w = n.transpose().matmul(dy.clone());
    let d_b = dy.clone().sum_dim(0).squeeze_dim::<1>(0);
    let dn = dy.matmul(w.transpose());
    let (dx, d_gamma, d_beta) = norm::backward(norm, dn);
    (dx, d_gamma, d_beta, d_w, d_b)
}
