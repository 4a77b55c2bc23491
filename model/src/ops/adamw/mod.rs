//! AdamW as one operation per parameter: on Flex, one pass over the parameter, its gradient and
//! its two moments, updating them in place (Burn's AdamW is about fifteen tensor operations a
//! parameter, each allocating a parameter-sized result). The arithmetic is Burn's, operation
//! for operation in `f32`, so the two agree to the last bit or so (a test holds them to it). On
//! a Cube device, in a build with one, the same arithmetic is one `#[cube]` kernel
//! (`cube`).

#[cfg(any(feature = "cuda", feature = "cube-cpu"))]
mod cube;
mod factors;

use burn::backend::flex::FlexTensor;
use burn::backend::{DispatchDevice, Flex};
use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

pub(crate) use factors::AdamWStep;
use factors::Factors;

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

/// Whether [`step`] runs on these tensors: the parameter, its gradient and its moments `f32`
/// vectors of one length on Flex (or, in a build with one, on Cube); else the caller runs
/// Burn's AdamW.
pub(crate) fn fits(param: &Tensor<1>, grad: &Tensor<1>, state: Option<&AdamWState<1>>) -> bool {
    let n = param.dims();
    let moments = state.map_or(Vec::new(), |s| {
        vec![&s.momentum.moment_1, &s.momentum.moment_2]
    });
    let kind = |t: &Tensor<1>| match t.device().inner().as_dispatch() {
        DispatchDevice::Flex(_) => Some(Kind::Flex),
        #[cfg(any(feature = "cuda", feature = "cube-cpu"))]
        DispatchDevice::Cube(_) => Some(Kind::Cube),
        _ => None,
    };
    let Some(k) = kind(param) else {
        return false;
    };
    std::iter::once(param)
        .chain(std::iter::once(grad))
        .chain(moments)
        .all(|t| t.dims() == n && t.dtype() == DType::F32 && kind(t) == Some(k))
}

/// The devices [`step`] has a pass for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Flex,
    #[cfg(any(feature = "cuda", feature = "cube-cpu"))]
    Cube,
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
    #[cfg(any(feature = "cuda", feature = "cube-cpu"))]
    if matches!(
        param.device().inner().as_dispatch(),
        DispatchDevice::Cube(_)
    ) {
        return cube_step(param, grad, state, h);
    }
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
        Factors::of(time, h),
    );
    let tensor = |t: FlexTensor| Tensor::<1>::from_primitive::<Flex>(t);
    let momentum = AdaptiveMomentumState::new(time, tensor(m1), tensor(m2));
    (tensor(p), AdamWState::new(momentum))
}

/// [`step`] on a Cube device: one kernel launch.
#[cfg(any(feature = "cuda", feature = "cube-cpu"))]
fn cube_step(
    param: Tensor<1>,
    grad: &Tensor<1>,
    state: Option<AdamWState<1>>,
    h: AdamWStep,
) -> (Tensor<1>, AdamWState<1>) {
    use burn::backend::Cube;
    let cube = |t: Tensor<1>| match t.try_into_primitive::<Cube>() {
        Ok(t) => t,
        Err(e) => unreachable!("`fits` checked every tensor is Cube: {e:?}"),
    };
    let (m1, m2, time) = match state {
        Some(s) => (
            s.momentum.moment_1,
            s.momentum.moment_2,
            s.momentum.time + 1,
        ),
        None => {
            let zeros = || Tensor::<1>::zeros(param.dims(), &param.device());
            (zeros(), zeros(), 1)
        }
    };
    let [p, m1, m2] = cube::step(
        cube(param),
        cube(grad.clone()),
        cube(m1),
        cube(m2),
        Factors::of(time, h),
    );
    let tensor = |t| Tensor::<1>::from_primitive::<Cube>(t);
    let momentum = AdaptiveMomentumState::new(time, tensor(m1), tensor(m2));
    (tensor(p), AdamWState::new(momentum))
}

/// The update on slices: Burn's arithmetic, element by element (a scale of 1 and a keep of 1
/// change nothing: `x * 1.0` is `x`).
fn update(p: &mut [f32], g: &[f32], m1: &mut [f32], m2: &mut [f32], s: Factors) {
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m1.par_chunks_mut(CHUNK))
        .zip(m2.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m1), m2)| {
            for i in 0..p.len() {
                let gi = g[i] * s.grad_scale;
                m1[i] = m1[i] * s.beta_1 + gi * s.f1;
                m2[i] = m2[i] * s.beta_2 + gi * gi * s.f2;
                let delta = (m1[i] / s.c1) / ((m2[i] / s.c2).sqrt() + s.epsilon);
                p[i] = p[i] * s.keep - delta * s.lr;
            }
        });
}

#[cfg(test)]
mod tests {
    use burn::optim::{AdamWConfig, Optimizer};
    use burn::tensor::{Device, Distribution};

    use super::*;

    /// The largest gap between `reference`'s values and `other`'s, relative to the reference's
    /// magnitude (at least 1e-3).
    fn largest_relative_gap(reference: Tensor<1>, other: Tensor<1>) -> f32 {
        let values = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
        let (a, b) = (values(reference), values(other));
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
            .fold(0f32, f32::max)
    }

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
            let worst = largest_relative_gap(burns, ours);
            assert!(
                worst <= 1e-6,
                "lr {lr} scale {grad_scale}: relative {worst}"
            );
            let (ours, burns) = (our_state.unwrap(), burn_state.unwrap());
            assert_eq!(ours.momentum.time, burns.momentum.time);
        }
    }

    /// The kernel on the Cube CPU runtime against the Flex pass, four steps from the same
    /// start (division and square root need not round alike on every device: 1e-5 relative).
    #[cfg(feature = "cube-cpu")]
    #[test]
    fn the_cube_kernel_is_the_flex_pass() {
        let (flex, cube) = (
            Device::flex(),
            crate::Backend::CubeCpu.base_device().unwrap(),
        );
        let n = 2 * CHUNK + 17;
        let h = AdamWStep {
            lr: 3e-4,
            grad_scale: 0.37,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.01,
        };
        let start = Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &flex);
        let (mut ours, mut theirs) = (start.clone(), start.to_device(&cube));
        let (mut our_state, mut their_state) = (None, None);
        for _ in 0..4 {
            let grad = Tensor::<1>::random([n], Distribution::Normal(0.0, 0.1), &flex);
            let on_cube = grad.clone().to_device(&cube);
            assert!(fits(&theirs, &on_cube, their_state.as_ref()));
            let (p, s) = step(ours, &grad, our_state, h);
            (ours, our_state) = (p, Some(s));
            let (p, s) = step(theirs, &on_cube, their_state, h);
            (theirs, their_state) = (p, Some(s));
        }
        let m2 = |s: Option<AdamWState<1>>| s.unwrap().momentum.moment_2;
        for (what, a, b) in [
            ("parameter", ours, theirs),
            ("second moment", m2(our_state), m2(their_state)),
        ] {
            let worst = largest_relative_gap(a, b);
            assert!(worst <= 1e-5, "{what}: relative {worst}");
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
