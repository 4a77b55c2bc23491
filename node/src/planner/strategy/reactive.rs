//! `reactive`: Parcae's throughput-optimised baseline (spec 5), a checkpoint-restart system.
//! On every change of its nodes (one arrived, or one is gone, even a spare) it restarts from
//! checkpoints into the throughput-optimal configuration for the nodes present, even when that
//! is the configuration running; it never changes plan without one. A member that announced it
//! leaves works on until it is gone.

use std::collections::BTreeSet;

use parcae_consensus::NodeId;
use parcae_strategies::ParallelConfig;

use super::{Situation, Strategy};
use crate::planner::build::present;

/// The strategy: the nodes the plan in force was made for, and those of its last choice.
#[derive(Default)]
pub struct Reactive {
    /// The epoch of the plan in force (`None` without one) and the nodes it was made for.
    in_force: Option<(Option<u64>, BTreeSet<NodeId>)>,
    /// The nodes present at the last choice, until a new plan is in force (a proposal that
    /// never commits leaves the change to be chosen for again).
    chosen: Option<BTreeSet<NodeId>>,
}

impl Strategy for Reactive {
    fn acts_on_notices(&self) -> bool {
        false
    }

    fn restarts_in_place(&self) -> bool {
        true
    }

    fn choose(&mut self, at: &Situation<'_>) -> Option<ParallelConfig> {
        let present = present(at.state);
        let epoch = at.state.plan.as_ref().map(|p| p.epoch);
        if self.in_force.as_ref().is_none_or(|(e, _)| *e != epoch) {
            // A plan came into force: made for the nodes of the last choice, or, one this
            // leader did not choose, for the nodes present.
            let nodes = self.chosen.take().unwrap_or_else(|| present.clone());
            self.in_force = Some((epoch, nodes));
        }
        let changed = self.in_force.as_ref().is_some_and(|(_, n)| *n != present);
        if at.planned && !at.broken && !changed {
            return None;
        }
        self.chosen = Some(present);
        Some(at.cost.best(at.workers))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parcae_consensus::state::{Job, MemberStatus, PeerInfo, Plan};
    use parcae_consensus::{Command, ControlState};
    use parcae_strategies::cost::CostModel;

    use super::*;
    use crate::planner::build::workers;

    /// A cluster of `n` members training one job, with a plan of `running` in force at
    /// `epoch` when given.
    fn cluster(n: u8, running: Option<(ParallelConfig, u64)>) -> ControlState {
        let job = Job {
            settings: [("seed".to_string(), "3".to_string())].into(),
        };
        let mut state = ControlState::default();
        state
            .apply(&Command::DefineJob { job: job.clone() })
            .unwrap();
        for k in 1..=n {
            join(&mut state, k);
        }
        state.plan = running.map(|(c, epoch)| Plan {
            epoch,
            data_parallel: c.d,
            pipeline_stages: c.p,
            partition: Vec::new(),
            assignment: Default::default(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        state
    }

    fn join(state: &mut ControlState, k: u8) {
        let peer = PeerInfo {
            peer_id: vec![k],
            data_addr: Some(format!("127.0.0.1:{}", 7000 + u16::from(k))),
            job: state.job.as_ref().map(Job::digest),
            ..PeerInfo::default()
        };
        let node = NodeId::from_peer_bytes(&[k]);
        state.apply(&Command::Join { node, peer }).unwrap();
    }

    fn set_status(state: &mut ControlState, k: u8, status: MemberStatus) {
        let node = NodeId::from_peer_bytes(&[k]);
        state.members.get_mut(&node).unwrap().status = status;
    }

    /// What `reactive` chooses on `state` (broken or not).
    fn choice(
        reactive: &mut Reactive,
        state: &ControlState,
        cost: &Arc<CostModel>,
        broken: bool,
    ) -> Option<ParallelConfig> {
        let running = state.plan.as_ref().map_or(ParallelConfig::IDLE, |p| {
            ParallelConfig::new(p.data_parallel, p.pipeline_stages)
        });
        reactive.choose(&Situation {
            state,
            cost,
            workers: workers(state).len() as u32,
            running,
            planned: state.plan.is_some(),
            broken,
            zones: None,
        })
    }

    #[test]
    fn it_restarts_on_every_change_of_its_nodes_and_never_without_one() {
        let cost = Arc::new(CostModel::builtin("gpt-1.5b").unwrap());
        let mut reactive = Reactive::default();
        let mut state = cluster(31, None);
        let first = choice(&mut reactive, &state, &cost, false);
        assert_eq!(first, Some(cost.best(31)), "the first plan");
        // The plan came into force; something other than the best runs (costs measured since
        // changed the best): no restart without a change of nodes.
        let running = ParallelConfig::new(2, 15);
        assert_ne!(running, cost.best(31));
        state.plan = cluster(0, Some((running, 1))).plan;
        assert_eq!(choice(&mut reactive, &state, &cost, false), None);
        // A member announces it leaves: it works on.
        set_status(&mut state, 3, MemberStatus::Leaving { deadline_ms: 1 });
        assert_eq!(choice(&mut reactive, &state, &cost, false), None);
        // Gone: a restart into the best for the 30 left.
        set_status(&mut state, 3, MemberStatus::Lost);
        assert_eq!(
            choice(&mut reactive, &state, &cost, false),
            Some(cost.best(30))
        );
        state.plan = cluster(0, Some((cost.best(30), 2))).plan;
        assert_eq!(choice(&mut reactive, &state, &cost, false), None);
        // A node arrives whose count has the same best: a restart all the same, into it.
        join(&mut state, 40);
        assert_eq!(cost.best(31), cost.best(30), "the 31st is a spare");
        assert_eq!(
            choice(&mut reactive, &state, &cost, false),
            Some(cost.best(31))
        );
        assert!(
            reactive.restarts_in_place(),
            "kept as a restart by the decision"
        );
        // Its plan never came into force (a dropped proposal): chosen again.
        assert_eq!(
            choice(&mut reactive, &state, &cost, false),
            Some(cost.best(31))
        );
        state.plan = cluster(0, Some((cost.best(31), 3))).plan;
        assert_eq!(choice(&mut reactive, &state, &cost, false), None);
        // A plan broken by a departure is restarted.
        assert_eq!(
            choice(&mut reactive, &state, &cost, true),
            Some(cost.best(31))
        );
    }

    #[test]
    fn a_new_leader_takes_the_plan_in_force_as_made_for_the_nodes_present() {
        let cost = Arc::new(CostModel::builtin("gpt-1.5b").unwrap());
        let state = cluster(31, Some((ParallelConfig::new(2, 15), 7)));
        let mut reactive = Reactive::default();
        assert_eq!(choice(&mut reactive, &state, &cost, false), None);
    }
}
