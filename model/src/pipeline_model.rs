//! The [`PipelineModel`] trait: a model as an ordered list of layers.
//!
//! A pipeline cuts a model between layers, and a repartition moves single layers between
//! machines, so the unit everything is built from is one layer: a Burn module that can be
//! initialised on its own (deterministically, from a per-layer seed), run on the previous layer's
//! output, and addressed by its index. A stage is then any contiguous range of layers.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use sha2::{Digest, Sha256};

use crate::activation::Activation;
use crate::error::Result;
use crate::rng::StageRng;

/// A model that can be cut into pipeline stages at any layer boundary.
///
/// Layer 0 receives the batch inputs; the output of the last layer goes into
/// [`PipelineModel::loss`] together with the batch targets. Implementations should validate the
/// kind and shape of what they receive and return [`crate::ModelError`] rather than panic, because
/// activations arrive from other machines.
///
/// Initialisation must draw all randomness from the backend RNG through Burn's initialisers (or
/// not at all): the stage seeds the device once per layer, so that a stage built on its own holds
/// exactly the weights of the same layers in the unsplit model.
///
/// # Example: a model that is not a transformer
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor, activation::relu};
/// use parcae_model::{Activation, ModelError, PipelineModel, StageRng};
///
/// /// A multilayer perceptron that regresses a vector: every layer is one `Linear`.
/// struct Mlp { widths: Vec<usize> }
///
/// #[derive(Module, Debug)]
/// struct Dense { linear: Linear }
///
/// impl PipelineModel for Mlp {
///     type Layer = Dense;
///     fn num_layers(&self) -> usize { self.widths.len() - 1 }
///     fn architecture(&self) -> String { format!("mlp{:?}", self.widths) }
///     fn init_layer(&self, i: usize, device: &Device) -> Dense {
///         Dense { linear: LinearConfig::new(self.widths[i], self.widths[i + 1]).init(device) }
///     }
///     fn forward(&self, i: usize, layer: &Dense, x: Activation, _rng: &mut StageRng)
///         -> Result<Activation, ModelError> {
///         let x = x.into_features(&format!("mlp layer {i}"))?;
///         if x.dims()[1] != self.widths[i] {
///             return Err(ModelError::ShapeMismatch {
///                 what: format!("mlp layer {i} input"),
///                 expected: format!("[batch, {}]", self.widths[i]),
///                 found: x.dims().to_vec(),
///             });
///         }
///         let y = layer.linear.forward(x);
///         let last = i + 1 == self.num_layers();
///         Ok(Activation::Features(if last { y } else { relu(y) }))
///     }
///     fn loss(&self, out: Activation, targets: &Activation) -> Result<Tensor<1>, ModelError> {
///         let y = out.into_features("mlp loss")?;
///         let t = targets.clone().into_features("mlp targets")?;
///         Ok((y - t).square().mean())
///     }
/// }
///
/// // Two stages of the same model, driven like any other.
/// let device = Device::flex().autodiff();
/// let model = std::sync::Arc::new(Mlp { widths: vec![4, 8, 8, 2] });
/// let config = parcae_model::StageConfig::default();
/// let mut pipe = parcae_model::Pipeline::new(model, &[0..2, 2..3], 7, &device, config).unwrap();
/// let x = Tensor::<2>::ones([3, 4], &device);
/// let y = Tensor::<2>::zeros([3, 2], &device);
/// let batch = parcae_model::Batch { inputs: Activation::Features(x), targets: Activation::Features(y) };
/// let loss = pipe.train_step(&[batch]).unwrap();
/// assert!(loss.is_finite());
/// ```
pub trait PipelineModel: Send + Sync + 'static {
    /// One layer. Use an enum module when layers differ (embedding, blocks, head).
    type Layer: Module;

    /// Number of layers.
    fn num_layers(&self) -> usize;

    /// A description of the architecture (kind and sizes) that differs between models whose
    /// states are not interchangeable; its hash guards state imports.
    fn architecture(&self) -> String;

    /// A human-readable name of layer `index`, for reports.
    fn layer_name(&self, index: usize) -> String {
        format!("layer {index}")
    }

    /// Builds layer `index` on `device`. The caller has seeded the device for this layer.
    fn init_layer(&self, index: usize, device: &Device) -> Self::Layer;

    /// Parameters of layer `index`. Sizing (state-message limits, memory estimates) asks this
    /// instead of building a stage; the default builds that one layer on the CPU and counts, so
    /// a model that knows its sizes should say them.
    fn layer_params(&self, index: usize) -> usize {
        self.init_layer(index, &Device::flex()).num_params()
    }

    /// Parameters of the whole model: the sum of [`PipelineModel::layer_params`].
    fn num_params(&self) -> usize {
        (0..self.num_layers()).map(|i| self.layer_params(i)).sum()
    }

    /// The token ids its first layer and its loss take (`0..vocab`), for a model that reads
    /// tokens (`None`: any the data has). Ids are checked on the host, where batches are made
    /// ([`crate::token_batch`], against the dataset's vocabulary, which [`crate::check_vocabulary`]
    /// holds to this one), not on the device, where a check is a blocking read-back.
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    /// Runs layer `index` on `input`. `rng` is the layer's own random stream, for stochastic
    /// layers that must continue identically after a hand-off.
    fn forward(
        &self,
        index: usize,
        layer: &Self::Layer,
        input: Activation,
        rng: &mut StageRng,
    ) -> Result<Activation>;

    /// The scalar training loss of the last layer's `output` against the batch `targets`, as a
    /// mean over examples (so that micro-batch losses average to the batch loss).
    fn loss(&self, output: Activation, targets: &Activation) -> Result<Tensor<1>>;

    /// The loss of the last layer, `index`, run on `input`: [`PipelineModel::loss`] of its
    /// [`PipelineModel::forward`] unless the model has a cheaper way to the same value (a
    /// language model's head fused with its loss keeps no logits for the backward). Training
    /// calls this; inference and evaluation call `forward` and `loss`.
    fn forward_loss(
        &self,
        index: usize,
        layer: &Self::Layer,
        input: Activation,
        targets: &Activation,
        rng: &mut StageRng,
    ) -> Result<Tensor<1>> {
        self.loss(self.forward(index, layer, input, rng)?, targets)
    }

    /// A 64-bit fingerprint of [`PipelineModel::architecture`], stored in every state buffer.
    fn fingerprint(&self) -> u64 {
        let digest = Sha256::digest(self.architecture().as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }
}

/// One micro-batch: the inputs of layer 0 and the targets of the loss.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs of layer 0 (token ids for a language model).
    pub inputs: Activation,
    /// Targets the loss compares the last layer's output with.
    pub targets: Activation,
}
