//! `parcae-api`: the one definition of what a `parcae-node` shows over HTTP, `GET /status` and
//! `GET /steps`, and a [`client`] that reads them with timeouts and size caps.
//!
//! The node renders these types (and writes [`LearnReport`], `parcae-node learn`'s file); the
//! testnet and the multi-process tests parse them. This crate
//! depends on serde and an HTTP client only, so a harness that reads a node's status never
//! links Burn or libp2p. Closed choices (roles, member states, migration kinds, trainer
//! phases) are enums spelled in lowercase on the wire.
//!
//! Documents from the network are untrusted: every field of [`StatusSnapshot`] and
//! [`TrainingView`] has a default, so a node that is still starting (or reports less) parses as
//! "nothing known yet" instead of failing, and unknown fields are ignored.

pub mod client;
mod fleet;
mod learn;

pub use fleet::{EstimateView, FleetView, LinkView, PoolAdviceView, PoolView};
pub use learn::{LearnReport, LearnRun, ValPoint};

use serde::{Deserialize, Serialize};

/// The node's raft role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleView {
    /// Raft leader.
    Leader,
    /// Voter following a leader.
    Follower,
    /// Non-voting member, or not yet a member.
    #[default]
    Learner,
    /// Voter campaigning for leadership.
    Candidate,
}

/// Where a member stands in the replicated membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Planned into the job.
    Active,
    /// Available, not planned in.
    Spare,
    /// Got a preemption notice; gone at its deadline.
    Leaving,
    /// Unreachable for longer than the lost timeout.
    Lost,
}

impl MemberState {
    /// Whether the member counts as part of the cluster (active or spare).
    pub fn is_healthy(self) -> bool {
        matches!(self, Self::Active | Self::Spare)
    }
}

/// A member of the replicated membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    /// libp2p peer id.
    pub peer_id: String,
    /// Whether it is a raft voter.
    pub voter: bool,
    /// Its state.
    pub status: MemberState,
    /// Its deadline when leaving (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_unix_ms: Option<u64>,
    /// Where it runs and on what, as it said when it joined.
    #[serde(default)]
    pub placement: Placement,
}

/// A member's zone, instance type and device (`cpu`, `cuda`, `emulated:PROFILE`), each empty
/// where it does not know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The cloud zone.
    #[serde(default)]
    pub zone: String,
    /// The instance type.
    #[serde(default)]
    pub instance_type: String,
    /// The device its stage runs on.
    #[serde(default)]
    pub device: String,
}

/// A gossiped notice as this node received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeView {
    /// The leaving node.
    pub peer_id: String,
    /// Its deadline (unix ms).
    pub deadline_unix_ms: u64,
    /// When the leaving node issued it (unix ms).
    pub issued_unix_ms: u64,
    /// When this node received it (unix ms); `received - issued` is the propagation time.
    pub received_unix_ms: u64,
}

/// A proposal this node refused because it was signed too far from now on its signer's clock,
/// as far as this node knows that clock (a clock off by more than the 5-minute window, or a
/// replay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockRefusalView {
    /// The signer.
    pub peer_id: String,
    /// How far from now it was signed (ms).
    pub skew_ms: u64,
    /// When it was refused (unix ms, this node's clock).
    pub refused_unix_ms: u64,
}

/// Quantiles of a latency sample, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest sample.
    pub max: u64,
}

impl LatencySummary {
    /// Summarises an ascending sample (nearest-rank quantiles).
    pub fn of_sorted(sorted: &[u64]) -> Self {
        let q = |p: f64| {
            let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1]
        };
        if sorted.is_empty() {
            return Self::default();
        }
        Self {
            count: sorted.len(),
            p50: q(0.5),
            p99: q(0.99),
            max: sorted[sorted.len() - 1],
        }
    }
}

/// How a node entered a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationKind {
    /// The job's first plan.
    Initial,
    /// Same stages, other nodes: state moves within a stage.
    Intra,
    /// Other stages, same partition: state moves between stages.
    Inter,
    /// A new layer partition.
    Repartition,
    /// The reactive baseline's restart from a checkpoint.
    Restart,
}

impl MigrationKind {
    /// The wire spelling (also used in logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Intra => "intra",
            Self::Inter => "inter",
            Self::Repartition => "repartition",
            Self::Restart => "restart",
        }
    }
}

impl std::fmt::Display for MigrationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reconfiguration this node took part in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationView {
    /// Epoch of the plan entered.
    pub epoch: u64,
    /// How it was entered.
    pub kind: MigrationKind,
    /// First step of the plan.
    pub at_step: u64,
    /// Seconds from seeing the plan to being ready to train.
    pub secs: f64,
    /// State bytes received from other nodes.
    #[serde(default)]
    pub received_bytes: u64,
}

/// What the trainer is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainingPhase {
    /// No plan that includes this node yet.
    #[default]
    Waiting,
    /// Getting the state of a new slot.
    Migrating,
    /// Running steps.
    Training,
    /// Not planned in.
    Spare,
    /// The job's step limit was reached.
    Finished,
    /// This node's job is not the cluster's: it does not train (see `error`).
    Refused,
    /// Some layers have no live holder and no complete checkpoint is left to roll back to:
    /// training waits until the job is restored from a store (see `error`).
    Stopped,
}

/// The trainer's side of `/status`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "actix", derive(actix::Message), rtype(result = "()"))]
pub struct TrainingView {
    /// `[pipeline, stage]` of this node in the current plan.
    pub slot: Option<[u32; 2]>,
    /// What the trainer is doing.
    pub phase: TrainingPhase,
    /// Duration of the last step this node trained, ms.
    pub last_step_ms: f64,
    /// Bytes this node process has sent in gradient all-reduces.
    pub allreduce_bytes: u64,
    /// Of them, bytes sent to a replica in another zone.
    pub allreduce_cross_zone_bytes: u64,
    /// Reconfigurations this node took part in, oldest first (bounded).
    pub migrations: Vec<MigrationView>,
    /// The planner's cost estimates (on the leader): samples/s of the best configurations.
    pub estimates: Vec<EstimateView>,
    /// The zones the leader plans over, when its workers are in several.
    pub fleet: Option<FleetView>,
    /// The emulated accelerator this node trains on, if any.
    pub emulated: Option<EmulatedView>,
    /// Under DiLoCo, the outer weights of this node's stage after the last round it closed.
    pub outer: Option<OuterView>,
    /// Why this node does not train, when it refuses to.
    pub error: Option<String>,
}

/// A stage's DiLoCo outer weights after a round: every replica of the same layers, in any
/// group, must show the same digest for the same round.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OuterView {
    /// The step the round closed before (a positive multiple of the inner steps, or the
    /// job's step limit for the round closed after its last step).
    pub step: u64,
    /// The stage's layers, `[start, end)`.
    pub layers: [u32; 2],
    /// SHA-256 of the outer weights (hex).
    pub digest: String,
    /// The stage's index in the round's plan (0 in views written before it was kept), where
    /// the round's committed step names its digest (`StepRecord::outer_digests`).
    #[serde(default)]
    pub stage: u32,
}

/// An emulated accelerator's pacing: what it emulates, and the work that outlasted its
/// emulated time (the machine was too slow for the time scale).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EmulatedView {
    /// The profiled model (e.g. `gpt-1.5b`).
    pub profile: String,
    /// Emulated durations are divided by this.
    pub time_scale: f64,
    /// Pieces of work that outlasted their emulated time.
    pub overrun_count: u64,
    /// Their excess, seconds.
    pub overrun_secs: f64,
    /// Emulated busy time paced so far, seconds.
    pub busy_secs: f64,
}

/// `GET /status`: everything a node shows about itself and the cluster as it sees it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "actix", derive(actix::Message), rtype(result = "()"))]
pub struct StatusSnapshot {
    /// This node's peer id.
    pub peer_id: String,
    /// Raft role.
    pub role: RoleView,
    /// Current leader's peer id, if known.
    pub leader: Option<String>,
    /// Raft term.
    pub term: u64,
    /// Replicated membership.
    pub members: Vec<MemberView>,
    /// Plan epoch (0 before the first plan).
    pub epoch: u64,
    /// Current (D, P), if a plan exists.
    pub config: Option<(u32, u32)>,
    /// Last committed training step.
    pub step: u64,
    /// Loss of the last committed step.
    pub loss: Option<f64>,
    /// The job the cluster trains (setting name -> value), once defined.
    pub job: Option<std::collections::BTreeMap<String, String>>,
    /// Loss on the held-out validation samples at the most recent step that evaluated them.
    pub validation_loss: Option<f64>,
    /// That step.
    pub validation_step: Option<u64>,
    /// The replicated sample cursor: samples trained by committed steps.
    pub samples: u64,
    /// Rollbacks and resumptions so far (steps of `/steps` carry the history they belong to).
    pub history: u64,
    /// Committed steps given up by rollbacks to a checkpoint (trained again after it).
    pub rolled_back_steps: u64,
    /// The step of the newest complete checkpoint cut, if any.
    pub checkpoint_step: Option<u64>,
    /// Raft commit index.
    pub commit_index: u64,
    /// Raft applied index.
    pub applied_index: u64,
    /// Listen addresses with `/p2p/<id>`.
    pub listen_addrs: Vec<String>,
    /// This node's data-plane address (tensors and state), when it trains.
    pub data_addr: Option<String>,
    /// Peers connected right now.
    pub connected_peers: Vec<String>,
    /// This node's own leave deadline, once it got a notice.
    pub leaving_deadline_unix_ms: Option<u64>,
    /// Notices received by gossip (or issued locally).
    pub notices: Vec<NoticeView>,
    /// Why `/readyz` answers 503 (`null` when the node is ready): e.g. "no leader known: this
    /// node reaches 1 of 5 voters (a quorum is 3)" on the minority side of a split.
    pub not_ready: Option<String>,
    /// Proposals refused for the time they were signed at, newest last (at most 16).
    pub clock_refusals: Vec<ClockRefusalView>,
    /// Latency from proposal to local apply of the commands this node proposed.
    pub commit_latency_us: LatencySummary,
    /// The trainer's side, when the node trains.
    pub training: Option<TrainingView>,
    /// Reconfigurations this node took part in (the trainer's, at the top level for readers
    /// that only want these).
    pub migrations: Vec<MigrationView>,
    /// Where this node watches for preemption notices besides SIGTERM: `"aws"`, `"gce"` or
    /// `"azure"` (the metadata service it polls), `"none"`, or `null` while it is detecting.
    pub notice_provider: Option<String>,
    /// Fingerprints of the cluster keys this node admits peers with, the key in force first
    /// (two while a key rotation is under way).
    pub keys_held: Vec<String>,
    /// Fingerprint of the cluster key in force by the replicated state once one was rotated in
    /// (`null`: the key the cluster was founded with).
    pub key_in_force: Option<String>,
}

impl StatusSnapshot {
    /// The snapshot of a node that has not joined anything yet.
    pub fn initial(peer_id: String) -> Self {
        Self {
            peer_id,
            ..Self::default()
        }
    }

    /// A member by peer id.
    pub fn member(&self, peer_id: &str) -> Option<&MemberView> {
        self.members.iter().find(|m| m.peer_id == peer_id)
    }

    /// Members that count as part of the cluster (active or spare).
    pub fn healthy_members(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.status.is_healthy())
            .count()
    }

    /// The listen address to dial the node at, ending in `/p2p/<id>`, for `--bootstrap`: the
    /// loopback one where it listens there (a local cluster), else its first IPv4 TCP address
    /// (a node in a network namespace of its own).
    pub fn p2p_addr(&self) -> Option<String> {
        if self.peer_id.is_empty() {
            return None;
        }
        let ipv4_tcp = |a: &&String| a.starts_with("/ip4/") && a.contains("/tcp/");
        let addr = self
            .listen_addrs
            .iter()
            .find(|a| a.starts_with("/ip4/127.0.0.1/tcp/"))
            .or_else(|| self.listen_addrs.iter().find(ipv4_tcp))?;
        Some(if addr.contains("/p2p/") {
            addr.clone()
        } else {
            format!("{addr}/p2p/{}", self.peer_id)
        })
    }
}

/// A committed step as applied on a node (`GET /steps`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "actix", derive(actix::Message), rtype(result = "()"))]
pub struct StepRecord {
    /// The step.
    pub step: u64,
    /// Plan epoch it ran under.
    pub epoch: u64,
    /// First sample.
    pub sample_start: u64,
    /// Samples.
    pub samples: u64,
    /// Mean loss.
    pub loss: f64,
    /// Loss on the held-out validation samples, on the steps that evaluate them.
    pub validation_loss: Option<f64>,
    /// The history the step belongs to: a rollback to a checkpoint starts a new one, and the
    /// steps after the checkpoint are committed again in it.
    pub history: u64,
    /// Under DiLoCo, on a step that opened with a round: SHA-256 (hex) of each stage's outer
    /// weights after it, stage by stage, as raft committed them; empty on other steps.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outer_digests: Vec<String>,
    /// Under DiLoCo, the groups that trained the step, in zone order: what a replay in one
    /// process needs to train each group's share as its replicas did. Empty under `step`, and
    /// where a pipeline of the step spanned zones.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<StepGroup>,
    /// With `groups`: the layer bounds of the step's stages (`P + 1` of them from 0, stage `s`
    /// holding layers `partition[s]..partition[s + 1]`), as its plan cut every pipeline: each
    /// stage's replicas average their own buffer, which a replay reproduces stage by stage.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partition: Vec<u32>,
}

/// Under DiLoCo, one group's part of a committed step: the zone its replicas share and the
/// samples each of its pipelines trained.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepGroup {
    /// The zone (empty where its members said none).
    pub zone: String,
    /// Each of its pipelines' samples, `[first, end)`, in pipeline order.
    pub shares: Vec<[u64; 2]>,
}

/// What `parcae-node replay` found: a cluster's committed steps trained again in one process,
/// from each stored checkpoint of the final history to the next, and the cluster's weights at
/// the next compared with the replay's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// Every window replayed within the tolerance, and no problem found.
    pub passed: bool,
    /// Largest difference allowed between a checkpoint's weights and the replay's.
    pub tolerance: f64,
    /// Windows replayed (checkpoint to checkpoint, or from the seeded start).
    pub windows: u64,
    /// Committed steps trained again.
    pub steps_replayed: u64,
    /// Committed steps of the history that no window covered (after the newest stored
    /// checkpoint, or between two checkpoints further apart than the longest window).
    pub steps_not_replayed: u64,
    /// Largest difference between a checkpoint's weights and the replay's, over all windows.
    pub max_abs_diff: f64,
    /// Largest difference between a step's committed loss and the replay's.
    pub max_loss_diff: f64,
    /// The step the newest replayed checkpoint was taken after (the model `parcae-node
    /// export --store` writes).
    pub last_checkpoint_step: Option<u64>,
    /// What is wrong, one line each.
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_json_has_the_documented_fields() {
        let mut s = StatusSnapshot::initial("12D3Koo".into());
        s.role = RoleView::Leader;
        s.config = Some((2, 3));
        s.members.push(MemberView {
            peer_id: "p".into(),
            voter: true,
            status: MemberState::Active,
            deadline_unix_ms: None,
            placement: Placement {
                zone: "us-east-1a".into(),
                ..Placement::default()
            },
        });
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["members"][0]["placement"]["zone"], "us-east-1a");
        assert_eq!(v["role"], "leader");
        assert_eq!(v["leader"], serde_json::Value::Null);
        assert_eq!(v["config"], serde_json::json!([2, 3]));
        assert_eq!(v["members"][0]["voter"], true);
        assert_eq!(v["members"][0]["status"], "active");
        for key in ["peer_id", "term", "epoch", "step"] {
            assert!(v.get(key).is_some(), "{key}");
        }
        let back: StatusSnapshot = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn latency_quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        let s = LatencySummary::of_sorted(&v);
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50, 99, 100));
        assert_eq!(LatencySummary::of_sorted(&[]), LatencySummary::default());
    }

    #[test]
    fn todays_status_parses_with_defaults_for_missing_fields() {
        let s: StatusSnapshot = serde_json::from_str(
            r#"{"peer_id":"12D3","role":"leader","leader":"12D3","term":2,
                "members":[{"peer_id":"12D3","voter":true,"status":"active"},
                           {"peer_id":"12D4","voter":false,"status":"lost"}],
                "epoch":3,"config":[2,1],"step":0,"commit_index":9,
                "listen_addrs":["/ip4/10.0.0.1/tcp/1","/ip4/127.0.0.1/tcp/7"]}"#,
        )
        .unwrap();
        assert_eq!(s.config, Some((2, 1)));
        assert_eq!(s.loss, None);
        assert_eq!(s.samples, 0);
        assert!(s.migrations.is_empty());
        assert_eq!(s.healthy_members(), 1);
        assert_eq!(
            s.p2p_addr().as_deref(),
            Some("/ip4/127.0.0.1/tcp/7/p2p/12D3")
        );
        let with_id = StatusSnapshot {
            listen_addrs: vec!["/ip4/127.0.0.1/tcp/8/p2p/12D3".into()],
            ..s
        };
        assert_eq!(
            with_id.p2p_addr().as_deref(),
            Some("/ip4/127.0.0.1/tcp/8/p2p/12D3")
        );
        let in_a_namespace = StatusSnapshot {
            listen_addrs: vec!["/ip6/::1/tcp/9".into(), "/ip4/10.1.0.3/tcp/7001".into()],
            ..with_id
        };
        assert_eq!(
            in_a_namespace.p2p_addr().as_deref(),
            Some("/ip4/10.1.0.3/tcp/7001/p2p/12D3")
        );
    }

    #[test]
    fn training_fields_parse() {
        let s: StatusSnapshot = serde_json::from_str(
            r#"{"peer_id":"a","loss":2.5,"samples":640,
                "training":{"slot":[1,0],"phase":"training",
                            "estimates":[{"config":[2,2],"samples_per_sec":31.5}]},
                "migrations":[{"epoch":2,"kind":"intra","at_step":40,"secs":0.25}]}"#,
        )
        .unwrap();
        assert_eq!(s.loss, Some(2.5));
        assert_eq!(s.samples, 640);
        let training = s.training.clone().unwrap();
        assert_eq!(training.slot, Some([1, 0]));
        assert_eq!(training.phase, TrainingPhase::Training);
        assert_eq!(training.estimates[0].config, [2, 2]);
        assert_eq!(training.estimates[0].samples_per_sec, 31.5);
        assert_eq!(s.migrations[0].kind, MigrationKind::Intra);
        for kind in [
            MigrationKind::Initial,
            MigrationKind::Intra,
            MigrationKind::Inter,
            MigrationKind::Repartition,
            MigrationKind::Restart,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(
                json,
                format!("\"{kind}\""),
                "one spelling on the wire and in logs"
            );
        }
        assert_eq!(s.migrations[0].at_step, 40);
        let steps: Vec<StepRecord> = serde_json::from_str(
            r#"[{"step":1,"epoch":1,"sample_start":0,"samples":16,"loss":4.1}]"#,
        )
        .unwrap();
        assert_eq!(steps[0].samples, 16);
        assert!(serde_json::from_str::<StatusSnapshot>("[1,2]").is_err());
    }
}
