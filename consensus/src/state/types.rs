//! Plain data types held by the replicated [`ControlState`](super::ControlState).
//!
//! Every collection is ordered (`BTreeMap`, `VecDeque`, sorted `Vec`) so that the bincode
//! encoding of the state, and therefore its digest, is identical on every node.

use std::collections::{BTreeMap, BTreeSet};

use parcae_pool::{AllReduce, check_instance_type, check_zone};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::NodeId;

/// A SHA-256 digest (state digests, stage parameter digests, checkpoint digests).
pub type Digest32 = [u8; 32];

/// How to reach a node and what it brings; carried by `Join`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PeerInfo {
    /// The libp2p `PeerId::to_bytes()` of the node; its [`NodeId`] is derived from these bytes.
    pub peer_id: Vec<u8>,
    /// Multiaddrs (as strings) the node listens on.
    pub addrs: Vec<String>,
    /// `IP:PORT` of the node's data plane (tensors and stage state), once it listens.
    pub data_addr: Option<String>,
    /// Resources the planner may take into account.
    pub caps: Capabilities,
    /// [`Job::digest`] of the job this node trains (none: it does not train). The planner
    /// gives slots only to members whose job is the cluster's.
    pub job: Option<Digest32>,
    /// Fingerprints of the cluster keys the node admits peers with (at most
    /// [`super::limits::MAX_KEYS`]): the key in force and, while a rotation is under way, the
    /// staged next one. The leader rotates the key once every member holds the staged one.
    pub keys: Vec<KeyId>,
}

/// A cluster key's public fingerprint: the first 8 bytes of the SHA-256 of the key.
pub type KeyId = [u8; 8];

/// The training job every member trains, as named settings (`model.architecture`,
/// `data.sha256`, `batch.global`, ...), fixed by the first `DefineJob` that commits. Settings
/// are compared by name, so a node whose own job differs is told which setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Job {
    /// Setting name -> value, as text.
    pub settings: BTreeMap<String, String>,
}

impl Job {
    /// SHA-256 over the settings in name order, each name and value length-prefixed.
    pub fn digest(&self) -> Digest32 {
        let mut h = Sha256::new();
        for (name, value) in &self.settings {
            for part in [name, value] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        h.finalize().into()
    }

    /// The settings (by name) in which `mine` differs from this job (the cluster's),
    /// described and joined by `; `: `seed: the cluster's job has "3", this node's "4"`.
    pub fn difference(&self, mine: &Job) -> Option<String> {
        let names: BTreeSet<&String> = self.settings.keys().chain(mine.settings.keys()).collect();
        let show =
            |v: Option<&String>| v.map_or_else(|| "no value".to_string(), |v| format!("{v:?}"));
        let differences: Vec<String> = names
            .into_iter()
            .filter_map(|name| {
                let (theirs, ours) = (self.settings.get(name), mine.settings.get(name));
                (theirs != ours).then(|| {
                    format!(
                        "{name}: the cluster's job has {}, this node's {}",
                        show(theirs),
                        show(ours)
                    )
                })
            })
            .collect();
        (!differences.is_empty()).then(|| differences.join("; "))
    }
}

/// Where a node runs and on what, as it says when it joins: the planner tells pools (a zone,
/// or an instance type in a zone) and device kinds apart by these, and `/status` shows them.
/// Each is empty where the node does not know; the zone and the instance type follow
/// `parcae_pool`'s rule (the one every crate reads pools by), the device is at most
/// [`super::limits::MAX_LABEL_BYTES`] of `A-Z a-z 0-9 . _ : / -`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Capabilities {
    /// The cloud zone (`us-east-1a`): `[placement] zone`, `--zone`, or the cloud's metadata.
    pub zone: String,
    /// The instance type (`p3.2xlarge`), likewise.
    pub instance_type: String,
    /// The device its stage runs on: `cpu`, `cuda`, or `emulated:PROFILE`.
    pub device: String,
    /// Usable memory of that device, MiB (0: unknown, and the planner assumes its own
    /// device's): the planner prices each pool at its own memory.
    pub memory_mib: u64,
}

impl Capabilities {
    /// Whether a device name may hold `c`.
    pub fn allows(c: char) -> bool {
        c.is_ascii_alphanumeric() || ".:_/-".contains(c)
    }

    /// The first field that breaks the rules above (a device's memory at most
    /// [`super::limits::MAX_DEVICE_MEMORY_MIB`]), and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.zone.is_empty() {
            check_zone(&self.zone).map_err(|e| ("caps.zone", e.to_string()))?;
        }
        if !self.instance_type.is_empty() {
            check_instance_type(&self.instance_type)
                .map_err(|e| ("caps.instance_type", e.to_string()))?;
        }
        Self::check_label(&self.device).map_err(|reason| ("caps.device", reason))?;
        if self.memory_mib > super::limits::MAX_DEVICE_MEMORY_MIB {
            return Err((
                "caps.memory_mib",
                format!(
                    "{} MiB (at most {})",
                    self.memory_mib,
                    super::limits::MAX_DEVICE_MEMORY_MIB
                ),
            ));
        }
        Ok(())
    }

    /// Why `value` may not be a device name, if it may not.
    pub fn check_label(value: &str) -> Result<(), String> {
        if value.len() > super::limits::MAX_LABEL_BYTES {
            return Err(format!(
                "{} bytes (at most {})",
                value.len(),
                super::limits::MAX_LABEL_BYTES
            ));
        }
        if let Some(c) = value.chars().find(|c| !Self::allows(*c)) {
            return Err(format!("{value:?} has {c:?} (only A-Z a-z 0-9 . _ : / -)"));
        }
        Ok(())
    }
}

/// The node's role in the raft configuration, as applied through the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRole {
    /// Counts in quorums and may lead.
    Voter,
    /// Receives the log, never votes.
    Learner,
    /// Known to the state machine but not (or no longer) in the raft configuration.
    Absent,
}

/// The node's health and duty as far as the cluster knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberStatus {
    /// Assigned a stage in the current plan.
    Active,
    /// Healthy, not assigned.
    Spare,
    /// Announced its preemption; gone after `deadline_ms` (unix milliseconds).
    Leaving {
        /// Wall-clock deadline in unix milliseconds, as reported by the notice.
        deadline_ms: u64,
    },
    /// Vanished without notice.
    Lost,
}

impl MemberStatus {
    /// Whether the node can take work and be promoted to voter.
    pub fn is_healthy(self) -> bool {
        matches!(self, MemberStatus::Active | MemberStatus::Spare)
    }
}

/// A member that left: its id and the peer id it had, so the transport can refuse it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// Raft id.
    pub id: NodeId,
    /// libp2p peer id bytes.
    pub peer_id: Vec<u8>,
}

/// One cluster member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Raft id, derived from `peer.peer_id`.
    pub id: NodeId,
    /// Identity and addresses.
    pub peer: PeerInfo,
    /// Role in the applied raft configuration.
    pub role: RaftRole,
    /// Health and duty.
    pub status: MemberStatus,
    /// Join order: smaller means member for longer (more stable); renewed on a re-join after loss.
    pub join_seq: u64,
}

/// Number of nodes available during one planning interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AvailabilitySample {
    /// Interval number (strictly increasing).
    pub interval: u64,
    /// Nodes available in that interval.
    pub count: u32,
    /// The same nodes by pool, pools in ascending order of name (empty when some node did not
    /// say its zone): what a planner over pools forecasts each pool from.
    pub pools: Vec<PoolCount>,
}

/// Nodes available in one pool (a zone, or an instance type in a zone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCount {
    /// The pool's name (`ZONE` or `ZONE/TYPE`, `parcae_pool::Pool`'s form), checked when the
    /// count is committed.
    pub pool: String,
    /// Its nodes.
    pub nodes: u32,
}

/// A node's place in a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StageSlot {
    /// Data-parallel pipeline index in `0..D`.
    pub pipeline: u32,
    /// Pipeline stage index in `0..P`.
    pub stage: u32,
}

/// A parallel configuration: D x P, the layer partition and who runs what, from `at_step` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Strictly increasing plan number; messages of older epochs are stale.
    pub epoch: u64,
    /// D: number of data-parallel pipelines.
    pub data_parallel: u32,
    /// P: number of pipeline stages.
    pub pipeline_stages: u32,
    /// P + 1 strictly increasing layer boundaries starting at 0: stage `s` owns layers
    /// `partition[s]..partition[s + 1]`.
    pub partition: Vec<u32>,
    /// Node -> slot; exactly one node per slot.
    pub assignment: BTreeMap<NodeId, StageSlot>,
    /// First training step run under this plan (the effective step).
    pub at_step: u64,
    /// The join sequence number the next member would have taken when the plan was made
    /// (`ControlState::next_join_seq`): members with a smaller `join_seq` were known to its
    /// planner, the others joined after it (what tells a restart that answers an arrival from
    /// one that answers a departure).
    pub joins_before: u64,
    /// Samples of each step's global batch that each pipeline trains, in pipeline order,
    /// where they differ (pipelines on devices of unequal speed: the faster take more);
    /// empty: the batch is cut evenly.
    pub batch_shares: Vec<u32>,
    /// How each stage's replicas average their gradients.
    pub all_reduce: AllReduce,
}

impl Plan {
    /// Layers owned by `stage`, if the stage exists.
    pub fn stage_layers(&self, stage: u32) -> Option<LayerRange> {
        let s = stage as usize;
        Some(LayerRange {
            start: *self.partition.get(s)?,
            end: *self.partition.get(s + 1)?,
        })
    }
}

/// Half-open range of model layers `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LayerRange {
    /// First layer.
    pub start: u32,
    /// One past the last layer.
    pub end: u32,
}

/// Optimizer scalars that must survive any reconfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OptimizerScalars {
    /// Optimizer steps taken (Adam's bias-correction `t`).
    pub step_count: u64,
    /// Position in the learning-rate schedule.
    pub schedule_position: u64,
}

/// Loss of one committed step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossRecord {
    /// Training step.
    pub step: u64,
    /// Mean loss of the step.
    pub loss: f64,
}

/// Training progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Progress {
    /// Last committed step, `None` before the first.
    pub last_committed_step: Option<u64>,
    /// Index of the next sample to train: the samples of step `s` start where step `s - 1`
    /// ended, which gives exactly-once data across reconfigurations.
    pub sample_cursor: u64,
    /// Optimizer scalars after the last committed step.
    pub optimizer: OptimizerScalars,
    /// Losses of the most recent steps, oldest first (bounded).
    pub recent_losses: std::collections::VecDeque<LossRecord>,
    /// Digest of every stage's state that step `audited_step` started from (index = stage);
    /// see `Command::StepCommitted`.
    pub stage_digests: Vec<Digest32>,
    /// The most recent committed step that carried digests.
    pub audited_step: Option<u64>,
    /// The validation loss of the most recent step that evaluated one.
    pub last_validation: Option<LossRecord>,
    /// Ends of the most recent committed steps, oldest first (bounded): a checkpoint registers
    /// against them.
    pub step_ends: std::collections::VecDeque<StepEnd>,
    /// Rollbacks and resumptions so far: steps committed in an earlier history after the
    /// checkpoint it went back to were trained again in this one.
    pub history: u64,
    /// Committed steps given up by rollbacks (trained again since, or to be).
    pub rolled_back_steps: u64,
    /// Under DiLoCo, the newest round committed: the step it opened and each stage's outer
    /// weights' digest after it.
    pub outer_round: Option<OuterRound>,
}

/// A DiLoCo round as committed with the step it opened.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OuterRound {
    /// The step the round opened (a positive multiple of the inner steps).
    pub step: u64,
    /// The digest of each stage's outer weights after it (index = stage).
    pub digests: Vec<Digest32>,
}

impl Progress {
    /// The step the cluster trains next.
    pub fn next_step(&self) -> u64 {
        self.last_committed_step.map_or(0, |s| s + 1)
    }
}

/// The end of one committed step as the cut registry needs it: a checkpoint of step `step`
/// resumes the data at `sample_cursor` with these optimizer scalars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    /// The step.
    pub step: u64,
    /// Epoch of the plan it ran under.
    pub epoch: u64,
    /// Sample cursor after it.
    pub sample_cursor: u64,
    /// Optimizer scalars after it.
    pub optimizer: OptimizerScalars,
}

/// Whether `parts` (by first layer) cover layers `0..layers` end to end.
fn covers(parts: &[CutPart], layers: u32) -> bool {
    let mut next = 0;
    for part in parts {
        if part.layers.start != next {
            return false;
        }
        next = part.layers.end;
    }
    next == layers && layers > 0
}

/// One stage's part of a checkpoint cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutPart {
    /// Layers saved.
    pub layers: LayerRange,
    /// Nodes holding a copy on their disks (sorted, unique).
    pub holders: Vec<NodeId>,
    /// SHA-256 of the saved state.
    pub digest: Digest32,
    /// The part is in the job's durable store too.
    pub stored: bool,
}

/// A checkpoint of the whole model: every stage's state after the same committed step. It is
/// complete when its parts cover every layer exactly once; only a complete cut can be restored,
/// so the model always equals some committed step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// The step whose end state was saved, its epoch, and the cursor and optimizer scalars
    /// training resumes with.
    pub end: StepEnd,
    /// The history the step belongs to (see [`Progress::history`]).
    pub history: u64,
    /// Layers of the whole model.
    pub layers: u32,
    /// Parts by first layer (non-overlapping).
    pub parts: Vec<CutPart>,
    /// Under DiLoCo, the other groups' states after the same step (the parts are pipeline 0's
    /// group's), by zone: a replay of the history trains every group from them. Never restored
    /// (a rollback resumes every group from the parts).
    #[serde(default)]
    pub groups: Vec<GroupParts>,
}

/// Under DiLoCo, one group's state after a cut's step: what the first replica of each stage in
/// its zone stored (in the durable store alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupParts {
    /// The group's zone.
    pub zone: String,
    /// Parts by first layer (non-overlapping).
    pub parts: Vec<CutPart>,
}

impl Cut {
    /// Steps trained into the cut's state (its end step and every one before it): what its
    /// files are named by, and where training resumes from it.
    pub fn steps_trained(&self) -> u64 {
        self.end.step + 1
    }

    /// Whether the parts cover layers `0..layers` end to end.
    pub fn is_complete(&self) -> bool {
        covers(&self.parts, self.layers)
    }

    /// Group `zone`'s parts, where they cover every layer and are all in the durable store.
    pub fn stored_group(&self, zone: &str) -> Option<&[CutPart]> {
        self.groups
            .iter()
            .find(|g| g.zone == zone)
            .map(|g| g.parts.as_slice())
            .filter(|parts| covers(parts, self.layers) && parts.iter().all(|p| p.stored))
    }

    /// Whether the cut is complete and every part is in the durable store.
    pub fn is_stored(&self) -> bool {
        self.is_complete() && self.parts.iter().all(|p| p.stored)
    }

    /// The part holding `layer`.
    pub fn part_of(&self, layer: u32) -> Option<&CutPart> {
        self.parts
            .iter()
            .find(|p| p.layers.start <= layer && layer < p.layers.end)
    }
}

/// Measured cost of one layer on one node, in seconds per micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayerCost {
    /// Forward time.
    pub forward_s: f64,
    /// Backward time.
    pub backward_s: f64,
    /// Optimizer step time.
    pub optimizer_s: f64,
    /// Trainable parameters of the layer.
    pub params: u64,
    /// Bytes of the layer's output activation for one micro-batch.
    pub output_bytes: u64,
}

/// Costs measured by one node (see `Command::CostReport`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeCosts {
    /// Step at which the latest report was taken.
    pub step: u64,
    /// Layer index -> cost.
    pub layers: BTreeMap<u32, LayerCost>,
    /// Peer -> measured transfer rate in bytes per second.
    pub bandwidth: BTreeMap<NodeId, f64>,
    /// What its latest reconfiguration took beyond moving state, seconds.
    pub reconfiguration_s: Option<f64>,
    /// The rate of its gradient all-reduce within its zone, bytes per second.
    pub allreduce_bytes_per_sec: Option<f64>,
    /// What one boundary activation took on its link to a neighbouring stage.
    pub boundary_link: Option<LinkTime>,
}

/// The time a link took to carry one message of a size: a point of its transfer curve, from
/// which the planner takes the link's latency beside the rate its state fetches measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkTime {
    /// Bytes of the message.
    pub bytes: u64,
    /// Seconds from the send to the receipt.
    pub secs: f64,
}
