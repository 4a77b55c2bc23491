//! The reference model: a GPT-2-style decoder cut into `embedding, block 1..N, head` layers.
//!
//! Pre-norm transformer blocks with explicit causal attention (matmul, mask, softmax: measured
//! faster on Flex than Burn's fused attention op, see `notes/burn-0.22.md`), a GELU MLP, learned
//! position embeddings, and an untied language-model head whose loss is the mean token
//! cross-entropy. The GPT-2 presets have Hugging Face GPT-2's layer structure and its tanh GELU,
//! so its published weights load into them ([`crate::Gpt2Safetensors`]); their head is untied
//! (a pipeline keeps the embedding and the head on different machines), starting as a copy of
//! the token embedding when a file has no head of its own.

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::{gelu_approximate, log_softmax, softmax};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use burn::backend::DispatchTensor;

use crate::activation::Activation;
use crate::block_kernel::{BlockParams, Gelu, LAYER_NORM_EPSILON};
use crate::error::{ModelError, Result};
use crate::fused_block;
use crate::ops::{self, OpSet};
use crate::pipeline_model::PipelineModel;
use crate::rng::StageRng;

/// Sizes of a [`Gpt`]. Use a preset or set any field; saved and loaded as JSON through Burn's
/// [`Config`] (`save`, `load`).
#[derive(Config, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Number of token ids.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub n_heads: usize,
    /// Transformer blocks; the model has `n_blocks + 2` pipeline layers.
    pub n_blocks: usize,
    /// Longest sequence (positions learned).
    pub seq_len: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// The MLP's GELU.
    #[config(default = "Gelu::Erf")]
    pub gelu: Gelu,
    /// How a block runs: the same arithmetic either way, and the same parameters.
    #[config(default = "BlockKernel::Composed")]
    pub kernel: BlockKernel,
    /// The operations a composed block and the head run: Burn's composition (the oracle) or
    /// ours with their own backward (`ops`), where the device has them.
    #[config(default = "OpSet::Native")]
    pub ops: OpSet,
}

/// How [`Gpt`] runs a transformer block.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum BlockKernel {
    /// Burn's operations, one per step of the block (about 50 forward): fast where the
    /// operations are large, on every backend.
    Composed,
    /// One operation with a hand-written backward (`fused_block`): for narrow models on
    /// the CPU, where Burn's per-operation cost is nearly all of a block's time (d 16, sequence
    /// 8: 9x faster forward and backward). Flex only; other devices run the composed block.
    Fused,
}

impl GptConfig {
    /// The test model: 4 pipeline layers, 30,080 parameters, trains in seconds.
    pub fn tiny() -> Self {
        Self {
            vocab_size: 64,
            d_model: 32,
            n_heads: 4,
            n_blocks: 2,
            seq_len: 16,
            d_ff: 128,
            gelu: Gelu::Erf,
            kernel: BlockKernel::Composed,
            ops: OpSet::Native,
        }
    }

    /// The benchmark model: d 512, 8 heads, 6 blocks, seq 128, vocab 4096 (23,175,168
    /// parameters).
    pub fn small() -> Self {
        Self {
            vocab_size: 4096,
            d_model: 512,
            n_heads: 8,
            n_blocks: 6,
            seq_len: 128,
            d_ff: 2048,
            gelu: Gelu::Erf,
            kernel: BlockKernel::Composed,
            ops: OpSet::Native,
        }
    }

    /// GPT-2 (OpenAI's 124M model): 12 blocks of width 768, 12 heads, 1024 positions, the
    /// 50,257-token BPE vocabulary; 124,439,808 parameters as published plus the untied head's
    /// 38,597,376.
    pub fn gpt2_124m() -> Self {
        Self::gpt2(768, 12, 12)
    }

    /// GPT-2 medium (355M): 24 blocks of width 1024, 16 heads.
    pub fn gpt2_355m() -> Self {
        Self::gpt2(1024, 16, 24)
    }

    /// GPT-2 large (774M): 36 blocks of width 1280, 20 heads.
    pub fn gpt2_774m() -> Self {
        Self::gpt2(1280, 20, 36)
    }

    /// GPT-2 XL (1.5B): 48 blocks of width 1600, 25 heads.
    pub fn gpt2_1558m() -> Self {
        Self::gpt2(1600, 25, 48)
    }

    fn gpt2(d_model: usize, n_heads: usize, n_blocks: usize) -> Self {
        Self {
            vocab_size: 50_257,
            d_model,
            n_heads,
            n_blocks,
            seq_len: 1024,
            d_ff: 4 * d_model,
            gelu: Gelu::Tanh,
            kernel: BlockKernel::Composed,
            ops: OpSet::Native,
        }
    }

    /// Checks that the sizes make a model.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("seq_len", self.seq_len),
            ("d_ff", self.d_ff),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::InvalidConfig(format!(
                "{name} must be positive"
            )));
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(ModelError::InvalidConfig(format!(
                "n_heads {} does not divide d_model {}",
                self.n_heads, self.d_model
            )));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(ModelError::InvalidConfig("vocab_size exceeds u32".into()));
        }
        Ok(())
    }
}

/// Token and position embeddings: layer 0.
#[derive(Module, Debug)]
pub struct GptEmbedding {
    token: Embedding,
    position: Embedding,
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct GptBlock {
    ln_attn: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln_mlp: LayerNorm,
    fc_in: Linear,
    fc_out: Linear,
}

impl GptBlock {
    /// The twelve parameters as the fused block takes them, or `None` where a layer norm or a
    /// linear layer has no bias (the fused block always adds one).
    fn fused_parameters(&self) -> Option<BlockParams<DispatchTensor>> {
        let linear = |l: &Linear| {
            Some((
                l.weight.val().into_dispatch(),
                l.bias.as_ref()?.val().into_dispatch(),
            ))
        };
        let norm = |n: &LayerNorm| {
            Some((
                n.gamma.val().into_dispatch(),
                n.beta.as_ref()?.val().into_dispatch(),
            ))
        };
        let (a, b) = norm(&self.ln_attn)?;
        let (c, d) = linear(&self.qkv)?;
        let (e, f) = linear(&self.proj)?;
        let (g, h) = norm(&self.ln_mlp)?;
        let (i, j) = linear(&self.fc_in)?;
        let (k, l) = linear(&self.fc_out)?;
        Some(BlockParams([a, b, c, d, e, f, g, h, i, j, k, l]))
    }
}

/// Final norm and the language-model head: the last layer.
#[derive(Module, Debug)]
pub struct GptHead {
    ln: LayerNorm,
    lm_head: Linear,
}

/// One pipeline layer of a [`Gpt`].
#[derive(Module, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "a handful of long-lived layers per stage; boxing only adds an indirection"
)]
pub enum GptLayer {
    /// Layer 0.
    Embedding(GptEmbedding),
    /// Layers 1..=n_blocks.
    Block(GptBlock),
    /// The last layer.
    Head(GptHead),
}

/// The reference GPT-2-style decoder as a [`PipelineModel`].
#[derive(Debug, Clone)]
pub struct Gpt {
    config: GptConfig,
}

impl Gpt {
    /// A model of the given sizes.
    pub fn new(config: GptConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { config })
    }

    /// Its sizes.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    fn check_hidden(&self, what: &str, x: &Tensor<3>, width: usize) -> Result<()> {
        let [b, t, d] = x.dims();
        if b == 0 || t == 0 || t > self.config.seq_len || d != width {
            return Err(ModelError::ShapeMismatch {
                what: what.to_string(),
                expected: format!("[batch >= 1, 1..={}, {width}]", self.config.seq_len),
                found: vec![b, t, d],
            });
        }
        Ok(())
    }

    /// Checks the shape of a batch of token ids; their values were checked where the batch was
    /// made ([`PipelineModel::vocab_size`]).
    fn check_tokens(&self, what: &str, tokens: &Tensor<2, Int>) -> Result<()> {
        let [b, t] = tokens.dims();
        if b == 0 || t == 0 || t > self.config.seq_len {
            return Err(ModelError::ShapeMismatch {
                what: what.to_string(),
                expected: format!("[batch >= 1, 1..={}]", self.config.seq_len),
                found: vec![b, t],
            });
        }
        Ok(())
    }

    fn embed(&self, layer: &GptEmbedding, tokens: Tensor<2, Int>) -> Result<Tensor<3>> {
        self.check_tokens("embedding input", &tokens)?;
        let [b, t] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<1, Int>::arange(0..t as i64, &device)
            .unsqueeze::<2>()
            .expand([b, t]);
        Ok(layer.token.forward(tokens) + layer.position.forward(positions))
    }

    /// Whether this model runs its native operations on `x`'s device.
    fn native(&self, x: &Tensor<3>) -> bool {
        self.config.ops == OpSet::Native && ops::supports(x)
    }

    /// `norm` applied to `x`: the native layer norm where it runs.
    fn norm(&self, norm: &LayerNorm, x: Tensor<3>) -> Tensor<3> {
        match native_norm(norm) {
            Some(n) if self.native(&x) => ops::layer_norm(x, n),
            _ => norm.forward(x),
        }
    }

    /// `linear(norm(x))`: one native operation where it runs (the norm's output is not kept).
    fn norm_linear(&self, norm: &LayerNorm, linear: &Linear, x: Tensor<3>) -> Tensor<3> {
        match (native_norm(norm), affine(linear)) {
            (Some(n), Some(a)) if self.native(&x) => ops::norm_linear(x, n, a),
            _ => linear.forward(self.norm(norm, x)),
        }
    }

    /// `linear(gelu(x))` with the model's GELU: one native operation where it runs (the GELU's
    /// output is not kept).
    fn gelu_linear(&self, linear: &Linear, x: Tensor<3>) -> Tensor<3> {
        let tanh = self.config.gelu == Gelu::Tanh;
        match affine(linear) {
            Some(a) if self.native(&x) => ops::gelu_linear(x, tanh, a),
            _ if tanh => linear.forward(gelu_approximate(x)),
            _ => linear.forward(ops::erf_gelu(x)),
        }
    }

    fn block(&self, layer: &GptBlock, x: Tensor<3>) -> Tensor<3> {
        if self.config.kernel == BlockKernel::Fused
            && fused_block::supports(&x)
            && let Some(params) = layer.fused_parameters()
        {
            return fused_block::block(params, x, self.config.n_heads, self.config.gelu);
        }
        let [b, t, d] = x.dims();
        let h = self.config.n_heads;
        let dh = d / h;
        let qkv = self.norm_linear(&layer.ln_attn, &layer.qkv, x.clone());
        let heads = |i: usize| {
            qkv.clone()
                .narrow(2, i * d, d)
                .reshape([b, t, h, dh])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let attn = if self.native(&x) {
            ops::causal_attention(q, k, v)
        } else {
            let scores = q.matmul(k.transpose()).div_scalar((dh as f64).sqrt());
            let scores = scores.mask_fill(causal_mask(t, &x.device()).expand([b, h, t, t]), -1e9);
            softmax(scores, 3)
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([b, t, d])
        };
        let x = x + layer.proj.forward(attn);
        let hidden = self.norm_linear(&layer.ln_mlp, &layer.fc_in, x.clone());
        x + self.gelu_linear(&layer.fc_out, hidden)
    }

    /// The targets of a loss over `[b, t]` positions, checked.
    fn loss_targets(&self, [b, t]: [usize; 2], targets: &Activation) -> Result<Tensor<2, Int>> {
        let targets = targets.clone().into_tokens("targets")?;
        self.check_tokens("targets", &targets)?;
        if targets.dims() != [b, t] {
            return Err(ModelError::ShapeMismatch {
                what: "targets".into(),
                expected: format!("[{b}, {t}]"),
                found: targets.dims().to_vec(),
            });
        }
        Ok(targets)
    }
}

/// A layer norm's parameters for the native operations, where it has a shift (every GPT layer
/// norm has one, and Burn's default epsilon).
fn native_norm(norm: &LayerNorm) -> Option<ops::Norm> {
    Some(ops::Norm {
        gamma: norm.gamma.val(),
        beta: norm.beta.as_ref()?.val(),
        epsilon: f64::from(LAYER_NORM_EPSILON),
    })
}

/// A linear layer's parameters for the native operations, where it has a bias.
fn affine(linear: &Linear) -> Option<ops::Affine> {
    Some(ops::Affine {
        weight: linear.weight.val(),
        bias: linear.bias.as_ref()?.val(),
    })
}

/// `true` above the diagonal: the positions a query must not attend to.
fn causal_mask(t: usize, device: &Device) -> Tensor<4, Bool> {
    let mask: Vec<bool> = (0..t * t).map(|k| k % t > k / t).collect();
    Tensor::<2, Bool>::from_data(TensorData::new(mask, [t, t]), device).unsqueeze::<4>()
}

impl PipelineModel for Gpt {
    type Layer = GptLayer;

    fn vocab_size(&self) -> Option<usize> {
        Some(self.config.vocab_size)
    }

    fn num_layers(&self) -> usize {
        self.config.n_blocks + 2
    }

    fn architecture(&self) -> String {
        let c = &self.config;
        let gelu = match c.gelu {
            Gelu::Erf => "",
            Gelu::Tanh => " gelu-tanh",
        };
        format!(
            "gpt2-prenorm v{} d{} h{} b{} s{} f{}{gelu}",
            c.vocab_size, c.d_model, c.n_heads, c.n_blocks, c.seq_len, c.d_ff
        )
    }

    fn layer_name(&self, index: usize) -> String {
        match index {
            0 => "embedding".into(),
            i if i == self.num_layers() - 1 => "head".into(),
            i => format!("block {i}"),
        }
    }

    fn layer_params(&self, index: usize) -> usize {
        let c = &self.config;
        let (d, f) = (c.d_model, c.d_ff);
        let layer_norm = 2 * d;
        let linear = |i: usize, o: usize| i * o + o;
        match index {
            0 => (c.vocab_size + c.seq_len) * d,
            i if i == self.num_layers() - 1 => layer_norm + d * c.vocab_size,
            _ => 2 * layer_norm + linear(d, 3 * d) + linear(d, d) + linear(d, f) + linear(f, d),
        }
    }

    fn init_layer(&self, index: usize, device: &Device) -> GptLayer {
        let c = &self.config;
        let small = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        if index == 0 {
            GptLayer::Embedding(GptEmbedding {
                token: EmbeddingConfig::new(c.vocab_size, c.d_model)
                    .with_initializer(small.clone())
                    .init(device),
                position: EmbeddingConfig::new(c.seq_len, c.d_model)
                    .with_initializer(small)
                    .init(device),
            })
        } else if index == self.num_layers() - 1 {
            GptLayer::Head(GptHead {
                ln: LayerNormConfig::new(c.d_model).init(device),
                lm_head: LinearConfig::new(c.d_model, c.vocab_size)
                    .with_bias(false)
                    .init(device),
            })
        } else {
            GptLayer::Block(GptBlock {
                ln_attn: LayerNormConfig::new(c.d_model).init(device),
                qkv: LinearConfig::new(c.d_model, 3 * c.d_model).init(device),
                proj: LinearConfig::new(c.d_model, c.d_model).init(device),
                ln_mlp: LayerNormConfig::new(c.d_model).init(device),
                fc_in: LinearConfig::new(c.d_model, c.d_ff).init(device),
                fc_out: LinearConfig::new(c.d_ff, c.d_model).init(device),
            })
        }
    }

    fn forward(
        &self,
        index: usize,
        layer: &GptLayer,
        input: Activation,
        _rng: &mut StageRng,
    ) -> Result<Activation> {
        let name = self.layer_name(index);
        match layer {
            GptLayer::Embedding(l) => {
                let tokens = input.into_tokens(&name)?;
                Ok(Activation::Hidden(self.embed(l, tokens)?))
            }
            GptLayer::Block(l) => {
                let x = input.into_hidden(&name)?;
                self.check_hidden(&name, &x, self.config.d_model)?;
                Ok(Activation::Hidden(self.block(l, x)))
            }
            GptLayer::Head(l) => {
                let x = input.into_hidden(&name)?;
                self.check_hidden(&name, &x, self.config.d_model)?;
                Ok(Activation::Hidden(l.lm_head.forward(self.norm(&l.ln, x))))
            }
        }
    }

    fn loss(&self, output: Activation, targets: &Activation) -> Result<Tensor<1>> {
        let logits = output.into_hidden("loss input")?;
        self.check_hidden("loss input", &logits, self.config.vocab_size)?;
        let [b, t, _] = logits.dims();
        let targets = self.loss_targets([b, t], targets)?;
        let device = logits.device();
        let logp = log_softmax(logits, 2);
        let picked = logp.gather(2, targets.to_device(&device).unsqueeze_dim::<3>(2));
        Ok(picked.mean().neg())
    }

    /// The head's loss without its logits where the native operations run (the head fused with
    /// the loss), else the head's logits into [`PipelineModel::loss`].
    fn forward_loss(
        &self,
        index: usize,
        layer: &GptLayer,
        input: Activation,
        targets: &Activation,
        rng: &mut StageRng,
    ) -> Result<Tensor<1>> {
        let head = match (layer, &input) {
            (GptLayer::Head(head), Activation::Hidden(x))
                if self.native(x) && head.lm_head.bias.is_none() =>
            {
                head
            }
            _ => return self.loss(self.forward(index, layer, input, rng)?, targets),
        };
        let name = self.layer_name(index);
        let x = input.into_hidden(&name)?;
        self.check_hidden(&name, &x, self.config.d_model)?;
        let [b, t, d] = x.dims();
        let targets = self.loss_targets([b, t], targets)?;
        let h = self.norm(&head.ln, x).reshape([b * t, d]);
        let targets = targets.to_device(&h.device()).reshape([b * t]);
        Ok(ops::head_loss(h, head.lm_head.weight.val(), targets))
    }
}

#[cfg(test)]
mod tests;
