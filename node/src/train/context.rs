//! What the rooms of the trainer share: the setup of the node's trainer, its ways out (the data
//! plane's runtime and endpoint, the replicated state, proposals), its part of `/status`, and
//! the slot it runs.

use std::sync::Arc;
use std::time::Duration;

use parcae_consensus::state::{Digest32, Job, LayerCost, StageSlot};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::{PipelineModel, Stage, StageConfig, WeightSource};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::samples::DataSource;
use crate::dataplane::links::EpochLinks;
use crate::dataplane::server::Endpoint;
use crate::emulate::Pacing;
use crate::job::JobSpec;
use crate::metrics::Metrics;
use crate::status::{TrainingPhase, TrainingView};

/// How a node's trainer is set up (the same on every node except `me`).
pub struct WorkerSetup<M: PipelineModel> {
    /// This node.
    pub me: NodeId,
    /// The model.
    pub model: Arc<M>,
    /// Training data.
    pub data: DataSource,
    /// Seed, batch, step limit, checkpoint cadence, optimizer.
    pub spec: JobSpec,
    /// Weights that replace the seeded ones of any layer that starts afresh.
    pub initial_weights: Option<Arc<dyn WeightSource>>,
    /// Optimizer and wire settings of a stage.
    pub stage_config: StageConfig,
    /// Burn device.
    pub device: burn::tensor::Device,
    /// Time a neighbour may take.
    pub peer_timeout: Duration,
    /// Move state by restarting (drop everything, fetch the whole stage) on every change.
    pub restart_on_change: bool,
    /// Per-layer costs this node measured at start (re-sent with measured transfer rates).
    pub layer_costs: Vec<(u32, LayerCost)>,
    /// How the device's time passes (paced to a profile on an emulated device).
    pub pacing: Arc<dyn Pacing>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The job this node trains, as replicated (the cluster's must be the same).
    pub job: Job,
}

/// The trainer's ways out.
pub struct Io {
    /// The runtime the data plane runs on (the trainer blocks on it).
    pub rt: Runtime,
    /// The data-plane endpoint.
    pub ep: Arc<Endpoint>,
    /// The replicated state as applied on this node.
    pub view: watch::Receiver<Arc<ControlState>>,
    /// Proposes a command through raft (forwarded to the leader).
    pub submit: Arc<dyn Fn(Command) + Send + Sync>,
}

impl Io {
    /// Proposes `command` through raft.
    pub fn propose(&self, command: Command) {
        (self.submit)(command)
    }
}

/// The trainer's part of `/status`, and where it is shown.
pub struct Board {
    /// What is shown.
    pub view: TrainingView,
    publish: Box<dyn Fn(TrainingView) + Send>,
}

impl Board {
    /// A board showing the default view through `publish`.
    pub fn new(publish: Box<dyn Fn(TrainingView) + Send>) -> Self {
        Self {
            view: TrainingView::default(),
            publish,
        }
    }

    /// Shows the view.
    pub fn publish(&self) {
        (self.publish)(self.view.clone())
    }

    /// Shows `phase` if it is not shown already.
    pub fn set_phase(&mut self, phase: TrainingPhase) {
        if self.view.phase != phase {
            self.view.phase = phase;
            self.publish();
        }
    }
}

/// The slot this node runs.
pub struct Current<M: PipelineModel> {
    /// The plan's epoch.
    pub epoch: u64,
    /// Where in the plan.
    pub slot: StageSlot,
    /// The stage's model and optimizer state.
    pub stage: Stage<M>,
    /// The epoch's links.
    pub links: EpochLinks,
    /// Digest of the stage state entering the next step, when it was just checkpointed
    /// (pipeline 0 only).
    pub digest: Option<Digest32>,
}
