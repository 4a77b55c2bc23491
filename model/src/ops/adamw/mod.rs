//! AdamW as one operation per parameter: on Flex, one pass over the parameter, its gradient and
//! its two moments, updating them in place (Burn's AdamW is about fifteen tensor operations a
//! parameter, each allocating a parameter-sized result). The arithmetic is Burn's, operation
//! for operation in `f32`, so the two agree to the last bit or so (a test holds them to it). On
//! a Cube device the update is Burn's AdamW, whose elementwise chain Burn's fusion joins.

use burn::backend::flex::FlexTensor;
use burn::backend::{DispatchDevice, Flex};
use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

/// One AdamW step's hyper-parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWStep {
    /// Learning rate.
    pub lr: f64,
    /// The factor the gradient is scaled by first (clipping).
    pub grad_scale: f32,
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
}

/// Elements per rayon task: large enough that scheduling is noise.
const CHUNK: usize = 1 << 15;

/// `t` uniquely owned, contiguous and starting at its storage's first element: what can be
/// updated in place (a copy otherwise, which `storage_mut` would also make).
fn owned(t: FlexTensor) -> FlexTensor {
    let n = t.layout().num_elements();
    match t.layout().contiguous_offsets() {
        Some((0, end)) if end == n && t.storage::<f32>().len() == n => t,
        _ => t.to_contiguous(),
    }
}

/// Whether [`step`] runs on these tensors: the parameter, its gradient and its moments Flex
/// `f32` vectors of one length (else the caller runs Burn's AdamW).
pub(crate) fn fits(param: &Tensor<1>, grad: &Tensor<1>, state: Option<&AdamWState<1>>) -> bool {
    let n = param.dims();
    let moments = state.map_or(Vec::new(), |s| {
        vec![&s.momentum.moment_1, &s.momentum.moment_2]
    });
    let flex_f32 = |t: &Tensor<1>| {
        t.dtype() == DType::F32
            && matches!(t.device().inner().as_dispatch(), DispatchDevice::Flex(_))
    };
    std::iter::once(grad)
        .chain(moments)
        .all(|t| t.dims() == n && flex_f32(t))
        && flex_f32(param)
}

fn flex(t: Tensor<1>) -> FlexTensor {
    match t.try_into_primitive::<Flex>() {
        Ok(t) => t,
        Err(e) => unreachable!("`fits` checked every tensor is Flex: {e:?}"),
    }
}

/// One AdamW step of the flat parameter `param` with `grad` from `state` (`None`: the first
/// step), where [`fits`] said it runs: the updated parameter and state, the parameter and the
/// moments updated in place when nothing else holds them.
pub(crate) fn step(
    param: Tensor<1>,
    grad: &Tensor<1>,
    state: Option<AdamWState<1>>,
    h: AdamWStep,
) -> (Tensor<1>, AdamWState<1>) {
    let n = param.dims()[0];
    let zeros = || FlexTensor::zeros([n].into(), DType::F32);
    let (m1, m2, time) = match state {
        Some(s) => (
            flex(s.momentum.moment_1),
            flex(s.momentum.moment_2),
            s.momentum.time + 1,
        ),
        None => (zeros(), zeros(), 1),
    };
    let (mut p, g) = (owned(flex(param)), owned(flex(grad.clone())));
    let (mut m1, mut m2) = (owned(m1), owned(m2));
    update(
        p.storage_mut::<f32>(),
        g.storage::<f32>(),
        m1.storage_mut::<f32>(),
        m2.storage_mut::<f32>(),
        time,
        h,
    );
    let tensor = |t: FlexTensor| Tensor::<1>::from_primitive::<Flex>(t);
    let momentum = AdaptiveMomentumState::new(time, tensor(m1), tensor(m2));
    (tensor(p), AdamWState::new(momentum))
}

/// The update on slices, as Burn's `AdamW::step` computes it (`f32` throughout; the decay
/// factor and the learning rate rounded from `f64` as Burn's scalar operations round them).
fn update(p: &mut [f32], g: &[f32], m1: &mut [f32], m2: &mut [f32], time: usize, h: AdamWStep) {
    let (f1, f2) = (1.0 - h.beta_1, 1.0 - h.beta_2);
    let t = i32::try_from(time).unwrap_or(i32::MAX);
    let (c1, c2) = (1f32 - h.beta_1.powi(t), 1f32 - h.beta_2.powi(t));
    let decay_rate = h.lr * f64::from(h.weight_decay);
    let keep = (1.0 - decay_rate) as f32;
    let lr = h.lr as f32;
    let scaled = h.grad_scale != 1.0;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m1.par_chunks_mut(CHUNK))
        .zip(m2.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m1), m2)| {
            for i in 0..p.len() {
                let gi = if scaled { g[i] * h.grad_scale } else { g[i] };
                m1[i] = m1[i] * h.beta_1 + gi * f1;
                m2[i] = m2[i] * h.beta_2 + gi * gi * f2;
                let delta = (m1[i] / c1) / ((m2[i] / c2).sqrt() + h.epsilon);
                let decayed = if decay_rate == 0.0 { p[i] } else { p[i] * keep };
                p[i] = decayed - delta * lr;
            }
        });
}

#[cfg(test)]
mod tests {
    use burn::optim::{AdamWConfig, Optimizer};
    use burn::tensor::{Device, Distribution};

    use super::*;

    #[test]
    fn one_pass_adamw_is_burns_adamw() {
        let device = Device::flex();
        let n = 3 * CHUNK + 17;
        let adamw = AdamWConfig::new()
            .with_beta_1(0.9)
            .with_beta_2(0.95)
            .with_epsilon(1e-8)
            .with_weight_decay(0.01)
            .build();
        for (lr, grad_scale) in [(1e-3, 1.0), (3e-4, 0.37)] {
            let h = AdamWStep {
                lr,
                grad_scale,
                beta_1: 0.9,
                beta_2: 0.95,
                epsilon: 1e-8,
                weight_decay: 0.01,
            };
            let mut ours = Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &device);
            let mut burns = ours.clone();
            let (mut our_state, mut burn_state) = (None, None);
            for _ in 0..4 {
                let grad = Tensor::<1>::random([n], Distribution::Normal(0.0, 0.1), &device);
                assert!(fits(&ours, &grad, our_state.as_ref()));
                let (p, s) = step(ours, &grad, our_state, h);
                (ours, our_state) = (p, Some(s));
                let scaled = if grad_scale == 1.0 {
                    grad
                } else {
                    grad.mul_scalar(grad_scale)
                };
                (burns, burn_state) = adamw.step(lr, burns, scaled, burn_state);
            }
            let (a, b) = (
                ours.into_data().try_to_vec::<f32>().unwrap(),
                burns.into_data().try_to_vec::<f32>().unwrap(),
            );
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / y.abs().max(1e-3))
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-6,
                "lr {lr} scale {grad_scale}: relative {worst}"
            );
            let (ours, burns) = (our_state.unwrap(), burn_state.unwrap());
            assert_eq!(ours.momentum.time, burns.momentum.time);
        }
    }

    #[test]
    fn anything_but_flex_f32_vectors_of_one_length_is_left_to_burn() {
        let device = Device::flex();
        let p = Tensor::<1>::zeros([4], &device).cast(DType::F64);
        assert!(!fits(&p, &p, None));
        let q = Tensor::<1>::zeros([4], &device);
        assert!(fits(&q, &q, None) && !fits(&q, &Tensor::zeros([5], &device), None));
    }
}
