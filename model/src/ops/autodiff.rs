//! The operations on the autodiff backend: each records one graph node that keeps what its
//! hand-written backward reads, and no intermediate of its forward.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, Backend, DispatchKindConversion, DispatchTensor};
use burn::tensor::Tensor;

use super::{
    StageOps, attention, gelu_linear, head_loss, int_tensor, norm, norm_linear, primitive, tensor,
};

/// Registers each tracked parent's gradient.
fn register<B: Backend, const N: usize, const D: usize>(
    parents: [Option<NodeId>; N],
    grads: &mut Gradients,
    values: [Option<Tensor<D>>; N],
) where
    DispatchTensor: DispatchKindConversion<B>,
{
    for (parent, value) in parents.into_iter().zip(values) {
        if let (Some(id), Some(value)) = (parent, value) {
            grads.register::<B>(id, primitive::<B, D>(value));
        }
    }
}

/// The parents' node ids (`None`: a constant, which gets no gradient).
fn parent_ids<S, const N: usize>(ops: &Ops<S, N>) -> [Option<NodeId>; N] {
    ops.parents
        .each_ref()
        .map(|p| p.as_ref().map(|node| node.id))
}

#[derive(Debug)]
struct AttentionBackward;

impl<B: Backend> Backward<B, 3> for AttentionBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = attention::Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_o = tensor::<B, 3>(grads.consume::<B>(&ops.node));
        let parents = parent_ids(&ops);
        let [dq, dk, dv] = attention::backward(ops.state, d_o);
        register::<B, 3, 4>(parents, grads, [Some(dq), Some(dk), Some(dv)]);
    }
}

#[derive(Debug)]
struct LayerNormBackward;

impl<B: Backend> Backward<B, 3> for LayerNormBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = norm::Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        let parents = parent_ids(&ops);
        let (dx, d_gamma, d_beta) = norm::backward(ops.state, dy);
        register::<B, 3, 2>(parents, grads, [Some(dx), None, None]);
        register::<B, 3, 1>(parents, grads, [None, Some(d_gamma), Some(d_beta)]);
    }
}

#[derive(Debug)]
struct NormLinearBackward;

impl<B: Backend> Backward<B, 5> for NormLinearBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = norm_linear::Saved;

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        let parents = parent_ids(&ops);
        let (dx, d_gamma, d_beta, d_w, d_b) = norm_linear::backward(ops.state, dy);
        register::<B, 5, 2>(parents, grads, [Some(dx), None, None, Some(d_w), None]);
        register::<B, 5, 1>(
            parents,
            grads,
            [None, Some(d_gamma), Some(d_beta), None, Some(d_b)],
        );
    }
}

#[derive(Debug)]
struct GeluLinearBackward;

impl<B: Backend> Backward<B, 3> for GeluLinearBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = gelu_linear::Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        let parents = parent_ids(&ops);
        let (dx, d_w, d_b) = gelu_linear::backward(ops.state, dy);
        register::<B, 3, 2>(parents, grads, [Some(dx), Some(d_w), None]);
        register::<B, 3, 1>(parents, grads, [None, None, Some(d_b)]);
    }
}

#[derive(Debug)]
struct HeadLossBackward;

impl<B: Backend> Backward<B, 2> for HeadLossBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = head_loss::Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_loss = tensor::<B, 1>(grads.consume::<B>(&ops.node));
        let parents = parent_ids(&ops);
        let (dh, dw) = head_loss::backward(ops.state, d_loss);
        register::<B, 2, 2>(parents, grads, [Some(dh), Some(dw)]);
    }
}

impl<B, C> StageOps for Autodiff<B, C>
where
    B: StageOps,
    C: CheckpointStrategy,
    DispatchTensor: DispatchKindConversion<B>,
{
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        block: usize,
    ) -> FloatTensor<Self> {
        let nodes = [q.node(), k.node(), v.node()];
        let [q, k, v] = [q, k, v].map(|t| tensor::<B, 4>(t.into_primitive()));
        let (o, lse) = attention::forward(q.clone(), k.clone(), v.clone(), block);
        let out = primitive::<B, 3>(o.clone());
        match AttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                attention::Saved {
                    q,
                    k,
                    v,
                    o,
                    lse,
                    block,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), gamma.node(), beta.node()];
        let x = tensor::<B, 2>(x.into_primitive());
        let gamma = tensor::<B, 1>(gamma.into_primitive());
        let beta = tensor::<B, 1>(beta.into_primitive());
        let (y, mean, rstd) = norm::forward(x.clone(), gamma.clone(), beta, epsilon);
        let out = primitive::<B, 2>(y);
        match LayerNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                norm::Saved {
                    x,
                    gamma,
                    mean,
                    rstd,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn norm_linear(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let nodes = [
            x.node(),
            gamma.node(),
            beta.node(),
            weight.node(),
            bias.node(),
        ];
        let x = tensor::<B, 2>(x.into_primitive());
        let gamma = tensor::<B, 1>(gamma.into_primitive());
        let beta = tensor::<B, 1>(beta.into_primitive());
        let w = tensor::<B, 2>(weight.into_primitive());
        let b = tensor::<B, 1>(bias.into_primitive());
        let (y, mean, rstd) = norm_linear::forward(
            x.clone(),
            gamma.clone(),
            beta.clone(),
            w.clone(),
            b,
            epsilon,
        );
        let out = primitive::<B, 2>(y);
        match NormLinearBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                norm_linear::Saved {
                    norm: norm::Saved {
                        x,
                        gamma,
                        mean,
                        rstd,
                    },
                    beta,
                    w,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn gelu_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        tanh: bool,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), weight.node(), bias.node()];
        let x = tensor::<B, 2>(x.into_primitive());
        let w = tensor::<B, 2>(weight.into_primitive());
        let b = tensor::<B, 1>(bias.into_primitive());
        let out = primitive::<B, 2>(gelu_linear::forward(x.clone(), tanh, w.clone(), b));
        match GeluLinearBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(gelu_linear::Saved { x, tanh, w }, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn head_loss(
        h: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        block: usize,
    ) -> FloatTensor<Self> {
        let nodes = [h.node(), weight.node()];
        let h = tensor::<B, 2>(h.into_primitive());
        let w = tensor::<B, 2>(weight.into_primitive());
        let targets = int_tensor::<B, 1>(targets);
        let (loss, lse) = head_loss::forward(&h, &w, &targets, block);
        let out = primitive::<B, 1>(loss);
        match HeadLossBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                head_loss::Saved {
                    h,
                    w,
                    targets,
                    lse,
                    block,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
