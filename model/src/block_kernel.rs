//! A GPT block's forward and backward written out on `f32` slices: the arithmetic of
//! [`crate::fused_block`], the fused block that narrow models train with on the CPU.
//!
//! At a narrow width (the emulated accelerator's stand-in: d 16, sequence 8, one sample per
//! micro-batch) a block is a few thousand multiply-adds, and Burn's per-operation cost (autodiff
//! bookkeeping, allocation: ~170 operations per block forward and backward) is nearly all of its
//! time. Written out, the same block is one operation. The math is exactly [`crate::Gpt`]'s
//! composed block (pre-norm, causal multi-head attention, GELU MLP); `fused_block`'s tests hold
//! the two to each other, outputs and every gradient.
//!
//! Layouts are Burn's: rows are `batch * seq` positions, a linear layer's weight is
//! `[d_in, d_out]`, and the fused `qkv` projection's output holds the queries, keys and values
//! one after another, each head's `d / heads` columns in order.

use burn::config::Config;

/// Which GELU the MLP applies.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Gelu {
    /// `x * Phi(x)` with the exact normal CDF.
    Erf,
    /// The tanh approximation GPT-2 was trained with (Hugging Face's `gelu_new`).
    Tanh,
}

/// Burn's `LayerNormConfig` default, which every [`crate::Gpt`] layer norm uses.
pub(crate) const LAYER_NORM_EPSILON: f32 = 1e-5;

/// The sizes of one block call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockDims {
    /// Samples.
    pub batch: usize,
    /// Positions per sample.
    pub seq: usize,
    /// Model width.
    pub d: usize,
    /// Attention heads (divides `d`).
    pub heads: usize,
    /// MLP width.
    pub d_ff: usize,
    /// The MLP's GELU is the tanh approximation (else the exact erf form).
    pub gelu_tanh: bool,
}

impl BlockDims {
    fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// A head's width and its attention scores' scale, `1 / sqrt(width)`.
    fn head(&self) -> (usize, f32) {
        let dh = self.d / self.heads;
        (dh, 1.0 / (dh as f32).sqrt())
    }
}

/// One of the block's twelve parameters, in [`crate::GptBlock`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    LnAttnGamma,
    LnAttnBeta,
    QkvWeight,
    QkvBias,
    ProjWeight,
    ProjBias,
    LnMlpGamma,
    LnMlpBeta,
    FcInWeight,
    FcInBias,
    FcOutWeight,
    FcOutBias,
}

/// The block's twelve parameters (or their gradients), indexed by [`Param`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BlockParams<T>(pub [T; 12]);

impl<T> BlockParams<T> {
    /// Each parameter through `f`.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> BlockParams<U> {
        BlockParams(self.0.map(f))
    }

    /// The parameters borrowed.
    pub fn as_ref(&self) -> BlockParams<&T> {
        BlockParams(self.0.each_ref())
    }
}

impl<T> std::ops::Index<Param> for BlockParams<T> {
    type Output = T;

    fn index(&self, p: Param) -> &T {
        &self.0[p as usize]
    }
}

/// What the forward pass keeps for the backward.
struct Saved {
    ln_attn: Normalized,
    qkv: Vec<f32>,
    /// Attention probabilities `[batch, heads, seq, seq]`, zero above the diagonal.
    probs: Vec<f32>,
    attn: Vec<f32>,
    ln_mlp: Normalized,
    /// The MLP's pre-activation `[rows, d_ff]` and its GELU.
    hidden: Vec<f32>,
    activated: Vec<f32>,
}

/// A layer norm's output with what its backward needs.
struct Normalized {
    xhat: Vec<f32>,
    rstd: Vec<f32>,
    out: Vec<f32>,
}

/// The block's output `[rows, d]` for input `x` `[rows, d]`.
pub(crate) fn forward(dims: BlockDims, p: &BlockParams<&[f32]>, x: &[f32]) -> Vec<f32> {
    forward_saved(dims, p, x).0
}

fn forward_saved(dims: BlockDims, p: &BlockParams<&[f32]>, x: &[f32]) -> (Vec<f32>, Saved) {
    let (n, d, f) = (dims.rows(), dims.d, dims.d_ff);
    let ln_attn = layer_norm(x, d, p[Param::LnAttnGamma], p[Param::LnAttnBeta]);
    let qkv = linear(
        &ln_attn.out,
        p[Param::QkvWeight],
        p[Param::QkvBias],
        n,
        d,
        3 * d,
    );
    let (attn, probs) = attention(dims, &qkv);
    let mut x1 = linear(&attn, p[Param::ProjWeight], p[Param::ProjBias], n, d, d);
    add_into(&mut x1, x);
    let ln_mlp = layer_norm(&x1, d, p[Param::LnMlpGamma], p[Param::LnMlpBeta]);
    let hidden = linear(
        &ln_mlp.out,
        p[Param::FcInWeight],
        p[Param::FcInBias],
        n,
        d,
        f,
    );
    let activated: Vec<f32> = hidden.iter().map(|&h| gelu(h, dims.gelu_tanh)).collect();
    let mut y = linear(
        &activated,
        p[Param::FcOutWeight],
        p[Param::FcOutBias],
        n,
        f,
        d,
    );
    add_into(&mut y, &x1);
    let saved = Saved {
        ln_attn,
        qkv,
        probs,
        attn,
        ln_mlp,
        hidden,
        activated,
    };
    (y, saved)
}

/// The gradients of the input and of every parameter for the output's gradient `dy`. The
/// forward pass is recomputed from `x` (cheaper at these widths than keeping it).
pub(crate) fn backward(
    dims: BlockDims,
    p: &BlockParams<&[f32]>,
    x: &[f32],
    dy: &[f32],
) -> (Vec<f32>, BlockParams<Vec<f32>>) {
    let (n, d, f) = (dims.rows(), dims.d, dims.d_ff);
    let (_, s) = forward_saved(dims, p, x);
    // y = x1 + fc_out(gelu(fc_in(ln_mlp(x1))))
    let fc_out_weight = at_b(&s.activated, dy, n, f, d);
    let fc_out_bias = column_sums(dy, d);
    let mut d_hidden = a_bt(dy, p[Param::FcOutWeight], n, d, f);
    for (g, &h) in d_hidden.iter_mut().zip(&s.hidden) {
        *g *= gelu_derivative(h, dims.gelu_tanh);
    }
    let fc_in_weight = at_b(&s.ln_mlp.out, &d_hidden, n, d, f);
    let fc_in_bias = column_sums(&d_hidden, f);
    let d_ln_mlp = a_bt(&d_hidden, p[Param::FcInWeight], n, f, d);
    let (mut dx1, ln_mlp_gamma, ln_mlp_beta) =
        layer_norm_backward(&s.ln_mlp, &d_ln_mlp, p[Param::LnMlpGamma], d);
    add_into(&mut dx1, dy);
    // x1 = x + proj(attention(qkv(ln_attn(x))))
    let proj_weight = at_b(&s.attn, &dx1, n, d, d);
    let proj_bias = column_sums(&dx1, d);
    let d_attn = a_bt(&dx1, p[Param::ProjWeight], n, d, d);
    let d_qkv = attention_backward(dims, &s.qkv, &s.probs, &d_attn);
    let qkv_weight = at_b(&s.ln_attn.out, &d_qkv, n, d, 3 * d);
    let qkv_bias = column_sums(&d_qkv, 3 * d);
    let d_ln_attn = a_bt(&d_qkv, p[Param::QkvWeight], n, 3 * d, d);
    let (mut dx, ln_attn_gamma, ln_attn_beta) =
        layer_norm_backward(&s.ln_attn, &d_ln_attn, p[Param::LnAttnGamma], d);
    add_into(&mut dx, &dx1);
    let grads = BlockParams([
        ln_attn_gamma,
        ln_attn_beta,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        ln_mlp_gamma,
        ln_mlp_beta,
        fc_in_weight,
        fc_in_bias,
        fc_out_weight,
        fc_out_bias,
    ]);
    (dx, grads)
}

fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `x [n, k] @ w [k, m] + b`.
fn linear(x: &[f32], w: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * m);
    for _ in 0..n {
        out.extend_from_slice(b);
    }
    for (row, out_row) in x.chunks_exact(k).zip(out.chunks_exact_mut(m)) {
        for (&xi, w_row) in row.iter().zip(w.chunks_exact(m)) {
            for (o, &wv) in out_row.iter_mut().zip(w_row) {
                *o += xi * wv;
            }
        }
    }
    out
}

/// `a^T @ b` for `a [n, k]`, `b [n, m]`: a weight's gradient.
fn at_b(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0.0; k * m];
    for (a_row, b_row) in a.chunks_exact(k).zip(b.chunks_exact(m)).take(n) {
        for (&av, out_row) in a_row.iter().zip(out.chunks_exact_mut(m)) {
            for (o, &bv) in out_row.iter_mut().zip(b_row) {
                *o += av * bv;
            }
        }
    }
    out
}

/// `a @ w^T` for `a [n, m]`, `w [k, m]`: an input's gradient through a linear layer.
fn a_bt(a: &[f32], w: &[f32], n: usize, m: usize, k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * k);
    for a_row in a.chunks_exact(m).take(n) {
        out.extend(w.chunks_exact(m).map(|w_row| dot(a_row, w_row)));
    }
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn column_sums(x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![0.0; m];
    for row in x.chunks_exact(m) {
        add_into(&mut out, row);
    }
    out
}

fn layer_norm(x: &[f32], d: usize, gamma: &[f32], beta: &[f32]) -> Normalized {
    let rows = x.len() / d;
    let (mut xhat, mut rstd, mut out) = (
        Vec::with_capacity(x.len()),
        Vec::with_capacity(rows),
        Vec::with_capacity(x.len()),
    );
    for row in x.chunks_exact(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let r = 1.0 / (var + LAYER_NORM_EPSILON).sqrt();
        rstd.push(r);
        for ((&v, &g), &b) in row.iter().zip(gamma).zip(beta) {
            let h = (v - mean) * r;
            xhat.push(h);
            out.push(h * g + b);
        }
    }
    Normalized { xhat, rstd, out }
}

/// The input's, gamma's and beta's gradients for the output's gradient `dout`.
fn layer_norm_backward(
    ln: &Normalized,
    dout: &[f32],
    gamma: &[f32],
    d: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut dx, mut dgamma, mut dbeta) =
        (Vec::with_capacity(dout.len()), vec![0.0; d], vec![0.0; d]);
    let mut dxhat = vec![0.0; d];
    for ((xhat, dout), &r) in ln
        .xhat
        .chunks_exact(d)
        .zip(dout.chunks_exact(d))
        .zip(&ln.rstd)
    {
        for i in 0..d {
            dgamma[i] += dout[i] * xhat[i];
            dbeta[i] += dout[i];
            dxhat[i] = dout[i] * gamma[i];
        }
        let mean_dxhat = dxhat.iter().sum::<f32>() / d as f32;
        let mean_dxhat_xhat = dot(&dxhat, xhat) / d as f32;
        dx.extend(
            dxhat
                .iter()
                .zip(xhat)
                .map(|(&g, &h)| r * (g - mean_dxhat - h * mean_dxhat_xhat)),
        );
    }
    (dx, dgamma, dbeta)
}

/// Causal multi-head attention over the fused projection `qkv [rows, 3d]`: the heads'
/// outputs `[rows, d]` and the probabilities.
fn attention(dims: BlockDims, qkv: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (batch, seq, d, heads) = (dims.batch, dims.seq, dims.d, dims.heads);
    let (dh, scale) = dims.head();
    let mut out = vec![0.0; batch * seq * d];
    let mut probs = vec![0.0; batch * heads * seq * seq];
    let mut scores = vec![0.0; seq];
    for b in 0..batch {
        let row = |t: usize, part: usize, h: usize| {
            let start = (b * seq + t) * 3 * d + part * d + h * dh;
            &qkv[start..start + dh]
        };
        for h in 0..heads {
            for i in 0..seq {
                let q = row(i, 0, h);
                for (j, s) in scores.iter_mut().enumerate().take(i + 1) {
                    *s = dot(q, row(j, 1, h)) * scale;
                }
                let max = scores[..=i]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0;
                for s in &mut scores[..=i] {
                    *s = (*s - max).exp();
                    total += *s;
                }
                let p_row = &mut probs[((b * heads + h) * seq + i) * seq..][..seq];
                let o = &mut out[(b * seq + i) * d + h * dh..][..dh];
                for j in 0..=i {
                    let p = scores[j] / total;
                    p_row[j] = p;
                    for (ov, &vv) in o.iter_mut().zip(row(j, 2, h)) {
                        *ov += p * vv;
                    }
                }
            }
        }
    }
    (out, probs)
}

/// The gradient of the fused projection for the attention output's gradient `d_out`.
fn attention_backward(dims: BlockDims, qkv: &[f32], probs: &[f32], d_out: &[f32]) -> Vec<f32> {
    let (batch, seq, d, heads) = (dims.batch, dims.seq, dims.d, dims.heads);
    let (dh, scale) = dims.head();
    let mut d_qkv = vec![0.0; qkv.len()];
    let mut d_scores = vec![0.0; seq];
    let at = |b: usize, t: usize, part: usize, h: usize| (b * seq + t) * 3 * d + part * d + h * dh;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                let p_row = &probs[((b * heads + h) * seq + i) * seq..][..seq];
                let g = &d_out[(b * seq + i) * d + h * dh..][..dh];
                for j in 0..=i {
                    let v = &qkv[at(b, j, 2, h)..][..dh];
                    d_scores[j] = dot(g, v);
                    for (dv, &gv) in d_qkv[at(b, j, 2, h)..][..dh].iter_mut().zip(g) {
                        *dv += p_row[j] * gv;
                    }
                }
                let weighted: f32 = (0..=i).map(|j| p_row[j] * d_scores[j]).sum();
                for j in 0..=i {
                    let ds = p_row[j] * (d_scores[j] - weighted) * scale;
                    let (qi, kj) = (at(b, i, 0, h), at(b, j, 1, h));
                    for e in 0..dh {
                        d_qkv[qi + e] += ds * qkv[kj + e];
                        d_qkv[kj + e] += ds * qkv[qi + e];
                    }
                }
            }
        }
    }
    d_qkv
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

fn gelu(x: f32, tanh: bool) -> f32 {
    if tanh {
        0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
    }
}

fn gelu_derivative(x: f32, tanh: bool) -> f32 {
    if tanh {
        let inner = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
        let t = inner.tanh();
        let d_inner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner
    } else {
        let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f32::consts::PI).sqrt();
        cdf + x * pdf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> BlockDims {
        BlockDims {
            batch: 2,
            seq: 3,
            d: 4,
            heads: 2,
            d_ff: 6,
            gelu_tanh: false,
        }
    }

    /// Deterministic values in about [-0.5, 0.5].
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                (h % 1000) as f32 / 1000.0 - 0.5
            })
            .collect()
    }

    fn params(dims: BlockDims) -> BlockParams<Vec<f32>> {
        let (d, f) = (dims.d, dims.d_ff);
        let sizes = [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * f, f, f * d, d];
        let mut seed = 0;
        BlockParams(sizes.map(|n| {
            seed += 1;
            values(n, seed)
        }))
    }

    fn borrowed(p: &BlockParams<Vec<f32>>) -> BlockParams<&[f32]> {
        p.as_ref().map(Vec::as_slice)
    }

    /// `sum(forward(x) * w)`: a scalar whose gradient is the backward of `dy = w`.
    fn objective(dims: BlockDims, p: &BlockParams<Vec<f32>>, x: &[f32], w: &[f32]) -> f64 {
        let y = forward(dims, &borrowed(p), x);
        y.iter().zip(w).map(|(a, b)| f64::from(a * b)).sum()
    }

    #[test]
    fn the_backward_matches_finite_differences_for_the_input_and_every_parameter() {
        for gelu_tanh in [false, true] {
            let dims = BlockDims {
                gelu_tanh,
                ..dims()
            };
            let p = params(dims);
            let x = values(dims.rows() * dims.d, 99);
            let w = values(dims.rows() * dims.d, 7);
            let (dx, grads) = backward(dims, &borrowed(&p), &x, &w);
            let eps = 1e-2;
            let check = |analytic: &[f32], perturb: &dyn Fn(usize, f32) -> f64, what: &str| {
                for (i, &a) in analytic.iter().enumerate() {
                    let numeric = (perturb(i, eps) - perturb(i, -eps)) / (2.0 * f64::from(eps));
                    assert!(
                        (numeric - f64::from(a)).abs() < 2e-3,
                        "{what}[{i}]: analytic {a}, numeric {numeric} (tanh {gelu_tanh})"
                    );
                }
            };
            check(
                &dx,
                &|i, e| {
                    let mut x = x.clone();
                    x[i] += e;
                    objective(dims, &p, &x, &w)
                },
                "x",
            );
            for (k, g) in grads.0.iter().enumerate() {
                check(
                    g,
                    &|i, e| {
                        let mut p = p.clone();
                        p.0[k][i] += e;
                        objective(dims, &p, &x, &w)
                    },
                    &format!("parameter {k}"),
                );
            }
        }
    }

    #[test]
    fn a_later_position_does_not_change_an_earlier_output() {
        let dims = dims();
        let p = params(dims);
        let x = values(dims.rows() * dims.d, 5);
        let mut changed = x.clone();
        let last = (dims.seq - 1) * dims.d;
        changed[last] += 1.0;
        let (a, b) = (
            forward(dims, &borrowed(&p), &x),
            forward(dims, &borrowed(&p), &changed),
        );
        assert_eq!(a[..last], b[..last]);
        assert_ne!(a[last..last + dims.d], b[last..last + dims.d]);
    }
}
