//! GELU into a linear layer, `gelu(x) W + b`, as one operation: it keeps only `x`, and the
//! backward recomputes `gelu(x)` for the weight's gradient (apart, GELU would keep `x` and the
//! linear layer `gelu(x)`: two `[rows, d_ff]` tensors, the largest a GPT block keeps).

use burn::tensor::Tensor;

use super::gelu;

/// `gelu(x) W + b` of `x` `[rows, f]`, `W` `[f, out]`.
pub(crate) fn forward(x: Tensor<2>, tanh: bool, w: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    gelu::forward(x, tanh).matmul(w) + b.unsqueeze::<2>()
}

/// What the backward reads.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub x: Tensor<2>,
    pub tanh: bool,
    pub w: Tensor<2>,
}

/// The gradients of `x`, `W` and `b` given the output's gradient `dy`.
pub(crate) fn backward(s: Saved, dy: Tensor<2>) -> (Tensor<2>, Tensor<2>, Tensor<1>) {
    let Saved { x, tanh, w } = s;
    let d_w = gelu::forward(x.clone(), tanh)
        .transpose()
        .matmul(dy.clone());
    let d_b = dy.clone().sum_dim(0).squeeze_dim::<1>(0);
    let dh = dy.matmul(w.transpose());
    (gelu::backward(x, tanh, dh), d_w, d_b)
}
