//! Every native operation against Burn's composition of the same arithmetic: values and every
//! gradient, over property-tested shapes (odd lengths, one head, one row, blocks that cut the
//! sequence at every edge), with and without Burn's gradient checkpointing.
//!
//! Causal attention has no fully masked row (each query sees its own key); the first row, which
//! sees one key only, is in every shape.

use burn::backend::Dispatch;
use burn::tensor::activation::{gelu_approximate, log_softmax, softmax};
use burn::tensor::module::layer_norm;
use burn::tensor::{Bool, Device, Distribution, Int, Tensor, TensorData};
use proptest::prelude::*;

use super::StageOps;

/// The devices every case runs on: Flex and, in a build with it, the Cube CPU runtime; each
/// with autodiff, without and with gradient checkpointing.
fn devices() -> Vec<Device> {
    #[cfg_attr(not(feature = "cube-cpu"), expect(unused_mut, reason = "one backend"))]
    let mut inner = vec![Device::flex()];
    #[cfg(feature = "cube-cpu")]
    inner.push(crate::Backend::CubeCpu.base_device().unwrap());
    inner
        .into_iter()
        .flat_map(|d| [d.clone().autodiff(), d.autodiff().gradient_checkpointing()])
        .collect()
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Every value of `b` within `tol` of `a`'s, relative to `a`'s largest magnitude (at least 0.01:
/// a gradient that is zero in exact arithmetic comes out as rounding noise).
fn assert_close<const D: usize>(what: &str, a: Tensor<D>, b: Tensor<D>, tol: f32) {
    assert_within(what, a, b, tol, 1e-2);
}

/// [`assert_close`] relative to at least `floor`.
fn assert_within<const D: usize>(what: &str, a: Tensor<D>, b: Tensor<D>, tol: f32, floor: f32) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (a, b) = (values(a), values(b));
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(floor);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: reference {x}, native {y} (scale {scale})"
        );
    }
}

/// The largest magnitude of `t`.
fn largest<const D: usize>(t: &Tensor<D>) -> f32 {
    values(t.clone()).iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn random<const D: usize>(dims: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::random(dims, Distribution::Normal(0.0, 1.0), device)
}

/// `x` as a fresh leaf that requires a gradient, once per side of a comparison.
fn leaf<const D: usize>(x: &Tensor<D>) -> Tensor<D> {
    x.clone().detach().require_grad()
}

/// The reference: scores, mask, softmax, values (what `Gpt`'s composed block computes).
fn reference_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<3> {
    let [b, h, t, dh] = q.dims();
    let mask: Vec<bool> = (0..t * t).map(|i| i % t > i / t).collect();
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask, [t, t]), &q.device())
        .unsqueeze::<4>()
        .expand([b, h, t, t]);
    let scores = q
        .matmul(k.transpose())
        .div_scalar((dh as f64).sqrt())
        .mask_fill(mask, -1e9);
    softmax(scores, 3)
        .matmul(v)
        .swap_dims(1, 2)
        .reshape([b, t, h * dh])
}

fn native_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, block: usize) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as StageOps>::causal_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        block,
    ))
}

fn check_attention(dims: [usize; 4], block: usize) {
    for device in devices() {
        let [q, k, v] = [0; 3].map(|_| random(dims, &device).detach());
        let [b, h, t, dh] = dims;
        let w = random([b, t, h * dh], &device).detach();
        let run = |native: bool| {
            let (q, k, v) = (leaf(&q), leaf(&k), leaf(&v));
            let o = if native {
                native_attention(q.clone(), k.clone(), v.clone(), block)
            } else {
                reference_attention(q.clone(), k.clone(), v.clone())
            };
            let grads = (o.clone() * w.clone()).sum().backward();
            let g = |x: &Tensor<4>| x.grad(&grads).unwrap();
            (o.detach(), g(&q), g(&k), g(&v))
        };
        let (r, n) = (run(false), run(true));
        let what = format!("attention {dims:?} block {block}");
        assert_close(&format!("{what} output"), r.0, n.0, 2e-5);
        // The three gradients share one scale: with one key a query's gradient is zero in
        // exact arithmetic, and rounding noise of the size of the others'.
        let scale = [&r.1, &r.2, &r.3]
            .map(largest)
            .into_iter()
            .fold(1e-2, f32::max);
        assert_within(&format!("{what} dq"), r.1, n.1, 5e-5, scale);
        assert_within(&format!("{what} dk"), r.2, n.2, 5e-5, scale);
        assert_within(&format!("{what} dv"), r.3, n.3, 5e-5, scale);
    }
}

fn check_layer_norm(rows: usize, d: usize) {
    for device in devices() {
        let x = random([rows, d], &device)
            .mul_scalar(3.0)
            .add_scalar(1.5)
            .detach();
        let w = random([rows, d], &device).detach();
        let gamma = random([d], &device).detach();
        let beta = random([d], &device).detach();
        let run = |native: bool| {
            let (x, gamma, beta) = (leaf(&x), leaf(&gamma), leaf(&beta));
            let y = if native {
                Tensor::<2>::from_dispatch(<Dispatch as StageOps>::layer_norm(
                    x.clone().into_dispatch(),
                    gamma.clone().into_dispatch(),
                    beta.clone().into_dispatch(),
                    1e-5,
                ))
            } else {
                layer_norm(x.clone(), gamma.clone(), Some(beta.clone()), 1e-5)
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            (
                y.detach(),
                x.grad(&grads).unwrap(),
                gamma.grad(&grads).unwrap(),
                beta.grad(&grads).unwrap(),
            )
        };
        let (r, n) = (run(false), run(true));
        let what = format!("layer norm [{rows}, {d}]");
        assert_close(&format!("{what} output"), r.0, n.0, 1e-5);
        // dx is a difference of terms of size |dy gamma| rstd that cancel (exactly at d = 2 but
        // for epsilon): its error is relative to them, not to itself.
        let var = (x.clone() - x.clone().mean_dim(1)).square().mean_dim(1);
        let rstd = var.add_scalar(1e-5).sqrt().recip();
        let terms = largest(&(w.clone() * gamma.clone().unsqueeze::<2>())) * largest(&rstd);
        assert_within(&format!("{what} dx"), r.1, n.1, 5e-6, terms);
        assert_close(&format!("{what} dgamma"), r.2, n.2, 1e-5);
        assert_close(&format!("{what} dbeta"), r.3, n.3, 1e-5);
    }
}

fn check_norm_linear(rows: usize, d: usize, out: usize) {
    for device in devices() {
        let x = random([rows, d], &device)
            .mul_scalar(2.0)
            .add_scalar(0.5)
            .detach();
        let [gamma, beta] = [0; 2].map(|_| random([d], &device).detach());
        let w = random([d, out], &device).detach();
        let bias = random([out], &device).detach();
        let dy = random([rows, out], &device).detach();
        let run = |native: bool| {
            let (x, gamma, beta, w, bias) =
                (leaf(&x), leaf(&gamma), leaf(&beta), leaf(&w), leaf(&bias));
            let y = if native {
                Tensor::<2>::from_dispatch(<Dispatch as StageOps>::norm_linear(
                    x.clone().into_dispatch(),
                    gamma.clone().into_dispatch(),
                    beta.clone().into_dispatch(),
                    w.clone().into_dispatch(),
                    bias.clone().into_dispatch(),
                    1e-5,
                ))
            } else {
                layer_norm(x.clone(), gamma.clone(), Some(beta.clone()), 1e-5).matmul(w.clone())
                    + bias.clone().unsqueeze::<2>()
            };
            let grads = (y.clone() * dy.clone()).sum().backward();
            let g1 = |t: &Tensor<1>| t.grad(&grads).unwrap();
            let g2 = |t: &Tensor<2>| t.grad(&grads).unwrap();
            (y.detach(), g2(&x), g1(&gamma), g1(&beta), g2(&w), g1(&bias))
        };
        let (r, n) = (run(false), run(true));
        let what = format!("norm-linear [{rows}, {d}] x [{d}, {out}]");
        assert_close(&format!("{what} output"), r.0, n.0, 2e-5);
        // dx cancels terms of size |dy W^T gamma| rstd (see `check_layer_norm`).
        let rstd = (x.clone() - x.clone().mean_dim(1))
            .square()
            .mean_dim(1)
            .add_scalar(1e-5)
            .sqrt()
            .recip();
        let upstream = dy.clone().matmul(w.clone().transpose()) * gamma.clone().unsqueeze::<2>();
        let terms = largest(&upstream) * largest(&rstd);
        assert_within(&format!("{what} dx"), r.1, n.1, 5e-6, terms);
        assert_close(&format!("{what} dgamma"), r.2, n.2, 5e-5);
        assert_close(&format!("{what} dbeta"), r.3, n.3, 5e-5);
        assert_close(&format!("{what} dweight"), r.4, n.4, 2e-5);
        assert_close(&format!("{what} dbias"), r.5, n.5, 1e-5);
    }
}

fn check_gelu_linear(rows: usize, f: usize, out: usize, tanh: bool) {
    for device in devices() {
        let x = random([rows, f], &device).mul_scalar(3.0).detach();
        let w = random([f, out], &device).detach();
        let bias = random([out], &device).detach();
        let dy = random([rows, out], &device).detach();
        let run = |native: bool| {
            let (x, w, bias) = (leaf(&x), leaf(&w), leaf(&bias));
            let y = if native {
                Tensor::<2>::from_dispatch(<Dispatch as StageOps>::gelu_linear(
                    x.clone().into_dispatch(),
                    w.clone().into_dispatch(),
                    bias.clone().into_dispatch(),
                    tanh,
                ))
            } else {
                let h = if tanh {
                    gelu_approximate(x.clone())
                } else {
                    super::erf_gelu(x.clone())
                };
                h.matmul(w.clone()) + bias.clone().unsqueeze::<2>()
            };
            let grads = (y.clone() * dy.clone()).sum().backward();
            (
                y.detach(),
                x.grad(&grads).unwrap(),
                w.grad(&grads).unwrap(),
                bias.grad(&grads).unwrap(),
            )
        };
        let (r, n) = (run(false), run(true));
        let what = format!("gelu-linear tanh={tanh} [{rows}, {f}] x [{f}, {out}]");
        assert_close(&format!("{what} output"), r.0, n.0, 2e-5);
        assert_close(&format!("{what} dx"), r.1, n.1, 2e-5);
        assert_close(&format!("{what} dweight"), r.2, n.2, 2e-5);
        assert_close(&format!("{what} dbias"), r.3, n.3, 1e-5);
    }
}

fn check_head_loss(rows: usize, d: usize, vocab: usize, block: usize) {
    for device in devices() {
        let h = random([rows, d], &device).detach();
        let weight = random([d, vocab], &device).detach();
        let ids: Vec<i64> = (0..rows).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
        let targets = Tensor::<1, Int>::from_data(TensorData::new(ids, [rows]), &device);
        let run = |native: bool| {
            let (h, weight) = (leaf(&h), leaf(&weight));
            let loss = if native {
                Tensor::<1>::from_dispatch(<Dispatch as StageOps>::head_loss(
                    h.clone().into_dispatch(),
                    weight.clone().into_dispatch(),
                    targets.clone().into_dispatch(),
                    block,
                ))
            } else {
                let logp = log_softmax(h.clone().matmul(weight.clone()), 1);
                logp.gather(1, targets.clone().unsqueeze_dim::<2>(1))
                    .mean()
                    .neg()
            };
            // A loss scaled as a micro-batch's is (1 / micro-batches).
            let grads = loss.clone().mul_scalar(0.25).backward();
            (
                loss.detach(),
                h.grad(&grads).unwrap(),
                weight.grad(&grads).unwrap(),
            )
        };
        let (r, n) = (run(false), run(true));
        let what = format!("head loss [{rows}, {d}] x [{d}, {vocab}] block {block}");
        assert_close(&format!("{what} loss"), r.0, n.0, 1e-5);
        assert_close(&format!("{what} dh"), r.1, n.1, 5e-5);
        assert_close(&format!("{what} dweight"), r.2, n.2, 5e-5);
    }
}

/// Shapes per property: 16, or `PROPTEST_CASES` (scripts/cube-check.sh runs fewer on the Cube
/// CPU runtime, where every new shape compiles and tunes its kernels on a software Vulkan).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn attention_matches_the_composition(
        batch in 1usize..3, heads in 1usize..4, t in 1usize..24, dh in 1usize..9,
        block in 1usize..10,
    ) {
        check_attention([batch, heads, t, dh], block);
    }

    #[test]
    fn layer_norm_matches_the_composition(rows in 1usize..20, d in 1usize..40) {
        check_layer_norm(rows, d);
    }

    #[test]
    fn norm_linear_matches_the_composition(rows in 1usize..20, d in 1usize..40, out in 1usize..20) {
        check_norm_linear(rows, d, out);
    }

    #[test]
    fn gelu_linear_matches_burns_gelu_and_matmul(
        rows in 1usize..20, f in 1usize..40, out in 1usize..20, tanh in any::<bool>(),
    ) {
        check_gelu_linear(rows, f, out, tanh);
    }

    #[test]
    fn the_head_loss_matches_log_softmax_and_gather(
        rows in 1usize..30, d in 1usize..12, vocab in 2usize..70, block in 1usize..12,
    ) {
        check_head_loss(rows, d, vocab, block);
    }
}

#[test]
fn the_edges_that_cut_blocks_exactly() {
    // A sequence of whole blocks, one row past them, and a block longer than the sequence.
    for (t, block) in [(16, 4), (17, 4), (5, 128), (1, 1)] {
        check_attention([2, 3, t, 4], block);
    }
    for (rows, block) in [(12, 4), (13, 4), (3, 256)] {
        check_head_loss(rows, 5, 11, block);
    }
}
