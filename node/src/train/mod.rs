//! Training across nodes: each node runs the stage of the replicated plan assigned to it with
//! `parcae-model`, on a dedicated thread beside the actors.
//!
//! The network is not here: links, state fetches and checkpoint copies are
//! [`crate::dataplane`]'s, served on a tokio runtime next to the trainer thread, so a node serves
//! its state while it computes.
//!
//! * [`step`]: one step across processes (`parcae-model`'s 1F1B driver over [`neighbours`],
//!   ring all-reduce, global norm).
//! * [`neighbours`]: the pipeline links as the 1F1B driver's neighbours.
//! * [`handoff`]: where a new slot's layers come from (own state, live holders in parallel,
//!   the checkpoint cut of the step) or which are missing (the cluster then rolls back).
//! * [`worker`]: the loop that follows the plan, commits steps through raft and applies them
//!   only once committed.
//! * [`job`]: the settings of the job this node trains, compared with the cluster's.
//! * [`launch`]: assembling the trainer of a [`TrainJob`] (endpoint, cost probe, thread); the
//!   library API that describes the job is [`crate::Trainer`].

pub mod handoff;
pub mod job;
pub mod launch;
pub mod neighbours;
pub mod step;
pub mod worker;

pub use launch::{TrainJob, TrainerContext, TrainerLauncher, TrainerStarted, ValidationConfig};

use parcae_model::ModelError;

use crate::dataplane::DataplaneError;

/// Why a training step or a reconfiguration could not complete. None of these stops the node:
/// the step is abandoned and retried under the next view of the replicated state.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model refused an input (wrong shape, bad state buffer, ...).
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// A data-plane channel failed.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    /// A checkpoint could not be stored or read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The emulated accelerator cannot run the stage.
    #[error("emulated device: {0}")]
    Emulation(#[from] crate::emulate::EmulationError),
    /// Local resources (threads, runtimes) could not be set up.
    #[error("local resources: {0}")]
    Resources(String),
    /// The plan or configuration cannot be run.
    #[error("config: {0}")]
    Config(String),
    /// A new plan replaced the epoch before the step committed.
    #[error("step {0} superseded by a new plan")]
    Superseded(u64),
    /// Layers of the slot have no live holder and no checkpoint of the step: the cluster
    /// rolls back to the complete checkpoint after step `to_step` (proposed).
    #[error(
        "layers {layers:?} are lost at step {step}: rolling back to the checkpoint after step {to_step}"
    )]
    RollingBack {
        /// The layers.
        layers: Vec<usize>,
        /// The step this node was to train.
        step: u64,
        /// The step of the checkpoint cut.
        to_step: u64,
    },
}
