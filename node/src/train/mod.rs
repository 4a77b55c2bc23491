//! Training across nodes: each node runs the stage of the replicated plan assigned to it with
//! `parcae-model`, on a dedicated thread beside the actors.
//!
//! * [`server`]: the data-plane endpoint (authenticated AES-GCM channels of
//!   [`crate::dataplane`]): pipeline and ring links, state queries and fetches, checkpoint
//!   copies; served on a tokio runtime next to the trainer thread, so a node serves its state
//!   while it computes.
//! * [`step`]: one step across processes (1F1B over the links, ring all-reduce, global norm).
//! * [`handoff`]: where a new slot's layers come from (own state, live holders in parallel,
//!   checkpoints).
//! * [`worker`]: the loop that follows the plan, commits steps through raft and applies them
//!   only once committed.
//! * [`Trainer`]: the library entry point: a user's `PipelineModel` and `Dataset` trained
//!   by a full node.

mod builder;
pub mod checkpoint;
pub mod handoff;
pub mod links;
pub mod peers;
pub mod protocol;
pub mod server;
pub mod step;
pub mod worker;

pub use builder::{Trainer, TrainerContext, TrainerLauncher};

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
    /// A peer broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A message of another epoch arrived.
    #[error("stale: {0}")]
    StaleMessage(String),
    /// A peer refused or is unknown.
    #[error("peer: {0}")]
    Peer(String),
    /// A peer did not answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// Local storage failed.
    #[error("storage: {0}")]
    Storage(String),
    /// The plan or configuration cannot be run.
    #[error("config: {0}")]
    Config(String),
    /// A new plan replaced the epoch before the step committed.
    #[error("step {0} superseded by a new plan")]
    Superseded(u64),
}
