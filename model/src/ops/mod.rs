//! The stage's heavy operations with their own backward: causal attention (FlashAttention-2's
//! arithmetic), layer norm (alone, and into the linear layer after it), GELU into the linear
//! layer after it, and the language-model head fused with its loss; and AdamW as one pass a
//! parameter (`adamw`).
//!
//! Each is one Burn backend-extension operation (`#[backend_extension]`): on the inner backend
//! it is the forward alone, written in Burn's tensor operations over that backend's primitives;
//! on the autodiff backend it records one graph node that keeps only what its hand-written
//! backward reads (see each module), where Burn's composition keeps every intermediate (the
//! attention's scores and probabilities, the logits). [`OpSet::Reference`] is that composition,
//! kept as the oracle the tests hold these operations to.
//!
//! The extension is routed for Flex and, in a build with a Cube runtime (`cuda`, `cube-cpu`), for
//! Cube, with and without autodiff; on another device the model runs the reference composition
//! ([`supports`]).

pub(crate) mod adamw;
mod attention;
mod autodiff;
mod gelu;
mod gelu_linear;
mod head_loss;
mod norm;
mod norm_linear;

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{
    Backend, Dispatch, DispatchDevice, DispatchKindConversion, DispatchTensor, Flex,
    backend_extension,
};
use burn::config::Config;
use burn::tensor::{DType, Int, Tensor};

/// Which operations a model's stage runs: the same arithmetic and parameters either way.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum OpSet {
    /// Burn's composed operations (each keeping its inputs for the backward): the oracle.
    Reference,
    /// This module's operations with their own backward, where the device supports them.
    Native,
}

impl std::str::FromStr for OpSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reference" => Ok(Self::Reference),
            "native" => Ok(Self::Native),
            other => Err(format!(
                "operations {other:?}: expected reference or native"
            )),
        }
    }
}

impl OpSet {
    /// The name [`OpSet::from_str`](std::str::FromStr) takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Native => "native",
        }
    }
}

/// The operations as a backend extension.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "cube-cpu")), Autodiff)]
pub trait StageOps: Backend {
    /// Causal attention of `q`, `k`, `v` `[batch, heads, seq, dh]`, query rows in blocks of
    /// `block`: `[batch, seq, heads * dh]`, the heads merged.
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        block: usize,
    ) -> FloatTensor<Self>;

    /// Layer norm of `x` `[rows, d]` with `gamma` and `beta` `[d]`.
    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self>;

    /// Layer norm of `x` `[rows, d]` into the linear layer `weight` `[d, out]`, `bias` `[out]`.
    fn norm_linear(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self>;

    /// GELU of `x` `[rows, f]` (the tanh approximation when `tanh`, else the erf form) into the
    /// linear layer `weight` `[f, out]`, `bias` `[out]`.
    fn gelu_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        tanh: bool,
    ) -> FloatTensor<Self>;

    /// The mean cross-entropy `[1]` of the head `weight` `[d, vocab]` applied to `h`
    /// `[rows, d]` against `targets` `[rows]`, rows in blocks of `block`.
    fn head_loss(
        h: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        block: usize,
    ) -> FloatTensor<Self>;
}

/// A primitive of backend `B` as a Burn tensor on `B` (no autodiff): the operations' arithmetic
/// is written in Burn's tensor API whatever the backend.
fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<D>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    Tensor::from_primitive::<B>(t)
}

fn int_tensor<B: Backend, const D: usize>(t: IntTensor<B>) -> Tensor<D, Int>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    Tensor::from_primitive::<B>(t)
}

/// The inverse of [`tensor`]: an operation on `B`'s tensors stays on `B`.
fn primitive<B: Backend, const D: usize>(t: Tensor<D>) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    match t.try_into_primitive::<B>() {
        Ok(p) => p,
        Err(e) => unreachable!("a tensor computed from one backend's inputs left it: {e:?}"),
    }
}

/// The operations on an inner backend: the forward alone, in Burn's tensor API over its
/// primitives (the same text for every backend the extension routes).
macro_rules! inner_backend {
    ($backend:ty) => {
        impl StageOps for $backend {
            fn causal_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                block: usize,
            ) -> FloatTensor<Self> {
                let (o, _) = attention::forward(
                    tensor::<$backend, 4>(q),
                    tensor::<$backend, 4>(k),
                    tensor::<$backend, 4>(v),
                    block,
                );
                primitive::<$backend, 3>(o)
            }

            fn layer_norm(
                x: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                epsilon: f64,
            ) -> FloatTensor<Self> {
                let (y, _, _) = norm::forward(
                    tensor::<$backend, 2>(x),
                    tensor::<$backend, 1>(gamma),
                    tensor::<$backend, 1>(beta),
                    epsilon,
                );
                primitive::<$backend, 2>(y)
            }

            fn norm_linear(
                x: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                epsilon: f64,
            ) -> FloatTensor<Self> {
                let (y, _, _) = norm_linear::forward(
                    tensor::<$backend, 2>(x),
                    tensor::<$backend, 1>(gamma),
                    tensor::<$backend, 1>(beta),
                    tensor::<$backend, 2>(weight),
                    tensor::<$backend, 1>(bias),
                    epsilon,
                );
                primitive::<$backend, 2>(y)
            }

            fn gelu_linear(
                x: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                tanh: bool,
            ) -> FloatTensor<Self> {
                primitive::<$backend, 2>(gelu_linear::forward(
                    tensor::<$backend, 2>(x),
                    tanh,
                    tensor::<$backend, 2>(weight),
                    tensor::<$backend, 1>(bias),
                ))
            }

            fn head_loss(
                h: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                targets: IntTensor<Self>,
                block: usize,
            ) -> FloatTensor<Self> {
                let (loss, _) = head_loss::forward(
                    &tensor::<$backend, 2>(h),
                    &tensor::<$backend, 2>(weight),
                    &int_tensor::<$backend, 1>(targets),
                    block,
                );
                primitive::<$backend, 1>(loss)
            }
        }
    };
}

inner_backend!(Flex);
#[cfg(any(feature = "cuda", feature = "cube-cpu"))]
inner_backend!(burn::backend::Cube);

/// Whether the native operations run on `x`'s device: `f32` on Flex or, in a build with a Cube
/// runtime, on Cube; with or without autodiff.
pub(crate) fn supports<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32
        && match x.device().inner().as_dispatch() {
            DispatchDevice::Flex(_) => true,
            #[cfg(any(feature = "cuda", feature = "cube-cpu"))]
            DispatchDevice::Cube(_) => true,
            #[allow(unreachable_patterns, reason = "other backends where a build has them")]
            _ => false,
        }
}

/// Causal multi-head attention of `q`, `k`, `v` `[batch, heads, seq, dh]`: `[batch, seq, d]`,
/// the heads merged.
pub(crate) fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as StageOps>::causal_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        attention::QUERY_BLOCK,
    ))
}

/// A layer norm's scale and shift, and the epsilon it adds to the variance.
pub(crate) struct Norm {
    pub gamma: Tensor<1>,
    pub beta: Tensor<1>,
    pub epsilon: f64,
}

/// A linear layer's weight `[in, out]` and bias `[out]`.
pub(crate) struct Affine {
    pub weight: Tensor<2>,
    pub bias: Tensor<1>,
}

/// `[batch, seq, d]` as `[batch * seq, d]`, and the batch and sequence to restore.
fn rows(x: Tensor<3>) -> (Tensor<2>, [usize; 2]) {
    let [b, t, d] = x.dims();
    (x.reshape([b * t, d]), [b, t])
}

fn unrows(y: DispatchTensor, [b, t]: [usize; 2]) -> Tensor<3> {
    let y = Tensor::<2>::from_dispatch(y);
    let out = y.dims()[1];
    y.reshape([b, t, out])
}

/// Layer norm over the last dimension of `x` `[batch, seq, d]`.
pub(crate) fn layer_norm(x: Tensor<3>, norm: Norm) -> Tensor<3> {
    let (x, bt) = rows(x);
    let y = <Dispatch as StageOps>::layer_norm(
        x.into_dispatch(),
        norm.gamma.into_dispatch(),
        norm.beta.into_dispatch(),
        norm.epsilon,
    );
    unrows(y, bt)
}

/// `norm` of `x` `[batch, seq, d]` into the linear layer `linear`.
pub(crate) fn norm_linear(x: Tensor<3>, norm: Norm, linear: Affine) -> Tensor<3> {
    let (x, bt) = rows(x);
    let y = <Dispatch as StageOps>::norm_linear(
        x.into_dispatch(),
        norm.gamma.into_dispatch(),
        norm.beta.into_dispatch(),
        linear.weight.into_dispatch(),
        linear.bias.into_dispatch(),
        norm.epsilon,
    );
    unrows(y, bt)
}

/// GELU of `x` `[batch, seq, f]` (the tanh approximation when `tanh`) into the linear layer
/// `linear`.
pub(crate) fn gelu_linear(x: Tensor<3>, tanh: bool, linear: Affine) -> Tensor<3> {
    let (x, bt) = rows(x);
    let y = <Dispatch as StageOps>::gelu_linear(
        x.into_dispatch(),
        linear.weight.into_dispatch(),
        linear.bias.into_dispatch(),
        tanh,
    );
    unrows(y, bt)
}

/// GELU's erf form composed of Burn's operations (`x (1 + erf(x / sqrt 2)) / 2`), which autodiff
/// differentiates exactly: Burn's `gelu` is exact on Flex, but elsewhere its backward is
/// `ActivationOps::gelu_backward`'s default, the tanh approximation's derivative (a dx 0.3 %
/// off on the Cube CPU runtime), so the reference composition uses this one.
pub(crate) fn erf_gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    gelu::forward(x, false)
}

/// The mean cross-entropy of the head `weight` `[d, vocab]` on `h` `[rows >= 1, d]` against
/// `targets` `[rows]`.
pub(crate) fn head_loss(h: Tensor<2>, weight: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as StageOps>::head_loss(
        h.into_dispatch(),
        weight.into_dispatch(),
        targets.into_dispatch(),
        head_loss::ROW_BLOCK,
    ))
}

#[cfg(test)]
mod tests;
