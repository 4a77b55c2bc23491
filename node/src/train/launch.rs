//! Assembling a node's trainer: the data-plane endpoint and its runtime, the layer-cost probe
//! the planner's cost model starts from, the device's pacing (an emulated accelerator is
//! injected here, nowhere else), and the trainer thread. [`crate::Trainer`] (the library API)
//! describes a job as a [`TrainJob`]; the node runtime calls its launcher with a
//! [`TrainerContext`] before its control driver starts.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::Keypair;
use parcae_consensus::state::Job;
use parcae_consensus::state::LayerCost as ReportedCost;
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::{
    Dataset, PipelineModel, Sampler, Stage, StageConfig, WeightSource, split_validation,
    token_batch,
};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::context::{Board, Io, WorkerSetup};
use super::error::TrainError;
use super::finish::Finisher;
use super::samples::{DataSource, Validation};
use super::worker::Worker;
use crate::checkpoint::CheckpointStore;
use crate::data_dir::DataDir;
use crate::dataplane::server::{self, Endpoint};
use crate::emulate::{Accelerator, Emulation, Pacing, RealTime};
use crate::job::{Identity, JobSpec};
use crate::keyring::KeyRing;
use crate::metrics::Metrics;
use crate::status::TrainingView;
use crate::store::{JobStore, max_part_bytes};

/// What the node gives its trainer when it starts.
pub struct TrainerContext {
    /// This node.
    pub me: NodeId,
    /// Its identity (data-plane handshakes).
    pub keypair: Keypair,
    /// The cluster keys (data-plane admission).
    pub keys: KeyRing,
    /// The data directory.
    pub data_dir: DataDir,
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
    /// Stops the node when the job is done (`None`: it idles then).
    pub stop_when_done: Option<Box<dyn FnOnce() + Send>>,
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
    /// Seed, batch sizes, step limit, checkpoint cadence, optimizer, validation split (the
    /// same on every node).
    pub spec: JobSpec,
    /// The job's durable checkpoint store (`None`: `store/` in the data directory).
    pub checkpoint_store: Option<String>,
    /// Another store of this job (a backup) whose newest complete checkpoint is copied into
    /// the job's store at start, for a new or a stopped cluster to resume from.
    pub restore_from: Option<String>,
    /// Complete checkpoints the job's store keeps (0: every one).
    pub keep_checkpoints: usize,
    /// The Burn device.
    pub device: burn::tensor::Device,
    /// The emulated accelerator the stage's work is paced to, if any.
    pub emulation: Option<Emulation>,
    /// Where the weights start instead of the seeded initialisation (a fine-tune).
    pub initial_weights: Option<Arc<dyn WeightSource>>,
    /// Settings the job carries besides its spec (`parcae-node`'s model keys, which let a
    /// joiner adopt the job).
    pub program_settings: Vec<(String, String)>,
}

impl<M: PipelineModel> TrainJob<M> {
    /// The launcher the node runtime calls before its control driver starts.
    pub fn launcher(self) -> TrainerLauncher {
        Box::new(move |ctx| self.start(ctx))
    }

    fn start(self, ctx: TrainerContext) -> Result<TrainerStarted, TrainError> {
        let pacing = self.pacing()?;
        let what = Identity::of(
            self.model.as_ref(),
            self.dataset.as_ref(),
            self.initial_weights.as_deref(),
        )?;
        let job = self.spec.job(&what, &self.program_settings)?;
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
        let data_addr = listener
            .local_addr()
            .map_err(|e| TrainError::Config(e.to_string()))?;
        let ep = Arc::new(self.endpoint(&rt, &ctx, &job)?);
        rt.spawn(server::serve(listener, ep.clone()));
        let setup = WorkerSetup {
            me: ctx.me,
            data: data_source(self.dataset, &self.spec)?,
            model: self.model,
            stage_config: StageConfig {
                optimizer: self.spec.optimizer.clone(),
                ..StageConfig::default()
            },
            spec: self.spec,
            initial_weights: self.initial_weights,
            device: self.device,
            peer_timeout: ctx.peer_timeout,
            restart_on_change: ctx.restart_on_change,
            layer_costs: Vec::new(),
            pacing,
            metrics: ctx.metrics,
            job: job.clone(),
        };
        let io = Io {
            rt,
            ep,
            view: ctx.view,
            submit: ctx.submit,
        };
        let finisher = Finisher::new(ctx.stop_when_done);
        spawn_worker(setup, io, Board::new(ctx.publish), finisher)?;
        Ok(TrainerStarted { data_addr, job })
    }

    /// How the device's time passes: an emulated accelerator when the job names one (its
    /// layers must be the model's), the device's own time otherwise.
    fn pacing(&self) -> Result<Arc<dyn Pacing>, TrainError> {
        if self.spec.global_batch == 0 || self.spec.micro_batch == 0 {
            return Err(TrainError::Config("batch sizes must be > 0".into()));
        }
        let Some(e) = &self.emulation else {
            return Ok(Arc::new(RealTime));
        };
        if e.layers() != self.model.num_layers() {
            return Err(TrainError::Config(format!(
                "the emulated {} has {} layers, the model {}: an emulated stage must hold the \
                 emulated model's layers",
                e.profile(),
                e.layers(),
                self.model.num_layers()
            )));
        }
        Ok(Arc::new(Accelerator::new(e.clone())))
    }

    /// The data-plane endpoint, with the job's store (a given backup's newest checkpoint
    /// copied into it first).
    fn endpoint(
        &self,
        rt: &Runtime,
        ctx: &TrainerContext,
        job: &Job,
    ) -> Result<Endpoint, TrainError> {
        let store_location = match &self.checkpoint_store {
            Some(location) => location.clone(),
            None => ctx.data_dir.store().display().to_string(),
        };
        let store = JobStore::open(&store_location, &job.digest())
            .map_err(|e| TrainError::Config(e.to_string()))?
            .keeping(self.keep_checkpoints);
        let max_state_bytes = max_part_bytes(self.model.num_params());
        if let Some(from) = &self.restore_from {
            restore_into(rt, &store, from, job, max_state_bytes)?;
        }
        Ok(Endpoint::new(
            ctx.keypair.clone(),
            ctx.keys.clone(),
            ctx.view.clone(),
            CheckpointStore::new(ctx.data_dir.checkpoints()),
            max_state_bytes,
            ctx.peer_timeout,
        )
        .with_store(store))
    }
}

/// The samples the job trains on, and the held-out split when it has one.
pub(crate) fn data_source(
    dataset: Arc<dyn Dataset>,
    spec: &JobSpec,
) -> Result<DataSource, TrainError> {
    let (dataset, validation) = match spec.validation {
        Some(v) => {
            if v.every == 0 || v.samples == 0 {
                return Err(TrainError::Config(
                    "validation needs every > 0 and samples > 0".into(),
                ));
            }
            let (train, held_out) = split_validation(dataset, v.fraction)?;
            let validation = Validation {
                sampler: Sampler::new(spec.seed, held_out.len())?,
                dataset: held_out,
                every: v.every,
                samples: v.samples,
            };
            (train, Some(validation))
        }
        None => (dataset, None),
    };
    Ok(DataSource {
        sampler: Sampler::new(spec.seed, dataset.len())?,
        dataset,
        validation,
    })
}

/// Starts the trainer thread: it measures the layers' costs (the planner's first cost model),
/// reports them, then runs the worker.
fn spawn_worker<M: PipelineModel>(
    mut setup: WorkerSetup<M>,
    io: Io,
    board: Board,
    finisher: Finisher,
) -> Result<(), TrainError> {
    std::thread::Builder::new()
        .name("parcae-trainer".into())
        .spawn(move || {
            match measure_costs(&setup) {
                Ok(layers) => {
                    setup.layer_costs = layers.clone();
                    io.propose(Command::CostReport {
                        node: setup.me,
                        step: 0,
                        layers,
                        bandwidth: Vec::new(),
                        reconfiguration_s: None,
                        allreduce_bytes_per_sec: setup.pacing.allreduce_rate(),
                        boundary_link: setup.pacing.boundary_link(setup.spec.micro_batch),
                    });
                }
                Err(e) => tracing::warn!("cannot measure layer costs: {e}"),
            }
            Worker::new(setup, io, board, finisher).run();
        })
        .map(|_| ())
        .map_err(|e| TrainError::Resources(format!("trainer thread: {e}")))
}

/// The runs of a node's own measurement: two, no warm-up (it delays the node's first step;
/// the planner takes the median over every node's report).
const PROBE_RUNS: parcae_model::Runs = parcae_model::Runs {
    warmup: 0,
    repeats: 2,
};

/// Forward, backward and optimizer time of every layer on one micro-batch, measured on this
/// node: the planner's cost model is built from these reports, not from an offline profile.
fn measure_costs<M: PipelineModel>(
    s: &WorkerSetup<M>,
) -> Result<Vec<(u32, ReportedCost)>, TrainError> {
    let stage = Stage::new(
        s.model.clone(),
        0..s.model.num_layers(),
        s.spec.seed,
        &s.device,
        s.stage_config.clone(),
    )?;
    let probe = token_batch(
        s.data.dataset.as_ref(),
        &s.data.sampler,
        0,
        s.spec.micro_batch as usize,
        &s.device,
    )?;
    let costs = stage.measure_layer_costs(probe.inputs, Some(&probe.targets), PROBE_RUNS)?;
    costs
        .into_iter()
        .map(|real| {
            Ok(reported(
                &s.pacing.measured_layer(real, s.spec.micro_batch)?,
            ))
        })
        .collect()
}

/// A layer's measured costs as a `CostReport` carries them: by layer, in seconds.
pub fn reported(c: &parcae_model::LayerCost) -> (u32, ReportedCost) {
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
}

/// Copies the newest complete checkpoint of the job from the store at `from` into the job's
/// store (every part checked against its manifest's digest): a new cluster then resumes from
/// it when it is the store's newest, and a stopped one when it does not hold it.
fn restore_into(
    rt: &Runtime,
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
