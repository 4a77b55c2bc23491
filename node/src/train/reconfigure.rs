//! Entering a plan: publish the state this node holds (so others can fetch it), obtain the
//! layers of the new slot (kept, from live holders, or from the checkpoint cut of the step),
//! open the epoch's links, pace the device, and report what the move cost, so the planner
//! prices the next one at what moves cost on this cluster.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use parcae_consensus::state::{Plan, StageSlot};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::{PipelineModel, Stage};
use parcae_pool::AllReduce;

use super::context::{Board, Current, Io, WorkerSetup};
use super::egress;
use super::error::TrainError;
use super::handoff::{self, Acquired, Acquisition, Missing};
use super::waiter::Waiter;
use crate::dataplane::links;
use crate::dataplane::server::Held;
use crate::emulate::{self, Change, Fetched};
use crate::status::{MigrationKind, MigrationView};

/// Longest a reconfiguration may take before it is retried (state of the `small` preset moves
/// in well under a second at the measured rates; this bounds a stuck peer).
const SWITCH_LIMIT: Duration = Duration::from_secs(600);

/// Reconfigurations shown in `/status`.
const MIGRATIONS_SHOWN: usize = 256;

/// The latest measurements of this node's reconfigurations, re-sent with every cost report.
#[derive(Debug, Default)]
pub struct Measured {
    /// Rate of the latest state fetch, per source.
    bandwidth: Vec<(NodeId, f64)>,
    /// What the latest priced reconfiguration took beyond its state fetch, seconds.
    reconfiguration_s: Option<f64>,
}

/// A move into a slot of a plan.
pub struct Move<'a> {
    /// The replicated state the plan is entered under.
    pub state: &'a ControlState,
    /// The plan.
    pub plan: &'a Plan,
    /// The plan this node entered before, if any.
    pub previous: Option<&'a Plan>,
    /// The slot.
    pub slot: StageSlot,
    /// The step the plan is entered at.
    pub next: u64,
    /// When the move began.
    pub started: Instant,
}

/// What entering a slot came to.
pub enum Entered<M: PipelineModel> {
    /// The slot's stage and links.
    Slot(Box<Current<M>>),
    /// Layers of the slot are lost with every holder and every checkpoint of the step.
    Missing(Missing),
}

/// Publishes the state `old` holds at step `next` for other nodes to fetch.
pub fn hold<M: PipelineModel>(
    io: &Io,
    state: &ControlState,
    old: Option<&Stage<M>>,
    next: u64,
) -> Result<(), TrainError> {
    let Some(stage) = old.filter(|s| s.step() == next) else {
        return Ok(());
    };
    let range = stage.layer_range();
    let layers = range
        .clone()
        .map(|l| stage.export_state(l..l + 1))
        .collect::<Result<Vec<_>, _>>()?;
    io.ep.hold(Some(Held {
        history: state.progress.history,
        step: next,
        start: range.start,
        layers,
    }));
    Ok(())
}

/// Takes the slot of `to`: the stage (from `old` when it holds the slot's layers at the step),
/// the links, the device's pacing, the cost report and `/status`.
pub fn take_slot<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    io: &Io,
    measured: &mut Measured,
    board: &mut Board,
    to: Move<'_>,
    old: Option<Stage<M>>,
) -> Result<Entered<M>, TrainError> {
    let range = to
        .plan
        .stage_layers(to.slot.stage)
        .map(|r| r.start as usize..r.end as usize)
        .ok_or_else(|| TrainError::Config(format!("plan has no stage {}", to.slot.stage)))?;
    // Each part has its own timeouts; a newer plan ends the move at once.
    let superseding = Waiter::new(
        &io.rt,
        SWITCH_LIMIT,
        io.view.clone(),
        to.plan.epoch,
        to.next,
    );
    let (stage, acquired) = match obtain(setup, io, &to, &superseding, old, range)? {
        Obtained::Stage(stage, acquired) => (stage, acquired),
        Obtained::Missing(missing) => return Ok(Entered::Missing(missing)),
    };
    // DiLoCo's steps stay inside a zone and its rounds meet across zones: by zone whatever the
    // plan would do for a synchronous job.
    let all_reduce = match setup.spec.sync.inner_steps() {
        Some(_) => AllReduce::ByZone,
        None => to.plan.all_reduce,
    };
    let connect = links::connect(&io.ep, to.state, to.plan, to.slot, all_reduce);
    let links = superseding.wait("links", connect)?;
    let kind = migration_kind(
        to.previous,
        to.plan,
        acquired.as_ref(),
        setup.restart_on_change,
    );
    let change = Change {
        previous: to.previous,
        plan: to.plan,
        next: to.next,
        kind,
        restart: if setup.restart_on_change {
            emulate::reactive_restart_kind(to.state, to.previous, to.plan)
        } else {
            emulate::restart_kind(to.previous, to.plan)
        },
        built: acquired.is_some(),
        reactive: setup.restart_on_change,
        fetched: paced_fetches(setup, &to, acquired.as_ref()),
        restored: acquired.as_ref().map_or_else(Vec::new, |a| {
            a.restored.iter().map(|p| p.layers.clone()).collect()
        }),
    };
    setup
        .pacing
        .reconfiguration(&change, to.started.elapsed())?;
    let secs = to.started.elapsed().as_secs_f64();
    let received_bytes = acquired.as_ref().map_or(0, |a| a.received_bytes);
    tracing::info!(epoch = to.plan.epoch, slot = ?to.slot, %kind, secs, received_bytes, "reconfiguration done");
    report_costs(setup, io, measured, &change, acquired.as_ref(), secs)?;
    board.view.slot = Some([to.slot.pipeline, to.slot.stage]);
    board.view.migrations.push(MigrationView {
        epoch: to.plan.epoch,
        kind,
        at_step: to.next,
        secs,
        received_bytes,
    });
    if board.view.migrations.len() > MIGRATIONS_SHOWN {
        board.view.migrations.remove(0);
    }
    Ok(Entered::Slot(Box::new(Current {
        epoch: to.plan.epoch,
        slot: to.slot,
        stage: *stage,
        links,
        digest: None,
    })))
}

/// The fetches of `acquired` as the device paces them: each with whether it crossed zones and
/// the pieces its holder sent at the same time, to the other nodes entering the plan (as they
/// plan their fetches) and to this one.
fn paced_fetches<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    to: &Move<'_>,
    acquired: Option<&Acquired>,
) -> Vec<Fetched> {
    let Some(a) = acquired.filter(|a| !a.fetched.is_empty()) else {
        return Vec::new();
    };
    let mut sends = to.previous.map_or_else(BTreeMap::new, |previous| {
        egress::sends(
            to.state,
            (previous, to.plan),
            to.next,
            setup.me,
            setup.spec.sync,
        )
    });
    for f in &a.fetched {
        sends.entry(f.from).or_default().push(f.layers.clone());
    }
    a.fetched
        .iter()
        .map(|f| {
            let mut beside = sends.get(&f.from).cloned().unwrap_or_default();
            if let Some(mine) = beside.iter().rposition(|p| *p == f.layers) {
                beside.swap_remove(mine);
            }
            Fetched {
                layers: f.layers.clone(),
                across: super::zones::crosses(to.state, &setup.me, &f.from),
                beside,
            }
        })
        .collect()
}

/// What obtaining a slot's layers came to.
enum Obtained<M: PipelineModel> {
    /// The slot's stage, and what was acquired for it (nothing when it was kept or starts the
    /// job).
    Stage(Box<Stage<M>>, Option<Acquired>),
    /// Layers of the slot are lost.
    Missing(Missing),
}

/// The stage of layers `range` at the step: `old` when it is that stage (unless every change
/// restarts), the job's first stage at step 0, else built from the layers' live holders and
/// checkpoints.
fn obtain<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    io: &Io,
    to: &Move<'_>,
    superseding: &Waiter<'_>,
    old: Option<Stage<M>>,
    range: Range<usize>,
) -> Result<Obtained<M>, TrainError> {
    let keep = !setup.restart_on_change
        && old
            .as_ref()
            .is_some_and(|s| s.layer_range() == range && s.step() == to.next);
    if let Some(stage) = old.filter(|_| keep) {
        return Ok(Obtained::Stage(Box::new(stage), None));
    }
    if to.next == 0 {
        let stage = build_stage(setup, range, 0, None)?;
        return Ok(Obtained::Stage(Box::new(stage), None));
    }
    let acquisition = superseding.wait(
        "state handoff",
        handoff::acquire(
            &io.ep,
            to.state,
            setup.me,
            (range.clone(), to.next),
            (
                to.slot.pipeline as usize,
                super::zones::group(to.state, &setup.me, setup.spec.sync),
            ),
        ),
    )?;
    Ok(match acquisition {
        Acquisition::Acquired(acquired) => {
            let stage = build_stage(setup, range, to.next, Some(&acquired))?;
            Obtained::Stage(Box::new(stage), Some(acquired))
        }
        Acquisition::Missing(missing) => Obtained::Missing(missing),
    })
}

/// The stage of layers `range` at step `next`: seeded (or from the job's starting weights) at
/// the job's start, else from the state acquired.
fn build_stage<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    range: Range<usize>,
    next: u64,
    acquired: Option<&Acquired>,
) -> Result<Stage<M>, TrainError> {
    let mut stage = Stage::new(
        setup.model.clone(),
        range,
        setup.spec.seed,
        &setup.device,
        setup.stage_config.clone(),
    )?;
    let Some(a) = acquired else {
        if let Some(weights) = &setup.initial_weights {
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

/// Proposes this node's costs again when the move measured something: the rate of its state
/// fetch (as the device's link times it) and, for a priced move, what it took beyond the fetch.
fn report_costs<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    io: &Io,
    measured: &mut Measured,
    change: &Change<'_>,
    acquired: Option<&Acquired>,
    secs: f64,
) -> Result<(), TrainError> {
    let fetched = acquired.filter(|a| a.received_bytes > 0 && a.fetch_secs > 0.0);
    // The state fetch as the device's links time it: each source's rate, and the whole.
    let fetch = match fetched {
        Some(a) => Some(setup.pacing.measured_fetch(
            &change.fetched,
            a.received_bytes,
            a.fetch_secs,
        )?),
        None => None,
    };
    if let (Some(a), Some(timed)) = (fetched, &fetch) {
        // One rate a source: the slowest of its fetches.
        let mut rates: BTreeMap<NodeId, f64> = BTreeMap::new();
        for (f, rate) in a.fetched.iter().zip(&timed.rates) {
            let slowest = rates.entry(f.from).or_insert(*rate);
            *slowest = slowest.min(*rate);
        }
        measured.bandwidth = rates.into_iter().collect();
    }
    let priced = priced(change.kind);
    if priced {
        // The model prices the state transfer from the measured rate; the rest (links,
        // groups, the stage's build, waiting for the slowest peer) is the fixed price.
        let fetch_secs = fetch.map_or(0.0, |f| f.secs);
        measured.reconfiguration_s = Some((secs - fetch_secs).max(0.0));
    }
    if fetched.is_some() || priced {
        io.propose(Command::CostReport {
            node: setup.me,
            step: change.next,
            layers: setup.layer_costs.clone(),
            bandwidth: measured.bandwidth.clone(),
            reconfiguration_s: measured.reconfiguration_s,
            allreduce_bytes_per_sec: setup.pacing.allreduce_rate(),
            boundary_link: setup.pacing.boundary_link(setup.spec.micro_batch),
        });
    }
    Ok(())
}

/// What to do when layers of this node's slot are gone with every holder and no checkpoint of
/// the step has them: propose the rollback to the older complete cut (and abandon the move), or,
/// when there is none, stop training with the reason returned for `/status`. Nothing starts
/// afresh.
pub fn on_missing(
    io: &Io,
    me: NodeId,
    plan: &Plan,
    next: u64,
    missing: Missing,
) -> Result<String, TrainError> {
    let Some(to_step) = missing.roll_back_to else {
        return Ok(format!(
            "layers {:?} have no live holder and no complete checkpoint is left to roll back to (step {next}): \
             training stops until a checkpoint the cluster does not hold is given in the job's \
             store (parcae-node run --restore URL copies one there)",
            missing.layers
        ));
    };
    io.propose(Command::RollBack {
        node: me,
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

/// Whether the planner's model charges a reconfiguration of this kind its fixed price (a
/// restart-like rebuild); an intra-stage move only re-forms pipelines.
fn priced(kind: MigrationKind) -> bool {
    matches!(
        kind,
        MigrationKind::Inter | MigrationKind::Repartition | MigrationKind::Restart
    )
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
