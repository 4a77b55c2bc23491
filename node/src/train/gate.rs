//! Whether this node may train, and what the job's store says about it: the cluster must train
//! this node's job (this node defines it when the cluster has none; it is refused, naming the
//! setting, when the cluster's differs), and before the first step the job's store must have
//! been read (a new cluster resumes from its newest complete checkpoint instead of starting
//! over). While training is stopped for want of a checkpoint, one given in the store later
//! resumes it.

use std::time::{Duration, Instant};

use parcae_consensus::state::Job;
use parcae_consensus::{Command, ControlState, NodeId};

use super::context::{Board, Io};
use super::waiter::block_on_timeout;
use crate::status::TrainingPhase;
use crate::store::StoreError;

/// Time between proposals of this node's job while the cluster has none (and between reads
/// of the job's store before the first step).
const JOB_RETRY: Duration = Duration::from_secs(2);

/// Longest a read of the job's store may take.
const STORE_READ_LIMIT: Duration = Duration::from_secs(60);

/// Time between reads of the job's store while training is stopped for want of a checkpoint.
const STOPPED_STORE_POLL: Duration = Duration::from_secs(5);

/// The gate and what it remembers.
#[derive(Debug, Default)]
pub struct JobGate {
    /// When this node last proposed its job as the cluster's.
    proposed: Option<Instant>,
    /// The job's store was read before the first step and holds no checkpoint of the job.
    store_read: bool,
    /// When this node last read the store or proposed adopting its checkpoint.
    store_tried: Option<Instant>,
}

impl JobGate {
    /// Whether this node may train now: the cluster trains its job (when the cluster has no
    /// job yet, this node proposes its own and waits; when the cluster's differs, it refuses,
    /// naming the setting), and the cluster committed steps already or the store holds nothing
    /// to resume from.
    pub fn admits(
        &mut self,
        state: &ControlState,
        me: NodeId,
        job: &Job,
        io: &Io,
        board: &mut Board,
    ) -> bool {
        let Some(defined) = &state.job else {
            self.propose_job(state, me, job, io);
            return false;
        };
        if let Some(difference) = defined.difference(job) {
            refuse(&difference, board);
            return false;
        }
        self.store_read_before_first_step(state, me, io, board)
    }

    /// Proposes this node's job as the cluster's (the first definition that commits stands),
    /// once it is a member, at most every [`JOB_RETRY`].
    fn propose_job(&mut self, state: &ControlState, me: NodeId, job: &Job, io: &Io) {
        if state.members.contains_key(&me) && self.proposed.is_none_or(|t| t.elapsed() > JOB_RETRY)
        {
            io.propose(Command::DefineJob { job: job.clone() });
            self.proposed = Some(Instant::now());
        }
    }

    /// Whether this node may train: the cluster committed steps already, or the job's store
    /// was read before the first step and holds no checkpoint of the job. When it holds one
    /// (every node of the cluster was lost, and this is a new cluster), this node proposes to
    /// adopt it, so training resumes from it instead of starting over. A store that cannot be
    /// read keeps training from starting (the error is in `/status`), since starting afresh
    /// would give up the job's progress.
    fn store_read_before_first_step(
        &mut self,
        state: &ControlState,
        me: NodeId,
        io: &Io,
        board: &mut Board,
    ) -> bool {
        if self.store_read || state.progress.last_committed_step.is_some() {
            return true;
        }
        let Some(store) = io.ep.store.clone() else {
            return true;
        };
        if !state.members.contains_key(&me)
            || self.store_tried.is_some_and(|t| t.elapsed() < JOB_RETRY)
        {
            return false;
        }
        self.store_tried = Some(Instant::now());
        match read_store(io, store.newest_cut()) {
            Ok(None) => {
                self.store_read = true;
                true
            }
            Ok(Some(cut)) => {
                tracing::warn!(
                    step = cut.end.step,
                    history = cut.history,
                    "resuming the job from the newest complete checkpoint in its store"
                );
                io.propose(Command::AdoptCut { cut });
                false
            }
            Err(error) => {
                tracing::error!("{error}");
                board.view.error = Some(error);
                board.publish();
                false
            }
        }
    }

    /// While training is stopped: a complete cut the cluster does not hold, given in the job's
    /// store (`parcae-node run --restore URL` copies one there), is proposed to resume from
    /// (`Command::RestoreCut`). Cuts the cluster holds failed already, so they are not retried.
    pub fn restore_given(
        &mut self,
        state: &ControlState,
        me: NodeId,
        (epoch, next): (u64, u64),
        io: &Io,
    ) {
        let Some(store) = io.ep.store.clone() else {
            return;
        };
        if self
            .store_tried
            .is_some_and(|t| t.elapsed() < STOPPED_STORE_POLL)
        {
            return;
        }
        self.store_tried = Some(Instant::now());
        let held: Vec<(u64, u64)> = state
            .checkpoints
            .values()
            .map(|c| (c.history, c.end.step))
            .collect();
        match read_store(io, store.newest_cut_not_held(next, &held)) {
            Ok(Some(cut)) => {
                tracing::warn!(
                    step = cut.end.step,
                    history = cut.history,
                    "training resumes from a checkpoint given in the job's store"
                );
                io.propose(Command::RestoreCut {
                    node: me,
                    epoch,
                    at_step: next,
                    cut,
                });
            }
            Ok(None) => {}
            Err(error) => tracing::warn!("{error}"),
        }
    }
}

/// Shows that this node does not train because the cluster's job differs from its own by
/// `difference` (logged once).
fn refuse(difference: &str, board: &mut Board) {
    if board.view.error.is_none() {
        tracing::error!("this node's job is not the cluster's, so it does not train: {difference}");
        board.view.error = Some(format!("the cluster trains another job: {difference}"));
    }
    board.set_phase(TrainingPhase::Refused);
}

/// A read of the job's store, bounded by [`STORE_READ_LIMIT`]; a failure, or the limit
/// reached, described for the log and `/status`.
fn read_store<T>(
    io: &Io,
    read: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, String> {
    match block_on_timeout(&io.rt, STORE_READ_LIMIT, read) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("the job's checkpoint store cannot be read: {e}")),
        Err(_) => Err(format!(
            "the job's checkpoint store did not answer in {STORE_READ_LIMIT:?}"
        )),
    }
}
