//! Building what the leader proposes: the plan that runs a chosen configuration (slots matched
//! to the layers each node holds, so survivors keep their stage when they can), and the
//! availability tick of the next interval.

use std::collections::{BTreeMap, BTreeSet};

use parcae_consensus::state::{Member, MemberStatus, Plan, PoolCount, StageSlot, limits};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_pool::AllReduce;
use parcae_strategies::ParallelConfig;
use parcae_strategies::assign::{Holding, Slot, assign, assign_in_zones};
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::fleet::shares::batch_shares;
use parcae_strategies::cost::spec::partition;

use super::settle::{Departure, departure};
use super::zones::{Zoned, pool_of};

/// Members that can take a slot: healthy, with a data plane, training the cluster's job, most
/// stable first (by join sequence).
pub fn workers(state: &ControlState) -> Vec<NodeId> {
    let mut w: Vec<(NodeId, u64)> = state
        .members
        .iter()
        .filter(|(_, m)| m.status.is_healthy() && trains(state, m))
        .map(|(id, m)| (*id, m.join_seq))
        .collect();
    w.sort_by_key(|(_, seq)| *seq);
    w.into_iter().map(|(id, _)| id).collect()
}

/// The workers and the members training the job that announced they leave (they work until
/// they are gone): the nodes a checkpoint-restart system counts as its own.
pub fn present(state: &ControlState) -> BTreeSet<NodeId> {
    state
        .members
        .iter()
        .filter(|(_, m)| {
            let leaving = departure(m.status) == Some(Departure::Announced);
            (m.status.is_healthy() || leaving) && trains(state, m)
        })
        .map(|(id, _)| *id)
        .collect()
}

/// Whether `m` can train the cluster's job: it has a data plane and trains that job.
fn trains(state: &ControlState, m: &Member) -> bool {
    m.peer.data_addr.is_some() && state.trains_the_job(&m.peer)
}

/// What `node` holds under `current`: its slot and that slot's layers.
fn holding(current: Option<&Plan>, node: NodeId) -> Holding<NodeId> {
    let slot = current.and_then(|p| p.assignment.get(&node).map(|s| (p, *s)));
    match slot.and_then(|(p, s)| Some((s, p.stage_layers(s.stage)?))) {
        Some((s, r)) => Holding {
            node,
            slot: Some(Slot {
                pipeline: s.pipeline,
                stage: s.stage,
            }),
            layers: r.start as usize..r.end as usize,
        },
        None => Holding {
            node,
            slot: None,
            layers: 0..0,
        },
    }
}

/// The step a new plan takes effect at: the one after the step in flight when the plan in
/// force trains and can finish it (it committed a step, none of its nodes is gone, and each of
/// them that announced it leaves has `margin_ms` of its notice left at `now_unix_ms`), so that
/// the step's work is committed rather than thrown away, as Parcae turns a notice into a
/// failure two steps later (spec 7.2); the next step otherwise (nothing trains, or the step in
/// flight cannot commit).
pub fn effective_step(state: &ControlState, now_unix_ms: u64, margin_ms: u64) -> u64 {
    let next = state.progress.next_step();
    let Some(plan) = state.plan.as_ref() else {
        return next;
    };
    let trains = state
        .progress
        .step_ends
        .back()
        .is_some_and(|e| e.epoch == plan.epoch);
    let finishes = plan.assignment.keys().all(|id| {
        state.members.get(id).is_some_and(|m| match m.status {
            MemberStatus::Leaving { deadline_ms } => {
                deadline_ms >= now_unix_ms.saturating_add(margin_ms)
            }
            status => departure(status).is_none(),
        })
    });
    if trains && finishes { next + 1 } else { next }
}

/// The plan running `target` from step `at_step`, slots matched to what nodes hold; over zones
/// (`zoned`), with the placement's stage bounds and every slot on a node of its zone. `None`
/// (logged) when the workers cannot be assigned to it.
pub fn build_plan(
    state: &ControlState,
    workers: &[NodeId],
    target: ParallelConfig,
    cost: &CostModel,
    zoned: Option<&Zoned>,
    at_step: u64,
) -> Option<Plan> {
    let current = state.plan.as_ref();
    let holdings: Vec<Holding<NodeId>> = workers.iter().map(|id| holding(current, *id)).collect();
    let layer_bytes: Vec<f64> = cost
        .spec
        .layers
        .iter()
        .map(|l| cost.spec.state_bytes(l.params))
        .collect();
    let placed = zoned.and_then(|z| Some((z, z.plans.placements.get(&target)?)));
    let shares = placed
        .and_then(|(_, placement)| placement.micro_batches.as_deref())
        .map_or_else(Vec::new, |m| batch_shares(m, cost.spec.global_batch));
    let (bounds, assigned) = match placed {
        Some((z, placement)) => {
            let bounds = placement.bounds.clone();
            let a = assign_in_zones(
                &holdings,
                target,
                &bounds,
                &layer_bytes,
                &z.node_zones,
                &placement.slot_zones(),
            );
            (bounds, a)
        }
        None => {
            if zoned.is_some() {
                tracing::warn!("no placement over the zones for {target}: planned as one zone");
            }
            let bounds = partition(cost.spec.layers.len(), target.p as usize);
            let a = assign(&holdings, target, &bounds, &layer_bytes);
            (bounds, a)
        }
    };
    let a = match assigned {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("no assignment for {target}: {e}");
            return None;
        }
    };
    Some(Plan {
        epoch: state.latest_epoch() + 1,
        data_parallel: target.d,
        pipeline_stages: target.p,
        partition: bounds.iter().map(|b| *b as u32).collect(),
        assignment: a
            .slots
            .into_iter()
            .map(|(id, s)| {
                let slot = StageSlot {
                    pipeline: s.pipeline,
                    stage: s.stage,
                };
                (id, slot)
            })
            .collect(),
        at_step,
        joins_before: state.next_join_seq,
        batch_shares: shares,
        all_reduce: placed.map_or(AllReduce::Ring, |(_, placement)| placement.all_reduce),
    })
}

/// The number of the next availability interval.
pub fn next_interval(state: &ControlState) -> u64 {
    state.availability.back().map_or(0, |s| s.interval + 1)
}

/// The availability command for the next interval: the count of healthy members, and their
/// count by pool (zone, or zone and instance type: [`super::zones::pool_of`]) when every one
/// said its zone (what a planner over zones forecasts each pool from), continuing the
/// replicated sequence (so a new leader goes on where the old one stopped).
pub fn availability_tick(state: &ControlState) -> Command {
    // By name: the record keeps the counts in the names' order.
    let mut by_zone: BTreeMap<String, u32> = BTreeMap::new();
    let mut unnamed = 0;
    for (id, _) in state.members.iter().filter(|(_, m)| m.status.is_healthy()) {
        match pool_of(state, id) {
            Some(pool) => *by_zone.entry(pool.to_string()).or_default() += 1,
            None => unnamed += 1,
        }
    }
    let named = unnamed == 0 && by_zone.len() <= limits::MAX_SAMPLE_POOLS;
    Command::AvailabilityTick {
        interval: next_interval(state),
        count: by_zone.values().sum::<u32>() + unnamed,
        pools: if named {
            by_zone
                .into_iter()
                .map(|(pool, nodes)| PoolCount { pool, nodes })
                .collect()
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::state::{MemberStatus, PeerInfo};

    #[test]
    fn only_members_that_train_the_cluster_s_job_are_workers() {
        use parcae_consensus::state::Job;
        let job = |seed: &str| Job {
            settings: [("seed".to_string(), seed.to_string())].into(),
        };
        let mut state = ControlState::default();
        for (n, seed) in [(1u8, Some("3")), (2, Some("4")), (3, None)] {
            let peer = PeerInfo {
                peer_id: vec![n],
                data_addr: Some(format!("127.0.0.1:700{n}")),
                job: seed.map(|s| job(s).digest()),
                ..PeerInfo::default()
            };
            let node = NodeId::from_peer_bytes(&[n]);
            state.apply(&Command::Join { node, peer }).unwrap();
        }
        assert!(workers(&state).is_empty(), "no job defined yet");
        state.apply(&Command::DefineJob { job: job("3") }).unwrap();
        let ids: Vec<NodeId> = workers(&state);
        assert_eq!(ids, vec![NodeId::from_peer_bytes(&[1])]);
    }

    #[test]
    fn a_plan_waits_for_the_step_in_flight_when_the_plan_in_force_can_finish_it() {
        use parcae_consensus::state::StepEnd;
        let mut state = ControlState::default();
        let ids: Vec<NodeId> = (1..=2u8)
            .map(|n| {
                let node = NodeId::from_peer_bytes(&[n]);
                let peer = PeerInfo {
                    peer_id: vec![n],
                    ..PeerInfo::default()
                };
                state.apply(&Command::Join { node, peer }).unwrap();
                node
            })
            .collect();
        assert_eq!(
            effective_step(&state, 0, 0),
            0,
            "no plan: nothing in flight"
        );
        state.plan = Some(Plan {
            epoch: 2,
            data_parallel: 1,
            pipeline_stages: 2,
            partition: vec![0, 1, 2],
            assignment: ids
                .iter()
                .enumerate()
                .map(|(s, id)| {
                    let slot = StageSlot {
                        pipeline: 0,
                        stage: s as u32,
                    };
                    (*id, slot)
                })
                .collect(),
            at_step: 4,
            joins_before: 2,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        state.progress.last_committed_step = Some(4);
        let end = |epoch: u64| StepEnd {
            step: 4,
            epoch,
            sample_cursor: 0,
            optimizer: Default::default(),
        };
        state.progress.step_ends.push_back(end(1));
        assert_eq!(
            effective_step(&state, 0, 0),
            5,
            "the plan in force has not trained yet: its move is replaced"
        );
        state.progress.step_ends.push_back(end(2));
        assert_eq!(effective_step(&state, 0, 0), 6, "step 5 is in flight");
        let member = |state: &mut ControlState, status: MemberStatus| {
            state.members.get_mut(&ids[1]).unwrap().status = status;
        };
        member(
            &mut state,
            MemberStatus::Leaving {
                deadline_ms: 10_000,
            },
        );
        assert_eq!(effective_step(&state, 7_000, 3_000), 6, "time to finish it");
        assert_eq!(
            effective_step(&state, 7_001, 3_000),
            5,
            "not enough of the notice left"
        );
        member(&mut state, MemberStatus::Lost);
        assert_eq!(
            effective_step(&state, 0, 0),
            5,
            "a node of the plan is gone"
        );
    }

    #[test]
    fn next_interval_continues_the_replicated_sequence() {
        let mut state = ControlState::default();
        for n in 1..=4u8 {
            let join = Command::Join {
                node: NodeId::from_peer_bytes(&[n]),
                peer: PeerInfo {
                    peer_id: vec![n],
                    ..PeerInfo::default()
                },
            };
            state.apply(&join).unwrap();
        }
        let first = availability_tick(&state);
        assert_eq!(
            first,
            Command::AvailabilityTick {
                interval: 0,
                count: 4,
                pools: Vec::new(),
            }
        );
        state.apply(&first).unwrap();
        state
            .members
            .get_mut(&NodeId::from_peer_bytes(&[2]))
            .unwrap()
            .status = MemberStatus::Lost;
        assert_eq!(
            availability_tick(&state),
            Command::AvailabilityTick {
                interval: 1,
                count: 3,
                pools: Vec::new(),
            }
        );
    }

    #[test]
    fn the_tick_counts_healthy_members_by_zone_when_every_one_names_its_zone() {
        let mut state = ControlState::default();
        for (n, zone) in [(1u8, "b"), (2, "a"), (3, "b"), (4, "b")] {
            let peer = PeerInfo {
                peer_id: vec![n],
                caps: parcae_consensus::state::Capabilities {
                    zone: zone.into(),
                    ..Default::default()
                },
                ..PeerInfo::default()
            };
            let node = NodeId::from_peer_bytes(&[n]);
            state.apply(&Command::Join { node, peer }).unwrap();
        }
        state
            .members
            .get_mut(&NodeId::from_peer_bytes(&[3]))
            .unwrap()
            .status = MemberStatus::Lost;
        let zone = |pool: &str, nodes| PoolCount {
            pool: pool.into(),
            nodes,
        };
        let tick = availability_tick(&state);
        assert_eq!(
            tick,
            Command::AvailabilityTick {
                interval: 0,
                count: 3,
                pools: vec![zone("a", 1), zone("b", 2)],
            }
        );
        state.apply(&tick).unwrap();
        // A member that does not say its zone: the count alone.
        let peer = PeerInfo {
            peer_id: vec![5],
            ..PeerInfo::default()
        };
        let node = NodeId::from_peer_bytes(&[5]);
        state.apply(&Command::Join { node, peer }).unwrap();
        assert_eq!(
            availability_tick(&state),
            Command::AvailabilityTick {
                interval: 1,
                count: 4,
                pools: Vec::new(),
            }
        );
    }
}
