//! The `Status` actor: what `/status` (JSON) and `/steps` (JSON: the committed steps applied
//! here) show.
//!
//! The control driver pushes a [`StatusSnapshot`] whenever something visible changes and a
//! [`StepRecord`] for every committed step; the trainer pushes its [`TrainingView`]. The `Status`
//! actor renders them to JSON once and publishes them in shared cells, which the HTTP server
//! ([`crate::http`]) only reads, so a slow or hostile HTTP client can never block an actor.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use serde::Serialize;

/// The node's raft role as shown on `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleView {
    /// Raft leader.
    Leader,
    /// Voter following a leader.
    Follower,
    /// Non-voting member, or not yet a member.
    Learner,
    /// Voter campaigning for leadership.
    Candidate,
}

/// A member as shown on `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    /// libp2p peer id.
    pub peer_id: String,
    /// Whether it is a raft voter.
    pub voter: bool,
    /// "active", "spare", "leaving" or "lost".
    pub status: &'static str,
    /// Its deadline when leaving (unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_unix_ms: Option<u64>,
}

/// A gossiped notice as this node received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

/// Everything `/status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Message)]
#[rtype(result = "()")]
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
    /// The replicated sample cursor: samples trained by committed steps.
    pub samples: u64,
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
    /// Latency from proposal to local apply of the commands this node proposed.
    pub commit_latency_us: LatencySummary,
}

/// One reconfiguration this node took part in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigrationView {
    /// Epoch of the plan entered.
    pub epoch: u64,
    /// `initial`, `intra`, `inter`, `repartition` or `restart`.
    pub kind: String,
    /// First step of the plan.
    pub at_step: u64,
    /// Seconds from seeing the plan to being ready to train.
    pub secs: f64,
    /// State bytes received from other nodes.
    pub received_bytes: u64,
}

/// The trainer's side of `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Default, Message)]
#[rtype(result = "()")]
pub struct TrainingView {
    /// `[pipeline, stage]` of this node in the current plan.
    pub slot: Option<[u32; 2]>,
    /// `waiting`, `migrating`, `training`, `spare` or `finished`.
    pub phase: String,
    /// Duration of the last step this node trained, ms.
    pub last_step_ms: f64,
    /// Reconfigurations this node took part in, oldest first (bounded).
    pub migrations: Vec<MigrationView>,
    /// The planner's cost estimates (on the leader): samples/s of the best configurations.
    pub estimates: Vec<EstimateView>,
}

/// The planner's throughput estimate of a configuration, from the measured cost model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateView {
    /// `[D, P]`.
    pub config: [u32; 2],
    /// Estimated samples per second.
    pub samples_per_sec: f64,
}

/// A committed step as applied on this node (`/steps`).
#[derive(Debug, Clone, PartialEq, Serialize, Message)]
#[rtype(result = "()")]
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
}

/// Step records kept for `/steps`.
const MAX_STEP_RECORDS: usize = 100_000;

/// Quantiles of a latency sample, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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

impl StatusSnapshot {
    /// The snapshot of a node that has not joined anything yet.
    pub fn initial(peer_id: String) -> Self {
        Self {
            peer_id,
            role: RoleView::Learner,
            leader: None,
            term: 0,
            members: Vec::new(),
            epoch: 0,
            config: None,
            step: 0,
            loss: None,
            samples: 0,
            commit_index: 0,
            applied_index: 0,
            listen_addrs: Vec::new(),
            data_addr: None,
            connected_peers: Vec::new(),
            leaving_deadline_unix_ms: None,
            notices: Vec::new(),
            commit_latency_us: LatencySummary::default(),
        }
    }
}

/// The rendered JSON, shared with the HTTP thread.
pub type SharedJson = Arc<RwLock<String>>;

/// The committed steps applied here, shared with the HTTP thread: rendered only when asked
/// for (rendering the whole history at every step costs quadratic time over a run).
pub type SharedSteps = Arc<RwLock<VecDeque<StepRecord>>>;

/// What the HTTP thread serves.
#[derive(Clone, Default)]
pub struct Published {
    /// `/status`, rendered by the actor.
    pub status: SharedJson,
    /// `/steps`.
    pub steps: SharedSteps,
}

/// The actor: renders snapshots into the shared cells.
pub struct Status {
    cells: Published,
    snapshot: Option<StatusSnapshot>,
    training: TrainingView,
}

impl Status {
    /// An actor publishing into `cells`.
    pub fn new(cells: Published) -> Self {
        Self {
            cells,
            snapshot: None,
            training: TrainingView::default(),
        }
    }

    fn render_status(&self) {
        #[derive(Serialize)]
        struct Full<'a> {
            #[serde(flatten)]
            raft: &'a StatusSnapshot,
            training: &'a TrainingView,
            migrations: &'a [MigrationView],
        }
        let Some(raft) = &self.snapshot else { return };
        let full = Full {
            raft,
            training: &self.training,
            migrations: &self.training.migrations,
        };
        store(&self.cells.status, serde_json::to_string(&full));
    }
}

fn store(cell: &SharedJson, text: serde_json::Result<String>) {
    match text {
        Ok(text) => match cell.write() {
            Ok(mut c) => *c = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        },
        Err(e) => tracing::error!("cannot render status: {e}"),
    }
}

impl Actor for Status {
    type Context = Context<Self>;
}

impl Handler<StatusSnapshot> for Status {
    type Result = ();

    fn handle(&mut self, snapshot: StatusSnapshot, _: &mut Context<Self>) {
        self.snapshot = Some(snapshot);
        self.render_status();
    }
}

impl Handler<TrainingView> for Status {
    type Result = ();

    fn handle(&mut self, view: TrainingView, _: &mut Context<Self>) {
        let estimates = std::mem::take(&mut self.training.estimates);
        self.training = view;
        if self.training.estimates.is_empty() {
            self.training.estimates = estimates;
        }
        self.render_status();
    }
}

/// The planner's latest estimates.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Estimates(pub Vec<EstimateView>);

impl Handler<Estimates> for Status {
    type Result = ();

    fn handle(&mut self, e: Estimates, _: &mut Context<Self>) {
        self.training.estimates = e.0;
        self.render_status();
    }
}

impl Handler<StepRecord> for Status {
    type Result = ();

    fn handle(&mut self, record: StepRecord, _: &mut Context<Self>) {
        let mut steps = self
            .cells
            .steps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if steps.len() == MAX_STEP_RECORDS {
            steps.pop_front();
        }
        steps.push_back(record);
    }
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
            status: "active",
            deadline_unix_ms: None,
        });
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["role"], "leader");
        assert_eq!(v["leader"], serde_json::Value::Null);
        assert_eq!(v["config"], serde_json::json!([2, 3]));
        assert_eq!(v["members"][0]["voter"], true);
        assert_eq!(v["members"][0]["status"], "active");
        for key in ["peer_id", "term", "epoch", "step"] {
            assert!(v.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn latency_quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        let s = LatencySummary::of_sorted(&v);
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50, 99, 100));
        assert_eq!(LatencySummary::of_sorted(&[]), LatencySummary::default());
    }
}
