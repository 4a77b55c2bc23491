//! When the leader may plan: the first plan once the workers of a new cluster stopped
//! arriving, a plan broken by departures once the other departures of the same boundary
//! arrived, and no second plan while one is on its way. Pure functions of the replicated state
//! and the times the planner saw things change.

use std::time::{Duration, Instant};

use parcae_consensus::state::MemberStatus;
use parcae_consensus::{ControlState, NodeId};

/// How long a proposed plan counts as on its way: after that (a dropped proposal, a change of
/// leader) the planner may propose again.
pub const PLAN_IN_FLIGHT: Duration = Duration::from_secs(2);

/// The last plan this planner proposed.
#[derive(Debug, Clone, Copy)]
pub struct Proposed {
    /// Its epoch.
    pub epoch: u64,
    /// Its effective step.
    pub at_step: u64,
    /// When it was proposed.
    pub at: Instant,
}

/// Whether the last proposed plan may still apply: its epoch is not reached yet, no step has
/// committed past its effective step (which would reject it), and it is younger than
/// [`PLAN_IN_FLIGHT`]. Planning again meanwhile would only put a duplicate in the log.
pub fn plan_on_its_way(state: &ControlState, proposed: Option<Proposed>, now: Instant) -> bool {
    proposed.is_some_and(|p| {
        p.epoch > state.latest_epoch()
            && state.progress.next_step() <= p.at_step
            && now.saturating_duration_since(p.at) < PLAN_IN_FLIGHT
    })
}

/// How long the set of workers must stay the same before the first plan: the nodes of a
/// cluster started together join over seconds (32 nodes started within 0.7 s on two busy
/// cores joined with gaps of more than a second, and a 1 s settle planned for 3 of them), and
/// planning at each arrival would restart training as many times.
pub const FIRST_PLAN_SETTLE: Duration = Duration::from_secs(3);

/// Until when the first plan waits: [`FIRST_PLAN_SETTLE`] after the set of workers last
/// changed (`workers_since`), if there is no plan yet; `None` when planning may go ahead.
pub fn first_plan_settles_until(
    state: &ControlState,
    workers_since: Instant,
    now: Instant,
) -> Option<Instant> {
    let settled = workers_since + FIRST_PLAN_SETTLE;
    (state.plan.is_none() && state.pending_plan.is_none() && now < settled).then_some(settled)
}

/// How long a plan broken by departures waits for more of them: the preemptions of one
/// interval boundary reach the leader over a second or so, one `Notice` at a time (the 32-node
/// hh replay re-planned at every arriving notice, gossip and a commit apart; a notice comes 30 s,
/// on AWS 120 s, before its deadline), and members killed together are marked lost a liveness
/// check or two apart (the reactive hh replay: three killed at once, marked 0.1 s apart, cost
/// two restarts). Planning at each would reconfigure as many times. The testnet's simulator
/// charges it, with the lost timeout, to every kill without notice
/// (`parcae-testnet`'s `predicted::DEPARTURE_SETTLE_MS`).
pub const DEPARTURE_SETTLE: Duration = Duration::from_millis(500);

/// How a member is on its way out, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// It announced its preemption and still works until its deadline.
    Announced,
    /// It is gone without notice (found lost).
    Gone,
}

/// The one rule of departures: a leaving member announced it, a lost one is gone.
pub fn departure(status: MemberStatus) -> Option<Departure> {
    match status {
        MemberStatus::Leaving { .. } => Some(Departure::Announced),
        MemberStatus::Lost => Some(Departure::Gone),
        MemberStatus::Active | MemberStatus::Spare => None,
    }
}

/// Members of the cluster departing in one of the ways `counts` accepts.
pub fn departing_members(state: &ControlState, counts: impl Fn(Departure) -> bool) -> u32 {
    state
        .members
        .values()
        .filter(|m| departure(m.status).is_some_and(&counts))
        .count() as u32
}

/// The members of the plan in force that are gone (lost, or no longer members) or, when
/// `notices` (the strategy acts on them), announced they leave: in id order.
pub fn departing_from_plan(state: &ControlState, notices: bool) -> Vec<NodeId> {
    state.plan.as_ref().map_or_else(Vec::new, |plan| {
        plan.assignment
            .keys()
            .filter(|id| {
                state
                    .members
                    .get(id)
                    .is_none_or(|m| match departure(m.status) {
                        Some(Departure::Gone) => true,
                        Some(Departure::Announced) => notices,
                        None => false,
                    })
            })
            .copied()
            .collect()
    })
}

/// Until when a plan that departures broke waits for more of them: [`DEPARTURE_SETTLE`] after
/// the set of its departing members (`departing`) last changed (`since`); `None` when planning
/// may go ahead.
pub fn departures_settle_until(
    departing: &[NodeId],
    since: Instant,
    now: Instant,
) -> Option<Instant> {
    let settled = since + DEPARTURE_SETTLE;
    (!departing.is_empty() && now < settled).then_some(settled)
}

/// A plan made between two ticks (a departure brought the interval's decision forward): the
/// last interval recorded when it was made, and the workers it was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedEarly {
    /// The last availability interval recorded then.
    pub recorded: Option<u64>,
    /// The workers then.
    pub workers: Vec<NodeId>,
}

/// Whether the tick that ends the interval after `recorded` decides: the planner decides once
/// an interval, as the simulator does, and a departure brings the decision forward; the tick
/// decides again only if workers arrived since (`workers` not all among `early`'s). A boundary's
/// notices come before it, its arrivals after, and the tick a few seconds later: deciding at the
/// notice and again at the tick made two moves for one boundary where the simulator makes one
/// (pairs of re-plans seconds apart in the lh liveput-predict rounds).
pub fn tick_decides(
    early: Option<&DecidedEarly>,
    recorded: Option<u64>,
    workers: &[NodeId],
) -> bool {
    !early.is_some_and(|e| e.recorded == recorded && workers.iter().all(|w| e.workers.contains(w)))
}

/// A value as last seen and since when it has been so: the workers, the departing members.
#[derive(Debug)]
pub struct Since<T> {
    seen: Option<(T, Instant)>,
}

impl<T> Default for Since<T> {
    fn default() -> Self {
        Self { seen: None }
    }
}

impl<T: PartialEq> Since<T> {
    /// Notes `value` at `now`; returns since when it has been unchanged.
    pub fn observe(&mut self, value: T, now: Instant) -> Instant {
        match &self.seen {
            Some((seen, since)) if *seen == value => *since,
            _ => {
                self.seen = Some((value, now));
                now
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::Command;
    use parcae_consensus::state::{PeerInfo, Plan, StageSlot};

    #[test]
    fn the_first_plan_waits_for_the_workers_to_settle() {
        let state = ControlState::default();
        let t0 = Instant::now();
        assert_eq!(
            first_plan_settles_until(&state, t0, t0),
            Some(t0 + FIRST_PLAN_SETTLE)
        );
        assert_eq!(
            first_plan_settles_until(&state, t0, t0 + FIRST_PLAN_SETTLE),
            None
        );
        let mut planned = state.clone();
        planned.plan = Some(Plan {
            epoch: 1,
            data_parallel: 1,
            pipeline_stages: 1,
            partition: vec![0, 1],
            assignment: Default::default(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        assert_eq!(
            first_plan_settles_until(&planned, t0, t0),
            None,
            "a broken plan is replaced at once"
        );
    }

    #[test]
    fn a_plan_broken_by_departures_waits_for_the_other_departures_of_the_boundary() {
        let mut state = ControlState::default();
        let ids: Vec<NodeId> = (1..=3u8)
            .map(|n| {
                let id = NodeId::from_peer_bytes(&[n]);
                state
                    .apply(&Command::Join {
                        node: id,
                        peer: PeerInfo {
                            peer_id: vec![n],
                            ..PeerInfo::default()
                        },
                    })
                    .unwrap();
                id
            })
            .collect();
        state.plan = Some(Plan {
            epoch: 1,
            data_parallel: 3,
            pipeline_stages: 1,
            partition: vec![0, 1],
            assignment: ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let slot = StageSlot {
                        pipeline: i as u32,
                        stage: 0,
                    };
                    (*id, slot)
                })
                .collect(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        let t0 = Instant::now();
        let settle = |notices: bool, since: Instant, now: Instant, state: &ControlState| {
            departures_settle_until(&departing_from_plan(state, notices), since, now)
        };
        assert_eq!(settle(true, t0, t0, &state), None, "nobody departs");
        for id in &ids[..2] {
            state
                .apply(&Command::Notice {
                    node: *id,
                    deadline_ms: 10_000,
                })
                .unwrap();
        }
        let mut noticed = ids[..2].to_vec();
        noticed.sort();
        assert_eq!(departing_from_plan(&state, true), noticed);
        assert_eq!(settle(true, t0, t0, &state), Some(t0 + DEPARTURE_SETTLE));
        assert_eq!(settle(true, t0, t0 + DEPARTURE_SETTLE, &state), None);
        assert!(
            departing_from_plan(&state, false).is_empty(),
            "notices do not count for a strategy that ignores them"
        );
        let mut lost = state.clone();
        lost.apply(&Command::Lost { node: ids[2] }).unwrap();
        assert_eq!(
            departing_from_plan(&lost, false),
            vec![ids[2]],
            "a member gone without notice counts for every strategy"
        );
        assert_eq!(
            settle(false, t0, t0, &lost),
            Some(t0 + DEPARTURE_SETTLE),
            "losses marked one liveness check apart make one plan"
        );
        state.apply(&Command::Leave { node: ids[0] }).unwrap();
        assert_eq!(
            departing_from_plan(&state, true),
            noticed,
            "a member that left is still gone from the plan"
        );
    }

    #[test]
    fn an_interval_decided_at_its_departures_is_decided_again_only_for_arrivals() {
        let id = |n: u8| NodeId::from_peer_bytes(&[n]);
        let (a, b, c) = (id(1), id(2), id(3));
        assert!(
            tick_decides(None, Some(4), &[a, b]),
            "nothing decided early"
        );
        let early = DecidedEarly {
            recorded: Some(4),
            workers: vec![a, b],
        };
        assert!(
            !tick_decides(Some(&early), Some(4), &[a, b]),
            "the notice made the interval's decision"
        );
        assert!(
            !tick_decides(Some(&early), Some(4), &[a]),
            "a departure since is the plan's to handle, not the tick's"
        );
        assert!(
            tick_decides(Some(&early), Some(4), &[a, b, c]),
            "a worker arrived since"
        );
        assert!(
            tick_decides(Some(&early), Some(5), &[a, b]),
            "decided in an earlier interval"
        );
    }

    #[test]
    fn a_proposed_plan_is_on_its_way_until_applied_overtaken_or_old() {
        let state = ControlState::default();
        let t0 = Instant::now();
        let proposed = Some(Proposed {
            epoch: 1,
            at_step: 0,
            at: t0,
        });
        assert!(plan_on_its_way(&state, proposed, t0));
        assert!(!plan_on_its_way(&state, None, t0));
        assert!(
            !plan_on_its_way(&state, proposed, t0 + PLAN_IN_FLIGHT),
            "given up on"
        );
        let stale = Some(Proposed {
            epoch: 1,
            at_step: 0,
            at: t0,
        });
        let mut stepped = state.clone();
        stepped.progress.last_committed_step = Some(0);
        assert!(
            !plan_on_its_way(&stepped, stale, t0),
            "a step committed past its effective step: it will be rejected"
        );
    }
}
