//! Why a training step or a reconfiguration could not complete.

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
    /// The job's settings cannot be written.
    #[error(transparent)]
    Job(#[from] crate::job::JobError),
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
