//! The trainer thread: follows the replicated plan, runs this node's stage step after step,
//! moves state at every reconfiguration, and checkpoints.
//!
//! The replicated state is the only input that decides anything, so every node takes the same
//! decision at the same step:
//! * the active plan says who runs which slot; a new epoch means: publish the state this node
//!   holds (so others can fetch it), get the layers of the new slot (own, live holders, the
//!   checkpoint cut of the step), open the epoch's links; layers that nobody holds and no cut
//!   of the step has make this node propose a rollback to an older complete cut (every node
//!   then restores its stage from it), or stop training when there is none;
//! * step `k` runs when `k` is the next step of the replicated progress; its optimizer update is
//!   applied only once `StepCommitted(k)` has committed, and dropped if a new plan replaced the
//!   epoch first. A step therefore takes effect on every surviving replica or on none, and the
//!   replicated sample cursor trains every sample exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parcae_consensus::state::{Digest32, Job, LayerCost, OptimizerScalars, Plan, StageSlot};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::{PipelineModel, Stage, StageConfig, WeightSource};
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::spec::RestartKind;
use sha2::{Digest, Sha256};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::TrainError;
use super::handoff::{self, Acquired};
use super::step::{self, DataSource, StepIo, StepSpec, Waiter, block_on_timeout};
use crate::dataplane::links::{self, EpochLinks};
use crate::dataplane::server::{Endpoint, Held};
use crate::emulate::Accelerator;
use crate::metrics::Metrics;
use crate::retry::Retry;
use crate::status::{MigrationKind, MigrationView, TrainingPhase, TrainingView};

/// First delay before a step report is proposed again (a lost proposal, a leader change).
const REPORT_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest delay between proposals of one step report.
const REPORT_RETRY_MAX: Duration = Duration::from_secs(8);

/// Time between proposals of this node's job while the cluster has none (and between reads
/// of the job's store before the first step).
const JOB_RETRY: Duration = Duration::from_secs(2);

/// Longest a read of the job's store before the first step may take.
const STORE_READ_LIMIT: Duration = Duration::from_secs(60);

/// Time between reads of the job's store while training is stopped for want of a checkpoint.
const STOPPED_STORE_POLL: Duration = Duration::from_secs(5);

/// Longest a reconfiguration may take before it is retried (state of the `small` preset moves
/// in well under a second at the measured rates; this bounds a stuck peer).
const SWITCH_LIMIT: Duration = Duration::from_secs(600);

/// How a node's trainer is set up (the same on every node except `me`).
pub struct WorkerSetup<M: PipelineModel> {
    /// This node.
    pub me: NodeId,
    /// The model.
    pub model: Arc<M>,
    /// Training data.
    pub data: DataSource,
    /// Seed of the initial weights.
    pub seed: u64,
    /// Weights that replace the seeded ones of any layer that starts afresh.
    pub initial_weights: Option<Arc<dyn WeightSource>>,
    /// Samples per step.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Stop after this many steps (0: never).
    pub max_steps: u64,
    /// Checkpoint every this many steps (0: never).
    pub checkpoint_every: u64,
    /// Optimizer and wire settings.
    pub stage_config: StageConfig,
    /// Burn device.
    pub device: burn::tensor::Device,
    /// Time a neighbour may take.
    pub peer_timeout: Duration,
    /// Move state by restarting (drop everything, fetch the whole stage) on every change.
    pub restart_on_change: bool,
    /// Per-layer costs this node measured at start (re-sent with measured transfer rates).
    pub layer_costs: Vec<(u32, LayerCost)>,
    /// The emulated accelerator the stage's work is paced to, if any.
    pub accelerator: Option<Accelerator>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The job this node trains (the cluster's must be the same).
    pub job: Job,
}

/// Where this node is.
struct Current<M: PipelineModel> {
    epoch: u64,
    slot: StageSlot,
    stage: Stage<M>,
    links: EpochLinks,
    /// Digest of the stage state entering the next step, when it was just checkpointed
    /// (pipeline 0 only).
    digest: Option<Digest32>,
}

/// The worker; [`Worker::run`] never returns while the node lives.
pub struct Worker<M: PipelineModel> {
    setup: WorkerSetup<M>,
    rt: Runtime,
    ep: Arc<Endpoint>,
    view: watch::Receiver<Arc<ControlState>>,
    submit: Arc<dyn Fn(Command) + Send + Sync>,
    publish: Box<dyn Fn(TrainingView) + Send>,
    current: Option<Current<M>>,
    /// The stage of a node that is spare now (kept so its state can seed a later slot).
    idle_stage: Option<Stage<M>>,
    last_plan: Option<Plan>,
    status: TrainingView,
    /// When this node last proposed its job as the cluster's.
    job_proposed: Option<Instant>,
    /// The plan epoch, step and history at which training stopped for want of a checkpoint
    /// (not retried until one of them changes).
    stopped_at: Option<(u64, u64, u64)>,
    /// The job's store was read before the first step and holds no checkpoint of the job.
    store_read: bool,
    /// When this node last read the store or proposed adopting its checkpoint.
    store_tried: Option<Instant>,
    /// `(history, step)` of the newest cut whose manifest this node wrote to the store.
    manifest_written: Option<(u64, u64)>,
    /// What this node measured of its reconfigurations, re-sent with every cost report.
    measured: Measured,
}

/// The latest measurements of this node's reconfigurations.
#[derive(Default)]
struct Measured {
    /// Rate of the latest state fetch, per source.
    bandwidth: Vec<(NodeId, f64)>,
    /// What the latest priced reconfiguration took beyond its state fetch, seconds.
    reconfiguration_s: Option<f64>,
}

/// Whether the planner's model charges a reconfiguration of this kind its fixed price (a
/// restart-like rebuild); an intra-stage move only re-forms pipelines.
fn priced(kind: MigrationKind) -> bool {
    matches!(
        kind,
        MigrationKind::Inter | MigrationKind::Repartition | MigrationKind::Restart
    )
}

enum Outcome {
    Committed,
    Superseded,
}

impl<M: PipelineModel> Worker<M> {
    /// A worker. `submit` proposes a command through raft (forwarded to the leader); `publish`
    /// shows the trainer's state in `/status`.
    pub fn new(
        setup: WorkerSetup<M>,
        rt: Runtime,
        ep: Arc<Endpoint>,
        submit: Arc<dyn Fn(Command) + Send + Sync>,
        publish: Box<dyn Fn(TrainingView) + Send>,
    ) -> Self {
        Self {
            view: ep.view.clone(),
            setup,
            rt,
            ep,
            submit,
            publish,
            current: None,
            idle_stage: None,
            last_plan: None,
            status: TrainingView::default(),
            job_proposed: None,
            stopped_at: None,
            store_read: false,
            store_tried: None,
            manifest_written: None,
            measured: Measured::default(),
        }
    }

    /// Runs forever.
    pub fn run(mut self) {
        loop {
            let state = self.view.borrow_and_update().clone();
            match self.tick(&state) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(epoch = ?self.current.as_ref().map(|c| c.epoch), "training step abandoned: {e}");
                    self.abandon();
                }
            }
            let mut view = self.view.clone();
            let _ = block_on_timeout(&self.rt, Duration::from_millis(500), view.changed());
        }
    }

    fn set_phase(&mut self, phase: TrainingPhase) {
        if self.status.phase != phase {
            self.status.phase = phase;
            (self.publish)(self.status.clone());
        }
    }

    /// Drops the links of the current epoch; the stage is kept for the next plan.
    fn abandon(&mut self) {
        if let Some(c) = self.current.take() {
            self.idle_stage = Some(c.stage);
        }
        self.set_phase(TrainingPhase::Waiting);
    }

    /// Whether the cluster trains this node's job: defines it when no job is defined yet
    /// (the first definition that commits stands), and refuses to train, naming the setting,
    /// when the cluster's differs.
    fn same_job(&mut self, state: &ControlState) -> bool {
        let Some(defined) = &state.job else {
            if state.members.contains_key(&self.setup.me)
                && self.job_proposed.is_none_or(|t| t.elapsed() > JOB_RETRY)
            {
                (self.submit)(Command::DefineJob {
                    job: self.setup.job.clone(),
                });
                self.job_proposed = Some(Instant::now());
            }
            return false;
        };
        let Some(difference) = defined.difference(&self.setup.job) else {
            return true;
        };
        if self.status.error.is_none() {
            tracing::error!(
                "this node's job is not the cluster's, so it does not train: {difference}"
            );
            self.status.error = Some(format!("the cluster trains another job: {difference}"));
        }
        self.set_phase(TrainingPhase::Refused);
        false
    }

    /// Whether this node may train: the cluster committed steps already, or the job's store
    /// was read before the first step and holds no checkpoint of the job. When it holds one
    /// (every node of the cluster was lost, and this is a new cluster), this node proposes to
    /// adopt it, so training resumes from it instead of starting over. A store that cannot be
    /// read keeps training from starting (the error is in `/status`), since starting afresh
    /// would give up the job's progress.
    fn resumed_from_store(&mut self, state: &ControlState) -> bool {
        if self.store_read || state.progress.last_committed_step.is_some() {
            return true;
        }
        let Some(store) = self.ep.store.clone() else {
            return true;
        };
        if !state.members.contains_key(&self.setup.me)
            || self.store_tried.is_some_and(|t| t.elapsed() < JOB_RETRY)
        {
            return false;
        }
        self.store_tried = Some(Instant::now());
        match self.read_store(store.newest_cut()) {
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
                (self.submit)(Command::AdoptCut { cut });
                false
            }
            Err(error) => {
                tracing::error!("{error}");
                self.status.error = Some(error);
                (self.publish)(self.status.clone());
                false
            }
        }
    }

    /// A read of the job's store, bounded by [`STORE_READ_LIMIT`]; a failure, or the limit
    /// reached, described for the log and `/status`.
    fn read_store<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, crate::store::StoreError>>,
    ) -> Result<T, String> {
        match block_on_timeout(&self.rt, STORE_READ_LIMIT, read) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(format!("the job's checkpoint store cannot be read: {e}")),
            Err(_) => Err(format!(
                "the job's checkpoint store did not answer in {STORE_READ_LIMIT:?}"
            )),
        }
    }

    /// While training is stopped: a complete cut the cluster does not hold, given in the job's
    /// store (`parcae-node run --restore URL` copies one there), is proposed to resume from
    /// (`Command::RestoreCut`). Cuts the cluster holds failed already, so they are not retried.
    fn restore_given(&mut self, state: &ControlState, epoch: u64, next: u64) {
        let Some(store) = self.ep.store.clone() else {
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
        match self.read_store(store.newest_cut_not_held(next, &held)) {
            Ok(Some(cut)) => {
                tracing::warn!(
                    step = cut.end.step,
                    history = cut.history,
                    "training resumes from a checkpoint given in the job's store"
                );
                (self.submit)(Command::RestoreCut {
                    node: self.setup.me,
                    epoch,
                    at_step: next,
                    cut,
                });
            }
            Ok(None) => {}
            Err(error) => tracing::warn!("{error}"),
        }
    }

    /// The first replica of the first stage writes the manifest of every complete cut whose
    /// parts are all stored, so a new cluster can resume from it.
    fn record_stored_cut(&mut self, state: &ControlState) {
        let first = StageSlot {
            pipeline: 0,
            stage: 0,
        };
        let Some(store) = self.ep.store.clone() else {
            return;
        };
        if self.current.as_ref().is_none_or(|c| c.slot != first) {
            return;
        }
        let Some(cut) = state.checkpoints.values().rev().find(|c| c.is_stored()) else {
            return;
        };
        let key = (cut.history, cut.end.step);
        if self.manifest_written.is_some_and(|w| w >= key) {
            return;
        }
        self.manifest_written = Some(key);
        let cut = cut.clone();
        self.rt.spawn(async move {
            match store.put_cut(&cut).await {
                Ok(()) => tracing::info!(
                    step = cut.end.step,
                    "checkpoint recorded in the job's store"
                ),
                Err(e) => {
                    tracing::warn!(step = cut.end.step, "checkpoint manifest not stored: {e}")
                }
            }
        });
    }

    /// One round of work; `true` when something happened and the loop should go on at once.
    fn tick(&mut self, state: &ControlState) -> Result<bool, TrainError> {
        if !self.same_job(state) || !self.resumed_from_store(state) {
            return Ok(false);
        }
        self.record_stored_cut(state);
        let Some(plan) = state.plan.as_ref() else {
            return Ok(false);
        };
        let next = state.progress.next_step();
        if self.stopped_at == Some((plan.epoch, next, state.progress.history)) {
            self.restore_given(state, plan.epoch, next);
            return Ok(false);
        }
        let slot = plan.assignment.get(&self.setup.me).copied();
        let in_epoch = self.current.as_ref().is_some_and(|c| {
            c.epoch == plan.epoch && Some(c.slot) == slot && c.stage.step() == next
        });
        if !in_epoch {
            if self.last_plan.as_ref().map(|p| p.epoch) == Some(plan.epoch)
                && self.current.is_none()
                && slot.is_none()
            {
                return Ok(false);
            }
            self.switch(state, plan, slot, next)?;
            return Ok(true);
        }
        if self.setup.max_steps > 0 && next >= self.setup.max_steps {
            self.set_phase(TrainingPhase::Finished);
            return Ok(false);
        }
        self.train_step(state, plan, next)?;
        Ok(true)
    }

    /// Enters the plan: publish what this node holds, get the new slot's layers, open links.
    fn switch(
        &mut self,
        state: &ControlState,
        plan: &Plan,
        slot: Option<StageSlot>,
        next: u64,
    ) -> Result<(), TrainError> {
        let started = Instant::now();
        self.set_phase(TrainingPhase::Migrating);
        let old = self
            .current
            .take()
            .map(|c| c.stage)
            .or(self.idle_stage.take());
        if let Some(stage) = &old
            && stage.step() == next
        {
            let range = stage.layer_range();
            let layers = range
                .clone()
                .map(|l| stage.export_state(l..l + 1))
                .collect::<Result<Vec<_>, _>>()?;
            self.ep.hold(Some(Held {
                history: state.progress.history,
                step: next,
                start: range.start,
                layers,
            }));
        }
        let previous = self.last_plan.replace(plan.clone());
        let Some(slot) = slot else {
            self.idle_stage = old;
            self.status.slot = None;
            self.set_phase(TrainingPhase::Spare);
            return Ok(());
        };
        let range = plan
            .stage_layers(slot.stage)
            .map(|r| r.start as usize..r.end as usize)
            .ok_or_else(|| TrainError::Config(format!("plan has no stage {}", slot.stage)))?;
        // Each part has its own timeouts; a newer plan ends the switch at once.
        let superseding = Waiter::new(&self.rt, SWITCH_LIMIT, self.view.clone(), plan.epoch, next);
        let keep = !self.setup.restart_on_change
            && old
                .as_ref()
                .is_some_and(|s| s.layer_range() == range && s.step() == next);
        let (stage, acquired) = if keep {
            (old.expect("checked above"), None)
        } else {
            let acquired = if next == 0 {
                None
            } else {
                let got = superseding.wait(
                    "state handoff",
                    handoff::acquire(
                        &self.ep,
                        state,
                        self.setup.me,
                        range.clone(),
                        next,
                        slot.pipeline as usize,
                    ),
                )?;
                match got {
                    Ok(acquired) => Some(acquired),
                    Err(missing) => return self.missing_layers(state, plan, next, missing),
                }
            };
            (
                self.build_stage(range.clone(), next, acquired.as_ref())?,
                acquired,
            )
        };
        let links = superseding.wait("links", links::connect(&self.ep, state, plan, slot))?;
        let kind = migration_kind(
            previous.as_ref(),
            plan,
            acquired.as_ref(),
            self.setup.restart_on_change,
        );
        if let Some(device) = &self.setup.accelerator
            && paced_on_the_device(previous.as_ref(), plan, next)
        {
            let to = ParallelConfig::new(plan.data_parallel, plan.pipeline_stages);
            let joined = restart_kind(previous.as_ref(), plan);
            let restart = kind == MigrationKind::Restart;
            let (fetched, restored): (Vec<_>, Vec<_>) =
                acquired.as_ref().map_or_else(Default::default, |a| {
                    (
                        a.fetched.iter().map(|f| f.layers.clone()).collect(),
                        a.restored.iter().map(|p| p.layers.clone()).collect(),
                    )
                });
            let emulated = if self.setup.restart_on_change {
                device.emulation().reactive_restart(to, joined)?
            } else {
                device
                    .emulation()
                    .switch(to, joined, restart, &fetched, &restored)?
            };
            device
                .pacer()
                .after_reconfiguration(started.elapsed(), emulated);
        }
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            epoch = plan.epoch,
            ?slot,
            %kind,
            secs,
            received_bytes = acquired.as_ref().map_or(0, |a| a.received_bytes),
            "reconfiguration done"
        );
        let fetched = acquired
            .as_ref()
            .filter(|a| a.received_bytes > 0 && a.fetch_secs > 0.0);
        // (bytes, seconds) of the state fetch, as the device's link times it.
        let fetch = match (fetched, &self.setup.accelerator) {
            (Some(a), Some(device)) => {
                let ranges: Vec<_> = a.fetched.iter().map(|f| f.layers.clone()).collect();
                Some(device.measured_fetch(&ranges, a.fetch_secs)?)
            }
            (Some(a), None) => Some((a.received_bytes as f64, a.fetch_secs)),
            (None, _) => None,
        };
        if let (Some(a), Some((bytes, fetch_secs))) = (fetched, fetch) {
            // Several sources sent in parallel: their aggregate rate bounds each link's.
            let rate = bytes / fetch_secs;
            self.measured.bandwidth = a.sources.iter().map(|s| (*s, rate)).collect();
        }
        if priced(kind) {
            // The model prices the state transfer from the measured rate; the rest (links,
            // groups, the stage's build, waiting for the slowest peer) is the fixed price.
            let fetch_secs = fetch.map_or(0.0, |(_, secs)| secs);
            self.measured.reconfiguration_s = Some((secs - fetch_secs).max(0.0));
        }
        if fetched.is_some() || priced(kind) {
            (self.submit)(Command::CostReport {
                node: self.setup.me,
                step: next,
                layers: self.setup.layer_costs.clone(),
                bandwidth: self.measured.bandwidth.clone(),
                reconfiguration_s: self.measured.reconfiguration_s,
            });
        }
        self.status.slot = Some([slot.pipeline, slot.stage]);
        self.status.migrations.push(MigrationView {
            epoch: plan.epoch,
            kind,
            at_step: next,
            secs,
            received_bytes: acquired.as_ref().map_or(0, |a| a.received_bytes),
        });
        if self.status.migrations.len() > 256 {
            self.status.migrations.remove(0);
        }
        self.current = Some(Current {
            epoch: plan.epoch,
            slot,
            stage,
            links,
            digest: None,
        });
        self.set_phase(TrainingPhase::Training);
        (self.publish)(self.status.clone());
        Ok(())
    }

    fn build_stage(
        &self,
        range: std::ops::Range<usize>,
        next: u64,
        acquired: Option<&Acquired>,
    ) -> Result<Stage<M>, TrainError> {
        let s = &self.setup;
        let mut stage = Stage::new(
            s.model.clone(),
            range,
            s.seed,
            &s.device,
            s.stage_config.clone(),
        )?;
        let Some(a) = acquired else {
            if let Some(weights) = &s.initial_weights {
                stage.load_weights(weights.as_ref())?;
            }
            return Ok(stage);
        };
        stage.set_step(next);
        for piece in &a.restored {
            tracing::warn!(layers = ?piece.layers, steps = next, "restoring layers from the checkpoint of the step");
        }
        for piece in a.live.iter().chain(&a.restored) {
            stage.import_state(&piece.bytes, piece.layers.clone())?;
        }
        Ok(stage)
    }

    /// Layers of this node's slot are gone with every holder and no checkpoint of the step
    /// has them: proposes the rollback to the older complete cut, or stops training (with the
    /// reason in `/status`) when there is none. Nothing starts afresh.
    fn missing_layers(
        &mut self,
        state: &ControlState,
        plan: &Plan,
        next: u64,
        missing: handoff::Missing,
    ) -> Result<(), TrainError> {
        let Some(to_step) = missing.roll_back_to else {
            let error = format!(
                "layers {:?} have no live holder and no complete checkpoint is left to roll back to (step {next}): \
                 training stops until a checkpoint the cluster does not hold is given in the job's \
                 store (parcae-node run --restore URL copies one there)",
                missing.layers
            );
            tracing::error!("{error}");
            self.stopped_at = Some((plan.epoch, next, state.progress.history));
            self.status.error = Some(error.clone());
            self.set_phase(TrainingPhase::Stopped);
            return Ok(());
        };
        (self.submit)(Command::RollBack {
            node: self.setup.me,
            epoch: plan.epoch,
            at_step: next,
            to_step,
        });
        Err(TrainError::RollingBack {
            layers: missing.layers,
            step: next,
            to_step,
        })
    }

    fn train_step(&mut self, state: &ControlState, plan: &Plan, k: u64) -> Result<(), TrainError> {
        let cur = self
            .current
            .as_mut()
            .ok_or_else(|| TrainError::Config("no stage".into()))?;
        let spec = StepSpec {
            epoch: plan.epoch,
            step: k,
            slot: cur.slot,
            data_parallel: plan.data_parallel,
            stages: plan.pipeline_stages,
            sample_start: state.progress.sample_cursor,
            global_batch: self.setup.global_batch,
            micro_batch: self.setup.micro_batch,
            digest: cur.digest,
        };
        let started = Instant::now();
        let mut io = StepIo {
            links: &mut cur.links,
            rt: &self.rt,
            data: &self.setup.data,
            timeout: self.setup.peer_timeout,
            view: self.view.clone(),
            accelerator: self.setup.accelerator.as_ref(),
        };
        let result = step::run(&mut io, &mut cur.stage, &spec)?;
        let ran = started.elapsed();
        let report = result.report.map(|r| Command::StepCommitted {
            step: k,
            epoch: plan.epoch,
            sample_start: spec.sample_start,
            samples: u64::from(spec.global_batch),
            loss: r.loss,
            validation_loss: r.validation_loss,
            stage_digests: r.stage_digests,
            optimizer: OptimizerScalars {
                step_count: k + 1,
                schedule_position: k + 1,
            },
        });
        match self.await_commit(k, plan.epoch, report) {
            Outcome::Committed => {
                let committed = started.elapsed();
                let cur = self.current.as_mut().expect("current slot");
                cur.stage.optimizer_step(result.global_sq_norm)?;
                if let Some(device) = &self.setup.accelerator {
                    let emulated = device.emulation().stage(
                        cur.stage.layer_range(),
                        self.setup.micro_batch,
                        1,
                    )?;
                    device
                        .pacer()
                        .after(started.elapsed() - committed, emulated.optimizer);
                    let view = device.view();
                    let m = &self.setup.metrics;
                    m.emulated_overruns.set(view.overrun_count);
                    m.emulated_overrun_ms.set((view.overrun_secs * 1e3) as u64);
                    m.emulated_busy_ms.set((view.busy_secs * 1e3) as u64);
                    self.status.emulated = Some(view);
                }
                cur.digest = None;
                let stepped = started.elapsed();
                self.status.last_step_ms = stepped.as_secs_f64() * 1e3;
                self.checkpoint_if_due(state, plan, k)?;
                tracing::debug!(
                    step = k,
                    run_ms = ran.as_secs_f64() * 1e3,
                    commit_wait_ms = (committed - ran).as_secs_f64() * 1e3,
                    optimizer_ms = (stepped - committed).as_secs_f64() * 1e3,
                    checkpoint_ms = (started.elapsed() - stepped).as_secs_f64() * 1e3,
                    "step done"
                );
                (self.publish)(self.status.clone());
                Ok(())
            }
            Outcome::Superseded => {
                if let Some(c) = self.current.as_mut() {
                    c.stage.clear_grads();
                }
                Err(TrainError::Superseded(k))
            }
        }
    }

    /// Waits until step `k` committed or a new plan replaced the epoch, re-proposing the report
    /// with backoff (a proposal can be lost in a leader change).
    fn await_commit(&mut self, k: u64, epoch: u64, report: Option<Command>) -> Outcome {
        let mut retry = Retry::new(REPORT_RETRY_MIN, REPORT_RETRY_MAX);
        loop {
            let state = self.view.borrow_and_update().clone();
            if state.progress.last_committed_step.is_some_and(|s| s >= k) {
                return Outcome::Committed;
            }
            if state.plan.as_ref().map(|p| p.epoch) != Some(epoch) {
                return Outcome::Superseded;
            }
            if let Some(cmd) = &report
                && retry.due(Instant::now())
            {
                (self.submit)(cmd.clone());
                retry.attempted(Instant::now());
            }
            let mut view = self.view.clone();
            let _ = block_on_timeout(&self.rt, Duration::from_millis(200), view.changed());
        }
    }

    /// The first replica of each stage saves its state every `checkpoint_every` steps, locally,
    /// on one peer outside its stage and in the job's durable store, then registers its part
    /// of the step's cut in raft. The training loop pays only for the snapshot and its digest:
    /// the file write, fsync, peer copy, upload and registration run in the background, and a
    /// part is registered only once durable.
    fn checkpoint_if_due(
        &mut self,
        state: &ControlState,
        plan: &Plan,
        k: u64,
    ) -> Result<(), TrainError> {
        let every = self.setup.checkpoint_every;
        let Some(cur) = self.current.as_mut() else {
            return Ok(());
        };
        if every == 0 || !(k + 1).is_multiple_of(every) || cur.slot.pipeline != 0 {
            return Ok(());
        }
        let snapshot = Instant::now();
        let range = cur.stage.layer_range();
        let bytes = cur.stage.export_state(range.clone())?;
        let steps = k + 1;
        let digest: Digest32 = Sha256::digest(&bytes).into();
        cur.digest = Some(digest);
        let metrics = self.setup.metrics.clone();
        metrics.checkpoints_total.inc();
        metrics
            .checkpoint_snapshot_ms_total
            .inc_by(snapshot.elapsed().as_millis() as u64);
        let me = self.setup.me;
        let peer = checkpoint_peer(state, plan, me, cur.slot);
        let ep = self.ep.clone();
        let submit = self.submit.clone();
        let epoch = plan.epoch;
        self.rt.spawn(async move {
            let written = Instant::now();
            let store = ep.checkpoints.clone();
            let layers = range.clone();
            let registered = crate::checkpoint::registered_steps(&ep.view.borrow(), &layers);
            let saved = tokio::task::spawn_blocking(move || {
                store.save(steps, &layers, &bytes, &registered).map(|_| bytes)
            })
            .await;
            let bytes = match saved {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(e)) => {
                    tracing::error!(steps, layers = ?range, "checkpoint not saved: {e}");
                    return;
                }
                Err(e) => {
                    tracing::error!(steps, layers = ?range, "checkpoint writer failed: {e}");
                    return;
                }
            };
            let mut holders = vec![me];
            let layers = parcae_consensus::state::LayerRange {
                start: range.start as u32,
                end: range.end as u32,
            };
            if let Some(peer) = peer {
                match crate::dataplane::client::put_checkpoint(
                    &ep,
                    &peer,
                    steps,
                    range.clone(),
                    &bytes,
                    digest,
                )
                .await
                {
                    Ok(()) => holders.push(peer.node),
                    Err(e) => tracing::warn!(node = %peer.node, "checkpoint copy failed: {e}"),
                }
            }
            metrics
                .checkpoint_write_ms_total
                .inc_by(written.elapsed().as_millis() as u64);
            let uploaded = Instant::now();
            let stored = match &ep.store {
                Some(store) => match store
                    .put_part(steps, layers.start..layers.end, &digest, bytes)
                    .await
                {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(steps, layers = ?range, "checkpoint not uploaded to the job's store: {e}");
                        false
                    }
                },
                None => false,
            };
            metrics
                .checkpoint_upload_ms_total
                .inc_by(uploaded.elapsed().as_millis() as u64);
            submit(Command::Checkpointed {
                step: k,
                epoch,
                layers,
                holders,
                digest,
                stored,
            });
        });
        Ok(())
    }
}

/// The peer that keeps a copy of a stage's checkpoint: the first replica of the next stage, or
/// for a one-stage plan any other member.
fn checkpoint_peer(
    state: &ControlState,
    plan: &Plan,
    me: NodeId,
    slot: StageSlot,
) -> Option<crate::dataplane::client::PeerAddr> {
    let other_stage = StageSlot {
        pipeline: 0,
        stage: (slot.stage + 1) % plan.pipeline_stages,
    };
    let node = if other_stage != slot {
        plan.assignment
            .iter()
            .find(|(_, s)| **s == other_stage)
            .map(|(n, _)| *n)
    } else {
        state
            .members
            .iter()
            .find(|(id, m)| **id != me && m.status.is_healthy())
            .map(|(id, _)| *id)
    }?;
    crate::dataplane::client::peer_addr(state, node).ok()
}

/// Whether a restart into `plan` brings in nodes that were not in `previous` (a full
/// rendezvous in Parcae's restart cost).
pub fn restart_kind(previous: Option<&Plan>, plan: &Plan) -> RestartKind {
    let joined = plan
        .assignment
        .keys()
        .any(|n| previous.is_none_or(|p| !p.assignment.contains_key(n)));
    if joined {
        RestartKind::Add
    } else {
        RestartKind::Remove
    }
}

/// Whether an emulated device pays for entering `plan` at step `next` after `previous`: every
/// change of plan after the job's start, a joiner's first one too (on the emulated cluster it
/// pays its rendezvous and fetch as the others pay theirs, and one that started at once would
/// wait out their pacing on its neighbours' links, past their timeout). Not the plan the node
/// was already in, entered again after an abandoned step: the emulated cluster retries a step
/// over the groups it has, and a reactive node that paid a whole restart for the retry (up to a
/// minute of emulated time, while the new plan that the failure brings waited behind it) paid
/// two restarts for one change, where the system it stands for pays one.
pub fn paced_on_the_device(previous: Option<&Plan>, plan: &Plan, next: u64) -> bool {
    next > 0 && previous.is_none_or(|p| p.epoch != plan.epoch)
}

/// The kind of a reconfiguration, as Parcae names them: `intra` (pipelines re-formed, nothing
/// moves), `inter` (nodes take other stages), `repartition` (layer boundaries move), `restart`
/// (state restored from checkpoints, or the reactive strategy), `initial`.
pub fn migration_kind(
    previous: Option<&Plan>,
    plan: &Plan,
    acquired: Option<&Acquired>,
    restart: bool,
) -> MigrationKind {
    let Some(prev) = previous else {
        return MigrationKind::Initial;
    };
    if restart || acquired.is_some_and(|a| !a.restored.is_empty()) {
        return MigrationKind::Restart;
    }
    if prev.partition != plan.partition {
        return MigrationKind::Repartition;
    }
    let same_stages = plan
        .assignment
        .iter()
        .all(|(n, s)| prev.assignment.get(n).is_some_and(|p| p.stage == s.stage));
    if same_stages {
        MigrationKind::Intra
    } else {
        MigrationKind::Inter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(nodes: &[u64]) -> Plan {
        Plan {
            epoch: 1,
            data_parallel: 1,
            pipeline_stages: nodes.len() as u32,
            partition: (0..=nodes.len() as u32).collect(),
            assignment: nodes
                .iter()
                .enumerate()
                .map(|(s, &n)| {
                    let slot = StageSlot {
                        pipeline: 0,
                        stage: s as u32,
                    };
                    (NodeId(n), slot)
                })
                .collect(),
            at_step: 0,
        }
    }

    #[test]
    fn a_restart_adds_when_a_node_joined() {
        let before = plan(&[1, 2, 3]);
        assert_eq!(
            restart_kind(Some(&before), &plan(&[1, 2])),
            RestartKind::Remove
        );
        assert_eq!(
            restart_kind(Some(&before), &plan(&[3, 1, 2])),
            RestartKind::Remove
        );
        assert_eq!(
            restart_kind(Some(&before), &plan(&[1, 4])),
            RestartKind::Add
        );
        assert_eq!(restart_kind(None, &plan(&[1])), RestartKind::Add);
    }

    #[test]
    fn a_change_of_plan_is_paced_and_a_retry_of_the_same_plan_is_not() {
        let before = plan(&[1, 2, 3]);
        let mut after = plan(&[1, 2]);
        after.epoch = 2;
        // The job's start is free; a joiner's first plan and every change are paid.
        assert!(!paced_on_the_device(None, &before, 0));
        assert!(paced_on_the_device(None, &before, 5));
        assert!(paced_on_the_device(Some(&before), &after, 5));
        // The same plan again after an abandoned step.
        assert!(!paced_on_the_device(Some(&after), &after, 5));
    }
}
