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

pub use parcae_api::{
    EmulatedView, EstimateView, LatencySummary, MemberState, MemberView, MigrationKind,
    MigrationView, NoticeView, RoleView, StatusSnapshot, StepRecord, TrainingPhase, TrainingView,
};

/// Step records kept for `/steps`.
const MAX_STEP_RECORDS: usize = 100_000;

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
        let Some(raft) = &self.snapshot else { return };
        let full = StatusSnapshot {
            training: Some(self.training.clone()),
            migrations: self.training.migrations.clone(),
            ..raft.clone()
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
