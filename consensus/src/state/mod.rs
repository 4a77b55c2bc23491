//! The deterministic control state machine every node applies.
//!
//! [`ControlState::apply`] is a pure function of the state and the command: no clock, no
//! randomness, no I/O, no floating-point arithmetic (floats are only stored). Invalid commands are
//! rejected with a [`Rejection`] and leave the state untouched, so all nodes stay equal whatever a
//! proposer sent. [`ControlState::digest`] hashes the canonical encoding, which tests use to
//! compare replicas.

mod apply;
mod command;
#[cfg(test)]
mod tests;
mod training;
mod types;

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use command::{COMMAND_VERSION, Command, MAX_COMMAND_BYTES, Rejection, StateEvent};
pub use types::{
    AvailabilitySample, Capabilities, Cut, CutPart, Digest32, GroupParts, Job, KeyId, LayerCost,
    LayerRange, LinkTime, LossRecord, Member, MemberStatus, NodeCosts, OptimizerScalars,
    OuterRound, PeerInfo, Plan, PoolCount, Progress, RaftRole, Retired, StageSlot, StepEnd,
};

use crate::codec::{self, CodecError};
use crate::ids::NodeId;

/// Largest encoded snapshot of the state (64 MiB); the bounds below keep real states far smaller.
pub const MAX_SNAPSHOT_BYTES: usize = 64 << 20;
/// Current version of the snapshot encoding.
pub const SNAPSHOT_VERSION: u16 = 12;

/// Bounds that keep the state (and thus snapshots) small whatever is proposed.
pub mod limits {
    /// Members, including lost ones.
    pub const MAX_MEMBERS: usize = 4096;
    /// Bytes of a libp2p peer id.
    pub const MAX_PEER_ID_BYTES: usize = 128;
    /// Addresses per member.
    pub const MAX_ADDRS: usize = 16;
    /// Bytes per address.
    pub const MAX_ADDR_BYTES: usize = 256;
    /// Bytes of a member's zone, instance type or device name.
    pub const MAX_LABEL_BYTES: usize = 64;
    /// A member's device memory, MiB (16 TiB).
    pub const MAX_DEVICE_MEMORY_MIB: u64 = 1 << 24;
    /// Availability samples kept (oldest dropped first).
    pub const MAX_AVAILABILITY: usize = 4096;
    /// Zones of one availability sample.
    pub const MAX_SAMPLE_POOLS: usize = 16;
    /// Losses kept (oldest dropped first).
    pub const MAX_RECENT_LOSSES: usize = 256;
    /// Pipeline stages and data-parallel width of a plan.
    pub const MAX_PLAN_DIM: u32 = 1024;
    /// Complete checkpoint cuts kept (newest first); a rollback goes to the newest.
    pub const MAX_COMPLETE_CUTS: usize = 2;
    /// Incomplete cuts newer than the newest complete one (the oldest is dropped first).
    pub const MAX_OPEN_CUTS: usize = 4;
    /// Holders of one checkpoint part.
    pub const MAX_HOLDERS: usize = 16;
    /// Groups' states besides its own that one checkpoint cut holds (DiLoCo).
    pub const MAX_GROUPS: usize = 16;
    /// Committed steps a checkpoint may register against (older ones are refused).
    pub const MAX_STEP_ENDS: usize = 64;
    /// Layers per cost report.
    pub const MAX_COST_LAYERS: usize = 4096;
    /// Peers per cost report.
    pub const MAX_COST_PEERS: usize = 1024;
    /// Former members remembered (oldest forgotten first).
    pub const MAX_RETIRED: usize = 4096;
    /// Settings of a job.
    pub const MAX_JOB_SETTINGS: usize = 64;
    /// Bytes of a job setting's name.
    pub const MAX_JOB_NAME_BYTES: usize = 64;
    /// Bytes of a job setting's value.
    pub const MAX_JOB_VALUE_BYTES: usize = 1024;
    /// Cluster keys a member holds: the key in force and a staged one.
    pub const MAX_KEYS: usize = 2;
}

/// The replicated control state. Read it freely; change it only through [`ControlState::apply`]
/// (the raft driver does so for committed entries).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ControlState {
    /// Members by raft id.
    pub members: BTreeMap<NodeId, Member>,
    /// Join sequence number for the next join.
    pub next_join_seq: u64,
    /// Availability history, oldest first.
    pub availability: VecDeque<AvailabilitySample>,
    /// Plan in force.
    pub plan: Option<Plan>,
    /// Plan waiting for its effective step.
    pub pending_plan: Option<Plan>,
    /// Training progress.
    pub progress: Progress,
    /// Checkpoint cuts by step: the newest complete ones and the incomplete ones after them.
    pub checkpoints: BTreeMap<u64, Cut>,
    /// Measured costs by node.
    pub costs: BTreeMap<NodeId, NodeCosts>,
    /// Members that left, newest last: refused at admission, in raft and as joiners (a machine
    /// that comes back does so under a new identity).
    pub retired: VecDeque<Retired>,
    /// The job the cluster trains, once defined.
    pub job: Option<Job>,
    /// The cluster key in force, once one was rotated in (none: the key the cluster was
    /// founded with). A joiner must hold it.
    pub cluster_key: Option<KeyId>,
}

impl ControlState {
    /// The newest complete checkpoint cut.
    pub fn newest_complete_cut(&self) -> Option<&Cut> {
        self.checkpoints.values().rev().find(|c| c.is_complete())
    }

    /// The epoch of the newest plan, pending or in force (0 before the first): the next plan
    /// takes the epoch after it.
    pub fn latest_epoch(&self) -> u64 {
        [self.pending_plan.as_ref(), self.plan.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| p.epoch)
            .max()
            .unwrap_or(0)
    }

    /// Whether `node` left the cluster (and so may never act in it again).
    pub fn is_retired(&self, node: NodeId) -> bool {
        self.retired.iter().any(|r| r.id == node)
    }

    /// Whether a member that brings `peer` trains the cluster's job: its job digest is the
    /// defined job's (a cluster without a job trains nothing yet).
    pub fn trains_the_job(&self, peer: &PeerInfo) -> bool {
        peer.job.is_some() && peer.job == self.job.as_ref().map(Job::digest)
    }

    /// The state a new cluster starts from: the bootstrap members, all healthy spares, with the
    /// given raft roles (the bootstrap voters).
    pub fn bootstrap(members: &[(PeerInfo, RaftRole)]) -> ControlState {
        let mut state = ControlState::default();
        for (peer, role) in members {
            let id = NodeId::from_peer_bytes(&peer.peer_id);
            state.members.insert(
                id,
                Member {
                    id,
                    peer: peer.clone(),
                    role: *role,
                    status: MemberStatus::Spare,
                    join_seq: state.next_join_seq,
                },
            );
            state.next_join_seq += 1;
        }
        state
    }

    /// Applies a command: validates it completely, then changes the state and returns what
    /// changed. An invalid command is rejected with the state untouched. Deterministic.
    pub fn apply(&mut self, command: &Command) -> Result<Vec<StateEvent>, Rejection> {
        apply::apply(self, command)
    }

    /// Decodes and applies a committed raft entry. Undecodable bytes are rejected like any other
    /// invalid command: deterministically and without a state change.
    pub fn apply_bytes(
        &mut self,
        bytes: &[u8],
    ) -> (Option<Command>, Result<Vec<StateEvent>, Rejection>) {
        match Command::decode(bytes) {
            Ok(cmd) => {
                let result = self.apply(&cmd);
                (Some(cmd), result)
            }
            Err(e) => (None, Err(Rejection::Undecodable(e.to_string()))),
        }
    }

    /// Records the raft roles after a configuration change was applied through the log. Nodes in
    /// neither set become [`RaftRole::Absent`]; ids not in the membership are ignored (a node is
    /// added to raft only after its `Join`).
    pub fn set_raft_roles(&mut self, voters: &[u64], learners: &[u64]) {
        for (id, member) in self.members.iter_mut() {
            member.role = if voters.contains(&id.0) {
                RaftRole::Voter
            } else if learners.contains(&id.0) {
                RaftRole::Learner
            } else {
                RaftRole::Absent
            };
        }
    }

    /// The member with this id.
    pub fn member(&self, node: NodeId) -> Option<&Member> {
        self.members.get(&node)
    }

    /// Encodes the whole state for a raft snapshot.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode_versioned::<_, MAX_SNAPSHOT_BYTES>(SNAPSHOT_VERSION, self)
    }

    /// Decodes a snapshot produced by [`encode_snapshot`](Self::encode_snapshot).
    pub fn decode_snapshot(bytes: &[u8]) -> Result<ControlState, CodecError> {
        codec::decode_versioned::<_, MAX_SNAPSHOT_BYTES>(bytes, SNAPSHOT_VERSION..=SNAPSHOT_VERSION)
            .map(|(_, state)| state)
    }

    /// SHA-256 of the canonical encoding: equal digests mean equal states.
    pub fn digest(&self) -> Digest32 {
        let mut hasher = Sha256::new();
        bincode::serde::encode_into_std_write(self, &mut hasher, bincode::config::standard())
            .expect("ControlState has only derived serializers and hashing does not fail");
        hasher.finalize().into()
    }
}
