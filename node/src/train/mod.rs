//! Training across nodes: each node runs the stage of the replicated plan assigned to it with
//! `parcae-model`, on a dedicated thread beside the actors.
//!
//! The network is not here: links, state fetches and checkpoint copies are
//! [`crate::dataplane`]'s, served on a tokio runtime next to the trainer thread, so a node serves
//! its state while it computes. Nor is the emulated accelerator: the trainer paces its work
//! through [`crate::emulate::Pacing`], which [`launch`] injects.
//!
//! The rooms, one job each:
//! * [`worker`]: the loop over the worker's phase (gated, spare, training, stopped), which
//!   hands each round to the room whose job it is;
//! * [`gate`]: whether this node may train (the job, the store before the first step);
//! * [`reconfigure`]: entering a plan (hold, obtain, pace, report), with [`handoff`] (where a
//!   new slot's layers come from: own state, live holders in parallel, the checkpoint cut of
//!   the step, or which are missing);
//! * [`commit`]: commit-then-apply of a step, which [`step`] runs (`parcae-model`'s 1F1B
//!   driver over [`neighbours`], ring all-reduce, global norm) on [`samples`];
//! * [`checkpointing`]: saving stages and recording complete cuts in the job's store;
//! * [`finish`]: the end of a job with a step limit, where a node run as a training loop stops;
//! * [`launch`]: assembling the trainer of a [`TrainJob`] (endpoint, cost probe, pacing,
//!   thread); the library API that describes the job is [`crate::Trainer`];
//! * [`context`] (what the rooms share), [`waiter`] (bounded waits on the data plane),
//!   [`error`].

pub mod checkpointing;
pub mod commit;
pub mod context;
pub mod egress;
pub mod error;
pub mod finish;
pub mod gate;
pub mod handoff;
pub mod launch;
pub mod neighbours;
pub mod reconfigure;
pub mod reduce;
pub mod samples;
pub mod step;
pub mod waiter;
pub mod worker;
pub mod zones;

pub use error::TrainError;
pub use launch::{TrainJob, TrainerContext, TrainerLauncher, TrainerStarted};
