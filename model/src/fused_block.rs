//! The fused GPT block: one Burn operation, with a hand-written backward, for narrow models on
//! the CPU ([`crate::BlockKernel::Fused`]).
//!
//! A Burn backend extension (`#[backend_extension]`) on Flex and on autodiff over Flex. Its
//! arithmetic is [`crate::block_kernel`]'s; the parameters stay the block's Burn parameters, so
//! optimizers, state, handoff and checkpoints see the same module either way. On the autodiff
//! device the operation records one graph node whose parents are the input and the twelve
//! parameters, and its backward recomputes the block's forward from them (the state it keeps is
//! the thirteen tensors it already shares with the module, not the activations).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, Backend, Dispatch, DispatchDevice, DispatchTensor, ExtensionType, Flex,
    backend_extension,
};
use burn::tensor::{DType, Tensor, TensorData};

use crate::block_kernel::{self, BlockDims, BlockParams, Gelu, Param};

/// The block's input and parameters (in [`Param`]'s order) across the dispatch boundary.
#[derive(ExtensionType)]
pub struct BlockInputs<B: Backend>(
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

impl<B: Backend> BlockInputs<B> {
    fn split(self) -> (FloatTensor<B>, BlockParams<FloatTensor<B>>) {
        let Self(x, a, b, c, d, e, f, g, h, i, j, k, l) = self;
        (x, BlockParams([a, b, c, d, e, f, g, h, i, j, k, l]))
    }

    fn join(x: FloatTensor<B>, p: BlockParams<FloatTensor<B>>) -> Self {
        let [a, b, c, d, e, f, g, h, i, j, k, l] = p.0;
        Self(x, a, b, c, d, e, f, g, h, i, j, k, l)
    }
}

/// The fused block as a backend operation.
#[backend_extension(Flex, Autodiff)]
pub trait FusedBlockBackend: Backend {
    /// The block's output for `inputs.x` `[batch, seq, d]`.
    fn gpt_block(
        #[extension_type] inputs: BlockInputs<Self>,
        heads: usize,
        gelu_tanh: bool,
    ) -> FloatTensor<Self>;
}

/// Whether [`block`] runs on `x`: `f32` on Flex, with or without autodiff.
pub(crate) fn supports(x: &Tensor<3>) -> bool {
    x.dtype() == DType::F32 && matches!(x.device().inner().as_dispatch(), DispatchDevice::Flex(_))
}

/// `layer` applied to `x` as one operation, given the block's parameters (see
/// `GptBlock::fused_parameters`); the caller checks [`supports`] first.
pub(crate) fn block(
    params: BlockParams<DispatchTensor>,
    x: Tensor<3>,
    heads: usize,
    gelu: Gelu,
) -> Tensor<3> {
    let inputs = BlockInputs::join(x.into_dispatch(), params);
    Tensor::from_dispatch(<Dispatch as FusedBlockBackend>::gpt_block(
        inputs,
        heads,
        gelu == Gelu::Tanh,
    ))
}

/// A Flex tensor's values, contiguous.
fn values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => s.into(),
        None => t
            .to_contiguous()
            .as_slice::<f32>()
            .unwrap_or_default()
            .to_vec()
            .into(),
    }
}

fn flex_tensor(values: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The kernel's sizes for `x` `[batch, seq, d]` and the MLP weight `[d, d_ff]`.
fn dims(x: &FlexTensor, fc_in_weight: &FlexTensor, heads: usize, gelu_tanh: bool) -> BlockDims {
    let shape = x.layout().shape();
    BlockDims {
        batch: shape[0],
        seq: shape[1],
        d: shape[2],
        heads,
        d_ff: fc_in_weight.layout().shape()[1],
        gelu_tanh,
    }
}

fn forward_flex(
    x: &FlexTensor,
    p: &BlockParams<FlexTensor>,
    heads: usize,
    gelu_tanh: bool,
) -> FlexTensor {
    debug_assert_eq!(x.dtype(), DType::F32);
    let dims = dims(x, &p[Param::FcInWeight], heads, gelu_tanh);
    let (xs, ps) = (values(x), p.as_ref().map(values));
    let y = block_kernel::forward(dims, &ps.as_ref().map(|v| &v[..]), &xs);
    flex_tensor(y, x.layout().shape().to_vec())
}

impl FusedBlockBackend for Flex {
    fn gpt_block(inputs: BlockInputs<Self>, heads: usize, gelu_tanh: bool) -> FloatTensor<Self> {
        let (x, p) = inputs.split();
        forward_flex(&x, &p, heads, gelu_tanh)
    }
}

/// The fused block's backward: the input's and every parameter's gradient.
#[derive(Debug)]
struct BlockBackward;

/// What the backward needs: the kernel's options and the forward's thirteen inputs.
#[derive(Debug, Clone)]
struct BlockState {
    heads: usize,
    gelu_tanh: bool,
    x: FlexTensor,
    params: BlockParams<FlexTensor>,
}

impl Backward<Flex, 13> for BlockBackward {
    type State = BlockState;

    fn backward(self, ops: Ops<Self::State, 13>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<Flex>(&ops.node);
        let s = ops.state;
        let dims = dims(&s.x, &s.params[Param::FcInWeight], s.heads, s.gelu_tanh);
        let (xs, ps, dys) = (values(&s.x), s.params.as_ref().map(values), values(&dy));
        let (dx, dp) = block_kernel::backward(dims, &ps.as_ref().map(|v| &v[..]), &xs, &dys);
        let shapes = std::iter::once(&s.x)
            .chain(&s.params.0)
            .map(|t| t.layout().shape().to_vec());
        let values = std::iter::once(dx).chain(dp.0);
        for ((parent, grad), shape) in ops.parents.iter().zip(values).zip(shapes) {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, flex_tensor(grad, shape));
            }
        }
    }
}

impl<C: CheckpointStrategy> FusedBlockBackend for Autodiff<Flex, C> {
    fn gpt_block(inputs: BlockInputs<Self>, heads: usize, gelu_tanh: bool) -> FloatTensor<Self> {
        let (x, p) = inputs.split();
        let [a, b, c, d, e, f, g, h, i, j, k, l] = p.as_ref().0.map(|t| t.node());
        let nodes = [x.node(), a, b, c, d, e, f, g, h, i, j, k, l];
        let x = x.into_primitive();
        let params = p.map(|t| t.into_primitive());
        let y = forward_flex(&x, &params, heads, gelu_tanh);
        match BlockBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(
                BlockState {
                    heads,
                    gelu_tanh,
                    x,
                    params,
                },
                y,
            ),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}
