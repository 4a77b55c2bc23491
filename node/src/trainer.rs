//! [`Trainer`]: how a Burn project trains its own [`PipelineModel`] on a Parcae-rs cluster.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo<M: parcae_model::PipelineModel>(model: M, data: impl parcae_model::Dataset + 'static,
//! #     opts: parcae_node::runtime::RunOptions) -> anyhow::Result<()> {
//! let code = parcae_node::Trainer::new(model, data)
//!     .seed(7)
//!     .batch(32, 4)
//!     .max_steps(1000)
//!     .run(opts)?;
//! # Ok(()) }
//! ```
//!
//! The builder only describes the job ([`TrainJob`]); [`crate::train`] assembles it inside a
//! node and [`crate::runtime`] runs the node.

use std::sync::Arc;

use parcae_model::{Dataset, OptimizerConfig, PipelineModel, WeightSource, default_device};

use crate::emulate::Emulation;
use crate::runtime::{NodeError, RunOptions};
use crate::train::{TrainJob, TrainerLauncher, ValidationConfig};

/// A user's model and data, trained by a node of the cluster.
pub struct Trainer<M: PipelineModel> {
    job: TrainJob<M>,
}

impl<M: PipelineModel> Trainer<M> {
    /// Trains `model` on `dataset` with defaults: seed 1, batch 16 in micro-batches of 2, no
    /// step limit, checkpoints every 20 steps, AdamW defaults, the default device.
    pub fn new(model: M, dataset: impl Dataset + 'static) -> Self {
        Self::with_shared_dataset(model, Arc::new(dataset))
    }

    /// [`Trainer::new`] with a dataset chosen at run time.
    pub fn with_shared_dataset(model: M, dataset: Arc<dyn Dataset>) -> Self {
        Self {
            job: TrainJob {
                model: Arc::new(model),
                dataset,
                seed: 1,
                global_batch: 16,
                micro_batch: 2,
                max_steps: 0,
                checkpoint_every: 20,
                checkpoint_store: None,
                restore_from: None,
                optimizer: OptimizerConfig::default(),
                device: default_device(),
                emulation: None,
                initial_weights: None,
                validation: None,
                extra_settings: Vec::new(),
            },
        }
    }

    /// Seed of the weights and of the data order (must be the same on every node).
    pub fn seed(mut self, seed: u64) -> Self {
        self.job.seed = seed;
        self
    }

    /// Samples per step over the cluster and per micro-batch.
    pub fn batch(mut self, global: u32, micro: u32) -> Self {
        self.job.global_batch = global;
        self.job.micro_batch = micro;
        self
    }

    /// Stop after this many committed steps (0: never).
    pub fn max_steps(mut self, steps: u64) -> Self {
        self.job.max_steps = steps;
        self
    }

    /// Checkpoint every this many steps (0: never).
    pub fn checkpoint_every(mut self, steps: u64) -> Self {
        self.job.checkpoint_every = steps;
        self
    }

    /// The job's durable checkpoint store: a directory, or an `s3://`, `gs://` or `az://` URL
    /// with credentials from the environment (`None`: `store/` in the node's data directory).
    /// Complete checkpoints are uploaded there in the background, and a new cluster started
    /// with the same store resumes from the newest one.
    pub fn checkpoint_store(mut self, location: Option<String>) -> Self {
        self.job.checkpoint_store = location;
        self
    }

    /// Another store of this job (a backup, or the store of an earlier cluster): at start its
    /// newest complete checkpoint is copied into the job's store, every part checked against
    /// its manifest. A new cluster resumes from it when it is the newest there; a cluster whose
    /// training stopped for want of a checkpoint resumes from it when it does not hold it.
    pub fn restore_from(mut self, location: Option<String>) -> Self {
        self.job.restore_from = location;
        self
    }

    /// AdamW, schedule and clipping.
    pub fn optimizer(mut self, optimizer: OptimizerConfig) -> Self {
        self.job.optimizer = optimizer;
        self
    }

    /// The Burn device (CPU by default; `Device::cuda(0)` with the `cuda` feature).
    pub fn device(mut self, device: burn::tensor::Device) -> Self {
        self.job.device = device;
        self
    }

    /// Paces the stage's work to an emulated accelerator ([`crate::emulate`]); the model must
    /// have the emulated model's layer list (gpt-1.5b: embedding, 48 blocks, head). `None`:
    /// the device's own speed.
    pub fn emulate(mut self, emulation: Option<Emulation>) -> Self {
        self.job.emulation = emulation;
        self
    }

    /// Starts from these weights instead of the seeded initialisation (a fine-tune): every
    /// layer that starts afresh takes its values from `weights` (for the built-in GPT,
    /// [`parcae_model::Gpt2Safetensors`]). Every node must be given the same weights.
    pub fn initial_weights(mut self, weights: Arc<dyn WeightSource>) -> Self {
        self.job.initial_weights = Some(weights);
        self
    }

    /// Holds out a validation split and measures its loss every so many steps (see
    /// [`ValidationConfig`]); shown in `/status`, `/steps` and the testnet's reports.
    pub fn validation(mut self, validation: ValidationConfig) -> Self {
        self.job.validation = Some(validation);
        self
    }

    /// Named settings the job carries besides the model, data and hyper-parameters above
    /// (compared like them: a node whose values differ is refused).
    pub fn job_settings(mut self, settings: Vec<(String, String)>) -> Self {
        self.job.extra_settings = settings;
        self
    }

    /// Runs a full node (control plane and this trainer) until it leaves; returns the exit code.
    pub fn run(self, mut opts: RunOptions) -> Result<i32, NodeError> {
        // The planner's cost model needs the job's batch shape.
        opts.config.train.global_batch = self.job.global_batch;
        opts.config.train.micro_batch = self.job.micro_batch;
        opts.trainer = Some(self.launcher());
        crate::runtime::run(opts)
    }

    /// The launcher the node runtime calls before its control driver starts.
    pub fn launcher(self) -> TrainerLauncher {
        self.job.launcher()
    }
}
