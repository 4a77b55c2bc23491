//! Validation and effects of each command (those of training's progress in `training`). Every
//! check runs before the first mutation, so a rejected command never leaves a partial change behind.

use std::collections::BTreeSet;

use parcae_pool::Pool;

use super::ControlState;
use super::command::{Command, Rejection, StateEvent};
use super::limits;
use super::training::{
    StepReport, activate_due_plan, adopt_cut, checkpointed, restore_cut, roll_back, step_committed,
};
use super::types::{
    AvailabilitySample, CutPart, Job, KeyId, LayerCost, LinkTime, Member, MemberStatus, NodeCosts,
    PeerInfo, Plan, PoolCount, RaftRole, Retired, StageSlot,
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
        Command::AvailabilityTick {
            interval,
            count,
            pools,
        } => availability(state, *interval, *count, pools),
        Command::Reconfigure { plan } => reconfigure(state, plan),
        Command::StepCommitted {
            step,
            epoch,
            sample_start,
            samples,
            loss,
            validation_loss,
            stage_digests,
            outer_digests,
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
                outer_digests,
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
            group,
        } => checkpointed(
            state,
            (*step, *epoch, group.as_deref()),
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
            allreduce_bytes_per_sec,
            boundary_link,
        } => cost_report(
            state,
            *node,
            *step,
            layers,
            bandwidth,
            (*reconfiguration_s, *allreduce_bytes_per_sec, *boundary_link),
        ),
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
        return Err(Rejection::invalid(
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
        return Err(Rejection::invalid(
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

fn validate_peer(node: NodeId, peer: &PeerInfo) -> Result<(), Rejection> {
    if peer.peer_id.is_empty() || peer.peer_id.len() > limits::MAX_PEER_ID_BYTES {
        return Err(Rejection::invalid(
            "peer_id",
            format!("{} bytes", peer.peer_id.len()),
        ));
    }
    if NodeId::from_peer_bytes(&peer.peer_id) != node {
        return Err(Rejection::invalid("node", "does not match the peer id"));
    }
    if peer.addrs.len() > limits::MAX_ADDRS {
        return Err(Rejection::invalid(
            "addrs",
            format!("{} addresses", peer.addrs.len()),
        ));
    }
    if let Some(a) = peer.addrs.iter().find(|a| a.len() > limits::MAX_ADDR_BYTES) {
        return Err(Rejection::invalid(
            "addrs",
            format!("address of {} bytes", a.len()),
        ));
    }
    if let Some(a) = peer.data_addr.as_ref()
        && a.len() > limits::MAX_ADDR_BYTES
    {
        return Err(Rejection::invalid(
            "data_addr",
            format!("address of {} bytes", a.len()),
        ));
    }
    let repeated = (1..peer.keys.len()).any(|i| peer.keys[..i].contains(&peer.keys[i]));
    if peer.keys.len() > limits::MAX_KEYS || repeated {
        return Err(Rejection::invalid(
            "keys",
            format!(
                "{} keys (at most {}, distinct)",
                peer.keys.len(),
                limits::MAX_KEYS
            ),
        ));
    }
    peer.caps
        .check()
        .map_err(|(field, reason)| Rejection::invalid(field, reason))
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
    pools: &[PoolCount],
) -> Result<Vec<StateEvent>, Rejection> {
    check_pool_counts(count, pools).map_err(|reason| Rejection::invalid("pools", reason))?;
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
    state.availability.push_back(AvailabilitySample {
        interval,
        count,
        pools: pools.to_vec(),
    });
    Ok(vec![StateEvent::AvailabilityRecorded { interval }])
}

/// Why `pools` are not `count` nodes by pool, if they are not: at most
/// [`limits::MAX_SAMPLE_POOLS`] named pools in ascending order, adding up to `count`.
fn check_pool_counts(count: u32, pools: &[PoolCount]) -> Result<(), String> {
    if pools.is_empty() {
        return Ok(());
    }
    if pools.len() > limits::MAX_SAMPLE_POOLS {
        return Err(format!(
            "{} pools (at most {})",
            pools.len(),
            limits::MAX_SAMPLE_POOLS
        ));
    }
    for p in pools {
        if p.pool.is_empty() {
            return Err("a pool without a name".into());
        }
        p.pool.parse::<Pool>().map_err(|e| e.to_string())?;
    }
    if let Some(pair) = pools.windows(2).find(|w| w[0].pool >= w[1].pool) {
        return Err(format!(
            "{:?} before {:?}: pools go in ascending order, once each",
            pair[0].pool, pair[1].pool
        ));
    }
    let sum: u64 = pools.iter().map(|p| u64::from(p.nodes)).sum();
    if sum != u64::from(count) {
        return Err(format!("{sum} nodes by pool for a count of {count}"));
    }
    Ok(())
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
        return Err(Rejection::invalid("config", format!("D={d} x P={p}")));
    }
    if plan.partition.len() != p as usize + 1
        || plan.partition[0] != 0
        || plan.partition.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(Rejection::invalid(
            "partition",
            format!("{:?} for P={p}", plan.partition),
        ));
    }
    if plan.assignment.len() as u64 != u64::from(d) * u64::from(p) {
        return Err(Rejection::invalid(
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
            return Err(Rejection::invalid(
                "assignment",
                format!("node {node} is not healthy"),
            ));
        }
        if slot.pipeline >= d || slot.stage >= p || !slots.insert(*slot) {
            return Err(Rejection::invalid(
                "assignment",
                format!("bad or duplicate slot {slot:?}"),
            ));
        }
    }
    let shares = &plan.batch_shares;
    if !shares.is_empty() && (shares.len() != d as usize || shares.contains(&0)) {
        return Err(Rejection::invalid(
            "batch_shares",
            format!("{} shares for D={d}, each above 0", shares.len()),
        ));
    }
    if plan.joins_before > state.next_join_seq {
        return Err(Rejection::invalid(
            "joins_before",
            format!(
                "{} is past the next join sequence number {}",
                plan.joins_before, state.next_join_seq
            ),
        ));
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

fn cost_report(
    state: &mut ControlState,
    node: NodeId,
    step: u64,
    layers: &[(u32, LayerCost)],
    bandwidth: &[(NodeId, f64)],
    (reconfiguration_s, allreduce_bytes_per_sec, boundary_link): (
        Option<f64>,
        Option<f64>,
        Option<LinkTime>,
    ),
) -> Result<Vec<StateEvent>, Rejection> {
    if !state.members.contains_key(&node) {
        return Err(Rejection::UnknownNode(node));
    }
    if layers.len() > limits::MAX_COST_LAYERS || bandwidth.len() > limits::MAX_COST_PEERS {
        return Err(Rejection::invalid(
            "costs",
            format!("{} layers, {} peers", layers.len(), bandwidth.len()),
        ));
    }
    let valid = |x: f64| x.is_finite() && x >= 0.0;
    if let Some((layer, _)) = layers
        .iter()
        .find(|(_, c)| !(valid(c.forward_s) && valid(c.backward_s) && valid(c.optimizer_s)))
    {
        return Err(Rejection::invalid(
            "layers",
            format!("layer {layer} has a negative or non-finite cost"),
        ));
    }
    if let Some((peer, _)) = bandwidth.iter().find(|(_, r)| !valid(*r)) {
        return Err(Rejection::invalid(
            "bandwidth",
            format!("rate to {peer} is negative or non-finite"),
        ));
    }
    for (field, value) in [
        ("reconfiguration_s", reconfiguration_s),
        ("allreduce_bytes_per_sec", allreduce_bytes_per_sec),
        ("boundary_link", boundary_link.map(|l| l.secs)),
    ] {
        if value.is_some_and(|v| !valid(v)) {
            return Err(Rejection::invalid(
                field,
                "negative or non-finite".to_string(),
            ));
        }
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
            allreduce_bytes_per_sec,
            boundary_link,
        },
    );
    Ok(vec![StateEvent::CostsRecorded { node }])
}
