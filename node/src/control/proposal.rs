//! Proposing through the control plane, as the driver and every holder of a handle agree on
//! it: the message, where a proposal went or why it went nowhere, and the watch channels the
//! driver publishes what it applied on.

use std::sync::Arc;

use actix::prelude::*;
use parcae_consensus::codec::CodecError;
use parcae_consensus::{Command, ControlState, ProposeError};
use tokio::sync::watch;

/// Proposes `command`: the one way into raft for every part of the node.
#[derive(Debug, Message)]
#[rtype(result = "Result<Routed, ProposeFailed>")]
pub struct Propose(pub Command);

/// Where a proposal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Appended to the leader's log here (not yet committed).
    Proposed,
    /// Sent to the leader, or to a relay while no leader is known.
    Forwarded,
    /// The same notice is already on its way through the log.
    AlreadyOnItsWay,
}

/// Why a proposal went nowhere.
#[derive(Debug, thiserror::Error)]
pub enum ProposeFailed {
    /// Only the leader may propose this command, and this node does not lead.
    #[error("only the leader proposes this command")]
    NotLeader,
    /// No leader is known and no peer is connected to relay through.
    #[error("no leader or relay to send the proposal to yet")]
    NoRoute,
    /// The command cannot be encoded (too large).
    #[error("cannot encode the proposal: {0}")]
    Encode(CodecError),
    /// The identity could not sign it.
    #[error(transparent)]
    Sign(super::proof::ProofError),
    /// raft refused it.
    #[error(transparent)]
    Raft(ProposeError),
    /// The driver has stopped.
    #[error("the control plane has stopped")]
    Stopped,
}

/// The senders of the handle's watch channels, kept by the driver.
pub struct Watches {
    /// The applied state.
    pub state: watch::Sender<Arc<ControlState>>,
    /// Whether this node leads.
    pub leading: watch::Sender<bool>,
}
