//! The `Status` actor: what `/status` (JSON) and `/steps` (JSON: the committed steps applied
//! here) show.
//!
//! The documents are `parcae-api`'s, the one definition the testnet and the tests read too.
//! The control driver pushes a [`StatusSnapshot`] whenever something visible changes and a
//! [`StepRecord`] for every committed step; the trainer pushes its [`TrainingView`]. The `Status`
//! actor renders them to JSON once and publishes them in shared cells, which the HTTP server
//! ([`crate::http`]) only reads, so a slow or hostile HTTP client can never block an actor.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use parcae_consensus::{Command, ControlState};

pub use parcae_api::{
    ClockRefusalView, EmulatedView, EstimateView, FleetView, LatencySummary, MemberState,
    MemberView, MigrationKind, MigrationView, NoticeView, Placement, RoleView, StatusSnapshot,
    StepRecord, TrainingPhase, TrainingView,
};

use crate::job::JobSpec;
use crate::train::zones::step_groups;

/// Step records kept for `/steps`.
const MAX_STEP_RECORDS: usize = 100_000;

/// The rendered JSON, shared with the HTTP thread.
pub type SharedJson = Arc<RwLock<String>>;

/// The committed steps applied here, shared with the HTTP thread: rendered only when asked
/// for (rendering the whole history at every step costs quadratic time over a run).
pub type SharedSteps = Arc<RwLock<VecDeque<StepRecord>>>;

/// What the HTTP thread serves.
#[derive(Clone)]
pub struct Published {
    /// `/status`, rendered by the actor.
    pub status: SharedJson,
    /// `/steps`.
    pub steps: SharedSteps,
    /// `/readyz`: ready, or why not.
    pub ready: Arc<RwLock<Result<(), NotReady>>>,
}

impl Default for Published {
    fn default() -> Self {
        Self {
            status: SharedJson::default(),
            steps: SharedSteps::default(),
            ready: Arc::new(RwLock::new(Err(NotReady::NotAMember))),
        }
    }
}

/// Why a node is not ready (`/readyz` answers 503 with this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The replicated membership does not list this node as active or spare.
    #[error("not a member of a cluster yet")]
    NotAMember,
    /// No leader is known: nothing can be committed. How many voters this node reaches (itself
    /// included) says whether it is cut off in a minority or waits for an election.
    #[error(
        "no leader known: this node reaches {reachable} of {voters} voters (a quorum is {})",
        voters / 2 + 1
    )]
    NoLeader {
        /// Voters connected, this node included if it votes.
        reachable: usize,
        /// Voters of the replicated membership.
        voters: usize,
    },
    /// The node got a preemption notice and is draining.
    #[error("leaving (preemption notice)")]
    Leaving,
    /// The job reached its step limit.
    #[error("the job finished")]
    Finished,
    /// This node's job is not the cluster's (`/status` `training.error` names the setting).
    #[error("this node's job is not the cluster's")]
    OtherJob,
}

/// Whether a node is ready: a healthy member of a cluster with a leader, not leaving, and
/// training or ready to (a node that trains nothing is ready once it is a member).
pub fn readiness(status: &StatusSnapshot) -> Result<(), NotReady> {
    if status.leaving_deadline_unix_ms.is_some() {
        return Err(NotReady::Leaving);
    }
    if !status
        .member(&status.peer_id)
        .is_some_and(|m| m.status.is_healthy())
    {
        return Err(NotReady::NotAMember);
    }
    if status.leader.is_none() {
        let voters: Vec<&str> = status
            .members
            .iter()
            .filter(|m| m.voter)
            .map(|m| m.peer_id.as_str())
            .collect();
        let reachable = voters
            .iter()
            .filter(|v| **v == status.peer_id || status.connected_peers.iter().any(|c| c == *v))
            .count();
        return Err(NotReady::NoLeader {
            reachable,
            voters: voters.len(),
        });
    }
    match status.training.as_ref().map(|t| t.phase) {
        Some(TrainingPhase::Finished) => Err(NotReady::Finished),
        Some(TrainingPhase::Refused) => Err(NotReady::OtherJob),
        _ => Ok(()),
    }
}

/// The actor: renders snapshots into the shared cells.
pub struct Status {
    cells: Published,
    snapshot: Option<StatusSnapshot>,
    training: TrainingView,
    notice_provider: Option<String>,
}

/// Where the notice watcher ended up watching (see [`StatusSnapshot::notice_provider`]).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct NoticeWatch(pub String);

impl Status {
    /// An actor publishing into `cells`.
    pub fn new(cells: Published) -> Self {
        Self {
            cells,
            snapshot: None,
            training: TrainingView::default(),
            notice_provider: None,
        }
    }

    fn render_status(&self) {
        let Some(raft) = &self.snapshot else { return };
        let mut full = StatusSnapshot {
            training: Some(self.training.clone()),
            migrations: self.training.migrations.clone(),
            notice_provider: self.notice_provider.clone(),
            ..raft.clone()
        };
        let ready = readiness(&full);
        full.not_ready = ready.err().map(|e| e.to_string());
        *self
            .cells
            .ready
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = ready;
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
        let fleet = self.training.fleet.take();
        self.training = view;
        if self.training.estimates.is_empty() {
            self.training.estimates = estimates;
            self.training.fleet = fleet;
        }
        self.render_status();
    }
}

/// The planner's latest estimates, and the zones they were laid over.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Estimates(pub Vec<EstimateView>, pub Option<FleetView>);

impl Handler<Estimates> for Status {
    type Result = ();

    fn handle(&mut self, e: Estimates, _: &mut Context<Self>) {
        self.training.estimates = e.0;
        self.training.fleet = e.1;
        self.render_status();
    }
}

impl Handler<NoticeWatch> for Status {
    type Result = ();

    fn handle(&mut self, watch: NoticeWatch, _: &mut Context<Self>) {
        self.notice_provider = Some(watch.0);
        self.render_status();
    }
}

/// The cluster rolled back: the committed steps from `next_step` on belong to an abandoned
/// history and leave `/steps` (they are committed again in the new one).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StepsRewound {
    /// The step the cluster trains next.
    pub next_step: u64,
}

impl Handler<StepsRewound> for Status {
    type Result = ();

    fn handle(&mut self, rewound: StepsRewound, _: &mut Context<Self>) {
        self.cells
            .steps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|r| r.step < rewound.next_step);
    }
}

/// A snapshot replaced the control state: the steps committed since the last entry this node
/// applied were never applied here one by one. The records it holds leave `/steps`, which stays
/// one unbroken run of steps (readers take the longest run for the committed history; one with
/// a hole would make the steps in it look lost).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StepsSkipped;

impl Handler<StepsSkipped> for Status {
    type Result = ();

    fn handle(&mut self, _: StepsSkipped, _: &mut Context<Self>) {
        self.cells
            .steps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
    }
}

/// The record of a committed step as `GET /steps` lists it (`None` for other commands), in
/// the state `state` it was applied to (its history, and under DiLoCo its groups).
pub fn step_record(command: &Command, state: &ControlState) -> Option<StepRecord> {
    let Command::StepCommitted {
        step,
        epoch,
        sample_start,
        samples,
        loss,
        validation_loss,
        outer_digests,
        ..
    } = command
    else {
        return None;
    };
    // The groups come from the plan of the step's epoch, which is the plan in force.
    let groups = state
        .job
        .as_ref()
        .and_then(|job| JobSpec::sync_of(job).ok())
        .map(|sync| step_groups(state, sync, *epoch, (*sample_start, *samples)))
        .unwrap_or_default();
    Some(StepRecord {
        step: *step,
        epoch: *epoch,
        sample_start: *sample_start,
        samples: *samples,
        loss: *loss,
        validation_loss: *validation_loss,
        history: state.progress.history,
        outer_digests: outer_digests.iter().map(hex::encode).collect(),
        partition: match groups.is_empty() {
            true => Vec::new(),
            false => state
                .plan
                .as_ref()
                .map(|p| p.partition.clone())
                .unwrap_or_default(),
        },
        groups,
    })
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

    fn member(status: MemberState) -> StatusSnapshot {
        StatusSnapshot {
            peer_id: "me".into(),
            leader: Some("other".into()),
            members: vec![MemberView {
                peer_id: "me".into(),
                voter: true,
                status,
                deadline_unix_ms: None,
                placement: Default::default(),
            }],
            ..StatusSnapshot::default()
        }
    }

    #[test]
    fn ready_means_a_healthy_member_with_a_leader_that_is_not_leaving_or_done() {
        assert_eq!(readiness(&member(MemberState::Active)), Ok(()));
        assert_eq!(readiness(&member(MemberState::Spare)), Ok(()));
        assert_eq!(
            readiness(&StatusSnapshot::initial("me".into())),
            Err(NotReady::NotAMember)
        );
        assert_eq!(
            readiness(&member(MemberState::Lost)),
            Err(NotReady::NotAMember)
        );
        let mut cut_off = StatusSnapshot {
            leader: None,
            connected_peers: vec!["b".into(), "spare".into()],
            ..member(MemberState::Active)
        };
        for (peer, voter) in [
            ("b", true),
            ("c", true),
            ("d", true),
            ("e", true),
            ("spare", false),
        ] {
            cut_off.members.push(MemberView {
                peer_id: peer.into(),
                voter,
                status: MemberState::Active,
                deadline_unix_ms: None,
                placement: Default::default(),
            });
        }
        let why = readiness(&cut_off).unwrap_err();
        assert_eq!(
            why,
            NotReady::NoLeader {
                reachable: 2,
                voters: 5
            }
        );
        assert_eq!(
            why.to_string(),
            "no leader known: this node reaches 2 of 5 voters (a quorum is 3)"
        );
        let leaving = StatusSnapshot {
            leaving_deadline_unix_ms: Some(1),
            ..member(MemberState::Active)
        };
        assert_eq!(readiness(&leaving), Err(NotReady::Leaving));
        let done = StatusSnapshot {
            training: Some(TrainingView {
                phase: TrainingPhase::Finished,
                ..TrainingView::default()
            }),
            ..member(MemberState::Active)
        };
        assert_eq!(readiness(&done), Err(NotReady::Finished));
        let training = StatusSnapshot {
            training: Some(TrainingView {
                phase: TrainingPhase::Training,
                ..TrainingView::default()
            }),
            ..member(MemberState::Active)
        };
        assert_eq!(readiness(&training), Ok(()));
    }
}
