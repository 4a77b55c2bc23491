//! Tunables of a [`RaftNode`](super::RaftNode).

use crate::ids::NodeId;
use crate::storage::StorageOptions;

/// Configuration of one raft node. `Default` gives production values for a node id of 0, which
/// must be replaced.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// This node's id (see [`NodeId::from_peer_bytes`]).
    pub id: NodeId,
    /// Ticks without a heartbeat before a follower campaigns (randomized in
    /// `[election_tick, 2 * election_tick)`).
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_tick: usize,
    /// Most voters in the configuration; odd, at least 1.
    pub max_voters: usize,
    /// Applied entries between automatic snapshots (which compact the log).
    pub snapshot_interval: u64,
    /// Largest inbound raft message accepted by [`RaftNode::step`](super::RaftNode::step).
    pub max_message_bytes: usize,
    /// Largest batch of entries in one append message.
    pub max_size_per_msg: u64,
    /// Most append messages in flight per follower.
    pub max_inflight_msgs: usize,
    /// Most bytes of proposed but uncommitted entries on the leader; beyond it proposals fail
    /// with `ProposeError::Dropped` instead of growing the log while no quorum answers.
    pub max_uncommitted_bytes: u64,
    /// Ticks after which an unanswered read-index request fails with a timeout.
    pub read_timeout_ticks: u64,
    /// A learner is promotable when its log is at most this many entries behind the leader's.
    pub catch_up_slack: u64,
    /// Durable store options (fsync).
    pub storage: StorageOptions,
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            id: NodeId(0),
            election_tick: 10,
            heartbeat_tick: 2,
            max_voters: 5,
            snapshot_interval: 1024,
            max_message_bytes: 16 << 20,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            max_uncommitted_bytes: 32 << 20,
            read_timeout_ticks: 30,
            catch_up_slack: 64,
            storage: StorageOptions::default(),
        }
    }
}

impl RaftConfig {
    /// A default configuration for `id`.
    pub fn new(id: NodeId) -> RaftConfig {
        RaftConfig {
            id,
            ..RaftConfig::default()
        }
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.id.0 == 0 {
            return Err("node id 0 is reserved".into());
        }
        if self.max_voters == 0 || self.max_voters.is_multiple_of(2) {
            return Err(format!(
                "max_voters must be odd and >= 1, got {}",
                self.max_voters
            ));
        }
        if self.heartbeat_tick == 0 || self.election_tick <= self.heartbeat_tick {
            return Err("election_tick must exceed heartbeat_tick > 0".into());
        }
        if self.max_uncommitted_bytes <= self.max_size_per_msg {
            return Err("max_uncommitted_bytes must exceed max_size_per_msg".into());
        }
        if self.snapshot_interval == 0 {
            return Err("snapshot_interval must be > 0".into());
        }
        Ok(())
    }

    pub(super) fn to_raft(&self) -> raft::Config {
        raft::Config {
            id: self.id.0,
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            max_size_per_msg: self.max_size_per_msg,
            max_inflight_msgs: self.max_inflight_msgs,
            max_uncommitted_size: self.max_uncommitted_bytes,
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..raft::Config::default()
        }
    }
}
