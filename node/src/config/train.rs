//! The `[train]` section: what the cluster trains and how, and the job spec it describes.

use parcae_model::OptimizerConfig;
use parcae_outer::{OuterSettings, SyncMode, Wire};
use serde::{Deserialize, Serialize};

use crate::job::{JobSpec, ValidationConfig};

/// The built-in GPT presets `parcae-node` trains (`parcae_model::GptConfig`'s).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModelPreset {
    /// 4 pipeline layers, 30,080 parameters: tests and the default testnet.
    Tiny,
    /// 8 pipeline layers, 23.2 M parameters: the benchmark model.
    Small,
    /// GPT-2 124M: Hugging Face GPT-2's structure (14 pipeline layers, untied head).
    #[serde(rename = "gpt2-124m")]
    Gpt2_124m,
    /// GPT-2 medium, 355M (26 pipeline layers).
    #[serde(rename = "gpt2-355m")]
    Gpt2_355m,
    /// GPT-2 large, 774M (38 pipeline layers).
    #[serde(rename = "gpt2-774m")]
    Gpt2_774m,
    /// GPT-2 XL, 1.5B (50 pipeline layers).
    #[serde(rename = "gpt2-1558m")]
    Gpt2_1558m,
}

impl ModelPreset {
    /// The preset's sizes.
    pub fn gpt(self) -> parcae_model::GptConfig {
        use parcae_model::GptConfig;
        match self {
            ModelPreset::Tiny => GptConfig::tiny(),
            ModelPreset::Small => GptConfig::small(),
            ModelPreset::Gpt2_124m => GptConfig::gpt2_124m(),
            ModelPreset::Gpt2_355m => GptConfig::gpt2_355m(),
            ModelPreset::Gpt2_774m => GptConfig::gpt2_774m(),
            ModelPreset::Gpt2_1558m => GptConfig::gpt2_1558m(),
        }
    }
}

impl std::str::FromStr for ModelPreset {
    type Err = String;

    /// The preset a command line names, spelt as in `[train] model`.
    fn from_str(s: &str) -> Result<Self, String> {
        use serde::de::IntoDeserializer;
        let name: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            s.into_deserializer();
        ModelPreset::deserialize(name).map_err(|e| format!("model: {e}"))
    }
}

/// The width of a token file's ids, as the config names it.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtypeName {
    /// 2-byte ids.
    U16,
    /// 4-byte ids.
    U32,
}

impl From<TokenDtypeName> for parcae_model::TokenDtype {
    fn from(name: TokenDtypeName) -> Self {
        match name {
            TokenDtypeName::U16 => parcae_model::TokenDtype::U16,
            TokenDtypeName::U32 => parcae_model::TokenDtype::U32,
        }
    }
}

/// Where a node's job settings come from.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum JobSource {
    /// This file's `[train]`: a founder defines the cluster's job with it, a joiner whose
    /// job differs is refused.
    #[default]
    Own,
    /// The cluster's job, as its founder's `parcae-node` defined it: the node waits for the
    /// job, then trains it with its own data file (checked against the job's hash) and the
    /// `[train]` keys its file sets (refused where they differ).
    Adopt,
}

/// What the cluster trains. Every node must use the same values: the cluster replicates its
/// founder's as the job, and refuses a joiner whose job differs (or gives it the job, with
/// `job = "adopt"`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Train at all (a node without training only runs the control plane).
    pub enabled: bool,
    /// `own`: the job is this section's; `adopt`: the cluster's ([`JobSource`]).
    pub job: JobSource,
    /// Built-in GPT preset.
    pub model: ModelPreset,
    /// `synthetic` (the seeded built-in task), or a path: a token file when `tokens` names its
    /// width, else a text file read as byte-level tokens.
    pub data: String,
    /// `u16` or `u32`: `data` is a flat file of little-endian token ids (nanoGPT's `.bin`,
    /// or what `parcae-node prepare-data` writes), memory-mapped.
    pub tokens: Option<TokenDtypeName>,
    /// The model's vocabulary instead of the preset's (token ids must stay below it; a token
    /// file of GPT-2 ids needs at least 50,257).
    pub vocab_size: Option<usize>,
    /// Width of the residual stream instead of the preset's (a preset's structure at a
    /// reduced width, for example).
    pub d_model: Option<usize>,
    /// Attention heads instead of the preset's (must divide the width).
    pub n_heads: Option<usize>,
    /// Transformer blocks instead of the preset's.
    pub n_blocks: Option<usize>,
    /// Hidden width of the MLP instead of the preset's.
    pub d_ff: Option<usize>,
    /// Longest sequence instead of the preset's.
    pub seq_len: Option<usize>,
    /// A safetensors file of GPT-2 weights (Hugging Face names, as `parcae-node export`
    /// writes and OpenAI's GPT-2 is published) the model starts from instead of the seeded
    /// initialisation: a fine-tune. Every node needs the same file.
    pub init: Option<String>,
    /// Share of the data's examples (its last ones) held out for the validation loss, never
    /// trained (0: no validation).
    pub val_fraction: f64,
    /// Steps between validation losses (step 0 has one too).
    pub val_every: u64,
    /// Held-out samples each validation loss is the mean over (the same ones every time).
    pub val_samples: u32,
    /// Seed of the weights, the data order and the synthetic task.
    pub seed: u64,
    /// Samples per training step over the whole cluster.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Stop after this many committed steps (0: never).
    pub max_steps: u64,
    /// Every this many steps the first replica of each stage checkpoints (0: never).
    pub checkpoint_every: u64,
    /// The job's durable checkpoint store: a directory, or an `s3://`, `gs://` or `az://` URL
    /// (credentials and endpoint from the environment). Unset: `store/` in the data
    /// directory. A new cluster pointed at the same store resumes the job from it.
    pub checkpoint_store: Option<String>,
    /// Another store of this job (a backup): its newest complete checkpoint is copied into the
    /// job's store at start, for a new cluster, or one whose training stopped for want of a
    /// checkpoint, to resume from (`parcae-node run --restore`).
    pub restore: Option<String>,
    /// Complete checkpoints the job's store keeps (0: every one, so that `parcae-node replay`
    /// can check the whole history afterwards).
    pub keep_checkpoints: usize,
    /// Peak learning rate.
    pub peak_lr: f64,
    /// Warmup steps of the learning-rate schedule.
    pub warmup_steps: u64,
    /// Seconds a pipeline neighbour or ring peer may take to answer before the step is
    /// abandoned.
    pub peer_timeout_secs: f64,
    /// Port of the data plane (0: any free port), bound on the libp2p listen IP.
    pub data_port: u16,
    /// How replicas in different zones agree: `step` (every step's gradients averaged over
    /// every replica) or `diloco:H` (inside a zone every step, between zones every H steps
    /// through DiLoCo's outer step).
    pub sync: SyncMode,
    /// The outer optimizer's learning rate (`diloco` only; Nesterov SGD).
    pub outer_lr: f32,
    /// The outer optimizer's momentum (`diloco` only).
    pub outer_momentum: f32,
    /// The form a round's pseudo-gradients cross zones in (`diloco` only): `f32` (exact),
    /// `bf16` (half the bytes) or `int8` (about a quarter, a scale per 256 values).
    pub pseudo_gradient: Wire,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            job: JobSource::Own,
            model: ModelPreset::Tiny,
            data: "synthetic".into(),
            tokens: None,
            vocab_size: None,
            d_model: None,
            n_heads: None,
            n_blocks: None,
            d_ff: None,
            seq_len: None,
            init: None,
            val_fraction: 0.0,
            val_every: 10,
            val_samples: 16,
            seed: 1,
            global_batch: 16,
            micro_batch: 2,
            max_steps: 0,
            checkpoint_every: 20,
            checkpoint_store: None,
            restore: None,
            keep_checkpoints: crate::store::KEEP_STORED_CUTS,
            peak_lr: 1e-2,
            warmup_steps: 10,
            peer_timeout_secs: 10.0,
            data_port: 0,
            sync: SyncMode::Step,
            outer_lr: parcae_outer::sync::DEFAULT_OUTER_LR,
            outer_momentum: parcae_outer::sync::DEFAULT_OUTER_MOMENTUM,
            pseudo_gradient: Wire::F32,
        }
    }
}

impl TrainConfig {
    /// The job spec this section describes: AdamW with the peak learning rate and warmup it
    /// sets, decaying to a tenth of the peak, and the validation split it asks for.
    pub fn job_spec(&self) -> JobSpec {
        JobSpec {
            seed: self.seed,
            global_batch: self.global_batch,
            micro_batch: self.micro_batch,
            max_steps: self.max_steps,
            checkpoint_every: self.checkpoint_every,
            optimizer: OptimizerConfig {
                peak_lr: self.peak_lr,
                min_lr: self.peak_lr / 10.0,
                warmup_steps: self.warmup_steps,
                // Runs that split a batch differently stay within 1e-4 of each other (see the
                // model crate's OptimizerConfig::epsilon).
                epsilon: 1e-5,
                ..OptimizerConfig::default()
            },
            validation: (self.val_fraction > 0.0).then_some(ValidationConfig {
                fraction: self.val_fraction,
                every: self.val_every,
                samples: self.val_samples,
            }),
            sync: self.sync,
            outer: OuterSettings {
                lr: self.outer_lr,
                momentum: self.outer_momentum,
                wire: self.pseudo_gradient,
            },
        }
    }

    /// This section with the spec's values where the spec has them (the optimizer's peak
    /// learning rate and warmup; the validation cadence only with validation).
    pub fn with_spec(&self, spec: &JobSpec) -> TrainConfig {
        let validation = spec
            .validation
            .map_or((0.0, self.val_every, self.val_samples), |v| {
                (v.fraction, v.every, v.samples)
            });
        TrainConfig {
            seed: spec.seed,
            global_batch: spec.global_batch,
            micro_batch: spec.micro_batch,
            max_steps: spec.max_steps,
            checkpoint_every: spec.checkpoint_every,
            peak_lr: spec.optimizer.peak_lr,
            warmup_steps: spec.optimizer.warmup_steps,
            val_fraction: validation.0,
            val_every: validation.1,
            val_samples: validation.2,
            sync: spec.sync,
            outer_lr: spec.outer.lr,
            outer_momentum: spec.outer.momentum,
            pseudo_gradient: spec.outer.wire,
            ..self.clone()
        }
    }
}
