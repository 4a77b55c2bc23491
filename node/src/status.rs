//! The `Status` actor and the HTTP endpoints `/status` (JSON), `/steps` (JSON: the committed
//! steps applied here) and `/metrics` (OpenMetrics text).
//!
//! The control driver pushes a [`StatusSnapshot`] whenever something visible changes and a
//! [`StepRecord`] for every committed step; the trainer pushes its [`TrainingView`]. The `Status`
//! actor renders them to JSON once and publishes them in shared cells. The HTTP server runs on its
//! own thread (tiny_http) and only reads that cell and the metrics atomics, so a slow or hostile
//! HTTP client can never block an actor.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use serde::Serialize;

use crate::metrics::Metrics;

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

/// Why the HTTP server could not start.
#[derive(Debug, thiserror::Error)]
#[error("status server on {addr}: {reason}")]
pub struct HttpError {
    addr: SocketAddr,
    reason: String,
}

/// Starts the HTTP server on its own thread; returns the bound address (useful with port 0).
pub fn serve_http(
    addr: SocketAddr,
    json: Published,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, HttpError> {
    let server = tiny_http::Server::http(addr).map_err(|e| HttpError {
        addr,
        reason: e.to_string(),
    })?;
    let bound = server.server_addr().to_ip().ok_or_else(|| HttpError {
        addr,
        reason: "not an IP listener".into(),
    })?;
    std::thread::Builder::new()
        .name("status-http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let (code, ctype, body) = route(request.method(), request.url(), &json, &metrics);
                let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes())
                    .expect("static header is valid");
                let response = tiny_http::Response::from_string(body)
                    .with_status_code(code)
                    .with_header(header);
                if let Err(e) = request.respond(response) {
                    tracing::debug!("status response failed: {e}");
                }
            }
        })
        .map_err(|e| HttpError {
            addr,
            reason: e.to_string(),
        })?;
    Ok(bound)
}

fn route(
    method: &tiny_http::Method,
    url: &str,
    json: &Published,
    metrics: &Metrics,
) -> (u16, &'static str, String) {
    if *method != tiny_http::Method::Get {
        return (405, "text/plain", "method not allowed\n".into());
    }
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    match path {
        "/status" => (
            200,
            "application/json",
            json.status
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        ),
        "/steps" => match steps_from(query) {
            Ok(from) => (200, "application/json", render_steps(&json.steps, from)),
            Err(reason) => (400, "text/plain", format!("{reason}\n")),
        },
        "/metrics" => (200, crate::metrics::CONTENT_TYPE, metrics.render()),
        _ => (404, "text/plain", "not found\n".into()),
    }
}

/// The `from` of `/steps?from=STEP` (0 without it): lets a poller fetch only what is new.
fn steps_from(query: &str) -> Result<u64, String> {
    let mut from = 0;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("from", v)) => {
                from = v
                    .parse()
                    .map_err(|_| format!("from={v}: not a step number"))?;
            }
            _ => return Err(format!("unknown query parameter {pair}")),
        }
    }
    Ok(from)
}

/// The records of steps `>= from`, as a JSON array.
fn render_steps(steps: &SharedSteps, from: u64) -> String {
    let steps = steps
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let tail: Vec<&StepRecord> = steps.iter().filter(|r| r.step >= from).collect();
    serde_json::to_string(&tail).unwrap_or_else(|e| {
        tracing::error!("cannot render steps: {e}");
        "[]".into()
    })
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

    #[test]
    fn steps_are_rendered_from_the_asked_step() {
        let json = Published::default();
        let record = |step| StepRecord {
            step,
            epoch: 1,
            sample_start: step * 16,
            samples: 16,
            loss: 1.5,
        };
        json.steps.write().unwrap().extend((0..5).map(record));
        let m = Metrics::default();
        let body = |url| route(&tiny_http::Method::Get, url, &json, &m).2;
        let all: Vec<serde_json::Value> = serde_json::from_str(&body("/steps")).unwrap();
        assert_eq!(all.len(), 5);
        let tail: Vec<serde_json::Value> = serde_json::from_str(&body("/steps?from=3")).unwrap();
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0]["step"], 3);
        assert_eq!(tail[1]["sample_start"], 64);
    }

    #[test]
    fn routes() {
        let json = Published::default();
        let m = Metrics::default();
        assert_eq!(route(&tiny_http::Method::Get, "/status", &json, &m).0, 200);
        assert_eq!(route(&tiny_http::Method::Get, "/metrics", &json, &m).0, 200);
        assert_eq!(route(&tiny_http::Method::Get, "/steps", &json, &m).0, 200);
        assert_eq!(route(&tiny_http::Method::Get, "/nope", &json, &m).0, 404);
        assert_eq!(
            route(&tiny_http::Method::Get, "/steps?from=x", &json, &m).0,
            400
        );
        assert_eq!(
            route(&tiny_http::Method::Get, "/steps?to=1", &json, &m).0,
            400
        );
        assert_eq!(route(&tiny_http::Method::Post, "/status", &json, &m).0, 405);
    }
}
