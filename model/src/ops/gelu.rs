//! GELU (the exact erf form and GPT-2's tanh approximation) with its own backward: the forward
//! keeps only its input, the backward recomputes the derivative from it (Burn's tanh form is
//! eight operations, each keeping its input).

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

use burn::tensor::Tensor;

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f64 = FRAC_2_SQRT_PI * FRAC_1_SQRT_2;
/// The cubic term of the tanh approximation.
const CUBIC: f64 = 0.044_715;

/// `tanh(sqrt(2/pi) (x + 0.044715 x^3))`.
fn tanh_inner<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let cube = x.clone().powi_scalar(3).mul_scalar(CUBIC);
    (x + cube).mul_scalar(SQRT_2_OVER_PI).tanh()
}

/// `Phi(x) = (1 + erf(x / sqrt 2)) / 2`.
fn cdf<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.mul_scalar(FRAC_1_SQRT_2)
        .erf()
        .add_scalar(1.0)
        .mul_scalar(0.5)
}

/// `x * Phi(x)`, or `x (1 + tanh(...)) / 2` when `tanh`.
pub(crate) fn forward<const D: usize>(x: Tensor<D>, tanh: bool) -> Tensor<D> {
    if tanh {
        let t = tanh_inner(x.clone());
        x.mul_scalar(0.5) * t.add_scalar(1.0)
    } else {
        x.clone() * cdf(x)
    }
}

/// The input's gradient given the output's, `dy`.
pub(crate) fn backward<const D: usize>(x: Tensor<D>, tanh: bool, dy: Tensor<D>) -> Tensor<D> {
    let slope = if tanh {
        // d/dx [x (1 + t) / 2] = (1 + t) / 2 + x (1 - t^2) sqrt(2/pi) (1 + 3c x^2) / 2
        let t = tanh_inner(x.clone());
        let inner = x
            .clone()
            .square()
            .mul_scalar(3.0 * CUBIC)
            .add_scalar(1.0)
            .mul_scalar(SQRT_2_OVER_PI);
        let sech2 = t.clone().square().neg().add_scalar(1.0);
        (t.add_scalar(1.0) + x * sech2 * inner).mul_scalar(0.5)
    } else {
        // d/dx [x Phi(x)] = Phi(x) + x phi(x)
        let density = x
            .clone()
            .square()
            .mul_scalar(-0.5)
            .exp()
            .mul_scalar(FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * 0.5);
        cdf(x.clone()) + x * density
    };
    dy * slope
}
