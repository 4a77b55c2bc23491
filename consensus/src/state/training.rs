//! The commands of training's progress: committed steps, checkpoints and the cuts they make,
//! rollbacks to a cut, restores from the store, and the pending plan taking effect at its step.
//! As in [`super::apply`], every check runs before the first mutation.

use super::ControlState;
use super::command::{Rejection, StateEvent};
use super::limits;
use super::types::{
    Cut, CutPart, Digest32, GroupParts, LossRecord, MemberStatus, OptimizerScalars, OuterRound,
    StepEnd,
};
use crate::ids::NodeId;

/// Makes the pending plan current once training reached its effective step, and marks assigned
/// healthy members active and the other healthy members spare.
pub(super) fn activate_due_plan(state: &mut ControlState) -> Option<StateEvent> {
    let due = state
        .pending_plan
        .as_ref()
        .is_some_and(|p| p.at_step <= state.progress.next_step());
    if !due {
        return None;
    }
    let plan = state.pending_plan.take()?;
    for (id, member) in state.members.iter_mut() {
        if member.status.is_healthy() {
            member.status = if plan.assignment.contains_key(id) {
                MemberStatus::Active
            } else {
                MemberStatus::Spare
            };
        }
    }
    let epoch = plan.epoch;
    state.plan = Some(plan);
    Some(StateEvent::PlanActivated { epoch })
}

pub(super) struct StepReport<'a> {
    pub(super) step: u64,
    pub(super) epoch: u64,
    pub(super) sample_start: u64,
    pub(super) samples: u64,
    pub(super) loss: f64,
    pub(super) validation_loss: Option<f64>,
    pub(super) stage_digests: &'a [Digest32],
    pub(super) outer_digests: &'a [Digest32],
    pub(super) optimizer: OptimizerScalars,
}

/// Refuses digests `field` that are neither none nor one for each of the plan's `stages`.
fn none_or_one_per_stage(
    field: &'static str,
    digests: &[Digest32],
    stages: u32,
) -> Result<(), Rejection> {
    if digests.is_empty() || digests.len() == stages as usize {
        return Ok(());
    }
    Err(Rejection::invalid(
        field,
        format!(
            "{} digests for P={stages} (none, or one per stage)",
            digests.len()
        ),
    ))
}

pub(super) fn step_committed(
    state: &mut ControlState,
    r: StepReport<'_>,
) -> Result<Vec<StateEvent>, Rejection> {
    let plan = state.plan.as_ref().ok_or(Rejection::NoPlan)?;
    let expected = state.progress.next_step();
    if r.step < expected {
        return Err(Rejection::AlreadyCommitted(r.step));
    }
    if r.step > expected {
        return Err(Rejection::StepGap {
            expected,
            got: r.step,
        });
    }
    if r.epoch != plan.epoch {
        return Err(Rejection::StaleEpoch {
            current: plan.epoch,
            got: r.epoch,
        });
    }
    if r.sample_start != state.progress.sample_cursor {
        return Err(Rejection::CursorMismatch {
            cursor: state.progress.sample_cursor,
            got: r.sample_start,
        });
    }
    let cursor = r
        .sample_start
        .checked_add(r.samples)
        .filter(|_| r.samples > 0)
        .ok_or_else(|| Rejection::invalid("samples", r.samples.to_string()))?;
    if !r.loss.is_finite() {
        return Err(Rejection::invalid("loss", r.loss.to_string()));
    }
    if let Some(v) = r.validation_loss.filter(|v| !v.is_finite()) {
        return Err(Rejection::invalid("validation_loss", v.to_string()));
    }
    none_or_one_per_stage("stage_digests", r.stage_digests, plan.pipeline_stages)?;
    none_or_one_per_stage("outer_digests", r.outer_digests, plan.pipeline_stages)?;
    let progress = &mut state.progress;
    progress.last_committed_step = Some(r.step);
    if !r.outer_digests.is_empty() {
        progress.outer_round = Some(OuterRound {
            step: r.step,
            digests: r.outer_digests.to_vec(),
        });
    }
    progress.sample_cursor = cursor;
    progress.optimizer = r.optimizer;
    if !r.stage_digests.is_empty() {
        progress.stage_digests = r.stage_digests.to_vec();
        progress.audited_step = Some(r.step);
    }
    if progress.recent_losses.len() >= limits::MAX_RECENT_LOSSES {
        progress.recent_losses.pop_front();
    }
    progress.recent_losses.push_back(LossRecord {
        step: r.step,
        loss: r.loss,
    });
    if let Some(loss) = r.validation_loss {
        progress.last_validation = Some(LossRecord { step: r.step, loss });
    }
    if progress.step_ends.len() >= limits::MAX_STEP_ENDS {
        progress.step_ends.pop_front();
    }
    progress.step_ends.push_back(StepEnd {
        step: r.step,
        epoch: r.epoch,
        sample_cursor: cursor,
        optimizer: r.optimizer,
    });
    let mut events = vec![StateEvent::StepCommitted { step: r.step }];
    events.extend(activate_due_plan(state));
    Ok(events)
}

/// Registers `part` of the cut after `step` (of `epoch`): the cut's own (pipeline 0's group),
/// or under DiLoCo group `group`'s.
pub(super) fn checkpointed(
    state: &mut ControlState,
    (step, epoch, group): (u64, u64, Option<&str>),
    mut part: CutPart,
) -> Result<Vec<StateEvent>, Rejection> {
    let (end, layers) = check_part(state, (step, epoch, group), &part)?;
    let range = part.layers;
    part.holders.sort_unstable();
    part.holders.dedup();
    let history = state.progress.history;
    let cut = state.checkpoints.entry(step).or_insert_with(|| Cut {
        end,
        history,
        layers,
        parts: Vec::new(),
        groups: Vec::new(),
    });
    let parts = match group {
        None => &mut cut.parts,
        Some(zone) => {
            let at = match cut.groups.iter().position(|g| g.zone == zone) {
                Some(at) => at,
                None => {
                    cut.groups.push(GroupParts {
                        zone: zone.to_string(),
                        parts: Vec::new(),
                    });
                    cut.groups.len() - 1
                }
            };
            &mut cut.groups[at].parts
        }
    };
    register(parts, part);
    let complete = cut.is_complete();
    prune_cuts(state);
    Ok(vec![StateEvent::CheckpointRegistered {
        layers: range,
        step,
        complete,
    }])
}

/// The step's end and the model's layers, where `part` may join the cut after `step`.
fn check_part(
    state: &ControlState,
    (step, epoch, group): (u64, u64, Option<&str>),
    part: &CutPart,
) -> Result<(StepEnd, u32), Rejection> {
    if state
        .progress
        .last_committed_step
        .is_none_or(|last| step > last)
    {
        return Err(Rejection::FutureStep(step));
    }
    let end = *state
        .progress
        .step_ends
        .iter()
        .find(|e| e.step == step)
        .ok_or_else(|| {
            Rejection::invalid(
                "step",
                format!("step {step} is not among the last committed steps of this history"),
            )
        })?;
    if end.epoch != epoch {
        return Err(Rejection::StaleEpoch {
            current: end.epoch,
            got: epoch,
        });
    }
    let layers = state
        .plan
        .as_ref()
        .and_then(|p| p.partition.last().copied())
        .ok_or(Rejection::NoPlan)?;
    let range = part.layers;
    if range.start >= range.end || range.end > layers {
        return Err(Rejection::invalid(
            "layers",
            format!("{}..{} of {layers} layers", range.start, range.end),
        ));
    }
    let holders_allowed = match group {
        // Another group's state is for a replay: it is in the store, on nobody's disk.
        Some(_) => part.holders.is_empty() && part.stored,
        None => !part.holders.is_empty() || part.stored,
    };
    if !holders_allowed || part.holders.len() > limits::MAX_HOLDERS {
        return Err(Rejection::invalid(
            "holders",
            format!("{} holders, stored: {}", part.holders.len(), part.stored),
        ));
    }
    if let Some(h) = part.holders.iter().find(|h| !state.members.contains_key(h)) {
        return Err(Rejection::UnknownNode(*h));
    }
    if let Some(zone) = group {
        check_group(state.checkpoints.get(&step), zone)?;
    }
    if state
        .newest_complete_cut()
        .is_some_and(|c| c.end.step >= step && !state.checkpoints.contains_key(&step))
    {
        return Err(Rejection::invalid(
            "step",
            format!("step {step} is not after the newest complete checkpoint"),
        ));
    }
    if let Some(cut) = state.checkpoints.get(&step)
        && let Some(other) = conflict(parts_of(cut, group), part)
    {
        return Err(Rejection::invalid(
            "layers",
            format!(
                "{}..{} conflicts with the registered part {}..{} of step {step}",
                range.start, range.end, other.layers.start, other.layers.end
            ),
        ));
    }
    Ok((end, layers))
}

/// A group's zone that the cut `cut` (if registered yet) may take parts of: a zone's name, and
/// no more groups than a fleet has pools.
fn check_group(cut: Option<&Cut>, zone: &str) -> Result<(), Rejection> {
    parcae_pool::check_zone(zone).map_err(|e| Rejection::invalid("group", e.to_string()))?;
    let groups = cut.map_or(&[][..], |c| c.groups.as_slice());
    if groups.len() >= limits::MAX_GROUPS && !groups.iter().any(|g| g.zone == zone) {
        return Err(Rejection::invalid(
            "group",
            format!("a cut holds at most {} groups' states", limits::MAX_GROUPS),
        ));
    }
    Ok(())
}

/// The parts of `cut` that a part of `group` joins: the cut's own, or that group's.
fn parts_of<'c>(cut: &'c Cut, group: Option<&str>) -> &'c [CutPart] {
    match group {
        None => &cut.parts,
        Some(zone) => cut
            .groups
            .iter()
            .find(|g| g.zone == zone)
            .map_or(&[][..], |g| g.parts.as_slice()),
    }
}

/// A registered part of `parts` that `part` overlaps without being it.
fn conflict<'p>(parts: &'p [CutPart], part: &CutPart) -> Option<&'p CutPart> {
    parts.iter().find(|p| {
        p.layers.start < part.layers.end
            && part.layers.start < p.layers.end
            && (p.layers != part.layers || p.digest != part.digest)
    })
}

/// Adds `part` to `parts` (by first layer), or its holders and storage to the same part's.
fn register(parts: &mut Vec<CutPart>, part: CutPart) {
    match parts.iter_mut().find(|p| p.layers == part.layers) {
        Some(same) => {
            same.holders.extend_from_slice(&part.holders);
            same.holders.sort_unstable();
            same.holders.dedup();
            same.holders.truncate(limits::MAX_HOLDERS);
            same.stored |= part.stored;
        }
        None => {
            parts.push(part);
            parts.sort_by_key(|p| p.layers.start);
        }
    }
}

/// Keeps the newest complete cuts and at most a few incomplete ones after them.
fn prune_cuts(state: &mut ControlState) {
    let complete: Vec<u64> = state
        .checkpoints
        .values()
        .rev()
        .filter(|c| c.is_complete())
        .map(|c| c.end.step)
        .collect();
    let oldest_kept = complete
        .get(limits::MAX_COMPLETE_CUTS - 1)
        .or(complete.last())
        .copied();
    let newest_complete = complete.first().copied();
    state.checkpoints.retain(|step, cut| {
        oldest_kept.is_none_or(|o| *step >= o)
            && (cut.is_complete() || newest_complete.is_none_or(|n| *step > n))
    });
    let open: Vec<u64> = state
        .checkpoints
        .values()
        .filter(|c| !c.is_complete())
        .map(|c| c.end.step)
        .collect();
    for step in open
        .iter()
        .take(open.len().saturating_sub(limits::MAX_OPEN_CUTS))
    {
        state.checkpoints.remove(step);
    }
}

/// Rewinds progress to a complete cut and starts a new history there: the steps after
/// it are dropped from the progress (counted in `rolled_back_steps`) and will be trained again
/// on the same samples. The plan in force (or the pending one) continues under a new epoch, so
/// every step in flight is superseded and every node restores its stage from the cut.
/// The next step, when `node` has a slot in the current plan of `epoch` and `at_step` is the
/// next step: what a member must show to turn the cluster back.
fn stuck_member(
    state: &ControlState,
    node: NodeId,
    epoch: u64,
    at_step: u64,
) -> Result<u64, Rejection> {
    let plan = state.plan.as_ref().ok_or(Rejection::NoPlan)?;
    if plan.epoch != epoch {
        return Err(Rejection::StaleEpoch {
            current: plan.epoch,
            got: epoch,
        });
    }
    if !plan.assignment.contains_key(&node) {
        return Err(Rejection::invalid(
            "node",
            format!("{node} has no slot in the plan"),
        ));
    }
    let next = state.progress.next_step();
    if at_step != next {
        return Err(not_the_next_step(at_step, next));
    }
    Ok(next)
}

pub(super) fn roll_back(
    state: &mut ControlState,
    node: NodeId,
    epoch: u64,
    at_step: u64,
    to_step: u64,
) -> Result<Vec<StateEvent>, Rejection> {
    let next = stuck_member(state, node, epoch, at_step)?;
    let end = state
        .checkpoints
        .get(&to_step)
        .filter(|c| c.is_complete())
        .map(|c| c.end)
        .ok_or(Rejection::NoCheckpoint)?;
    if end.step + 1 >= next {
        return Err(Rejection::invalid(
            "to_step",
            format!(
                "the checkpoint of step {} holds the state entering step {next}: nothing to roll back",
                end.step
            ),
        ));
    }
    state.checkpoints.retain(|step, _| *step <= end.step);
    Ok(resume_after(state, next, end))
}

/// Goes back from step `next` to the state after `end` in a new history; the plan continues
/// under a new epoch, so every step in flight is superseded.
fn resume_after(state: &mut ControlState, next: u64, end: StepEnd) -> Vec<StateEvent> {
    let latest_epoch = state.latest_epoch();
    let resumed = state
        .pending_plan
        .take()
        .or(state.plan.clone())
        .map(|mut p| {
            p.epoch = latest_epoch + 1;
            p.at_step = end.step + 1;
            p
        });
    let progress = &mut state.progress;
    progress.rolled_back_steps += next.saturating_sub(end.step + 1);
    progress.history += 1;
    rewind(progress, end);
    state.pending_plan = resumed;
    let mut events = vec![StateEvent::RolledBack {
        from_step: next,
        to_step: end.step + 1,
    }];
    events.extend(activate_due_plan(state));
    events
}

/// A stopped cluster resumes from a complete stored cut it does not hold.
pub(super) fn restore_cut(
    state: &mut ControlState,
    node: NodeId,
    epoch: u64,
    at_step: u64,
    cut: &Cut,
) -> Result<Vec<StateEvent>, Rejection> {
    let next = stuck_member(state, node, epoch, at_step)?;
    stored_cut_shape(cut)?;
    if cut.end.step + 1 > next {
        return Err(Rejection::invalid(
            "cut",
            format!(
                "the cut of step {} is ahead of the cluster (at step {next})",
                cut.end.step
            ),
        ));
    }
    if state
        .checkpoints
        .get(&cut.end.step)
        .is_some_and(|held| held.history == cut.history)
    {
        return Err(Rejection::invalid(
            "cut",
            format!(
                "the cluster holds the cut of step {} already: it rolls back to it itself",
                cut.end.step
            ),
        ));
    }
    let restored = cleared(cut);
    state.checkpoints = [(cut.end.step, restored)].into_iter().collect();
    // The new history is newer than the cut's too, so the store orders its cuts after it.
    state.progress.history = state.progress.history.max(cut.history);
    Ok(resume_after(state, next, cut.end))
}

/// A cut to take from the store must name every part stored, and not too many.
fn stored_cut_shape(cut: &Cut) -> Result<(), Rejection> {
    if cut.parts.len() > limits::MAX_PLAN_DIM as usize || !cut.is_stored() {
        return Err(Rejection::invalid(
            "cut",
            format!(
                "{} parts over {} layers: not a complete stored cut",
                cut.parts.len(),
                cut.layers
            ),
        ));
    }
    Ok(())
}

/// A stored cut as the registry holds it once taken: its copies are in the store, on no
/// member's disk.
fn cleared(cut: &Cut) -> Cut {
    let mut taken = cut.clone();
    for part in &mut taken.parts {
        part.holders.clear();
    }
    // Every group resumes from the cut's own parts.
    taken.groups.clear();
    taken
}

fn not_the_next_step(at_step: u64, next: u64) -> Rejection {
    if at_step < next {
        Rejection::AlreadyCommitted(at_step)
    } else {
        Rejection::StepGap {
            expected: next,
            got: at_step,
        }
    }
}

/// Sets the progress to the end of step `end.step`, forgetting what came after it.
fn rewind(progress: &mut super::Progress, end: StepEnd) {
    progress.last_committed_step = Some(end.step);
    progress.sample_cursor = end.sample_cursor;
    progress.optimizer = end.optimizer;
    progress.recent_losses.retain(|l| l.step <= end.step);
    progress.step_ends.retain(|e| e.step <= end.step);
    if progress.step_ends.back() != Some(&end) {
        progress.step_ends.push_back(end);
    }
    if progress.last_validation.is_some_and(|v| v.step > end.step) {
        progress.last_validation = None;
    }
    if progress.audited_step.is_some_and(|s| s > end.step) {
        progress.audited_step = None;
        progress.stage_digests.clear();
    }
    if progress
        .outer_round
        .as_ref()
        .is_some_and(|r| r.step > end.step)
    {
        progress.outer_round = None;
    }
}

/// A new cluster takes up a job where a stored complete cut left it.
pub(super) fn adopt_cut(state: &mut ControlState, cut: &Cut) -> Result<Vec<StateEvent>, Rejection> {
    if let Some(last) = state.progress.last_committed_step {
        return Err(Rejection::AlreadyCommitted(last));
    }
    stored_cut_shape(cut)?;
    let adopted = cleared(cut);
    let progress = &mut state.progress;
    progress.history = cut.history + 1;
    rewind(progress, cut.end);
    state.checkpoints = [(cut.end.step, adopted)].into_iter().collect();
    Ok(vec![StateEvent::CutAdopted { step: cut.end.step }])
}
