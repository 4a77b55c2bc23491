//! # parcae-node: the actix actor node on libp2p
//!
//! What every spot VM runs: a set of processes started with the same cluster key becomes one
//! authenticated cluster with a raft leader, a replicated membership, and preemption notices
//! that reach every node within milliseconds.
//!
//! ## Actors (one process = one actix `System`)
//!
//! * [`net::actor::Network`], on its own arbiter (thread): the only owner of the libp2p
//!   `Swarm`, polled by a small `ActorFuture` so handlers can call the swarm directly. Reports
//!   everything as [`net::actor::NetEvent`]s to the control driver.
//! * [`control::ControlDriver`], on its own arbiter: the only owner of the
//!   `parcae_consensus::RaftNode`; drains its mailbox, then runs one ready cycle and publishes
//!   the applied state and the leadership on watch channels. Every other part holds a
//!   [`control::ControlHandle`] (one `propose`, the watch receivers). Its decisions (who may
//!   propose what, lost members, this node's `Join`, the `/status` projection) are pure
//!   functions in [`control`]. Membership changes (learners, at most `max_voters` odd voters,
//!   replacing a leaving voter by a caught-up learner) are planned inside the consensus crate.
//! * `planner::Planner`: on the leader, woken by every change of the state or the leadership:
//!   proposes `AvailabilityTick` every planning interval and `Reconfigure` when the plan must
//!   change (the decision a pure function, the strategies in rooms of their own).
//! * `notices::NoticeWatcher`: SIGTERM/SIGINT (deadline = now + grace, default 30 s) and the
//!   AWS IMDSv2 / GCE / Azure metadata pollers (configurable base URLs, a thread of their own
//!   that hands its notice straight to the driver).
//! * the trainer ([`train`], a dedicated thread plus a small tokio runtime for the data plane):
//!   follows the replicated plan, runs its stage with `parcae-model`, moves activations,
//!   gradients and stage state over the encrypted data plane ([`dataplane`]), commits every step
//!   through raft before applying it. [`Trainer`] is the library entry point; [`assembly`]
//!   assembles and runs a node.
//! * `status::Status`: renders `/status` JSON; the HTTP server ([`http`], actix-web on a
//!   worker thread of its own, with connection limits and timeouts) serves it, `/steps` and
//!   `/metrics` (OpenMetrics text from `metrics::Metrics`, prometheus-client).
//!
//! ## Transport and admission
//!
//! TCP → noise (XX, ed25519 peer ids) → **cluster-key admission** ([`net::admission`]) → yamux.
//! The admission handshake runs on the noise channel before yamux: both sides exchange nonces
//! and prove the cluster key with HMAC-SHA256 over (sender id, receiver id, both nonces). A
//! peer without the key never yields `ConnectionEstablished`, so no behaviour sees it. pnet was
//! not used: its XSalsa20 layer caps bulk transfers at 0.08x raw TCP (noise alone 0.15-0.2x);
//! admission costs one round trip per connection and nothing per byte. QUIC is not enabled,
//! because its TLS handshake would bypass the admission upgrade.
//!
//! Behaviours: connection limits, identify, ping, gossipsub (signed, strict validation, 100 ms
//! heartbeat; a notice is accepted only if its signer is the node it names) and one
//! long-lived stream per peer and direction on `/parcae/control/2.0.0` ([`net::control_streams`],
//! on `libp2p-stream`) carrying [`wire::ControlMessage`]s (raft bytes, proposals from
//! non-leaders/non-members) in length-prefixed frames bounded before allocation
//! ([`net::codec`]). Oversized frames, undecodable messages and malformed or forged raft
//! messages disconnect the sender.
//!
//! Bulk tensors do not share these connections: a bulk transfer raised control round trips 20x
//! in the prototype, and noise+yamux tops out far below the 1.25 GB/s goal. They go
//! over the data plane ([`dataplane`]: raw TCP with AES-GCM records keyed by a Noise handshake
//! that proves the cluster key), leaving this swarm to control traffic.
//!
//! ## Files in the data directory
//!
//! [`data_dir::DataDir`] names every one (identity, raft log, remembered members, the mark of
//! a graceful exit, checkpoints, the job's default store) and writes them whole or not at all.
//! The cluster key is a separate 64-hex-digit file made by `parcae-node keygen`.
//!
//! ## Version note
//!
//! libp2p 0.56 (not 0.57): libp2p-swarm 0.48 pins `wasm-bindgen-futures = 0.4.58` (hence
//! `js-sys = 0.3.85`) while burn 0.22 needs `js-sys >= 0.3.91`, which cannot resolve in one
//! workspace lock. The APIs used here are the same in both.

// The library API: a Burn project's trainer, the node's settings and job, assembling a node.
pub mod assembly;
pub mod config;
pub mod job;
mod outcome;
pub mod process;
mod trainer;

// The tools of the `parcae-node` binary besides `run`.
pub mod adopt;
pub mod device_info;
pub mod export;
pub mod learn;
pub mod prepare;
pub mod profile;
pub mod replay;
pub mod smoke;
pub mod train_bench;

// The control plane: raft, planning, notices, `/status`.
pub mod control;
pub mod http;
pub(crate) mod notices;
pub(crate) mod planner;
/// The leader's decision timed (`parcae-node bench-planner`, the `planner` bench).
pub use planner::bench as planner_bench;
pub(crate) mod status;

// The networks: the libp2p swarm and its messages, the data plane.
pub mod dataplane;
pub mod net;
pub mod wire;

// Training: the trainer's rooms, the emulated accelerator, checkpoints and the job's store.
pub mod checkpoint;
pub mod clock;
pub mod emulate;
pub(crate) mod store;
pub mod train;

// Who a node is and what it keeps: its data directory, identity and cluster keys.
pub mod data_dir;
pub mod identity;
pub mod key;
pub mod keyring;
pub(crate) mod resync;

// Plumbing.
pub(crate) mod metrics;
pub(crate) mod retry;

// What a Burn project needs to train its model on a cluster, in one place.
pub use assembly::NodeError;
pub use config::NodeConfig;
pub use emulate::Emulation;
pub use job::{JobSpec, ValidationConfig};
pub use outcome::{Ended, SavedWeights, TrainOutcome};
pub use parcae_model::{
    Activation, Backend, ByteTextDataset, Dataset, ModelError, OptimizerConfig, PipelineModel,
    StageRng, SyntheticTask, TokenFileDataset, WeightSource,
};
pub use trainer::{DEFAULT_DATA_DIR, DEFAULT_LISTEN, DEFAULT_STATUS_ADDR, Trainer};
