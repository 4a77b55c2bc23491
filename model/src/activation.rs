//! What flows between layers and stages: token ids, hidden states, feature vectors.
//!
//! Burn tensors have a compile-time rank, but a pipeline boundary is decided at run time (any
//! layer can end a stage), so the boundary value is an enum over the shapes that models use. It is
//! also the unit of the stage-boundary autodiff idiom: a received activation becomes a leaf that
//! requires a gradient, and the backward of a stage is the backward of `sum(y * dL/dy)`.

use burn::tensor::{Device, Gradients, Int, Tensor};

use crate::error::{ModelError, Result};
use crate::wire::{WireDType, WireLimits, WireTensor};

/// A value at a layer boundary.
#[derive(Debug, Clone)]
pub enum Activation {
    /// Token ids `[batch, seq]`: the input of a language model's first layer, and its targets.
    Tokens(Tensor<2, Int>),
    /// Hidden states `[batch, seq, features]`: between transformer layers.
    Hidden(Tensor<3>),
    /// Feature vectors `[batch, features]`: between layers of a non-sequence model.
    Features(Tensor<2>),
}

impl Activation {
    /// The variant's name, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Tokens(_) => "tokens",
            Self::Hidden(_) => "hidden",
            Self::Features(_) => "features",
        }
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Self::Tokens(t) => t.dims().to_vec(),
            Self::Hidden(t) => t.dims().to_vec(),
            Self::Features(t) => t.dims().to_vec(),
        }
    }

    /// Number of examples (the first dimension).
    pub fn batch_size(&self) -> usize {
        self.dims()[0]
    }

    /// Positions per example: the sequence length of tokens and hidden states, 1 for feature
    /// vectors.
    pub(crate) fn positions_per_example(&self) -> usize {
        match self {
            Self::Tokens(_) | Self::Hidden(_) => self.dims()[1],
            Self::Features(_) => 1,
        }
    }

    /// The hidden states, or an error naming `what` received something else.
    pub fn into_hidden(self, what: &str) -> Result<Tensor<3>> {
        match self {
            Self::Hidden(t) => Ok(t),
            other => Err(other.wrong_kind(what, "hidden")),
        }
    }

    /// The feature vectors, or an error naming `what` received something else.
    pub fn into_features(self, what: &str) -> Result<Tensor<2>> {
        match self {
            Self::Features(t) => Ok(t),
            other => Err(other.wrong_kind(what, "features")),
        }
    }

    /// The token ids, or an error naming `what` received something else.
    pub fn into_tokens(self, what: &str) -> Result<Tensor<2, Int>> {
        match self {
            Self::Tokens(t) => Ok(t),
            other => Err(other.wrong_kind(what, "tokens")),
        }
    }

    fn wrong_kind(&self, what: &str, expected: &'static str) -> ModelError {
        ModelError::WrongActivationKind {
            what: what.to_string(),
            expected,
            found: self.kind(),
        }
    }

    /// Encodes a float activation (or gradient) for the wire. Token ids never cross the wire: both
    /// ends of a pipeline derive them from the sampler.
    pub fn to_wire(&self, dtype: WireDType) -> Result<Vec<u8>> {
        match self {
            Self::Hidden(t) => WireTensor::encode_tensor(t, dtype),
            Self::Features(t) => WireTensor::encode_tensor(t, dtype),
            Self::Tokens(_) => Err(self.wrong_kind("wire encoding", "hidden or features")),
        }
    }

    /// Decodes a wire buffer onto `device`: rank 3 becomes [`Activation::Hidden`], rank 2
    /// [`Activation::Features`].
    pub fn from_wire(bytes: &[u8], limits: &WireLimits, device: &Device) -> Result<Self> {
        let t = WireTensor::decode(bytes, limits)?;
        match t.shape.len() {
            3 => Ok(Self::Hidden(t.into_tensor(device)?)),
            2 => Ok(Self::Features(t.into_tensor(device)?)),
            _ => Err(ModelError::ShapeMismatch {
                what: "wire activation".into(),
                expected: "rank 2 or 3".into(),
                found: t.shape,
            }),
        }
    }

    /// A copy cut from the autodiff graph that produced it: what a neighbour stage receives.
    pub(crate) fn detached(&self) -> Self {
        match self {
            Self::Tokens(t) => Self::Tokens(t.clone()),
            Self::Hidden(t) => Self::Hidden(t.clone().detach()),
            Self::Features(t) => Self::Features(t.clone().detach()),
        }
    }

    /// Marks a received float activation as a leaf whose gradient the backward keeps.
    pub(crate) fn into_leaf(self) -> Self {
        match self {
            Self::Tokens(t) => Self::Tokens(t),
            Self::Hidden(t) => Self::Hidden(t.detach().require_grad()),
            Self::Features(t) => Self::Features(t.detach().require_grad()),
        }
    }

    /// Moves the tensor onto `device` (no-op when it is there already).
    pub(crate) fn into_device(self, device: &Device) -> Self {
        match self {
            Self::Tokens(t) => Self::Tokens(t.to_device(device)),
            Self::Hidden(t) => Self::Hidden(t.to_device(device)),
            Self::Features(t) => Self::Features(t.to_device(device)),
        }
    }

    /// Cuts the activation along its first dimension into consecutive slices of `sizes`
    /// examples (which must add up to [`Activation::batch_size`]).
    pub(crate) fn split(self, sizes: &[usize]) -> Vec<Self> {
        if sizes.len() == 1 {
            return vec![self];
        }
        let starts = sizes.iter().scan(0, |start, &n| {
            let s = *start;
            *start += n;
            Some((s, n))
        });
        starts
            .map(|(s, n)| match &self {
                Self::Tokens(t) => Self::Tokens(t.clone().narrow(0, s, n)),
                Self::Hidden(t) => Self::Hidden(t.clone().narrow(0, s, n)),
                Self::Features(t) => Self::Features(t.clone().narrow(0, s, n)),
            })
            .collect()
    }

    /// Joins float slices made by [`Activation::split`] back into one activation.
    pub(crate) fn concat(parts: Vec<Self>) -> Result<Self> {
        let mut parts = parts.into_iter();
        let what = "lane output";
        match parts.next() {
            Some(Self::Hidden(first)) => Ok(Self::Hidden(cat_after(
                first,
                parts.map(|p| p.into_hidden(what)),
            )?)),
            Some(Self::Features(first)) => Ok(Self::Features(cat_after(
                first,
                parts.map(|p| p.into_features(what)),
            )?)),
            Some(other) => Err(other.wrong_kind(what, "hidden or features")),
            None => Err(ModelError::InvalidConfig("no lane output to join".into())),
        }
    }

    /// Takes this leaf's gradient out of `grads` (None for token ids).
    pub(crate) fn grad_remove(&self, grads: &mut Gradients) -> Option<Self> {
        match self {
            Self::Tokens(_) => None,
            Self::Hidden(t) => t.grad_remove(grads).map(Self::Hidden),
            Self::Features(t) => t.grad_remove(grads).map(Self::Features),
        }
    }

    /// `sum(self * upstream)`: the scalar whose backward is the vector-Jacobian product with the
    /// upstream gradient. `upstream` must have this activation's kind and shape.
    pub(crate) fn vjp_seed(&self, upstream: Self) -> Result<Tensor<1>> {
        let (expected, found) = (self.dims(), upstream.dims());
        if expected != found {
            return Err(ModelError::ShapeMismatch {
                what: "upstream gradient".into(),
                expected: format!("{expected:?}"),
                found,
            });
        }
        let device = match self {
            Self::Hidden(t) => t.device(),
            Self::Features(t) => t.device(),
            Self::Tokens(_) => return Err(self.wrong_kind("backward output", "hidden or features")),
        };
        match (self, upstream.into_device(&device)) {
            (Self::Hidden(y), Self::Hidden(dy)) => Ok((y.clone() * dy.detach()).sum()),
            (Self::Features(y), Self::Features(dy)) => Ok((y.clone() * dy.detach()).sum()),
            (_, other) => Err(other.wrong_kind("upstream gradient", self.kind())),
        }
    }
}

/// `first` and then `rest` joined along the first dimension.
fn cat_after<const D: usize>(
    first: Tensor<D>,
    rest: impl Iterator<Item = Result<Tensor<D>>>,
) -> Result<Tensor<D>> {
    let parts = std::iter::once(Ok(first))
        .chain(rest)
        .collect::<Result<_>>()?;
    Ok(Tensor::cat(parts, 0))
}
