//! Commands replicated through raft, their encoding, and what applying them yields.

use serde::{Deserialize, Serialize};

use super::types::{
    Cut, Digest32, Job, KeyId, LayerCost, LayerRange, LinkTime, OptimizerScalars, PeerInfo, Plan,
    PoolCount,
};
use crate::codec::{self, CodecError};
use crate::ids::NodeId;

/// Largest encoded command accepted for proposal or application (1 MiB). Commands carry control
/// data only; tensors never go through raft.
pub const MAX_COMMAND_BYTES: usize = 1 << 20;

/// Current version of the command encoding.
pub const COMMAND_VERSION: u16 = 7;

/// A change to the control state. Every node applies the committed sequence of commands in the
/// same order; [`ControlState::apply`](super::ControlState::apply) is deterministic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A node asks to join (or re-join after being lost). `node` must equal
    /// `NodeId::from_peer_bytes(&peer.peer_id)`.
    Join {
        /// The joining node's raft id.
        node: NodeId,
        /// Its identity, addresses and resources.
        peer: PeerInfo,
    },
    /// A node announced its preemption; it leaves at `deadline_ms` (unix milliseconds).
    Notice {
        /// The leaving node.
        node: NodeId,
        /// Wall-clock deadline in unix milliseconds.
        deadline_ms: u64,
    },
    /// A node vanished without notice.
    Lost {
        /// The lost node.
        node: NodeId,
    },
    /// A node left for good (after its notice, or administratively); it is forgotten.
    Leave {
        /// The departing node.
        node: NodeId,
    },
    /// Availability observed during a planning interval (input of the predictor).
    AvailabilityTick {
        /// Interval number, strictly increasing.
        interval: u64,
        /// Nodes available.
        count: u32,
        /// The same nodes by pool, in ascending order of name, adding up to `count`; empty when
        /// some node did not say its zone.
        pools: Vec<PoolCount>,
    },
    /// A new plan, effective from `plan.at_step`.
    Reconfigure {
        /// The plan; `plan.epoch` must be the next epoch.
        plan: Plan,
    },
    /// A training step finished on every stage.
    StepCommitted {
        /// The step; must be the next step.
        step: u64,
        /// Epoch of the plan it ran under; must be the current epoch.
        epoch: u64,
        /// First sample of the step; must equal the sample cursor.
        sample_start: u64,
        /// Samples trained in the step (global batch), > 0.
        samples: u64,
        /// Mean loss, finite.
        loss: f64,
        /// Loss on the held-out validation samples, evaluated after the step's training
        /// (before its update) on the steps the job evaluates; finite.
        validation_loss: Option<f64>,
        /// Digest of each stage's state the step started from (length P), or none: hashing a
        /// stage's whole state is as dear as checkpointing it, so the trainer audits the steps
        /// that start from a checkpoint, whose digests it already has. Replicas apply the
        /// step's update only once this command commits, so its result cannot be in it.
        stage_digests: Vec<Digest32>,
        /// Under DiLoCo, on a step that opened with a round: the digest of each stage's outer
        /// weights after the round's outer step (length P), the same on every replica of the
        /// stage; empty on other steps. The round (its step) and its result are committed
        /// with the step they opened, or not at all.
        outer_digests: Vec<Digest32>,
        /// Optimizer scalars after the step.
        optimizer: OptimizerScalars,
    },
    /// A stage's part of the checkpoint cut of a step was saved on peers (and maybe in the
    /// job's durable store); the cut becomes complete once every stage's part is registered.
    Checkpointed {
        /// Step whose end state was saved (one of the last committed steps).
        step: u64,
        /// Epoch of that step.
        epoch: u64,
        /// Layers saved.
        layers: LayerRange,
        /// Nodes holding a copy.
        holders: Vec<NodeId>,
        /// Digest of the saved state.
        digest: Digest32,
        /// The part is in the job's durable store too.
        stored: bool,
        /// Under DiLoCo, the zone of the group whose state this is, where it is not pipeline
        /// 0's group (whose parts make the cut): stored only, for a replay.
        group: Option<String>,
    },
    /// Some layers have no live holder: the cluster goes back to the newest complete checkpoint
    /// cut, and the steps after it are trained again (the model then always equals a committed
    /// step, never a mix of two).
    RollBack {
        /// The member that found the layers missing.
        node: NodeId,
        /// The plan it found them under (the current one).
        epoch: u64,
        /// The step it was to train (the next step).
        at_step: u64,
        /// The step of the complete cut to go back to: the newest one, or an older one when
        /// every copy of a part of the newer ones failed its digest.
        to_step: u64,
    },
    /// A new cluster resumes a job from a complete cut in the job's durable store (after an
    /// outage took every node); accepted only before the cluster commits any step.
    AdoptCut {
        /// The cut, every part in the store.
        cut: Cut,
    },
    /// The job the cluster trains: the first definition that commits stands; the same one
    /// again changes nothing, another is rejected naming the setting that differs.
    DefineJob {
        /// The job.
        job: Job,
    },
    /// Measured per-layer compute costs and transfer rates of one node (feeds the planner's
    /// cost model so that no offline profiling is needed).
    CostReport {
        /// Reporting node.
        node: NodeId,
        /// Step at which the measurement was taken.
        step: u64,
        /// Layer index -> cost.
        layers: Vec<(u32, LayerCost)>,
        /// Peer -> bytes per second.
        bandwidth: Vec<(NodeId, f64)>,
        /// What the node's latest reconfiguration took beyond moving state (links, groups,
        /// building the stage), seconds: the planner's price of a reconfiguration.
        reconfiguration_s: Option<f64>,
        /// The rate of the node's gradient all-reduce within its zone, bytes per second as
        /// the cost model's ring counts it (`2 (n - 1) / n` of the gradient's bytes a member
        /// sends, over the time the ring took), when the node knows it.
        allreduce_bytes_per_sec: Option<f64>,
        /// What one activation at a stage boundary takes on the node's link to a neighbouring
        /// stage (its size is the output of the node's stage), when the node knows it.
        boundary_link: Option<LinkTime>,
    },
    /// Training stopped (some layers have no live holder and no complete cut the cluster
    /// holds restores them) and a complete cut the cluster does not hold was given in the
    /// job's durable store (`parcae-node run --restore URL` puts one there): the cluster
    /// resumes from it in a new history, as after a rollback.
    RestoreCut {
        /// The stopped member that found the cut.
        node: NodeId,
        /// The plan it stopped under (the current one).
        epoch: u64,
        /// The step it stopped at (the next step).
        at_step: u64,
        /// The cut, every part in the store.
        cut: Cut,
    },
    /// The leader's decision that every member holds the staged cluster key: it is in force
    /// from now on, and the key before it is dropped (members stop admitting peers with it).
    RotateKey {
        /// The new key's fingerprint; every member that is not lost must list it.
        key: KeyId,
    },
}

impl Command {
    /// Encodes the command in a versioned envelope, refusing commands over [`MAX_COMMAND_BYTES`].
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode_versioned::<_, MAX_COMMAND_BYTES>(COMMAND_VERSION, self)
    }

    /// Decodes bytes produced by [`Command::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Command, CodecError> {
        codec::decode_versioned::<_, MAX_COMMAND_BYTES>(bytes, COMMAND_VERSION..=COMMAND_VERSION)
            .map(|(_, cmd)| cmd)
    }

    /// Short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Join { .. } => "join",
            Command::Notice { .. } => "notice",
            Command::Lost { .. } => "lost",
            Command::Leave { .. } => "leave",
            Command::AvailabilityTick { .. } => "availability_tick",
            Command::Reconfigure { .. } => "reconfigure",
            Command::StepCommitted { .. } => "step_committed",
            Command::Checkpointed { .. } => "checkpointed",
            Command::CostReport { .. } => "cost_report",
            Command::DefineJob { .. } => "define_job",
            Command::RollBack { .. } => "roll_back",
            Command::AdoptCut { .. } => "adopt_cut",
            Command::RestoreCut { .. } => "restore_cut",
            Command::RotateKey { .. } => "rotate_key",
        }
    }
}

/// What applying a valid command changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StateEvent {
    /// The cluster's job was defined.
    JobDefined,
    /// A node joined (`rejoined`: it was known before).
    Joined {
        /// The node.
        node: NodeId,
        /// It was already a member (re-join after loss, or an address update).
        rejoined: bool,
    },
    /// A notice was recorded.
    NoticeRecorded {
        /// The node.
        node: NodeId,
        /// Effective deadline (the earliest announced).
        deadline_ms: u64,
    },
    /// A node was marked lost.
    MarkedLost {
        /// The node.
        node: NodeId,
    },
    /// A node was removed from the membership.
    Left {
        /// The node.
        node: NodeId,
    },
    /// An availability sample was recorded.
    AvailabilityRecorded {
        /// Its interval.
        interval: u64,
    },
    /// A plan was accepted and waits for its effective step.
    PlanScheduled {
        /// Its epoch.
        epoch: u64,
        /// Its effective step.
        at_step: u64,
    },
    /// A plan became current.
    PlanActivated {
        /// Its epoch.
        epoch: u64,
    },
    /// A training step was committed.
    StepCommitted {
        /// The step.
        step: u64,
    },
    /// A checkpoint part was registered.
    CheckpointRegistered {
        /// Its layers.
        layers: LayerRange,
        /// Its step.
        step: u64,
        /// The cut of the step is complete now.
        complete: bool,
    },
    /// The cluster rolled back to a complete cut.
    RolledBack {
        /// The step it was to train.
        from_step: u64,
        /// The step it trains next (the cut's step + 1).
        to_step: u64,
    },
    /// A new cluster adopted a stored cut.
    CutAdopted {
        /// The cut's step.
        step: u64,
    },
    /// Measured costs were recorded.
    CostsRecorded {
        /// The reporting node.
        node: NodeId,
    },
    /// Another cluster key is in force.
    KeyRotated {
        /// Its fingerprint.
        key: KeyId,
    },
}

/// Why a committed command was rejected. Rejection is deterministic: every node rejects the same
/// command the same way and none of them changes its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Rejection {
    /// The entry bytes are not a command of a supported version.
    #[error("undecodable command: {0}")]
    Undecodable(String),
    /// A field is out of its allowed range or shape.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The command names a node that is not a member.
    #[error("node {0} is not a member")]
    UnknownNode(NodeId),
    /// A different peer already owns this node id.
    #[error("node id {0} is taken by another peer")]
    IdCollision(NodeId),
    /// The membership is at its size limit.
    #[error("membership is full ({0} members)")]
    ClusterFull(usize),
    /// The node left the cluster: it may not join again under the same identity.
    #[error("node {0} left the cluster; a machine comes back only under a new identity")]
    Retired(NodeId),
    /// A joiner that does not hold the cluster key in force.
    #[error("node {0} does not hold the cluster key in force")]
    StaleKey(NodeId),
    /// A key rotation to a key that a member does not hold yet.
    #[error("member {0} does not hold the key to rotate to")]
    KeyNotHeld(NodeId),
    /// A job other than the one the cluster trains.
    #[error("the cluster's job is defined already and differs: {0}")]
    JobConflict(String),
    /// The node was already marked lost.
    #[error("node {0} is already lost")]
    AlreadyLost(NodeId),
    /// An availability interval not after the last recorded one.
    #[error("availability interval {got} is not after {last}")]
    StaleInterval {
        /// Last recorded interval.
        last: u64,
        /// Interval in the command.
        got: u64,
    },
    /// A plan epoch that is not the next one.
    #[error("plan epoch {got} is not the next epoch {expected}")]
    WrongEpoch {
        /// The epoch expected.
        expected: u64,
        /// The epoch given.
        got: u64,
    },
    /// The plan's effective step is already past.
    #[error("plan effective step {at_step} is before the next step {next_step}")]
    StepInPast {
        /// The plan's effective step.
        at_step: u64,
        /// The next step to train.
        next_step: u64,
    },
    /// No plan is current, so no step can commit.
    #[error("no current plan")]
    NoPlan,
    /// The step was committed already (a duplicate report).
    #[error("step {0} is already committed")]
    AlreadyCommitted(u64),
    /// The step is not the next one.
    #[error("step {got} is not the next step {expected}")]
    StepGap {
        /// The next step.
        expected: u64,
        /// The step given.
        got: u64,
    },
    /// The command's epoch is not the current plan's.
    #[error("epoch {got} is not the current epoch {current}")]
    StaleEpoch {
        /// The current plan's epoch.
        current: u64,
        /// The epoch given.
        got: u64,
    },
    /// The step's samples do not start at the sample cursor (would skip or repeat data).
    #[error("samples start at {got}, the cursor is at {cursor}")]
    CursorMismatch {
        /// The replicated cursor.
        cursor: u64,
        /// The start given.
        got: u64,
    },
    /// A checkpoint of a step not committed yet.
    #[error("checkpoint of uncommitted step {0}")]
    FutureStep(u64),
    /// A rollback with no complete checkpoint cut to go back to.
    #[error("no complete checkpoint to roll back to")]
    NoCheckpoint,
}

impl Rejection {
    /// A field of the command that no state accepts.
    pub(super) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            reason: reason.into(),
        }
    }
}
