//! Commit, then apply: step `k` runs when it is the next step of the replicated progress; its
//! report is proposed (`StepCommitted`), and its optimizer update is applied only once the step
//! has committed, or dropped if a new plan replaced the epoch first. A step therefore takes
//! effect on every surviving replica or on none, and the replicated sample cursor trains every
//! sample exactly once. (A DiLoCo job's last step applies its update before the commit, to
//! close the round after it; its state from before the step is put back if it does not
//! commit.)

use std::time::{Duration, Instant};

use parcae_api::OuterView;
use parcae_consensus::state::{OptimizerScalars, Plan};
use parcae_consensus::{Command, ControlState};
use parcae_model::PipelineModel;

use super::context::{Board, Current, Io, WorkerSetup};
use super::error::TrainError;
use super::step::{self, StepIo, StepSpec};
use super::waiter::block_on_timeout;
use crate::retry::Retry;

/// First delay before a step report is proposed again (a lost proposal, a leader change).
const REPORT_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest delay between proposals of one step report.
const REPORT_RETRY_MAX: Duration = Duration::from_secs(8);
/// Longest wait for a change of the replicated state before the commit is looked for again.
const COMMIT_WAIT: Duration = Duration::from_millis(200);

/// When the parts of a step ended.
pub struct StepTimes {
    started: Instant,
    ran: Duration,
    committed: Duration,
    stepped: Duration,
}

impl StepTimes {
    /// Logs the parts of step `k` (what followed the optimizer update counted as checkpoint).
    pub fn log(&self, k: u64) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            step = k,
            run_ms = ms(self.ran),
            commit_wait_ms = ms(self.committed - self.ran),
            optimizer_ms = ms(self.stepped - self.committed),
            checkpoint_ms = ms(self.started.elapsed() - self.stepped),
            "step done"
        );
    }
}

/// How waiting for a step's commit ended.
enum Outcome {
    Committed,
    Superseded,
}

/// Runs step `k` of `plan` on `current`'s stage, proposes its report, and applies its update
/// once it committed (paced by the device); `Err(Superseded)` when a new plan came first.
pub fn train_step<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    io: &Io,
    board: &mut Board,
    current: &mut Current<M>,
    state: &ControlState,
    (plan, k): (&Plan, u64),
) -> Result<StepTimes, TrainError> {
    let sync = (setup.spec.sync, setup.spec.outer.wire);
    let spec = StepSpec {
        epoch: plan.epoch,
        step: k,
        slot: current.slot,
        data_parallel: plan.data_parallel,
        stages: plan.pipeline_stages,
        sample_start: state.progress.sample_cursor,
        global_batch: setup.spec.global_batch,
        micro_batch: setup.spec.micro_batch,
        batch_shares: plan.batch_shares.clone(),
        digest: current.digest,
        crossings: super::zones::crossings(state, plan, current.slot, sync),
        step_replicas: super::zones::step_replicas(state, plan, current.slot, setup.spec.sync),
        sync: setup.spec.sync,
        outer: setup.spec.outer,
        max_steps: setup.spec.max_steps,
    };
    let started = Instant::now();
    let mut step_io = StepIo {
        links: &mut current.links,
        rt: &io.rt,
        data: &setup.data,
        timeout: setup.peer_timeout,
        view: io.view.clone(),
        pacing: setup.pacing.as_ref(),
        metrics: &setup.metrics,
    };
    let result = step::run(&mut step_io, &mut current.stage, &spec)?;
    let ran = started.elapsed();
    let report = result.report.map(|r| Command::StepCommitted {
        step: k,
        epoch: plan.epoch,
        sample_start: spec.sample_start,
        samples: u64::from(spec.global_batch),
        loss: r.loss,
        validation_loss: r.validation_loss,
        stage_digests: r.stage_digests,
        outer_digests: r.outer_digests,
        optimizer: OptimizerScalars {
            step_count: k + 1,
            schedule_position: k + 1,
        },
    });
    if let Outcome::Superseded = await_commit(io, k, plan.epoch, report) {
        current.stage.clear_grads();
        if let Some(before) = result.before_round {
            let layers = current.stage.layer_range();
            current.stage.import_state(&before, layers)?;
        }
        return Err(TrainError::Superseded(k));
    }
    if let Some(ended) = result.ended {
        setup.pacing.committed(ended);
    }
    let committed = started.elapsed();
    if !result.applied {
        current.stage.optimizer_step(result.global_sq_norm)?;
    }
    setup.pacing.optimizer(
        current.stage.layer_range(),
        setup.spec.micro_batch,
        started.elapsed() - committed,
    )?;
    if let Some(view) = setup.pacing.report(&setup.metrics) {
        board.view.emulated = Some(view);
    }
    current.digest = None;
    if result.before_round.is_some() {
        let layers = current.stage.layer_range();
        // A job's closing round follows its last step: it closed before the step after it.
        board.view.outer = current.stage.outer_digest().map(|d| OuterView {
            step: k + u64::from(result.applied),
            layers: [layers.start as u32, layers.end as u32],
            digest: hex::encode(d),
            stage: current.slot.stage,
        });
    }
    let stepped = started.elapsed();
    board.view.last_step_ms = stepped.as_secs_f64() * 1e3;
    board.view.allreduce_bytes = setup.metrics.allreduce_bytes_total.get();
    board.view.allreduce_cross_zone_bytes = setup.metrics.allreduce_cross_zone_bytes_total.get();
    Ok(StepTimes {
        started,
        ran,
        committed,
        stepped,
    })
}

/// Waits until step `k` committed or a new plan replaced the epoch, re-proposing the report
/// with backoff (a proposal can be lost in a leader change).
fn await_commit(io: &Io, k: u64, epoch: u64, report: Option<Command>) -> Outcome {
    let mut retry = Retry::new(REPORT_RETRY_MIN, REPORT_RETRY_MAX);
    let mut view = io.view.clone();
    loop {
        let state = view.borrow_and_update().clone();
        if state.progress.last_committed_step.is_some_and(|s| s >= k) {
            return Outcome::Committed;
        }
        if state.plan.as_ref().map(|p| p.epoch) != Some(epoch) {
            return Outcome::Superseded;
        }
        if let Some(cmd) = &report
            && retry.due(Instant::now())
        {
            io.propose(cmd.clone());
            retry.attempted(Instant::now());
        }
        let _ = block_on_timeout(&io.rt, COMMIT_WAIT, view.changed());
    }
}
