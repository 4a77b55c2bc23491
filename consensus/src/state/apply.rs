//! Validation and effects of each command. Every check runs before the first mutation, so a
//! rejected command never leaves a partial change behind.

use std::collections::BTreeSet;

use super::ControlState;
use super::command::{Command, Rejection, StateEvent};
use super::limits;
use super::types::{
    AvailabilitySample, Cut, CutPart, Digest32, Job, KeyId, LayerCost, LossRecord, Member,
    MemberStatus, NodeCosts, OptimizerScalars, PeerInfo, Plan, RaftRole, Retired, StageSlot,
    StepEnd,
};
use crate::ids::NodeId;

pub(super) fn apply(
    state: &mut ControlState,
    command: &Command,
) -> Result<Vec<StateEvent>, Rejection> {
    match command {
        Command::Join { node, peer } => join(state, *node, peer),
        Command::Notice { node, deadline_ms } => notice(state, *node, *deadline_ms),
        Command::Lost { node } => lost(state, *node),
        Command::Leave { node } => leave(state, *node),
        Command::AvailabilityTick { interval, count } => availability(state, *interval, *count),
        Command::Reconfigure { plan } => reconfigure(state, plan),
        Command::StepCommitted {
            step,
            epoch,
            sample_start,
            samples,
            loss,
            validation_loss,
            stage_digests,
            optimizer,
        } => step_committed(
            state,
            StepReport {
                step: *step,
                epoch: *epoch,
                sample_start: *sample_start,
                samples: *samples,
                loss: *loss,
                validation_loss: *validation_loss,
                stage_digests,
                optimizer: *optimizer,
            },
        ),
        Command::Checkpointed {
            step,
            epoch,
            layers,
            holders,
            digest,
            stored,
        } => checkpointed(
            state,
            *step,
            *epoch,
            CutPart {
                layers: *layers,
                holders: holders.clone(),
                digest: *digest,
                stored: *stored,
            },
        ),
        Command::RollBack {
            node,
            epoch,
            at_step,
            to_step,
        } => roll_back(state, *node, *epoch, *at_step, *to_step),
        Command::AdoptCut { cut } => adopt_cut(state, cut),
        Command::CostReport {
            node,
            step,
            layers,
            bandwidth,
            reconfiguration_s,
        } => cost_report(state, *node, *step, layers, bandwidth, *reconfiguration_s),
        Command::DefineJob { job } => define_job(state, job),
        Command::RestoreCut {
            node,
            epoch,
            at_step,
            cut,
        } => restore_cut(state, *node, *epoch, *at_step, cut),
        Command::RotateKey { key } => rotate_key(state, *key),
    }
}

/// The key goes into force when every member that is not lost holds it; the same key again
/// changes nothing.
fn rotate_key(state: &mut ControlState, key: KeyId) -> Result<Vec<StateEvent>, Rejection> {
    if state.cluster_key == Some(key) {
        return Ok(Vec::new());
    }
    if let Some(m) = state
        .members
        .values()
        .find(|m| m.status != MemberStatus::Lost && !m.peer.keys.contains(&key))
    {
        return Err(Rejection::KeyNotHeld(m.id));
    }
    state.cluster_key = Some(key);
    Ok(vec![StateEvent::KeyRotated { key }])
}

fn define_job(state: &mut ControlState, job: &Job) -> Result<Vec<StateEvent>, Rejection> {
    if job.settings.is_empty() || job.settings.len() > limits::MAX_JOB_SETTINGS {
        return Err(invalid(
            "job",
            format!(
                "{} settings (1 to {})",
                job.settings.len(),
                limits::MAX_JOB_SETTINGS
            ),
        ));
    }
    if let Some((name, value)) = job.settings.iter().find(|(n, v)| {
        n.is_empty()
            || n.len() > limits::MAX_JOB_NAME_BYTES
            || v.len() > limits::MAX_JOB_VALUE_BYTES
    }) {
        return Err(invalid(
            "job",
            format!(
                "setting of {} name bytes and {} value bytes (1 to {}, at most {})",
                name.len(),
                value.len(),
                limits::MAX_JOB_NAME_BYTES,
                limits::MAX_JOB_VALUE_BYTES
            ),
        ));
    }
    match &state.job {
        None => {
            state.job = Some(job.clone());
            Ok(vec![StateEvent::JobDefined])
        }
        Some(defined) => match defined.difference(job) {
            None => Ok(Vec::new()),
            Some(difference) => Err(Rejection::JobConflict(difference)),
        },
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Rejection {
    Rejection::Invalid {
        field,
        reason: reason.into(),
    }
}

fn validate_peer(node: NodeId, peer: &PeerInfo) -> Result<(), Rejection> {
    if peer.peer_id.is_empty() || peer.peer_id.len() > limits::MAX_PEER_ID_BYTES {
        return Err(invalid("peer_id", format!("{} bytes", peer.peer_id.len())));
    }
    if NodeId::from_peer_bytes(&peer.peer_id) != node {
        return Err(invalid("node", "does not match the peer id"));
    }
    if peer.addrs.len() > limits::MAX_ADDRS {
        return Err(invalid("addrs", format!("{} addresses", peer.addrs.len())));
    }
    if let Some(a) = peer.addrs.iter().find(|a| a.len() > limits::MAX_ADDR_BYTES) {
        return Err(invalid("addrs", format!("address of {} bytes", a.len())));
    }
    if let Some(a) = peer.data_addr.as_ref()
        && a.len() > limits::MAX_ADDR_BYTES
    {
        return Err(invalid(
            "data_addr",
            format!("address of {} bytes", a.len()),
        ));
    }
    let repeated = (1..peer.keys.len()).any(|i| peer.keys[..i].contains(&peer.keys[i]));
    if peer.keys.len() > limits::MAX_KEYS || repeated {
        return Err(invalid(
            "keys",
            format!(
                "{} keys (at most {}, distinct)",
                peer.keys.len(),
                limits::MAX_KEYS
            ),
        ));
    }
    if peer.caps.label.len() > limits::MAX_ADDR_BYTES {
        return Err(invalid(
            "caps.label",
            format!("{} bytes", peer.caps.label.len()),
        ));
    }
    Ok(())
}

fn join(
    state: &mut ControlState,
    node: NodeId,
    peer: &PeerInfo,
) -> Result<Vec<StateEvent>, Rejection> {
    validate_peer(node, peer)?;
    if state.is_retired(node) {
        return Err(Rejection::Retired(node));
    }
    if state.cluster_key.is_some_and(|k| !peer.keys.contains(&k)) {
        return Err(Rejection::StaleKey(node));
    }
    if let Some(existing) = state.members.get_mut(&node) {
        if existing.peer.peer_id != peer.peer_id {
            return Err(Rejection::IdCollision(node));
        }
        existing.peer = peer.clone();
        if !existing.status.is_healthy() {
            // Back after a loss or a cancelled notice: a fresh, least stable member.
            existing.status = MemberStatus::Spare;
            existing.join_seq = state.next_join_seq;
            state.next_join_seq += 1;
        }
        return Ok(vec![StateEvent::Joined {
            node,
            rejoined: true,
        }]);
    }
    if state.members.len() >= limits::MAX_MEMBERS {
        return Err(Rejection::ClusterFull(state.members.len()));
    }
    state.members.insert(
        node,
        Member {
            id: node,
            peer: peer.clone(),
            role: RaftRole::Absent,
            status: MemberStatus::Spare,
            join_seq: state.next_join_seq,
        },
    );
    state.next_join_seq += 1;
    Ok(vec![StateEvent::Joined {
        node,
        rejoined: false,
    }])
}

fn notice(
    state: &mut ControlState,
    node: NodeId,
    deadline_ms: u64,
) -> Result<Vec<StateEvent>, Rejection> {
    let member = state
        .members
        .get_mut(&node)
        .ok_or(Rejection::UnknownNode(node))?;
    let deadline_ms = match member.status {
        MemberStatus::Lost => return Err(Rejection::AlreadyLost(node)),
        MemberStatus::Leaving { deadline_ms: d } => d.min(deadline_ms),
        MemberStatus::Active | MemberStatus::Spare => deadline_ms,
    };
    member.status = MemberStatus::Leaving { deadline_ms };
    Ok(vec![StateEvent::NoticeRecorded { node, deadline_ms }])
}

fn lost(state: &mut ControlState, node: NodeId) -> Result<Vec<StateEvent>, Rejection> {
    let member = state
        .members
        .get_mut(&node)
        .ok_or(Rejection::UnknownNode(node))?;
    if member.status == MemberStatus::Lost {
        return Err(Rejection::AlreadyLost(node));
    }
    member.status = MemberStatus::Lost;
    Ok(vec![StateEvent::MarkedLost { node }])
}

fn leave(state: &mut ControlState, node: NodeId) -> Result<Vec<StateEvent>, Rejection> {
    let member = state
        .members
        .remove(&node)
        .ok_or(Rejection::UnknownNode(node))?;
    state.costs.remove(&node);
    if state.retired.len() >= limits::MAX_RETIRED {
        state.retired.pop_front();
    }
    state.retired.push_back(Retired {
        id: node,
        peer_id: member.peer.peer_id,
    });
    Ok(vec![StateEvent::Left { node }])
}

fn availability(
    state: &mut ControlState,
    interval: u64,
    count: u32,
) -> Result<Vec<StateEvent>, Rejection> {
    if let Some(last) = state.availability.back()
        && interval <= last.interval
    {
        return Err(Rejection::StaleInterval {
            last: last.interval,
            got: interval,
        });
    }
    if state.availability.len() >= limits::MAX_AVAILABILITY {
        state.availability.pop_front();
    }
    state
        .availability
        .push_back(AvailabilitySample { interval, count });
    Ok(vec![StateEvent::AvailabilityRecorded { interval }])
}

fn validate_plan(state: &ControlState, plan: &Plan) -> Result<(), Rejection> {
    let expected = state.latest_epoch().saturating_add(1);
    if plan.epoch != expected {
        return Err(Rejection::WrongEpoch {
            expected,
            got: plan.epoch,
        });
    }
    let (d, p) = (plan.data_parallel, plan.pipeline_stages);
    if d == 0 || p == 0 || d > limits::MAX_PLAN_DIM || p > limits::MAX_PLAN_DIM {
        return Err(invalid("config", format!("D={d} x P={p}")));
    }
    if plan.partition.len() != p as usize + 1
        || plan.partition[0] != 0
        || plan.partition.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(invalid(
            "partition",
            format!("{:?} for P={p}", plan.partition),
        ));
    }
    if plan.assignment.len() as u64 != u64::from(d) * u64::from(p) {
        return Err(invalid(
            "assignment",
            format!(
                "{} nodes for {} slots",
                plan.assignment.len(),
                u64::from(d) * u64::from(p)
            ),
        ));
    }
    let mut slots = BTreeSet::<StageSlot>::new();
    for (node, slot) in &plan.assignment {
        let member = state
            .members
            .get(node)
            .ok_or(Rejection::UnknownNode(*node))?;
        if !member.status.is_healthy() {
            return Err(invalid("assignment", format!("node {node} is not healthy")));
        }
        if slot.pipeline >= d || slot.stage >= p || !slots.insert(*slot) {
            return Err(invalid(
                "assignment",
                format!("bad or duplicate slot {slot:?}"),
            ));
        }
    }
    let next_step = state.progress.next_step();
    if plan.at_step < next_step {
        return Err(Rejection::StepInPast {
            at_step: plan.at_step,
            next_step,
        });
    }
    Ok(())
}

fn reconfigure(state: &mut ControlState, plan: &Plan) -> Result<Vec<StateEvent>, Rejection> {
    validate_plan(state, plan)?;
    let mut events = vec![StateEvent::PlanScheduled {
        epoch: plan.epoch,
        at_step: plan.at_step,
    }];
    state.pending_plan = Some(plan.clone());
    events.extend(activate_due_plan(state));
    Ok(events)
}

/// Makes the pending plan current once training reached its effective step, and marks assigned
/// healthy members active and the other healthy members spare.
fn activate_due_plan(state: &mut ControlState) -> Option<StateEvent> {
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

struct StepReport<'a> {
    step: u64,
    epoch: u64,
    sample_start: u64,
    samples: u64,
    loss: f64,
    validation_loss: Option<f64>,
    stage_digests: &'a [Digest32],
    optimizer: OptimizerScalars,
}

fn step_committed(
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
        .ok_or_else(|| invalid("samples", r.samples.to_string()))?;
    if !r.loss.is_finite() {
        return Err(invalid("loss", r.loss.to_string()));
    }
    if let Some(v) = r.validation_loss.filter(|v| !v.is_finite()) {
        return Err(invalid("validation_loss", v.to_string()));
    }
    if !r.stage_digests.is_empty() && r.stage_digests.len() != plan.pipeline_stages as usize {
        return Err(invalid(
            "stage_digests",
            format!(
                "{} digests for P={} (none, or one per stage)",
                r.stage_digests.len(),
                plan.pipeline_stages
            ),
        ));
    }
    let progress = &mut state.progress;
    progress.last_committed_step = Some(r.step);
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

fn checkpointed(
    state: &mut ControlState,
    step: u64,
    epoch: u64,
    mut part: CutPart,
) -> Result<Vec<StateEvent>, Rejection> {
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
            invalid(
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
        return Err(invalid(
            "layers",
            format!("{}..{} of {layers} layers", range.start, range.end),
        ));
    }
    if (part.holders.is_empty() && !part.stored) || part.holders.len() > limits::MAX_HOLDERS {
        return Err(invalid(
            "holders",
            format!("{} holders, stored: {}", part.holders.len(), part.stored),
        ));
    }
    if let Some(h) = part.holders.iter().find(|h| !state.members.contains_key(h)) {
        return Err(Rejection::UnknownNode(*h));
    }
    if state
        .newest_complete_cut()
        .is_some_and(|c| c.end.step >= step && !state.checkpoints.contains_key(&step))
    {
        return Err(invalid(
            "step",
            format!("step {step} is not after the newest complete checkpoint"),
        ));
    }
    if let Some(cut) = state.checkpoints.get(&step)
        && let Some(other) = cut.parts.iter().find(|p| {
            p.layers.start < range.end
                && range.start < p.layers.end
                && (p.layers != range || p.digest != part.digest)
        })
    {
        return Err(invalid(
            "layers",
            format!(
                "{}..{} conflicts with the registered part {}..{} of step {step}",
                range.start, range.end, other.layers.start, other.layers.end
            ),
        ));
    }
    part.holders.sort_unstable();
    part.holders.dedup();
    let history = state.progress.history;
    let cut = state.checkpoints.entry(step).or_insert_with(|| Cut {
        end,
        history,
        layers,
        parts: Vec::new(),
    });
    match cut.parts.iter_mut().find(|p| p.layers == range) {
        Some(same) => {
            same.holders.extend_from_slice(&part.holders);
            same.holders.sort_unstable();
            same.holders.dedup();
            same.holders.truncate(limits::MAX_HOLDERS);
            same.stored |= part.stored;
        }
        None => {
            cut.parts.push(part);
            cut.parts.sort_by_key(|p| p.layers.start);
        }
    }
    let complete = cut.is_complete();
    prune_cuts(state);
    Ok(vec![StateEvent::CheckpointRegistered {
        layers: range,
        step,
        complete,
    }])
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
        return Err(invalid("node", format!("{node} has no slot in the plan")));
    }
    let next = state.progress.next_step();
    if at_step != next {
        return Err(not_the_next_step(at_step, next));
    }
    Ok(next)
}

fn roll_back(
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
        return Err(invalid(
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
fn restore_cut(
    state: &mut ControlState,
    node: NodeId,
    epoch: u64,
    at_step: u64,
    cut: &Cut,
) -> Result<Vec<StateEvent>, Rejection> {
    let next = stuck_member(state, node, epoch, at_step)?;
    stored_cut_shape(cut)?;
    if cut.end.step + 1 > next {
        return Err(invalid(
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
        return Err(invalid(
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
        return Err(invalid(
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
}

/// A new cluster takes up a job where a stored complete cut left it.
fn adopt_cut(state: &mut ControlState, cut: &Cut) -> Result<Vec<StateEvent>, Rejection> {
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

fn cost_report(
    state: &mut ControlState,
    node: NodeId,
    step: u64,
    layers: &[(u32, LayerCost)],
    bandwidth: &[(NodeId, f64)],
    reconfiguration_s: Option<f64>,
) -> Result<Vec<StateEvent>, Rejection> {
    if !state.members.contains_key(&node) {
        return Err(Rejection::UnknownNode(node));
    }
    if layers.len() > limits::MAX_COST_LAYERS || bandwidth.len() > limits::MAX_COST_PEERS {
        return Err(invalid(
            "costs",
            format!("{} layers, {} peers", layers.len(), bandwidth.len()),
        ));
    }
    let valid = |x: f64| x.is_finite() && x >= 0.0;
    if let Some((layer, _)) = layers
        .iter()
        .find(|(_, c)| !(valid(c.forward_s) && valid(c.backward_s) && valid(c.optimizer_s)))
    {
        return Err(invalid(
            "layers",
            format!("layer {layer} has a negative or non-finite cost"),
        ));
    }
    if let Some((peer, _)) = bandwidth.iter().find(|(_, r)| !valid(*r)) {
        return Err(invalid(
            "bandwidth",
            format!("rate to {peer} is negative or non-finite"),
        ));
    }
    if reconfiguration_s.is_some_and(|s| !valid(s)) {
        return Err(invalid(
            "reconfiguration_s",
            "negative or non-finite".to_string(),
        ));
    }
    // A report replaces the node's previous one (it measures what it runs now), which also keeps
    // the stored costs bounded by the per-report limits.
    state.costs.insert(
        node,
        NodeCosts {
            step,
            layers: layers.iter().copied().collect(),
            bandwidth: bandwidth.iter().copied().collect(),
            reconfiguration_s,
        },
    );
    Ok(vec![StateEvent::CostsRecorded { node }])
}
