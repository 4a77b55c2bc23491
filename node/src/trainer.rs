//! [`Trainer`]: how a Burn project trains its own [`PipelineModel`] on a Parcae-rs cluster.
//! One object wraps the whole node: the job (model, data, hyper-parameters) and where the node
//! lives (data directory, cluster key, addresses, seeds, its settings).
//!
//! ```no_run
//! # fn demo<M: parcae_node::PipelineModel>(model: M, data: impl parcae_node::Dataset + 'static)
//! #     -> anyhow::Result<()> {
//! let outcome = parcae_node::Trainer::new(model, data)
//!     .seed(7)
//!     .batch(32, 4)
//!     .max_steps(1000)
//!     .backend(parcae_node::Backend::Cuda(0))
//!     .key_file("cluster.key")
//!     .listen("/ip4/0.0.0.0/tcp/7000".parse()?)
//!     .bootstrap(["/dns4/founder.internal/tcp/7000".parse()?])
//!     .run()?;
//! println!("{outcome}");
//! # Ok(()) }
//! ```
//!
//! The job is a [`TrainJob`], which [`crate::train`] assembles inside the node; the node's side
//! is [`RunOptions`], which [`crate::assembly`] runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use libp2p::Multiaddr;
use parcae_model::{
    Backend, Dataset, OptimizerConfig, PipelineModel, WeightSource, default_device,
};

use crate::assembly::{NodeError, RunOptions};
use crate::config::NodeConfig;
use crate::emulate::Emulation;
use crate::job::{JobSpec, ValidationConfig};
use crate::keyring::KeyRing;
use crate::outcome::TrainOutcome;
use crate::store::KEEP_STORED_CUTS;
use crate::train::{TrainJob, TrainerLauncher};

/// The data directory of a node the builder is not told one.
pub const DEFAULT_DATA_DIR: &str = "parcae-data";
/// The libp2p address a node listens on when it is not told one.
pub const DEFAULT_LISTEN: &str = "/ip4/0.0.0.0/tcp/7000";
/// Where a node serves `/status` when it is not told.
pub const DEFAULT_STATUS_ADDR: &str = "0.0.0.0:9000";

/// A change of the node's settings, applied in order after its configuration file.
type Configure = Box<dyn FnOnce(&mut NodeConfig)>;

/// A user's model and data, trained by a node of the cluster.
pub struct Trainer<M: PipelineModel> {
    job: TrainJob<M>,
    /// The device by kind, made when the trainer starts (it replaces `job.device`).
    backend: Option<Backend>,
    node: NodeSettings,
}

/// Where the node lives, as the builder was told.
struct NodeSettings {
    data_dir: PathBuf,
    key_file: Option<PathBuf>,
    listen: Vec<Multiaddr>,
    bootstrap: Vec<Multiaddr>,
    bootstrap_file: Option<PathBuf>,
    status_addr: Option<SocketAddr>,
    config_file: Option<PathBuf>,
    configure: Vec<Configure>,
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
                spec: JobSpec::default(),
                checkpoint_store: None,
                restore_from: None,
                keep_checkpoints: KEEP_STORED_CUTS,
                device: default_device(),
                emulation: None,
                initial_weights: None,
                program_settings: Vec::new(),
            },
            backend: None,
            node: NodeSettings {
                data_dir: PathBuf::from(DEFAULT_DATA_DIR),
                key_file: None,
                listen: Vec::new(),
                bootstrap: Vec::new(),
                bootstrap_file: None,
                status_addr: None,
                config_file: None,
                configure: Vec::new(),
            },
        }
    }

    /// The whole job spec at once (seed, batches, step limit, checkpoint cadence, optimizer,
    /// validation).
    pub fn spec(mut self, spec: JobSpec) -> Self {
        self.job.spec = spec;
        self
    }

    /// Seed of the weights and of the data order (must be the same on every node).
    pub fn seed(mut self, seed: u64) -> Self {
        self.job.spec.seed = seed;
        self
    }

    /// Samples per step over the cluster and per micro-batch.
    pub fn batch(mut self, global: u32, micro: u32) -> Self {
        self.job.spec.global_batch = global;
        self.job.spec.micro_batch = micro;
        self
    }

    /// Stop after this many committed steps (0: never); the state after the last one is
    /// checkpointed whatever the cadence, and [`Trainer::run`] returns once it is stored.
    pub fn max_steps(mut self, steps: u64) -> Self {
        self.job.spec.max_steps = steps;
        self
    }

    /// Checkpoint every this many steps (0: never).
    pub fn checkpoint_every(mut self, steps: u64) -> Self {
        self.job.spec.checkpoint_every = steps;
        self
    }

    /// The job's durable checkpoint store: a directory, or an `s3://`, `gs://` or `az://` URL
    /// with credentials from the environment (default: `store/` in the node's data directory).
    /// Complete checkpoints are uploaded there in the background, and a new cluster started
    /// with the same store resumes from the newest one.
    pub fn checkpoint_store(mut self, location: impl Into<String>) -> Self {
        self.job.checkpoint_store = Some(location.into());
        self
    }

    /// Another store of this job (a backup, or the store of an earlier cluster): at start its
    /// newest complete checkpoint is copied into the job's store, every part checked against
    /// its manifest. A new cluster resumes from it when it is the newest there; a cluster whose
    /// training stopped for want of a checkpoint resumes from it when it does not hold it.
    pub fn restore_from(mut self, location: impl Into<String>) -> Self {
        self.job.restore_from = Some(location.into());
        self
    }

    /// Complete checkpoints the job's store keeps (default 2; 0: every one, for a run whose
    /// history is checked afterwards with `parcae-node replay`).
    pub fn keep_checkpoints(mut self, cuts: usize) -> Self {
        self.job.keep_checkpoints = cuts;
        self
    }

    /// AdamW, schedule and clipping.
    pub fn optimizer(mut self, optimizer: OptimizerConfig) -> Self {
        self.job.spec.optimizer = optimizer;
        self
    }

    /// The device by kind: Flex on the CPU (the default), a CUDA GPU (the `cuda` feature) or
    /// the Cube runtime on the CPU (the `cube-cpu` feature); made and checked when the node
    /// starts, an unusable one failing [`Trainer::run`] with the reason.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// A Burn device made by the caller (with autodiff), instead of [`Trainer::backend`].
    pub fn device(mut self, device: burn::tensor::Device) -> Self {
        self.backend = None;
        self.job.device = device;
        self
    }

    /// Paces the stage's work to an emulated accelerator ([`crate::emulate`]) instead of the
    /// device's own speed; the model must have the emulated model's layer list (gpt-1.5b:
    /// embedding, 48 blocks, head).
    pub fn emulate(mut self, emulation: Emulation) -> Self {
        self.job.emulation = Some(emulation);
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
        self.job.spec.validation = Some(validation);
        self
    }

    /// Named settings the job carries besides the model, data and hyper-parameters above
    /// (compared like them: a node whose values differ is refused).
    pub fn job_settings(mut self, settings: Vec<(String, String)>) -> Self {
        self.job.program_settings = settings;
        self
    }

    /// The node's data directory (identity, raft log, checkpoints; default
    /// [`DEFAULT_DATA_DIR`] in the working directory).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.node.data_dir = dir.into();
        self
    }

    /// The file holding the cluster key (`parcae-node keygen` makes one; required). A key
    /// staged beside it as `FILE.next` is rotated in as with `parcae-node run`.
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.node.key_file = Some(path.into());
        self
    }

    /// A libp2p address to listen on (repeatable; default [`DEFAULT_LISTEN`]).
    pub fn listen(mut self, addr: Multiaddr) -> Self {
        self.node.listen.push(addr);
        self
    }

    /// Addresses of members (or of DNS names that lead to them) to join the cluster through;
    /// without any, the node founds a cluster unless its data directory remembers one.
    pub fn bootstrap(mut self, seeds: impl IntoIterator<Item = Multiaddr>) -> Self {
        self.node.bootstrap.extend(seeds);
        self
    }

    /// A file of bootstrap addresses, read again while the node is alone.
    pub fn bootstrap_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.node.bootstrap_file = Some(path.into());
        self
    }

    /// Where the node serves `/status`, `/steps`, `/metrics` and its probes (default
    /// [`DEFAULT_STATUS_ADDR`]).
    pub fn status_addr(mut self, addr: SocketAddr) -> Self {
        self.node.status_addr = Some(addr);
        self
    }

    /// The node's settings from a TOML file, as `parcae-node run --config` reads it (read when
    /// the node runs).
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.node.config_file = Some(path.into());
        self
    }

    /// Changes the node's settings (after its configuration file, in the order given).
    pub fn configure(mut self, change: impl FnOnce(&mut NodeConfig) + 'static) -> Self {
        self.node.configure.push(Box::new(change));
        self
    }

    /// Runs the node (control plane and this trainer) until the job is done (its step limit
    /// reached and the last checkpoint stored: [`crate::train::finish`]) or the node leaves
    /// the cluster (a preemption notice or a signal); returns how far the job got and where
    /// its weights are. A job without a step limit returns only when the node leaves.
    pub fn run(self) -> Result<TrainOutcome, NodeError> {
        let store = self.job.checkpoint_store.clone();
        let (global, micro) = (self.job.spec.global_batch, self.job.spec.micro_batch);
        let (node, launcher) = (self.node, Self::launch(self.job, self.backend));
        let mut opts = node.options()?;
        // The planner's cost model needs the job's batch shape.
        opts.config.train.global_batch = global;
        opts.config.train.micro_batch = micro;
        let exit = crate::assembly::run_to_exit(opts.exit_when_done(true).with_trainer(launcher))?;
        TrainOutcome::of(&exit, store.as_deref())
    }

    /// The launcher the node runtime calls before its control driver starts (for programs that
    /// assemble [`RunOptions`] themselves, as `parcae-node run` does).
    pub fn launcher(self) -> TrainerLauncher {
        Self::launch(self.job, self.backend)
    }

    /// `job`'s launcher, on `backend`'s device when one is named.
    fn launch(mut job: TrainJob<M>, backend: Option<Backend>) -> TrainerLauncher {
        Box::new(move |ctx| {
            if let Some(backend) = backend {
                job.device = backend.device()?;
            }
            job.launcher()(ctx)
        })
    }
}

impl NodeSettings {
    /// The options of the node these settings describe: its files read, defaults filled in.
    fn options(self) -> Result<RunOptions, NodeError> {
        let key_file = self.key_file.ok_or(NodeError::NoKeyFile)?;
        let mut config = match &self.config_file {
            Some(path) => NodeConfig::load(path)?,
            None => NodeConfig::default(),
        };
        for change in self.configure {
            change(&mut config);
        }
        config.validate()?;
        let listen = if self.listen.is_empty() {
            vec![DEFAULT_LISTEN.parse().expect("the default listen address")]
        } else {
            self.listen
        };
        let status_addr = self.status_addr.unwrap_or_else(|| {
            DEFAULT_STATUS_ADDR
                .parse()
                .expect("the default status address")
        });
        Ok(RunOptions::new(
            self.data_dir,
            KeyRing::load(&key_file)?,
            listen,
            status_addr,
            config,
        )
        .seeds(self.bootstrap, self.bootstrap_file))
    }
}
