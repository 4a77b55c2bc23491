//! The language-model head fused with its cross-entropy: `mean(logsumexp(h W) - (h W)[target])`
//! over blocks of rows, keeping no `[tokens, vocab]` tensor between the forward and the backward
//! (only the head's input, its weight, the targets and each row's log-sum-exp); the backward
//! recomputes each block's logits. One more head matmul than the composed loss, against three
//! logits-sized tensors kept or allocated around its backward.

use burn::tensor::{IndexingUpdateOp, Int, Tensor};

/// Rows per block: `[rows, vocab]` is the largest transient (51 MB at GPT-2's 50,257 tokens).
pub(crate) const ROW_BLOCK: usize = 256;

fn blocks(n: usize, block: usize) -> impl Iterator<Item = (usize, usize)> {
    let block = block.max(1);
    (0..n.div_ceil(block)).map(move |i| (i * block, ((i + 1) * block).min(n)))
}

/// One block's logits `h[r0..r1] W`.
fn logits(h: &Tensor<2>, w: &Tensor<2>, (r0, r1): (usize, usize)) -> Tensor<2> {
    let d = h.dims()[1];
    h.clone().slice([r0..r1, 0..d]).matmul(w.clone())
}

/// The mean loss `[1]` of `h` `[rows, d]` through `w` `[d, vocab]` against `targets` `[rows]`,
/// and each row's log-sum-exp `[rows, 1]`.
pub(crate) fn forward(
    h: &Tensor<2>,
    w: &Tensor<2>,
    targets: &Tensor<1, Int>,
    block: usize,
) -> (Tensor<1>, Tensor<2>) {
    let n = h.dims()[0];
    let mut lses = Vec::new();
    let mut total: Option<Tensor<1>> = None;
    for (r0, r1) in blocks(n, block) {
        let z = logits(h, w, (r0, r1));
        let m = z.clone().max_dim(1);
        let lse = m.clone() + (z.clone() - m).exp().sum_dim(1).log();
        let picked = z.gather(
            1,
            targets.clone().narrow(0, r0, r1 - r0).unsqueeze_dim::<2>(1),
        );
        let part = (lse.clone() - picked).sum().reshape([1]);
        total = Some(match total {
            Some(t) => t + part,
            None => part,
        });
        lses.push(lse);
    }
    let loss = total.map_or_else(
        || Tensor::zeros([1], &h.device()),
        |t| t.div_scalar(n.max(1) as f64),
    );
    (loss, Tensor::cat(lses, 0))
}

/// What the backward reads.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub h: Tensor<2>,
    pub w: Tensor<2>,
    pub targets: Tensor<1, Int>,
    pub lse: Tensor<2>,
    pub block: usize,
}

/// The gradients of `h` and `w` given the loss's gradient `d_loss` `[1]`.
pub(crate) fn backward(s: Saved, d_loss: Tensor<1>) -> (Tensor<2>, Tensor<2>) {
    let Saved {
        h,
        w,
        targets,
        lse,
        block,
    } = s;
    let n = h.dims()[0];
    // d mean / d row = 1 / n, times the loss's own gradient: kept on the device (no read-back).
    let g = d_loss.div_scalar(n.max(1) as f64).reshape([1, 1]);
    let mut dh = Vec::new();
    let mut dw: Option<Tensor<2>> = None;
    for (r0, r1) in blocks(n, block) {
        let z = logits(&h, &w, (r0, r1));
        let p = (z - lse.clone().slice([r0..r1, 0..1])).exp();
        let at = targets.clone().narrow(0, r0, r1 - r0).unsqueeze_dim::<2>(1);
        let minus_one = Tensor::full([r1 - r0, 1], -1.0, &h.device());
        let dz = p.scatter(1, at, minus_one, IndexingUpdateOp::Add) * g.clone();
        dh.push(dz.clone().matmul(w.clone().transpose()));
        let d = h.dims()[1];
        let part = h.clone().slice([r0..r1, 0..d]).transpose().matmul(dz);
        dw = Some(match dw {
            Some(acc) => acc + part,
            None => part,
        });
    }
    let dw = dw.unwrap_or_else(|| w.zeros_like());
    (Tensor::cat(dh, 0), dw)
}
