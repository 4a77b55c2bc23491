//! AdamW as one `#[cube]` kernel a parameter, on a Cube device: one launch reads the parameter,
//! its gradient and its two moments and writes the three updated in place (where nothing else
//! holds them), where Burn's AdamW registers about fourteen elementwise operations a parameter.
//! Elementwise only, no plane operations: it runs on every Cube runtime.
//!
//! The device's tensors are fusion tensors: the kernel is registered on the fusion stream as a
//! custom operation (lazy, in order with the rest of the step's work), which hands it the
//! underlying Cube tensors when the stream runs it.

use burn::backend::Cube;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::fusion::{CubeFusionHandle, FusionCubeRuntime};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::custom::{
    CustomOpIr, HandleContainer, Operation, OperationIr, OperationOutput, StreamId, TensorIr,
};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::factors::Factors;

#[cube(launch_unchecked)]
#[expect(
    clippy::too_many_arguments,
    reason = "a kernel's arguments are its interface"
)]
fn adamw_kernel(
    param: &mut Tensor<f32>,
    grad: &Tensor<f32>,
    m1: &mut Tensor<f32>,
    m2: &mut Tensor<f32>,
    grad_scale: f32,
    beta_1: f32,
    beta_2: f32,
    f1: f32,
    f2: f32,
    c1: f32,
    c2: f32,
    epsilon: f32,
    keep: f32,
    lr: f32,
) {
    let i = ABSOLUTE_POS;
    if i < param.len() {
        let g = grad[i] * grad_scale;
        let a = m1[i] * beta_1 + g * f1;
        let b = m2[i] * beta_2 + g * g * f2;
        m1[i] = a;
        m2[i] = b;
        let delta = (a / c1) / (f32::sqrt(b / c2) + epsilon);
        param[i] = param[i] * keep - delta * lr;
    }
}

/// `t` contiguous and writable: its own buffer when nothing else holds it, else a copy.
fn writable(t: CubeTensor) -> CubeTensor {
    let t = into_contiguous(t);
    if t.can_mut() { t } else { t.copy() }
}

/// Launches the kernel: the updated parameter and moments.
fn launch(
    p: CubeTensor,
    g: CubeTensor,
    m1: CubeTensor,
    m2: CubeTensor,
    s: Factors,
) -> [CubeTensor; 3] {
    let (p, m1, m2, g) = (writable(p), writable(m1), writable(m2), into_contiguous(g));
    let n = p.meta.num_elements();
    let client = p.client.clone();
    let cube_dim = CubeDim::new(&client, n);
    let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
    // SAFETY: every access is behind the kernel's bound check on the parameter's length, which
    // the gradient and moments share (`adamw::fits`).
    unsafe {
        adamw_kernel::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            p.clone().into_tensor_arg(),
            g.into_tensor_arg(),
            m1.clone().into_tensor_arg(),
            m2.clone().into_tensor_arg(),
            s.grad_scale,
            s.beta_1,
            s.beta_2,
            s.f1,
            s.f2,
            s.c1,
            s.c2,
            s.epsilon,
            s.keep,
            s.lr,
        );
    }
    [p, m1, m2]
}

/// The kernel as a fusion stream's custom operation.
#[derive(Debug)]
struct AdamWOp {
    inputs: [TensorIr; 4],
    outputs: [TensorIr; 3],
    factors: Factors,
}

impl Operation<FusionCubeRuntime> for AdamWOp {
    fn execute(
        &self,
        handles: &mut HandleContainer<CubeFusionHandle>,
    ) -> Result<(), burn::backend::ExecutionError> {
        let [p, g, m1, m2] = self
            .inputs
            .each_ref()
            .map(|ir| handles.get_float_tensor::<CubeBackend>(ir));
        for (ir, t) in self.outputs.iter().zip(launch(p, g, m1, m2, self.factors)) {
            handles.register_float_tensor::<CubeBackend>(&ir.id, t);
        }
        Ok(())
    }
}

/// One AdamW step of `param` with `grad` and the moments `m1`, `m2` (one length, `f32`):
/// the updated parameter and moments, queued on the device's stream.
pub(super) fn step(
    param: FloatTensor<Cube>,
    grad: FloatTensor<Cube>,
    m1: FloatTensor<Cube>,
    m2: FloatTensor<Cube>,
    factors: Factors,
) -> [FloatTensor<Cube>; 3] {
    let client = param.client.clone();
    let outputs: [TensorIr; 3] = std::array::from_fn(|_| {
        TensorIr::uninit(
            client.create_empty_handle(),
            param.shape.clone(),
            param.dtype,
        )
    });
    let inputs = [param.into_ir(), grad.into_ir(), m1.into_ir(), m2.into_ir()];
    let desc = CustomOpIr::new("parcae_adamw", &inputs, &outputs);
    client
        .register(
            StreamId::current(),
            OperationIr::Custom(desc),
            AdamWOp {
                inputs,
                outputs,
                factors,
            },
        )
        .outputs::<3>()
}
