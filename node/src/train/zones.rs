//! Which of a node's transfers leave its zone (issue 37): an emulated fleet over zones paces
//! what crosses on the slower link between zones, as the planner prices it. A member that did
//! not say its zone crosses nothing, so a cluster without zones is paced as before. Under
//! DiLoCo a zone's replicas are a group: which members share a stage's state, and which
//! groups trained a step.

use std::collections::{BTreeMap, BTreeSet};

use parcae_api::StepGroup;
use parcae_consensus::state::{Plan, StageSlot};
use parcae_consensus::{ControlState, NodeId};
use parcae_outer::{SyncMode, Wire};
use parcae_pool::AllReduce;

use super::samples::pipeline_share;
use crate::emulate::{Crossings, RoundCrossing, ZoneSpread};
use crate::planner::zones::{zone_of, zones_differ};

/// Whether `a` and `b` said zones and they differ.
pub fn crosses(state: &ControlState, a: &NodeId, b: &NodeId) -> bool {
    zones_differ(zone_of(state, a), zone_of(state, b))
}

/// The transfers of `slot` under `plan` that leave its node's zone: activations to the next
/// stage of its pipeline, gradients to the previous one, and the ring of the stage's replicas
/// (crossing when any two of them are in different zones; never under DiLoCo, whose steps
/// average inside a zone); under DiLoCo, how a round's all-reduce of the stage's
/// pseudo-gradient spreads over the zones, `wire` between them.
pub fn crossings(
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
    (sync, wire): (SyncMode, Wire),
) -> Crossings {
    let node_at = |pipeline: u32, stage: u32| {
        plan.assignment
            .iter()
            .find(|(_, s)| s.pipeline == pipeline && s.stage == stage)
            .map(|(id, _)| *id)
    };
    let Some(me) = node_at(slot.pipeline, slot.stage) else {
        return Crossings::default();
    };
    let crosses_to = |other: Option<NodeId>| other.is_some_and(|o| crosses(state, &me, &o));
    let replicas: Vec<NodeId> = (0..plan.data_parallel)
        .filter_map(|p| node_at(p, slot.stage))
        .collect();
    let ring = sync.inner_steps().is_none()
        && replicas
            .iter()
            .any(|r| replicas.iter().any(|q| crosses(state, r, q)));
    Crossings {
        next: crosses_to(node_at(slot.pipeline, slot.stage + 1)),
        prev: slot
            .stage
            .checked_sub(1)
            .is_some_and(|s| crosses_to(node_at(slot.pipeline, s))),
        ring,
        by_zone: (ring && plan.all_reduce == AllReduce::ByZone).then(|| spread(state, &replicas)),
        round: sync.inner_steps().map(|_| RoundCrossing {
            spread: spread(state, &replicas),
            wire,
        }),
    }
}

/// The replicas a step of `slot` averages its gradients with, itself included: the stage's
/// every replica, or under DiLoCo those in its node's zone.
pub fn step_replicas(state: &ControlState, plan: &Plan, slot: StageSlot, sync: SyncMode) -> u32 {
    if sync.inner_steps().is_none() {
        return plan.data_parallel;
    }
    let zone_at = |pipeline: u32| {
        plan.assignment
            .iter()
            .find(|(_, s)| s.pipeline == pipeline && s.stage == slot.stage)
            .map(|(id, _)| zone_of(state, id))
    };
    let mine = zone_at(slot.pipeline);
    (0..plan.data_parallel)
        .filter(|&p| zone_at(p) == mine)
        .count() as u32
}

/// The members whose stage state is `node`'s group's (DiLoCo: every member in its zone, where
/// it said one; none otherwise): a slot takes its layers from them where they hold them, so a
/// group continues its own inner steps.
pub fn group(state: &ControlState, node: &NodeId, sync: SyncMode) -> BTreeSet<NodeId> {
    let zone = zone_of(state, node);
    if sync.inner_steps().is_none() || zone.is_empty() {
        return BTreeSet::new();
    }
    state
        .members
        .keys()
        .filter(|m| zone_of(state, m) == zone)
        .copied()
        .collect()
}

/// Under DiLoCo, the groups that trained the step of `epoch` whose `samples` start at
/// `sample_start` (`StepRecord::groups`): each zone's pipelines' shares of the batch, as its
/// replicas trained them. Empty under `step`, for an epoch other than the plan's, and where a
/// pipeline spans zones (its stages then average with different groups).
pub fn step_groups(
    state: &ControlState,
    sync: SyncMode,
    epoch: u64,
    (sample_start, samples): (u64, u64),
) -> Vec<StepGroup> {
    let Some(plan) = state.plan.as_ref().filter(|p| p.epoch == epoch) else {
        return Vec::new();
    };
    let Ok(batch) = u32::try_from(samples) else {
        return Vec::new();
    };
    if sync.inner_steps().is_none() {
        return Vec::new();
    }
    let mut zones: Vec<Option<&str>> = vec![None; plan.data_parallel as usize];
    for (id, slot) in &plan.assignment {
        let Some(zone) = zones.get_mut(slot.pipeline as usize) else {
            return Vec::new();
        };
        match zone {
            Some(z) if *z != zone_of(state, id) => return Vec::new(),
            _ => *zone = Some(zone_of(state, id)),
        }
    }
    let mut groups: BTreeMap<&str, Vec<[u64; 2]>> = BTreeMap::new();
    for (pipeline, zone) in zones.iter().enumerate() {
        let Some(zone) = zone else {
            return Vec::new();
        };
        let share = pipeline_share(
            sample_start,
            batch,
            (pipeline as u32, plan.data_parallel),
            &plan.batch_shares,
        );
        groups
            .entry(zone)
            .or_default()
            .push([share.start, share.end]);
    }
    groups
        .into_iter()
        .map(|(zone, shares)| StepGroup {
            zone: zone.to_string(),
            shares,
        })
        .collect()
}

/// Which part of the checkpoint after a step a slot writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartWritten {
    /// The cut's own part of its stage (pipeline 0's replica: the state every group resumes
    /// from after a rollback).
    Cut,
    /// Under DiLoCo, the state of the stage in this zone's group, for a replay.
    Group(String),
}

/// The part of a step's checkpoint that `slot` writes under `plan`: pipeline 0's replica of
/// each stage the cut's own; under DiLoCo, the first replica of the stage in every other zone
/// its group's, so that a replay can train every group from the checkpoint. `None`: nothing.
pub fn part_written(
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
    sync: SyncMode,
) -> Option<PartWritten> {
    if slot.pipeline == 0 {
        return Some(PartWritten::Cut);
    }
    sync.inner_steps()?;
    let zone_at = |pipeline: u32| {
        plan.assignment
            .iter()
            .find(|(_, s)| s.pipeline == pipeline && s.stage == slot.stage)
            .map(|(id, _)| zone_of(state, id))
    };
    let mine = zone_at(slot.pipeline).filter(|z| !z.is_empty())?;
    let first = (0..plan.data_parallel).find(|&p| zone_at(p) == Some(mine))?;
    (first == slot.pipeline && zone_at(0) != Some(mine))
        .then(|| PartWritten::Group(mine.to_string()))
}

/// How `replicas` spread over their zones.
fn spread(state: &ControlState, replicas: &[NodeId]) -> ZoneSpread {
    let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
    for r in replicas {
        *per_zone.entry(zone_of(state, r)).or_default() += 1;
    }
    ZoneSpread {
        replicas: replicas.len() as u32,
        zones: per_zone.len() as u32,
        fewest: per_zone.values().copied().min().unwrap_or(1),
        most: per_zone.values().copied().max().unwrap_or(1),
    }
}

#[cfg(test)]
mod tests {
    use parcae_consensus::Command;
    use parcae_consensus::state::{Capabilities, PeerInfo};

    use super::*;

    /// Members 1..=zones.len() in `zones` ("" for none), planned 2 x 2 in id order: pipeline 0
    /// holds members 1 and 2, pipeline 1 members 3 and 4.
    fn planned(zones: &[&str]) -> (ControlState, Plan) {
        let mut state = ControlState::default();
        let mut assignment = std::collections::BTreeMap::new();
        for (i, zone) in zones.iter().enumerate() {
            let node = NodeId::from_peer_bytes(&[i as u8 + 1]);
            let peer = PeerInfo {
                peer_id: vec![i as u8 + 1],
                caps: Capabilities {
                    zone: (*zone).into(),
                    ..Capabilities::default()
                },
                ..PeerInfo::default()
            };
            state.apply(&Command::Join { node, peer }).unwrap();
            let slot = StageSlot {
                pipeline: i as u32 / 2,
                stage: i as u32 % 2,
            };
            assignment.insert(node, slot);
        }
        let plan = Plan {
            epoch: 1,
            data_parallel: 2,
            pipeline_stages: 2,
            partition: vec![0, 4, 8],
            assignment,
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        };
        (state, plan)
    }

    /// A synchronous job's steps (its wire form unused).
    const STEP: (SyncMode, Wire) = (SyncMode::Step, Wire::F32);

    fn slot(pipeline: u32, stage: u32) -> StageSlot {
        StageSlot { pipeline, stage }
    }

    #[test]
    fn a_pipeline_over_two_zones_crosses_at_its_boundary_only() {
        // Stage 0 of both pipelines in a, stage 1 in b: each ring inside a zone.
        let (state, plan) = planned(&["a", "b", "a", "b"]);
        let first = crossings(&state, &plan, slot(0, 0), STEP);
        assert_eq!((first.next, first.prev, first.ring), (true, false, false));
        let last = crossings(&state, &plan, slot(1, 1), STEP);
        assert_eq!((last.next, last.prev, last.ring), (false, true, false));
    }

    #[test]
    fn pipelines_in_two_zones_cross_in_their_rings_only() {
        let (state, plan) = planned(&["a", "a", "b", "b"]);
        for s in [slot(0, 0), slot(0, 1), slot(1, 0), slot(1, 1)] {
            let c = crossings(&state, &plan, s, STEP);
            assert_eq!((c.next, c.prev, c.ring), (false, false, true), "{s:?}");
        }
    }

    #[test]
    fn a_plan_by_zone_says_how_each_ring_spreads_over_zones() {
        let (state, mut plan) = planned(&["a", "a", "b", "b"]);
        assert_eq!(crossings(&state, &plan, slot(0, 1), STEP).by_zone, None);
        plan.all_reduce = AllReduce::ByZone;
        let spread = ZoneSpread {
            replicas: 2,
            zones: 2,
            fewest: 1,
            most: 1,
        };
        assert_eq!(
            crossings(&state, &plan, slot(0, 1), STEP).by_zone,
            Some(spread)
        );
        // A ring inside one zone is one ring whatever the plan says.
        let (state, mut plan) = planned(&["a", "b", "a", "b"]);
        plan.all_reduce = AllReduce::ByZone;
        assert_eq!(crossings(&state, &plan, slot(1, 0), STEP).by_zone, None);
    }

    /// Under DiLoCo a step's ring stays inside the zone: nothing of it crosses, and it
    /// averages with the stage's replicas in the node's zone alone.
    #[test]
    fn diloco_steps_average_inside_the_zone() {
        let (state, plan) = planned(&["a", "a", "b", "b"]);
        let diloco = SyncMode::Diloco(20);
        let c = crossings(&state, &plan, slot(0, 1), (diloco, Wire::Int8));
        assert_eq!((c.ring, c.by_zone), (false, None));
        // Its rounds meet every replica, by zone, in the job's wire form between zones.
        let spread = ZoneSpread {
            replicas: 2,
            zones: 2,
            fewest: 1,
            most: 1,
        };
        let round = RoundCrossing {
            spread,
            wire: Wire::Int8,
        };
        assert_eq!(c.round, Some(round));
        assert_eq!(crossings(&state, &plan, slot(0, 1), STEP).round, None);
        assert_eq!(step_replicas(&state, &plan, slot(0, 1), SyncMode::Step), 2);
        assert_eq!(step_replicas(&state, &plan, slot(0, 1), diloco), 1);
        let (state, plan) = planned(&["a", "b", "a", "b"]);
        assert_eq!(step_replicas(&state, &plan, slot(1, 1), diloco), 2);
    }

    #[test]
    fn a_diloco_group_is_the_zone() {
        let (state, _) = planned(&["a", "b", "a", ""]);
        let id = |i: u8| NodeId::from_peer_bytes(&[i]);
        let diloco = SyncMode::Diloco(5);
        assert_eq!(
            group(&state, &id(1), diloco),
            BTreeSet::from([id(1), id(3)])
        );
        assert_eq!(group(&state, &id(2), diloco), BTreeSet::from([id(2)]));
        assert!(group(&state, &id(4), diloco).is_empty(), "no zone said");
        assert!(group(&state, &id(1), SyncMode::Step).is_empty());
    }

    #[test]
    fn a_diloco_step_lists_each_zones_pipelines_and_their_samples() {
        let group = |zone: &str, shares: &[[u64; 2]]| StepGroup {
            zone: zone.into(),
            shares: shares.to_vec(),
        };
        let diloco = SyncMode::Diloco(5);
        let (mut state, plan) = planned(&["b", "b", "a", "a"]);
        state.plan = Some(plan);
        assert_eq!(
            step_groups(&state, diloco, 1, (100, 16)),
            [group("a", &[[108, 116]]), group("b", &[[100, 108]])]
        );
        if let Some(plan) = state.plan.as_mut() {
            plan.batch_shares = vec![10, 6];
        }
        assert_eq!(
            step_groups(&state, diloco, 1, (100, 16)),
            [group("a", &[[110, 116]]), group("b", &[[100, 110]])]
        );
        assert!(step_groups(&state, SyncMode::Step, 1, (100, 16)).is_empty());
        assert!(
            step_groups(&state, diloco, 2, (100, 16)).is_empty(),
            "another epoch's"
        );

        let (mut state, plan) = planned(&["a", "a", "a", "a"]);
        state.plan = Some(plan);
        assert_eq!(
            step_groups(&state, diloco, 1, (0, 16)),
            [group("a", &[[0, 8], [8, 16]])]
        );
        let (mut state, plan) = planned(&["a", "b", "a", "b"]);
        state.plan = Some(plan);
        assert!(
            step_groups(&state, diloco, 1, (0, 16)).is_empty(),
            "pipelines across zones: no group holds a whole replica"
        );
    }

    #[test]
    fn pipeline_0_writes_the_cut_and_under_diloco_each_other_zone_its_group() {
        // Pipelines 0 and 2 in zone a, 1 and 3 in b, one stage each.
        let (mut state, mut plan) = planned(&["a", "b", "a", "b"]);
        plan.data_parallel = 4;
        plan.pipeline_stages = 1;
        for i in 0..4u8 {
            plan.assignment
                .insert(NodeId::from_peer_bytes(&[i + 1]), slot(u32::from(i), 0));
        }
        let writes = |state: &ControlState, pipeline, sync| {
            part_written(state, &plan, slot(pipeline, 0), sync)
        };
        let diloco = SyncMode::Diloco(5);
        assert_eq!(writes(&state, 0, diloco), Some(PartWritten::Cut));
        assert_eq!(
            writes(&state, 1, diloco),
            Some(PartWritten::Group("b".into()))
        );
        assert_eq!(writes(&state, 2, diloco), None, "pipeline 0's group");
        assert_eq!(writes(&state, 3, diloco), None, "b's first replica writes");
        assert_eq!(writes(&state, 0, SyncMode::Step), Some(PartWritten::Cut));
        assert_eq!(writes(&state, 1, SyncMode::Step), None);
        // A member that said no zone is in no group of its own.
        let b = NodeId::from_peer_bytes(&[2]);
        if let Some(m) = state.members.get_mut(&b) {
            m.peer.caps.zone = String::new();
        }
        assert_eq!(writes(&state, 1, diloco), None);
    }

    #[test]
    fn nothing_crosses_without_zones() {
        let (state, plan) = planned(&["", "b", "", "b"]);
        assert_eq!(
            crossings(&state, &plan, slot(0, 0), STEP),
            Crossings::default()
        );
        let (state, plan) = planned(&["a", "a", "a", "a"]);
        assert_eq!(
            crossings(&state, &plan, slot(1, 1), STEP),
            Crossings::default()
        );
    }
}
