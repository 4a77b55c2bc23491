//! Assembling a node's trainer: the data-plane endpoint and its runtime, the layer-cost probe
//! the planner's cost model starts from, and the trainer thread. [`crate::Trainer`] (the
//! library API) describes a job as a [`TrainJob`]; the node runtime calls its launcher with a
//! [`TrainerContext`] before its control driver starts.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::Keypair;
use parcae_consensus::state::Job;
use parcae_consensus::state::LayerCost as ReportedCost;
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::{
    Dataset, OptimizerConfig, PipelineModel, Sampler, Stage, StageConfig, WeightSource,
    split_validation, token_batch,
};
use tokio::sync::watch;

use super::TrainError;
use super::job::{JobParts, job_of};
use super::step::{DataSource, Validation};
use super::worker::{Worker, WorkerSetup};
use crate::checkpoint::CheckpointStore;
use crate::dataplane::server::{self, Endpoint};
use crate::emulate::{Accelerator, Emulation};
use crate::keyring::KeyRing;
use crate::metrics::Metrics;
use crate::status::TrainingView;
use crate::store::JobStore;

/// Directory of checkpoints inside the data directory.
pub const CHECKPOINT_DIR: &str = "checkpoints";
/// Directory of the job's durable checkpoint store in the data directory, when no other
/// location is configured.
pub const STORE_DIR: &str = "store";

/// What the node gives its trainer when it starts.
pub struct TrainerContext {
    /// This node.
    pub me: NodeId,
    /// Its identity (data-plane handshakes).
    pub keypair: Keypair,
    /// The cluster keys (data-plane admission).
    pub keys: KeyRing,
    /// The data directory.
    pub data_dir: PathBuf,
    /// IP to bind the data plane on.
    pub bind_ip: IpAddr,
    /// Port (0: any).
    pub data_port: u16,
    /// The replicated state as applied on this node.
    pub view: watch::Receiver<Arc<ControlState>>,
    /// Proposes a command through raft.
    pub submit: Arc<dyn Fn(Command) + Send + Sync>,
    /// Shows the trainer's state in `/status`.
    pub publish: Box<dyn Fn(TrainingView) + Send>,
    /// Time a neighbour may take.
    pub peer_timeout: Duration,
    /// Reactive strategy: restart on every change.
    pub restart_on_change: bool,
    /// The node's metrics (the trainer's emulated-accelerator pacing).
    pub metrics: Arc<Metrics>,
}

/// Starts a trainer.
pub type TrainerLauncher =
    Box<dyn FnOnce(TrainerContext) -> Result<TrainerStarted, TrainError> + Send>;

/// A started trainer: where its data plane listens and the job it trains (its digest goes
/// into the node's `Join`).
pub struct TrainerStarted {
    /// The data plane's address.
    pub data_addr: SocketAddr,
    /// The job's settings.
    pub job: Job,
}

/// A user's model and data and how to train them: everything a trainer needs besides what the
/// node gives it ([`TrainerContext`]).
pub struct TrainJob<M: PipelineModel> {
    /// The model.
    pub model: Arc<M>,
    /// The samples.
    pub dataset: Arc<dyn Dataset>,
    /// Seed of the weights and of the data order (the same on every node).
    pub seed: u64,
    /// Samples per step over the cluster.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Stop after this many committed steps (0: never).
    pub max_steps: u64,
    /// Checkpoint every this many steps (0: never).
    pub checkpoint_every: u64,
    /// The job's durable checkpoint store (`None`: `store/` in the data directory).
    pub checkpoint_store: Option<String>,
    /// Another store of this job (a backup) whose newest complete checkpoint is copied into
    /// the job's store at start, for a new or a stopped cluster to resume from.
    pub restore_from: Option<String>,
    /// AdamW, schedule and clipping.
    pub optimizer: OptimizerConfig,
    /// The Burn device.
    pub device: burn::tensor::Device,
    /// The emulated accelerator the stage's work is paced to, if any.
    pub emulation: Option<Emulation>,
    /// Where the weights start instead of the seeded initialisation (a fine-tune).
    pub initial_weights: Option<Arc<dyn WeightSource>>,
    /// The held-out split and how often its loss is measured, if any.
    pub validation: Option<ValidationConfig>,
    /// Settings the job carries besides those of its parts (`parcae-node`'s `[train]` keys,
    /// which let a joiner adopt the job).
    pub extra_settings: Vec<(String, String)>,
}

/// A validation split: the last `fraction` of the dataset's examples, never trained; every
/// `every` steps pipeline 0 evaluates its first `samples` (the same ones each time) after the
/// step's training micro-batches, and the step's record carries their mean loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationConfig {
    /// Share of the examples held out, in (0, 1).
    pub fraction: f64,
    /// Steps between evaluations (step 0 evaluates too).
    pub every: u64,
    /// Samples evaluated each time.
    pub samples: u32,
}

impl<M: PipelineModel> TrainJob<M> {
    /// The launcher the node runtime calls before its control driver starts.
    pub fn launcher(self) -> TrainerLauncher {
        Box::new(move |ctx| self.start(ctx))
    }

    fn start(self, ctx: TrainerContext) -> Result<TrainerStarted, TrainError> {
        if self.global_batch == 0 || self.micro_batch == 0 {
            return Err(TrainError::Config("batch sizes must be > 0".into()));
        }
        if let Some(e) = &self.emulation
            && e.layers() != self.model.num_layers()
        {
            return Err(TrainError::Config(format!(
                "the emulated {} has {} layers, the model {}: an emulated stage must hold the \
                 emulated model's layers",
                e.profile(),
                e.layers(),
                self.model.num_layers()
            )));
        }
        let job = job_of(&JobParts {
            model: self.model.as_ref(),
            dataset: self.dataset.as_ref(),
            seed: self.seed,
            batch: (self.global_batch, self.micro_batch),
            max_steps: self.max_steps,
            checkpoint_every: self.checkpoint_every,
            optimizer: &self.optimizer,
            initial_weights: self.initial_weights.as_deref(),
            validation: self.validation,
            extra: &self.extra_settings,
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("parcae-dataplane")
            .enable_all()
            .build()
            .map_err(|e| TrainError::Resources(format!("tokio runtime: {e}")))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((ctx.bind_ip, ctx.data_port)))
            .map_err(|e| {
                TrainError::Config(format!(
                    "data plane cannot listen on {}:{}: {e}",
                    ctx.bind_ip, ctx.data_port
                ))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| TrainError::Config(e.to_string()))?;
        let num_params = self.model.num_params() as u64;
        let store_location = match &self.checkpoint_store {
            Some(location) => location.clone(),
            None => ctx.data_dir.join(STORE_DIR).display().to_string(),
        };
        let store = JobStore::open(&store_location, &job.digest())
            .map_err(|e| TrainError::Config(e.to_string()))?;
        let max_state_bytes = num_params * 12 + (16 << 20);
        if let Some(from) = &self.restore_from {
            restore_into(&rt, &store, from, &job, max_state_bytes)?;
        }
        let endpoint = Arc::new(
            Endpoint::new(
                ctx.keypair,
                ctx.keys,
                ctx.view.clone(),
                CheckpointStore::new(ctx.data_dir.join(CHECKPOINT_DIR)),
                max_state_bytes,
                ctx.peer_timeout,
            )
            .with_store(store),
        );
        rt.spawn(server::serve(listener, endpoint.clone()));
        let (dataset, validation) = match self.validation {
            Some(v) => {
                if v.every == 0 || v.samples == 0 {
                    return Err(TrainError::Config(
                        "validation needs every > 0 and samples > 0".into(),
                    ));
                }
                let (train, held_out) = split_validation(self.dataset, v.fraction)?;
                let validation = Validation {
                    sampler: Sampler::new(self.seed, held_out.len())?,
                    dataset: held_out,
                    every: v.every,
                    samples: v.samples,
                };
                (train, Some(validation))
            }
            None => (self.dataset, None),
        };
        let sampler = Sampler::new(self.seed, dataset.len())?;
        let setup = WorkerSetup {
            me: ctx.me,
            model: self.model,
            data: DataSource {
                dataset,
                sampler,
                validation,
            },
            seed: self.seed,
            initial_weights: self.initial_weights,
            global_batch: self.global_batch,
            micro_batch: self.micro_batch,
            max_steps: self.max_steps,
            checkpoint_every: self.checkpoint_every,
            stage_config: StageConfig {
                optimizer: self.optimizer,
                ..StageConfig::default()
            },
            device: self.device,
            peer_timeout: ctx.peer_timeout,
            restart_on_change: ctx.restart_on_change,
            layer_costs: Vec::new(),
            accelerator: self.emulation.map(Accelerator::new),
            metrics: ctx.metrics,
            job: job.clone(),
        };
        let submit = ctx.submit.clone();
        let publish = ctx.publish;
        let mut setup = setup;
        std::thread::Builder::new()
            .name("parcae-trainer".into())
            .spawn(move || {
                match measure_costs(&setup) {
                    Ok(layers) => {
                        setup.layer_costs = layers.clone();
                        submit(Command::CostReport {
                            node: setup.me,
                            step: 0,
                            layers,
                            bandwidth: Vec::new(),
                            reconfiguration_s: None,
                        });
                    }
                    Err(e) => tracing::warn!("cannot measure layer costs: {e}"),
                }
                Worker::new(setup, rt, endpoint, submit, publish).run();
            })
            .map_err(|e| TrainError::Resources(format!("trainer thread: {e}")))?;
        Ok(TrainerStarted {
            data_addr: addr,
            job,
        })
    }
}

/// Forward, backward and optimizer time of every layer on one micro-batch, measured on this
/// node: the planner's cost model is built from these reports, not from an offline profile.
fn measure_costs<M: PipelineModel>(
    s: &WorkerSetup<M>,
) -> Result<Vec<(u32, ReportedCost)>, TrainError> {
    let stage = Stage::new(
        s.model.clone(),
        0..s.model.num_layers(),
        s.seed,
        &s.device,
        s.stage_config.clone(),
    )?;
    let probe = token_batch(
        s.data.dataset.as_ref(),
        &s.data.sampler,
        0,
        s.micro_batch as usize,
        &s.device,
    )?;
    let mut costs = stage.measure_layer_costs(probe.inputs, Some(&probe.targets), 2)?;
    if let Some(device) = &s.accelerator {
        for c in &mut costs {
            *c = device.measured(c, s.micro_batch)?;
        }
    }
    Ok(costs
        .into_iter()
        .map(|c| {
            (
                c.layer as u32,
                ReportedCost {
                    forward_s: c.forward_ms / 1e3,
                    backward_s: c.backward_ms / 1e3,
                    optimizer_s: c.optimizer_ms / 1e3,
                    params: c.param_count as u64,
                    output_bytes: c.output_bytes as u64,
                },
            )
        })
        .collect())
}

/// Copies the newest complete checkpoint of the job from the store at `from` into the job's
/// store (every part checked against its manifest's digest): a new cluster then resumes from
/// it when it is the store's newest, and a stopped one when it does not hold it.
fn restore_into(
    rt: &tokio::runtime::Runtime,
    store: &JobStore,
    from: &str,
    job: &Job,
    max_state_bytes: u64,
) -> Result<(), TrainError> {
    let failed = |e: String| TrainError::Config(format!("--restore {from}: {e}"));
    let source = JobStore::open(from, &job.digest()).map_err(|e| failed(e.to_string()))?;
    match rt.block_on(store.copy_newest_from(&source, max_state_bytes)) {
        Ok(Some(cut)) => {
            tracing::warn!(
                step = cut.end.step,
                history = cut.history,
                "copied the newest checkpoint of the job from {from} into its store"
            );
            Ok(())
        }
        Ok(None) => Err(failed(
            "the store holds no complete checkpoint of this job".into(),
        )),
        Err(e) => Err(failed(e.to_string())),
    }
}
