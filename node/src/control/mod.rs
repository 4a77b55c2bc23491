//! The control plane: raft over the libp2p swarm, and the decisions about membership.
//!
//! * [`driver`]: the [`ControlDriver`] actor, sole owner of the
//!   `RaftNode`, on its own arbiter: drains its mailbox, runs one ready cycle, publishes.
//! * [`handle`]: [`ControlHandle`], what every other part holds: one
//!   `propose`, and watch channels of the applied state and of the leadership; [`proposal`]:
//!   the message and its answers, which the driver and the handle share.
//! * pure decisions, each with its unit tests: [`authorize`] (what a peer may propose),
//!   [`proof`] (who really proposed it: the origin's signature),
//!   [`liveness`] (who is lost, gone or back), [`membership`] (this node's `Join`, notices
//!   already on their way) and [`project`] (the `/status` projection).

pub mod authorize;
pub mod driver;
pub mod handle;
pub mod known_peers;
pub mod liveness;
pub mod membership;
pub mod peer_clocks;
pub mod project;
pub mod proof;
pub mod proposal;

pub use driver::{ControlDriver, RaftActorError, RaftSetup, TrainerReady, open_node};
pub use handle::{ControlHandle, ControlPlane};
pub use proposal::{ProposeFailed, Routed};
