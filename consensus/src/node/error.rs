//! Errors of the raft driver, one type per entry point.

use crate::codec::CodecError;
use crate::ids::NodeId;
use crate::state::Rejection;
use crate::storage::StorageError;

/// Opening, bootstrapping or driving the node failed; the node should be restarted from disk.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The durable store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// A stored or received snapshot does not decode.
    #[error("snapshot: {0}")]
    Snapshot(CodecError),
}

/// An inbound raft message was refused (and counted in [`Metrics`](super::Metrics)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// Longer than `RaftConfig::max_message_bytes`.
    #[error("raft message of {len} bytes exceeds {max}")]
    TooLarge {
        /// Message length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not a raft protobuf message.
    #[error("malformed raft message: {0}")]
    Malformed(String),
    /// The message claims another sender than the authenticated peer.
    #[error("message claims sender {claimed} but came from {actual}")]
    WrongSender {
        /// `from` field of the message.
        claimed: u64,
        /// The peer it came from.
        actual: NodeId,
    },
    /// The message is addressed to another node.
    #[error("message addressed to {0}")]
    WrongRecipient(u64),
    /// An election message from a sender outside the applied raft configuration.
    #[error("election message from non-member {0}")]
    NonMember(NodeId),
    /// Any message from a member that left.
    #[error("raft message from former member {0}")]
    Retired(NodeId),
    /// A node-local message type (never valid on the wire).
    #[error("local message type {0:?} on the wire")]
    LocalMessage(raft::eraftpb::MessageType),
    /// raft-rs refused the message.
    #[error("raft: {0}")]
    Raft(String),
}

/// A proposal failed, or its outcome is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// Only the leader takes proposals; forward to `leader` when known.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The current leader, if known.
        leader: Option<NodeId>,
    },
    /// The encoded command exceeds `MAX_COMMAND_BYTES`.
    #[error("command of {len} bytes exceeds {max}")]
    TooLarge {
        /// Encoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The command could not be encoded.
    #[error("cannot encode command: {0}")]
    Encode(CodecError),
    /// raft dropped the proposal (e.g. during a leader transfer); safe to retry.
    #[error("proposal dropped by raft")]
    Dropped,
    /// Another leader's entry took the proposal's place in the log: it was not applied.
    #[error("proposal superseded by another leader's entry")]
    Superseded,
    /// A snapshot jumped over the proposal's index: it may or may not have been applied.
    #[error("outcome unknown: a snapshot covered the proposal")]
    OutcomeUnknown,
    /// The command was committed and rejected by the state machine.
    #[error("rejected: {0}")]
    Rejected(Rejection),
    /// The node was dropped before the proposal resolved.
    #[error("raft node shut down")]
    Shutdown,
}

/// A linearizable read could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No read index was confirmed in time (no leader, or no quorum).
    #[error("read index timed out")]
    Timeout,
    /// The node was dropped before the read resolved.
    #[error("raft node shut down")]
    Shutdown,
}
