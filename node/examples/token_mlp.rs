//! A user-defined Burn model trained across processes through the library API.
//!
//! `TokenMlp` is not the built-in GPT: an embedding, position-wise residual MLP blocks and an
//! output projection, predicting the next token of the built-in synthetic task. It implements
//! `PipelineModel`, so the cluster can cut it into stages anywhere; this example pins two
//! stages, one per process, and each process returns from `run` once the 40th step is committed
//! and its checkpoint stored, printing how the job ended:
//!
//! ```text
//! parcae-node keygen --out /tmp/key
//! cargo run --example token_mlp -- /tmp/a 127.0.0.1:9100 /tmp/key
//! cargo run --example token_mlp -- /tmp/b 127.0.0.1:9101 /tmp/key /ip4/127.0.0.1/tcp/PORT/p2p/ID
//! ```
//! (the bootstrap address is in the first process's `/status`, `listen_addrs`).

use anyhow::Context as _;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::activation::{log_softmax, relu};
use burn::tensor::{Device, Tensor};
use parcae_node::{
    Activation, ModelError, OptimizerConfig, PipelineModel, StageRng, SyntheticTask, Trainer,
};

/// Embedding, `blocks` residual MLP blocks, output projection.
struct TokenMlp {
    vocab: usize,
    width: usize,
    blocks: usize,
}

/// One layer of the model (Burn modules are enums-of-structs friendly, so one struct with
/// optional parts keeps `PipelineModel::Layer` a single type).
#[derive(Module, Debug)]
struct MlpLayer {
    embedding: Option<Embedding>,
    linear: Option<Linear>,
}

impl TokenMlp {
    fn hidden(&self, i: usize, x: Activation) -> Result<Tensor<3>, ModelError> {
        let h = x.into_hidden(&format!("token-mlp layer {i}"))?;
        if h.dims()[2] != self.width {
            return Err(ModelError::ShapeMismatch {
                what: format!("token-mlp layer {i} input"),
                expected: format!("[batch, seq, {}]", self.width),
                found: h.dims().to_vec(),
            });
        }
        Ok(h)
    }
}

impl PipelineModel for TokenMlp {
    type Layer = MlpLayer;

    fn num_layers(&self) -> usize {
        self.blocks + 2
    }

    fn architecture(&self) -> String {
        format!("token-mlp v{} w{} b{}", self.vocab, self.width, self.blocks)
    }

    fn init_layer(&self, i: usize, device: &Device) -> MlpLayer {
        let (embedding, linear) = if i == 0 {
            (
                Some(EmbeddingConfig::new(self.vocab, self.width).init(device)),
                None,
            )
        } else if i == self.num_layers() - 1 {
            (
                None,
                Some(LinearConfig::new(self.width, self.vocab).init(device)),
            )
        } else {
            (
                None,
                Some(LinearConfig::new(self.width, self.width).init(device)),
            )
        };
        MlpLayer { embedding, linear }
    }

    fn forward(
        &self,
        i: usize,
        layer: &MlpLayer,
        x: Activation,
        _rng: &mut StageRng,
    ) -> Result<Activation, ModelError> {
        let missing = || ModelError::InvalidConfig(format!("token-mlp layer {i} is incomplete"));
        if let Some(embedding) = &layer.embedding {
            let tokens = x.into_tokens("token-mlp input")?;
            return Ok(Activation::Hidden(embedding.forward(tokens)));
        }
        let linear = layer.linear.as_ref().ok_or_else(missing)?;
        let h = self.hidden(i, x)?;
        Ok(Activation::Hidden(if i == self.num_layers() - 1 {
            linear.forward(h)
        } else {
            h.clone() + relu(linear.forward(h))
        }))
    }

    fn loss(&self, output: Activation, targets: &Activation) -> Result<Tensor<1>, ModelError> {
        let logits = output.into_hidden("token-mlp logits")?;
        let targets = targets.clone().into_tokens("token-mlp targets")?;
        let logp = log_softmax(logits, 2);
        Ok(logp.gather(2, targets.unsqueeze_dim::<3>(2)).mean().neg())
    }
}

fn main() -> anyhow::Result<()> {
    parcae_node::process::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data_dir, status_addr, key, bootstrap @ ..] = args.as_slice() else {
        anyhow::bail!("usage: token_mlp DATA_DIR STATUS_ADDR KEY_FILE [BOOTSTRAP_MULTIADDR]");
    };
    let model = TokenMlp {
        vocab: 64,
        width: 32,
        blocks: 2,
    };
    let data = SyntheticTask::default_for(5, 64, 16)?;
    let outcome = Trainer::new(model, data)
        .seed(5)
        .batch(16, 4)
        .max_steps(40)
        .checkpoint_every(0)
        .optimizer(OptimizerConfig {
            peak_lr: 1e-2,
            warmup_steps: 5,
            ..OptimizerConfig::default()
        })
        .data_dir(data_dir)
        .key_file(key)
        .listen("/ip4/127.0.0.1/tcp/0".parse()?)
        .status_addr(status_addr.parse().context("STATUS_ADDR")?)
        .bootstrap(
            bootstrap
                .iter()
                .map(|b| b.parse())
                .collect::<Result<Vec<_>, _>>()?,
        )
        .configure(|node| {
            node.planner.interval_secs = 2.0;
            node.planner.pin = Some([1, 2]);
        })
        .run()?;
    println!("{outcome}");
    Ok(())
}
