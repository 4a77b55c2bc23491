//! The trainer thread: follows the replicated plan, runs this node's stage step after step,
//! moves state at every reconfiguration, and checkpoints.
//!
//! The replicated state is the only input that decides anything, so every node takes the same
//! decision at the same step. The worker is a loop over its [`Phase`]; each round it hands the
//! state to the room whose job it is:
//! * [`super::gate`]: may this node train (the cluster's job is its own; the job's store was
//!   read before the first step)?
//! * [`super::reconfigure`]: a new epoch, or a slot this node does not run yet: publish the
//!   state this node holds, get the layers of the new slot, open the epoch's links; layers that
//!   nobody holds and no cut of the step has make this node propose a rollback to an older
//!   complete cut, or stop training when there is none;
//! * [`super::commit`]: step `k` runs when `k` is the next step of the replicated progress,
//!   and takes effect only once committed;
//! * [`super::checkpointing`]: every `checkpoint_every` steps and after a limited job's last
//!   one, in the background;
//! * [`super::finish`]: a limited job's end, where a node run as a training loop stops.

use std::time::{Duration, Instant};

use parcae_consensus::ControlState;
use parcae_consensus::state::{Plan, StageSlot};
use parcae_model::{PipelineModel, Stage};

use super::checkpointing::{CutRecorder, checkpoint_if_due};
use super::commit::train_step;
use super::context::{Board, Current, Io, WorkerSetup};
use super::error::TrainError;
use super::finish::{Finisher, JobEnd, job_end};
use super::gate::JobGate;
use super::reconfigure::{self, Entered, Measured, Move};
use super::waiter::block_on_timeout;
use crate::status::TrainingPhase;

/// Longest the loop sleeps before it looks at the replicated state again.
const IDLE_WAIT: Duration = Duration::from_millis(500);

/// Where the worker is in its life.
enum Phase<M: PipelineModel> {
    /// Not cleared to train yet ([`JobGate`]).
    Gated,
    /// Runs no slot: spare in the plan, or its last step or move failed (the next round
    /// enters the plan again). The stage is kept so its state can seed a later slot.
    Spare(Option<Box<Stage<M>>>),
    /// Runs a slot of a plan.
    Training(Box<Current<M>>),
    /// Stopped for want of a checkpoint at `(epoch, next step, history)`: not retried until
    /// one of them changes.
    Stopped((u64, u64, u64)),
}

impl<M: PipelineModel> Phase<M> {
    /// The stage this node has, leaving it in no slot.
    fn take_stage(&mut self) -> Option<Stage<M>> {
        match std::mem::replace(self, Phase::Spare(None)) {
            Phase::Training(current) => Some(current.stage),
            Phase::Spare(stage) => stage.map(|s| *s),
            Phase::Gated | Phase::Stopped(_) => None,
        }
    }

    /// The slot it runs.
    fn slot(&self) -> Option<StageSlot> {
        match self {
            Phase::Training(current) => Some(current.slot),
            _ => None,
        }
    }
}

/// The worker; [`Worker::run`] never returns while the node lives.
pub struct Worker<M: PipelineModel> {
    setup: WorkerSetup<M>,
    io: Io,
    board: Board,
    phase: Phase<M>,
    /// The plan this node entered last.
    last_plan: Option<Plan>,
    gate: JobGate,
    recorder: CutRecorder,
    measured: Measured,
    finisher: Finisher,
}

impl<M: PipelineModel> Worker<M> {
    /// A worker proposing through `io`, showing its state on `board` and stopping the node
    /// through `finisher` when the job is done.
    pub fn new(setup: WorkerSetup<M>, io: Io, board: Board, finisher: Finisher) -> Self {
        Self {
            setup,
            io,
            board,
            phase: Phase::Gated,
            last_plan: None,
            gate: JobGate::default(),
            recorder: CutRecorder::default(),
            measured: Measured::default(),
            finisher,
        }
    }

    /// Runs forever.
    pub fn run(mut self) {
        loop {
            let state = self.io.view.borrow_and_update().clone();
            match self.round(&state) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    let epoch = match &self.phase {
                        Phase::Training(current) => Some(current.epoch),
                        _ => None,
                    };
                    tracing::error!(?epoch, "training step abandoned: {e}");
                    self.abandon();
                }
            }
            let mut view = self.io.view.clone();
            let _ = block_on_timeout(&self.io.rt, IDLE_WAIT, view.changed());
        }
    }

    /// Drops the links of the current epoch; the stage is kept for the next plan.
    fn abandon(&mut self) {
        if let Phase::Training(_) = self.phase {
            let stage = self.phase.take_stage();
            self.phase = Phase::Spare(stage.map(Box::new));
        }
        self.board.set_phase(TrainingPhase::Waiting);
    }

    /// One round of work; `true` when something happened and the loop should go on at once.
    fn round(&mut self, state: &ControlState) -> Result<bool, TrainError> {
        if let Phase::Gated = self.phase {
            let (me, job) = (self.setup.me, &self.setup.job);
            if !self.gate.admits(state, me, job, &self.io, &mut self.board) {
                return Ok(false);
            }
            self.phase = Phase::Spare(None);
        }
        self.recorder
            .record_stored_cut(state, self.phase.slot(), &self.io);
        let end = job_end(state, self.setup.spec.max_steps);
        if end != JobEnd::Training {
            self.board.set_phase(TrainingPhase::Finished);
            self.finisher.observe(end, Instant::now());
            return Ok(false);
        }
        let Some(plan) = state.plan.as_ref() else {
            return Ok(false);
        };
        let next = state.progress.next_step();
        if let Phase::Stopped(at) = self.phase
            && at == (plan.epoch, next, state.progress.history)
        {
            let me = self.setup.me;
            self.gate
                .restore_given(state, me, (plan.epoch, next), &self.io);
            return Ok(false);
        }
        let slot = plan.assignment.get(&self.setup.me).copied();
        let in_epoch = match &self.phase {
            Phase::Training(c) => {
                c.epoch == plan.epoch && Some(c.slot) == slot && c.stage.step() == next
            }
            _ => false,
        };
        if !in_epoch {
            let spare_already = self.phase.slot().is_none()
                && slot.is_none()
                && self.last_plan.as_ref().map(|p| p.epoch) == Some(plan.epoch);
            if spare_already {
                return Ok(false);
            }
            self.enter(state, plan, slot, next)?;
            return Ok(true);
        }
        self.train(state, plan, next)?;
        Ok(true)
    }

    /// Enters `plan` at step `next` in `slot` (spare without one).
    fn enter(
        &mut self,
        state: &ControlState,
        plan: &Plan,
        slot: Option<StageSlot>,
        next: u64,
    ) -> Result<(), TrainError> {
        let started = Instant::now();
        self.board.set_phase(TrainingPhase::Migrating);
        let old = self.phase.take_stage();
        reconfigure::hold(&self.io, state, old.as_ref(), next)?;
        let previous = self.last_plan.replace(plan.clone());
        let Some(slot) = slot else {
            self.phase = Phase::Spare(old.map(Box::new));
            self.board.view.slot = None;
            self.board.set_phase(TrainingPhase::Spare);
            return Ok(());
        };
        let to = Move {
            state,
            plan,
            previous: previous.as_ref(),
            slot,
            next,
            started,
        };
        let entered = reconfigure::take_slot(
            &self.setup,
            &self.io,
            &mut self.measured,
            &mut self.board,
            to,
            old,
        )?;
        match entered {
            Entered::Slot(current) => {
                self.phase = Phase::Training(current);
                self.board.set_phase(TrainingPhase::Training);
                self.board.publish();
            }
            Entered::Missing(missing) => {
                let error = reconfigure::on_missing(&self.io, self.setup.me, plan, next, missing)?;
                tracing::error!("{error}");
                self.phase = Phase::Stopped((plan.epoch, next, state.progress.history));
                self.board.view.error = Some(error);
                self.board.set_phase(TrainingPhase::Stopped);
            }
        }
        Ok(())
    }

    /// Trains step `k` of `plan`, then checkpoints when due.
    fn train(&mut self, state: &ControlState, plan: &Plan, k: u64) -> Result<(), TrainError> {
        let Phase::Training(current) = &mut self.phase else {
            return Err(TrainError::Config("no stage".into()));
        };
        let (setup, io) = (&self.setup, &self.io);
        let times = train_step(setup, io, &mut self.board, current, state, (plan, k))?;
        checkpoint_if_due(setup, io, current, state, (plan, k))?;
        times.log(k);
        self.board.publish();
        Ok(())
    }
}
