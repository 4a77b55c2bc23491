//! Causal attention with FlashAttention-2's arithmetic, in Burn tensor operations over blocks of
//! query rows: the forward keeps the output and each row's log-sum-exp, nothing of size
//! sequence²; the backward recomputes each block's scores. Keys after a block's last row are
//! never touched (the blocks wholly above the diagonal are skipped), so the work is about half
//! the dense form's at long sequences.

use burn::tensor::{Bool, Device, Tensor, TensorData};

/// Query rows per block: `[batch, heads, 128, keys]` is the largest transient (12.6 MB at
/// batch 4, 12 heads, 512 keys; 50 MB at batch 8 and 1,024 keys).
pub(crate) const QUERY_BLOCK: usize = 128;

/// The row blocks of a sequence of `t` positions: `[r0, r1)` each.
fn blocks(t: usize, block: usize) -> impl Iterator<Item = (usize, usize)> {
    let block = block.max(1);
    (0..t.div_ceil(block)).map(move |i| (i * block, ((i + 1) * block).min(t)))
}

/// `true` where key `j` (of `0..r1`) lies after query `r0 + i`: the diagonal block's upper part.
fn after_diagonal(r0: usize, r1: usize, device: &Device) -> Tensor<4, Bool> {
    let rows = r1 - r0;
    let mask: Vec<bool> = (0..rows * r1).map(|k| k % r1 > r0 + k / r1).collect();
    Tensor::<2, Bool>::from_data(TensorData::new(mask, [rows, r1]), device).unsqueeze::<4>()
}

/// One block's scaled, masked scores `q[r0..r1] k[..r1]^T / sqrt(dh)`.
fn scores(q: &Tensor<4>, k: &Tensor<4>, (r0, r1): (usize, usize), scale: f64) -> Tensor<4> {
    let [b, h, _, dh] = q.dims();
    let qc = q.clone().slice([0..b, 0..h, r0..r1, 0..dh]);
    let kc = k.clone().slice([0..b, 0..h, 0..r1, 0..dh]);
    let s = qc.matmul(kc.swap_dims(2, 3)).mul_scalar(scale);
    let mask = after_diagonal(r0, r1, &q.device()).expand([b, h, r1 - r0, r1]);
    s.mask_fill(mask, f32::NEG_INFINITY)
}

fn scale(dh: usize) -> f64 {
    1.0 / (dh as f64).sqrt()
}

/// `[batch, heads, seq, dh]` as `[batch, seq, heads * dh]`: the heads side by side, as the
/// projection after attention reads them.
fn merge(x: Tensor<4>) -> Tensor<3> {
    let [b, h, t, dh] = x.dims();
    x.swap_dims(1, 2).reshape([b, t, h * dh])
}

/// The inverse of [`merge`] for `heads` heads (a view).
fn split(x: Tensor<3>, heads: usize) -> Tensor<4> {
    let [b, t, d] = x.dims();
    x.reshape([b, t, heads, d / heads]).swap_dims(1, 2)
}

/// The output `[batch, seq, heads * dh]` (heads merged: the one copy both this operation's
/// backward and the projection after it keep) and each row's log-sum-exp
/// `[batch, heads, seq, 1]` of causal attention over `q`, `k`, `v` (`[batch, heads, seq, dh]`
/// each).
pub(crate) fn forward(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    block: usize,
) -> (Tensor<3>, Tensor<4>) {
    let [b, h, t, dh] = q.dims();
    let scale = scale(dh);
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for (r0, r1) in blocks(t, block) {
        let s = scores(&q, &k, (r0, r1), scale);
        // Every row sees its own key, so its maximum is finite.
        let m = s.clone().max_dim(3);
        let p = (s - m.clone()).exp();
        let l = p.clone().sum_dim(3);
        let vc = v.clone().slice([0..b, 0..h, 0..r1, 0..dh]);
        outs.push(p.matmul(vc).div(l.clone()));
        lses.push(m + l.log());
    }
    (merge(Tensor::cat(outs, 2)), Tensor::cat(lses, 2))
}

/// What the backward reads: the forward's inputs, output and log-sum-exps.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub q: Tensor<4>,
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    /// The output, heads merged.
    pub o: Tensor<3>,
    pub lse: Tensor<4>,
    pub block: usize,
}

/// The gradients of `q`, `k` and `v` given the output's gradient `d_o` (heads merged).
pub(crate) fn backward(s: Saved, d_o: Tensor<3>) -> [Tensor<4>; 3] {
    let Saved {
        q,
        k,
        v,
        o,
        lse,
        block,
    } = s;
    let [b, h, t, dh] = q.dims();
    let scale = scale(dh);
    // FlashAttention-2's D: rowsum(dO * O), the softmax backward's correction for every row.
    let delta = (d_o.clone() * o)
        .reshape([b, t, h, dh])
        .sum_dim(3)
        .swap_dims(1, 2);
    let d_o = split(d_o, h);
    let rows =
        |x: &Tensor<4>, (r0, r1): (usize, usize)| x.clone().slice([0..b, 0..h, r0..r1, 0..dh]);
    let column =
        |x: &Tensor<4>, (r0, r1): (usize, usize)| x.clone().slice([0..b, 0..h, r0..r1, 0..1]);
    let spans: Vec<_> = blocks(t, block).collect();
    let mut dq = Vec::with_capacity(spans.len());
    // dK and dV by key block: query block i adds to key blocks 0..=i.
    let (mut dk, mut dv): (Vec<Option<Tensor<4>>>, Vec<Option<Tensor<4>>>) =
        (vec![None; spans.len()], vec![None; spans.len()]);
    for (i, &(r0, r1)) in spans.iter().enumerate() {
        let p = (scores(&q, &k, (r0, r1), scale) - column(&lse, (r0, r1))).exp();
        let doc = rows(&d_o, (r0, r1));
        let (kc, vc) = (rows(&k, (0, r1)), rows(&v, (0, r1)));
        let dv_c = p.clone().swap_dims(2, 3).matmul(doc.clone());
        let dp = doc.matmul(vc.swap_dims(2, 3));
        let ds = (p * (dp - column(&delta, (r0, r1)))).mul_scalar(scale);
        dq.push(ds.clone().matmul(kc));
        let dk_c = ds.swap_dims(2, 3).matmul(rows(&q, (r0, r1)));
        for (j, &span) in spans[..=i].iter().enumerate() {
            let add = |acc: &mut Option<Tensor<4>>, part: Tensor<4>| {
                *acc = Some(match acc.take() {
                    Some(a) => a + part,
                    None => part,
                });
            };
            add(&mut dk[j], rows(&dk_c, span));
            add(&mut dv[j], rows(&dv_c, span));
        }
    }
    let join =
        |parts: Vec<Option<Tensor<4>>>| Tensor::cat(parts.into_iter().flatten().collect(), 2);
    [Tensor::cat(dq, 2), join(dk), join(dv)]
}
