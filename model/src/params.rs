//! Parameters addressed by (layer index, visit order) instead of Burn's `ParamId`.
//!
//! `ParamId`s are drawn from OS entropy per process, so a state or gradient keyed by them means
//! nothing on another machine. The order in which Burn's module visitor walks a layer's
//! parameters is fixed by the module's type, so (layer, position in that walk) names the same
//! parameter in every process; the path (`Block.qkv.weight`) and shape are recorded alongside to
//! detect a mismatch.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{GradientCheckpointingStrategy, Gradients, Tensor};

/// Name and shape of one parameter of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Module path inside the layer, for example `Block.qkv.weight`.
    pub path: String,
    /// Dimensions.
    pub shape: Vec<usize>,
}

impl ParamInfo {
    /// Number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Tracks the module path during a visit or a map.
#[derive(Default)]
struct PathStack(Vec<String>);

impl PathStack {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }

    fn exit(&mut self) {
        self.0.pop();
    }

    fn joined(&self) -> String {
        self.0.join(".")
    }
}

struct InfoVisitor {
    path: PathStack,
    out: Vec<ParamInfo>,
}

impl ModuleVisitor for InfoVisitor {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.enter(name);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // `val()` materialises a lazily initialised parameter, which also fixes its value right
        // after the per-layer seed (see `Stage::new`).
        let dims = param.val().dims();
        self.out.push(ParamInfo {
            path: self.path.joined(),
            shape: dims.to_vec(),
        });
    }
}

/// Names and shapes of `layer`'s float parameters in visit order; materialises lazy parameters.
pub(crate) fn param_infos<L: Module>(layer: &L) -> Vec<ParamInfo> {
    let mut v = InfoVisitor {
        path: PathStack::default(),
        out: Vec::new(),
    };
    layer.visit(&mut v);
    v.out
}

struct ValueVisitor(Vec<Tensor<1>>);

impl ModuleVisitor for ValueVisitor {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val().inner();
        let n = t.shape().num_elements();
        self.0.push(t.reshape([n]));
    }
}

/// The values of `layer`'s parameters in visit order, flattened, outside autodiff.
pub(crate) fn param_values<L: Module>(layer: &L) -> Vec<Tensor<1>> {
    let mut v = ValueVisitor(Vec::new());
    layer.visit(&mut v);
    v.0
}

struct GradVisitor<'a> {
    grads: &'a mut Gradients,
    out: Vec<Option<Tensor<1>>>,
}

impl ModuleVisitor for GradVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let grad = if param.is_require_grad() {
            param.val().grad_remove(self.grads).map(|g| {
                let n = g.shape().num_elements();
                g.reshape([n])
            })
        } else {
            None
        };
        self.out.push(grad);
    }
}

/// Removes `layer`'s parameter gradients from `grads`, flattened, in visit order.
pub(crate) fn take_grads<L: Module>(layer: &L, grads: &mut Gradients) -> Vec<Option<Tensor<1>>> {
    let mut v = GradVisitor {
        grads,
        out: Vec::new(),
    };
    layer.visit(&mut v);
    v.out
}

/// Replaces parameter values in visit order, keeping each parameter's id and autodiff settings.
struct ValueMapper {
    values: std::vec::IntoIter<Tensor<1>>,
}

impl ModuleMapper for ValueMapper {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(value) = self.values.next() else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let value = value
            .reshape(tensor.dims())
            .to_device(&tensor.device().inner());
        Param::from_mapped_value(id, Leaf::of(&tensor).wrap(value), mapper)
    }
}

/// How a parameter sits on autodiff, taken before its tensor is consumed so that a new value
/// can stand where it stood: `Tensor::from_inner` alone gives Burn's default
/// gradient-checkpointing strategy, and an op that mixes two strategies panics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leaf {
    strategy: Option<GradientCheckpointingStrategy>,
    require_grad: bool,
}

impl Leaf {
    pub(crate) fn of<const D: usize>(tensor: &Tensor<D>) -> Self {
        Self {
            strategy: tensor.gradient_checkpointing_strategy(),
            require_grad: tensor.is_require_grad(),
        }
    }

    /// `value`, a tensor of the inner backend, on autodiff as this leaf was.
    pub(crate) fn wrap<const D: usize>(self, value: Tensor<D>) -> Tensor<D> {
        let mut t = Tensor::from_inner(value);
        if let Some(strategy) = self.strategy {
            t = t.with_gradient_checkpointing_strategy(strategy);
        }
        if self.require_grad {
            t = t.require_grad();
        }
        t
    }
}

/// `layer` with its parameter values replaced by `values` (flattened, visit order); the caller
/// has checked count and sizes against [`param_infos`].
pub(crate) fn with_values<L: Module>(layer: L, values: Vec<Tensor<1>>) -> L {
    layer.map(&mut ValueMapper {
        values: values.into_iter(),
    })
}

/// Gives every trainable parameter a leaf of its own over the same values.
struct FreshLeaves;

impl ModuleMapper for FreshLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if !param.is_require_grad() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.detach().require_grad(), mapper)
    }
}

/// A copy of `layer` whose trainable parameters are new autodiff leaves sharing the values.
/// Burn's autodiff merges every graph that touches a leaf into the leaf's graph and holds that
/// graph's lock for a whole backward, so lanes that shared the stage's leaves would run their
/// backward passes one after the other; with leaves of their own they run at once.
pub(crate) fn with_fresh_leaves<L: Module>(layer: L) -> L {
    layer.map(&mut FreshLeaves)
}
