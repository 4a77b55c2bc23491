//! A device's first test: a handful of tensor operations, the stage's own operations one by one
//! (each forward and backward, AdamW two steps), then a GPT trained one step as one stage
//! (forward to the loss, backward, AdamW), on the device and on Flex from the same weights and
//! batch, their results compared. On CUDA this is also the first proof that the PTX
//! cubecl generated through the linked LLVM loads on the driver and computes what the CPU does,
//! so it runs before anything long.
//!
//! A result passes when its largest absolute difference from Flex's is within `tolerance` of
//! the larger of 1 and Flex's largest magnitude: GPUs may run f32 matmuls in TF32 (10-bit
//! mantissa, ~1e-3 relative per product), and sums run in another order.

use std::sync::Arc;

use burn::tensor::activation::{gelu, log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Serialize;

use crate::codec::f32_from_le;
use crate::data::{Dataset, Sampler, SyntheticTask, token_batch};
use crate::error::{ModelError, Result};
use crate::gpt::{Gpt, GptConfig};
use crate::host::read_data;
use crate::ops::{self, adamw, adamw::AdamWStep, supports};
use crate::pipeline_model::PipelineModel;
use crate::stage::{Stage, StageConfig, StageOutput, Upstream};
use crate::wire::tensor_values;

/// Seed of the model and batch (any seed does: both sides start from the same weights).
const SEED: u64 = 7;

/// One result on the device against Flex's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// What was computed.
    pub name: String,
    /// Largest absolute difference between the two.
    pub max_abs_diff: f64,
    /// Largest magnitude of Flex's result.
    pub reference_max_abs: f64,
    /// Whether the difference is within the tolerance.
    pub passed: bool,
}

/// Every comparison of one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SmokeReport {
    /// The relative tolerance applied.
    pub tolerance: f64,
    /// The comparisons, in the order they ran.
    pub checks: Vec<Comparison>,
    /// Whether every one passed.
    pub passed: bool,
}

/// The GPT the smoke test trains: every part of GPT-2's block (several heads, a wider
/// feed-forward, causal attention), small enough to run in a second on a CPU.
pub fn smoke_model() -> GptConfig {
    GptConfig {
        vocab_size: 512,
        d_model: 64,
        n_heads: 4,
        n_blocks: 2,
        seq_len: 32,
        d_ff: 256,
        ..GptConfig::tiny()
    }
}

/// Runs the comparisons on `device` against Flex.
pub fn smoke(device: &Device, tolerance: f64) -> Result<SmokeReport> {
    if !(tolerance.is_finite() && tolerance > 0.0) {
        return Err(ModelError::InvalidConfig(format!(
            "smoke tolerance must be a positive number, got {tolerance}"
        )));
    }
    let flex = Device::flex().autodiff();
    let compare =
        |name: &str, reference: Vec<f32>, got: Vec<f32>| compare(name, &reference, &got, tolerance);
    let mut checks = Vec::new();
    for (name, op) in ops() {
        checks.push(compare(name, op(&flex)?, op(device)?));
    }
    // The stage's own operations one by one, where the device runs them: a wrong kernel is
    // named here, where the training step below only says that something differs.
    if supports(&input(device, [1, 1], 0)) {
        for (name, op) in stage_ops() {
            checks.push(compare(name, op(&flex)?, op(device)?));
        }
    }
    let (reference, got) = (
        train_one_step(&flex, &flex)?,
        train_one_step(&flex, device)?,
    );
    checks.push(compare("stage loss", vec![reference.loss], vec![got.loss]));
    checks.push(compare("stage gradients", reference.grads, got.grads));
    checks.push(compare(
        "weights after AdamW",
        reference.weights,
        got.weights,
    ));
    Ok(SmokeReport {
        tolerance,
        passed: checks.iter().all(|c| c.passed),
        checks,
    })
}

fn compare(name: &str, reference: &[f32], got: &[f32], tolerance: f64) -> Comparison {
    let reference_max_abs = reference
        .iter()
        .map(|v| f64::from(v.abs()))
        .fold(0.0, f64::max);
    let max_abs_diff = if reference.len() == got.len() {
        reference
            .iter()
            .zip(got)
            .map(|(a, b)| f64::from((a - b).abs()))
            // A NaN on the device is the largest difference of all.
            .fold(0.0, |m, d| if d.is_nan() || d > m { d } else { m })
    } else {
        f64::INFINITY
    };
    Comparison {
        name: name.into(),
        max_abs_diff,
        reference_max_abs,
        passed: max_abs_diff <= tolerance * reference_max_abs.max(1.0),
    }
}

type Op = fn(&Device) -> Result<Vec<f32>>;

/// The operations compared one by one, each on inputs made on the host.
fn ops() -> [(&'static str, Op); 4] {
    [
        ("matmul 64x96 by 96x80", |d| {
            read(input(d, [64, 96], 1).matmul(input(d, [96, 80], 2)))
        }),
        ("softmax over 128", |d| {
            read(softmax(input(d, [8, 128], 3), 1))
        }),
        ("log_softmax over 512", |d| {
            read(log_softmax(input(d, [4, 512], 4), 1))
        }),
        ("gelu and a sum", |d| {
            read(gelu(input(d, [32, 64], 5)).sum_dim(1))
        }),
    ]
}

/// The stage's own operations (`crate::ops`), each its output and then the gradient of
/// `sum(y * w)` (`w` fixed) for every input; AdamW two steps of a parameter and its moments.
fn stage_ops() -> [(&'static str, Op); 7] {
    [
        ("attention, forward and backward", |d| {
            let [q, k, v] = [11, 12, 13].map(|seed| leaf(d, [64, 8], seed));
            let heads = |x: &Tensor<2>| x.clone().reshape([2, 2, 16, 8]);
            let y = ops::causal_attention(heads(&q), heads(&k), heads(&v));
            with_gradients(y, &[q, k, v], 14)
        }),
        ("layer norm, forward and backward", |d| {
            let [x, gamma, beta] = [
                leaf(d, [32, 48], 21),
                leaf(d, [1, 48], 22),
                leaf(d, [1, 48], 23),
            ];
            let y = ops::layer_norm(x.clone().reshape([2, 16, 48]), norm(&gamma, &beta));
            with_gradients(y, &[x, gamma, beta], 24)
        }),
        (
            "layer norm into a linear layer, forward and backward",
            |d| {
                let [x, gamma, beta] = [
                    leaf(d, [32, 48], 31),
                    leaf(d, [1, 48], 32),
                    leaf(d, [1, 48], 33),
                ];
                let [weight, bias] = [leaf(d, [48, 40], 34), leaf(d, [1, 40], 35)];
                let y = ops::norm_linear(
                    x.clone().reshape([2, 16, 48]),
                    norm(&gamma, &beta),
                    affine(&weight, &bias),
                );
                with_gradients(y, &[x, gamma, beta, weight, bias], 36)
            },
        ),
        ("erf GELU into a linear layer, forward and backward", |d| {
            gelu_linear(d, false)
        }),
        ("tanh GELU into a linear layer, forward and backward", |d| {
            gelu_linear(d, true)
        }),
        ("head and loss, forward and backward", |d| {
            let [h, weight] = [leaf(d, [32, 48], 51), leaf(d, [48, 96], 52)];
            let targets: Vec<i64> = (0..32).map(|i| i * 37 % 96).collect();
            let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [32]), d);
            let loss = ops::head_loss(h.clone(), weight.clone(), targets);
            with_gradients(loss, &[h, weight], 53)
        }),
        ("AdamW, two steps", |d| {
            let d = d.clone().inner();
            let flat = |seed| input(&d, [1, 4096], seed).reshape([4096]);
            let h = AdamWStep {
                lr: 3e-4,
                grad_scale: 0.5,
                beta_1: 0.9,
                beta_2: 0.95,
                epsilon: 1e-8,
                weight_decay: 0.01,
            };
            let (param, grad) = (flat(61), flat(62));
            if !adamw::fits(&param, &grad, None) {
                return Err(ModelError::InvalidConfig(
                    "AdamW's one pass does not run on this device".into(),
                ));
            }
            let (param, state) = adamw::step(param, &grad, None, h);
            let (param, state) = adamw::step(param, &flat(63), Some(state), h);
            let mut out = read(param)?;
            out.extend(read(state.momentum.moment_1)?);
            out.extend(read(state.momentum.moment_2)?);
            Ok(out)
        }),
    ]
}

/// GELU (the tanh approximation when `tanh`) into a linear layer, forward and backward.
fn gelu_linear(d: &Device, tanh: bool) -> Result<Vec<f32>> {
    let [x, weight, bias] = [
        leaf(d, [32, 40], 41),
        leaf(d, [40, 24], 42),
        leaf(d, [1, 24], 43),
    ];
    let y = ops::gelu_linear(x.clone().reshape([2, 16, 40]), tanh, affine(&weight, &bias));
    with_gradients(y, &[x, weight, bias], 44)
}

/// A layer norm of a `[1, d]` scale and shift.
fn norm(gamma: &Tensor<2>, beta: &Tensor<2>) -> ops::Norm {
    let d = gamma.dims()[1];
    ops::Norm {
        gamma: gamma.clone().reshape([d]),
        beta: beta.clone().reshape([d]),
        epsilon: 1e-5,
    }
}

/// A linear layer of a `[in, out]` weight and a `[1, out]` bias.
fn affine(weight: &Tensor<2>, bias: &Tensor<2>) -> ops::Affine {
    ops::Affine {
        weight: weight.clone(),
        bias: bias.clone().reshape([bias.dims()[1]]),
    }
}

/// [`input`] on `device` with autodiff, as a leaf that keeps its gradient.
fn leaf(device: &Device, shape: [usize; 2], seed: u64) -> Tensor<2> {
    let device = if device.is_autodiff() {
        device.clone()
    } else {
        device.clone().autodiff()
    };
    input(&device, shape, seed).require_grad()
}

/// `y`'s values, then the gradient of `sum(y * w)` (`w` from `seed`) for each of `leaves`.
fn with_gradients<const D: usize>(
    y: Tensor<D>,
    leaves: &[Tensor<2>],
    seed: u64,
) -> Result<Vec<f32>> {
    let n = y.shape().num_elements();
    let w = input(&y.device(), [1, n], seed).reshape(y.dims());
    let grads = (y.clone() * w).sum().backward();
    let mut out = read(y.detach())?;
    for x in leaves {
        let g = x
            .grad(&grads)
            .ok_or_else(|| ModelError::InvalidConfig("an input got no gradient".into()))?;
        out.extend(read(g)?);
    }
    Ok(out)
}

/// A tensor of `shape` filled from `seed` with values in [-2, 2), the same on every device.
fn input(device: &Device, shape: [usize; 2], seed: u64) -> Tensor<2> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

fn read<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    tensor_values(read_data(t, "smoke result")?)
}

/// What one training step of the smoke model produced.
struct StepResult {
    loss: f32,
    grads: Vec<f32>,
    weights: Vec<f32>,
}

/// One step of the smoke model as one stage on `device`, from the weights it has when built on
/// `origin` (so that both sides start equal whatever each backend's random stream).
fn train_one_step(origin: &Device, device: &Device) -> Result<StepResult> {
    let model = Arc::new(Gpt::new(smoke_model())?);
    let n = model.num_layers();
    let built = Stage::new(model.clone(), 0..n, SEED, origin, StageConfig::default())?;
    let mut stage = Stage::new(model, 0..n, SEED, device, StageConfig::default())?;
    stage.import_state(&built.export_state(0..n)?, 0..n)?;
    let task = SyntheticTask::default_for(SEED, smoke_model().vocab_size, smoke_model().seq_len)?;
    let batch = token_batch(&task, &Sampler::new(SEED, task.len())?, 0, 4, device)?;
    if !matches!(
        stage.forward(0, batch.inputs, Some(&batch.targets))?,
        StageOutput::LossKept
    ) {
        return Err(ModelError::MissingTargets);
    }
    stage.backward(0, Upstream::Loss { scale: 1.0 })?;
    let grads = f32_from_le(&stage.export_grads()?);
    let totals = stage.step_totals()?;
    let loss = totals.loss.ok_or(ModelError::MissingTargets)? as f32;
    stage.optimizer_step(totals.grad_sq_norm)?;
    let mut weights = Vec::new();
    for layer in 0..n {
        weights.extend(stage.param_values(layer)?.into_iter().flatten());
    }
    Ok(StepResult {
        loss,
        grads,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flex_against_itself_passes_and_a_wrong_result_fails() {
        let report = smoke(&Device::flex().autodiff(), 1e-6).unwrap();
        assert_eq!(report.checks.len(), 14);
        assert!(report.passed, "{report:?}");
        for c in &report.checks {
            assert_eq!(c.max_abs_diff, 0.0, "{c:?}");
            assert!(c.reference_max_abs > 0.0, "{c:?}");
        }
        let off = compare("x", &[1.0, -3.0], &[1.0, -2.9], 0.01);
        assert!(
            !off.passed && (off.max_abs_diff - 0.1).abs() < 1e-6,
            "{off:?}"
        );
        assert!(compare("x", &[1.0, -3.0], &[1.0, -2.98], 0.01).passed);
        assert!(!compare("x", &[1.0], &[f32::NAN], 0.01).passed);
        assert!(!compare("x", &[1.0], &[1.0, 2.0], 0.01).passed);
        assert!(smoke(&Device::flex().autodiff(), 0.0).is_err());
    }

    /// The Cube code a GPU runs, on this CPU: every check at the GPU check's tolerance.
    #[cfg(feature = "cube-cpu")]
    #[test]
    fn the_cube_cpu_runtime_passes_every_check() {
        let device = crate::Backend::CubeCpu.device().unwrap();
        let report = smoke(&device, 1e-2).unwrap();
        assert_eq!(report.checks.len(), 14);
        for c in &report.checks {
            eprintln!(
                "{}: {:.3e} of {:.3e}",
                c.name, c.max_abs_diff, c.reference_max_abs
            );
        }
        assert!(report.passed, "{report:?}");
    }
}
