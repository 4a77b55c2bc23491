//! The report `parcae-node learn` writes (issue 68's learning reference: groups synchronised
//! every step or every `H` steps, validation loss against samples, the bytes between groups)
//! and `parcae-testnet plot-learning` draws.

use serde::{Deserialize, Serialize};

/// What `parcae-node learn` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnReport {
    /// The model preset.
    pub model: String,
    /// Its width, blocks and tokens per sample (the preset's or as changed).
    pub d_model: usize,
    /// Transformer blocks.
    pub n_blocks: usize,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Its trainable parameters.
    pub params: u64,
    /// The data: `synthetic` or the text file.
    pub data: String,
    /// Groups that train apart between rounds.
    pub groups: u32,
    /// Data-parallel pipelines a group.
    pub replicas: u32,
    /// Stages a pipeline.
    pub stages: u32,
    /// Samples per step.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// AdamW's peak learning rate.
    pub lr: f64,
    /// The outer Nesterov SGD's learning rate.
    pub outer_lr: f32,
    /// Its momentum.
    pub outer_momentum: f32,
    /// The pseudo-gradient's wire form (`f32`, `bf16`, `int8`).
    pub pseudo_gradient: String,
    /// One run per mode and seed.
    pub runs: Vec<LearnRun>,
}

/// One mode trained from one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnRun {
    /// `step` or `diloco:H`.
    pub sync: String,
    /// The seed of its weights and sample order.
    pub seed: u64,
    /// Samples trained.
    pub samples: u64,
    /// Validation loss against samples trained.
    pub curve: Vec<ValPoint>,
    /// The last validation loss (after the last step).
    pub val_loss_last: f64,
    /// Bytes priced between groups (see the module).
    pub cross_group_bytes: u64,
    /// Outer rounds taken (0 under `step`).
    pub rounds: u64,
    /// Wall time of the run, seconds.
    pub secs: f64,
}

/// One validation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValPoint {
    /// Samples trained before it.
    pub samples: u64,
    /// The mean loss of the held-out batches.
    pub val_loss: f64,
}
