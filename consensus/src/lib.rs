//! # parcae-consensus: the raft-replicated control state of Parcae-rs
//!
//! No coordinator: the nodes agree through raft on one [`ControlState`] (membership, plan,
//! training progress, checkpoints, measured costs). This crate is transport-agnostic: it turns
//! inputs (ticks, peer bytes, proposals) into outputs (peer bytes, applied events) and never
//! touches a socket, so the node crate drives it from an actix actor over libp2p and the tests
//! drive it over a simulated network.
//!
//! ## Modules
//!
//! * [`codec`]: the project's single wire codec (serde + bincode 2), with const-generic size
//!   limits (`encode::<T, MAX>`, `decode::<T, MAX>`), versioned envelopes
//!   (`encode_versioned`/`decode_versioned`/`peek_version`) and a typed [`codec::CodecError`].
//!   The node crate uses it for its own wire types.
//! * [`ids`]: [`NodeId`] = first 8 bytes (big-endian) of SHA-256(`"parcae-node-id/v1"` ||
//!   libp2p `PeerId::to_bytes()`), never 0. `Join` carries the full peer id bytes; the state
//!   machine checks the hash and refuses collisions.
//! * [`state`]: [`ControlState`] and [`Command`] (`Join`, `Notice`, `Lost`, `Leave`,
//!   `AvailabilityTick`, `Reconfigure`, `StepCommitted`, `Checkpointed`, `CostReport`);
//!   deterministic [`ControlState::apply`] returning [`StateEvent`]s or a [`Rejection`] (state
//!   untouched); versioned encodings (`Command::encode/decode`, `encode_snapshot`); `digest()`.
//! * [`membership`]: the pure membership planner the leader runs (learners join, at most
//!   `max_voters` voters, odd, most stable learners promoted, leaving voters demoted and lost
//!   ones removed in one joint ConfChangeV2, leader transfer before self-demotion).
//! * [`storage`]: raft-rs `Storage` on raft-engine (fsync'd log, hard state, snapshots, log
//!   compaction after snapshots).
//! * [`node`]: [`RaftNode`], the driver.
//!
//! ## Driving a node (what the node crate does)
//!
//! ```text
//! let id = NodeId::from_peer_bytes(&peer_id.to_bytes());
//! let mut node = if first_node_of_cluster {
//!     // bootstraps once; later starts reopen the same cluster. Then node.campaign()
//!     RaftNode::open_or_bootstrap(dir, RaftConfig::new(id), &[my_peer_info])?
//! } else {
//!     RaftNode::open(dir, RaftConfig::new(id))?    // restart, or empty: waits for the leader
//! };
//! // every 100 ms (election after 10..20 ticks):   node.tick();
//! // on raft bytes from authenticated peer p:      node.step(NodeId::from_peer_bytes(p), &bytes)?;
//! // to change the state (leader only):            let h = node.propose(&cmd)?;  // h: Future
//! // for a linearizable status read:               let r = node.read_index();    // r: Future
//! // after each batch of the above:                node.drive()?;
//! //   for Outbound { to, bytes } in node.take_messages() { send to peer `to` }
//! //   for ev in node.take_events() { NodeEvent::Applied / ConfChanged / SnapshotInstalled / RoleChanged }
//! ```
//!
//! * `propose` fails at once with `ProposeError::NotLeader { leader }` on followers: forward the
//!   command to the leader (e.g. a new node's `Join` goes through any member to the leader).
//!   The handle resolves after the entry is applied on this node: `Ok(events)`,
//!   `Err(Rejected(_))`, `Err(Superseded)` (another leader's entry won the index),
//!   `Err(OutcomeUnknown)` (a snapshot skipped it) or `Err(Shutdown)`.
//! * Joining: the new node opens an empty directory; once a `Join` for it is committed, the
//!   leader's planner adds it as a learner and sends it a snapshot; it is promoted when caught up
//!   and a voter slot is free. `Notice` demotes a voter (a learner is promoted in the same joint
//!   change), `Lost` removes it, `Leave` forgets the member.
//! * `step` refuses (typed [`node::StepError`], counted in [`node::Metrics`]) oversized or
//!   malformed bytes, forged senders, messages for another node, node-local message types and
//!   election messages from non-members. Leader traffic from a sender unknown to this node is
//!   let through (a lagging node cannot know a leader that joined after its applied index), so
//!   the transport must admit only cluster members (cluster key).
//! * Handles are plain futures (`futures::channel::oneshot`), no runtime dependency; they make
//!   progress only through `drive`.
//! * On restart, committed entries after the latest snapshot are re-applied and reported again as
//!   `NodeEvent::Applied`: consumers must treat events as idempotent (compare with `state()`).
//!
//! * `RaftNode` is `Send`; it is not shared between threads (own it in one actor).
//! * Sizes: `RaftConfig::max_message_bytes` (16 MiB) bounds inbound raft messages, snapshots
//!   included (the state is bounded far below); `state::MAX_COMMAND_BYTES` (1 MiB) bounds a
//!   command. The transport should use the same message limit.
//!
//! ## Durability
//!
//! `DiskStorage` writes through raft-engine with fsync on every ready (one write for all entries
//! and the hard state of a ready; a commit-index-only update rides on the next synced write).
//! Snapshots of the whole state are taken every `snapshot_interval` applied entries (and when a
//! new node needs one) and compact the log. `StorageOptions { sync: false }` exists for the
//! randomized in-process tests only (an in-process crash loses nothing the OS already has).
//!
//! ## Tests and benchmark
//!
//! `tests/consensus/` drives clusters over a seeded simulated network (loss, delay, reordering,
//! duplication, partitions, crash and restart from disk); `PARCAE_CONSENSUS_SEEDS=N` widens the
//! randomized sweep (200 seeds by default). `src/bin/consensus-probe.rs` is the child process of
//! the SIGKILL test. `cargo bench -p parcae-consensus` prints commit latency and throughput of 5
//! fsync'd nodes in one process.
//!
//! ## Determinism
//!
//! `apply` reads no clock and no randomness and never does floating-point arithmetic; all
//! collections are ordered, so the encoding and `digest()` are equal on every replica.

pub mod codec;
pub mod ids;
mod logger;
pub mod membership;
pub mod node;
pub mod state;
pub mod storage;

pub use ids::NodeId;
pub use node::{
    Metrics, NodeEvent, NodeStatus, Outbound, ProposalHandle, ProposeError, RaftConfig, RaftError,
    RaftNode, ReadError, ReadHandle, Role, StepError,
};
pub use state::{Command, ControlState, Rejection, StateEvent};
pub use storage::{DiskStorage, StorageOptions};
