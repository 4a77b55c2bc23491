//! Public value types of the driver: outbound messages, roles, events, counters, status.

use crate::ids::NodeId;
use crate::state::{Command, Rejection, StateEvent};

/// A raft message to deliver: protobuf bytes for the peer `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// Recipient.
    pub to: NodeId,
    /// Encoded `raft::eraftpb::Message`; hand to [`RaftNode::step`](super::RaftNode::step) on the recipient.
    pub bytes: Vec<u8>,
}

/// The node's raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Leader of the current term.
    Leader,
    /// Voter following a leader (or waiting for one).
    Follower,
    /// Voter campaigning.
    Candidate,
    /// Voter probing whether it could win an election.
    PreCandidate,
    /// Non-voting member (or not yet part of a configuration).
    Learner,
}

/// Something the node applied or observed; delivered in log order.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// A committed command entry was applied (or deterministically rejected).
    Applied {
        /// Log index.
        index: u64,
        /// The decoded command, `None` if the bytes did not decode (boxed: a `Join` carries a
        /// member's whole record).
        command: Option<Box<Command>>,
        /// What changed, or why nothing did.
        outcome: Result<Vec<StateEvent>, Rejection>,
    },
    /// A configuration change was applied.
    ConfChanged {
        /// Log index.
        index: u64,
        /// Voters now.
        voters: Vec<NodeId>,
        /// Learners now.
        learners: Vec<NodeId>,
    },
    /// The state was replaced by a snapshot from the leader.
    SnapshotInstalled {
        /// Index the snapshot covers.
        index: u64,
    },
    /// The role, leader or term changed.
    RoleChanged {
        /// New role.
        role: Role,
        /// Known leader.
        leader: Option<NodeId>,
        /// Current term.
        term: u64,
    },
}

/// Counters of refused inputs and work done (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Inbound messages over the size limit.
    pub oversized_messages: u64,
    /// Inbound messages that are not raft protobuf.
    pub malformed_messages: u64,
    /// Inbound messages from non-members, with a forged sender or for another node.
    pub refused_messages: u64,
    /// Inbound messages raft-rs itself refused.
    pub raft_step_errors: u64,
    /// Proposals refused for size.
    pub oversized_proposals: u64,
    /// Committed commands the state machine rejected.
    pub rejected_commands: u64,
    /// Committed configuration changes that raft-rs refused or that did not decode.
    pub rejected_conf_changes: u64,
    /// Entries applied.
    pub applied_entries: u64,
    /// Snapshots taken locally.
    pub snapshots_created: u64,
    /// Snapshot attempts that failed (the node keeps running with a longer log).
    pub snapshot_failures: u64,
    /// Snapshots installed from a leader.
    pub snapshots_installed: u64,
    /// Events dropped because nobody took them.
    pub dropped_events: u64,
    /// Membership changes proposed by this node as leader.
    pub membership_proposals: u64,
}

/// A point-in-time view for status pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// This node.
    pub id: NodeId,
    /// Its role.
    pub role: Role,
    /// The known leader.
    pub leader: Option<NodeId>,
    /// Current term.
    pub term: u64,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// Voters of the applied configuration.
    pub voters: Vec<NodeId>,
    /// Learners of the applied configuration.
    pub learners: Vec<NodeId>,
}
