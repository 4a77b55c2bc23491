//! The membership planner: which raft configuration change the leader proposes next.
//!
//! A pure function of the replicated state, the applied raft configuration and which learners
//! are caught up, so it is tested on its own and any new leader continues where the old one
//! stopped. Rules:
//!
//! * every member that is healthy and not in the configuration is added as a learner;
//! * configuration nodes that are lost or no longer members are removed;
//! * the voters are the healthy voters plus the most stable caught-up learners (smallest join
//!   order), at most `max_voters` and an odd number (an even count adds no fault tolerance);
//!   a learner that is behind is promoted once it caught up, and meanwhile no healthy voter is
//!   demoted just to make the count odd;
//! * voters that got a notice (leaving) are demoted to learners, lost voters removed: all of it in
//!   one ConfChangeV2, which raft-rs runs as joint consensus with automatic leave;
//! * the leader never demotes itself: it hands leadership to the most stable remaining voter
//!   first (raft-rs does not step down a demoted leader);
//! * a joint configuration left behind by a previous leader is left explicitly.

use std::collections::BTreeSet;

use crate::ids::NodeId;
use crate::state::ControlState;

/// One node's change within a configuration change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfStep {
    /// Make the node a voter (promotes a learner).
    AddVoter(NodeId),
    /// Make the node a learner (adds a new node, or demotes a voter).
    AddLearner(NodeId),
    /// Remove the node from the configuration.
    Remove(NodeId),
}

/// What the leader should do about membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipAction {
    /// Propose these changes as one ConfChangeV2 (sorted, one per node).
    Change(Vec<ConfStep>),
    /// Leave the current joint configuration.
    LeaveJoint,
    /// Hand leadership to this voter before the leader's own demotion.
    TransferLeader(NodeId),
}

/// The applied raft configuration, as sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RaftConf {
    /// Voters of the (incoming) configuration.
    pub voters: BTreeSet<NodeId>,
    /// Learners.
    pub learners: BTreeSet<NodeId>,
    /// Whether the configuration is joint (outgoing voters present).
    pub joint: bool,
}

impl RaftConf {
    /// Converts raft-rs's `ConfState`.
    pub fn from_conf_state(cs: &raft::eraftpb::ConfState) -> RaftConf {
        RaftConf {
            voters: cs.voters.iter().map(|&v| NodeId(v)).collect(),
            learners: cs
                .learners
                .iter()
                .chain(cs.learners_next.iter())
                .map(|&v| NodeId(v))
                .collect(),
            joint: !cs.voters_outgoing.is_empty(),
        }
    }
}

/// Largest odd number <= `n` (0 for 0).
fn odd_floor(n: usize) -> usize {
    if n == 0 { 0 } else { n - (1 - n % 2) }
}

/// Plans the next membership action of `leader`; `None` when the configuration is as wanted.
pub fn plan_membership(
    state: &ControlState,
    conf: &RaftConf,
    leader: NodeId,
    caught_up: &BTreeSet<NodeId>,
    max_voters: usize,
) -> Option<MembershipAction> {
    if conf.joint {
        return Some(MembershipAction::LeaveJoint);
    }
    let member = |n: &NodeId| state.members.get(n);
    let healthy = |n: &NodeId| member(n).is_some_and(|m| m.status.is_healthy());
    let known =
        |n: &NodeId| member(n).is_some_and(|m| m.status != crate::state::MemberStatus::Lost);
    let stability = |n: &NodeId| (member(n).map_or(u64::MAX, |m| m.join_seq), *n);

    let mut keep: Vec<NodeId> = conf.voters.iter().copied().filter(|v| healthy(v)).collect();
    keep.sort_by_key(stability);
    let mut promotable: Vec<NodeId> = conf
        .learners
        .iter()
        .copied()
        .filter(|l| healthy(l) && caught_up.contains(l))
        .collect();
    promotable.sort_by_key(stability);

    // The target counts every healthy learner, caught up or not, so that a learner that is
    // momentarily behind does not make the leader demote a healthy voter to reach an odd count.
    let healthy_learners = conf.learners.iter().filter(|l| healthy(l)).count();
    let target = odd_floor(max_voters.min(keep.len() + healthy_learners));
    let mut new_voters: BTreeSet<NodeId> = keep
        .iter()
        .chain(promotable.iter())
        .take(target)
        .copied()
        .collect();
    if !new_voters.contains(&leader) {
        let successor = keep
            .iter()
            .find(|v| new_voters.contains(v) && caught_up.contains(v));
        if let Some(&to) = successor {
            return Some(MembershipAction::TransferLeader(to));
        }
        // No voter can take over yet: keep the leader a voter this round so that its
        // replacement is promoted first; the transfer happens on a later round.
        new_voters.insert(leader);
    }

    let mut steps = BTreeSet::new();
    for n in conf.voters.iter().chain(conf.learners.iter()) {
        if !known(n) && *n != leader {
            steps.insert(ConfStep::Remove(*n));
        }
    }
    for v in &conf.voters {
        if !new_voters.contains(v) && known(v) {
            steps.insert(ConfStep::AddLearner(*v));
        }
    }
    for v in &new_voters {
        if !conf.voters.contains(v) {
            steps.insert(ConfStep::AddVoter(*v));
        }
    }
    for (id, m) in &state.members {
        if m.status.is_healthy() && !conf.voters.contains(id) && !conf.learners.contains(id) {
            steps.insert(ConfStep::AddLearner(*id));
        }
    }
    if steps.is_empty() {
        None
    } else {
        Some(MembershipAction::Change(steps.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, MemberStatus, PeerInfo, RaftRole};

    fn peer(i: u8) -> PeerInfo {
        PeerInfo {
            peer_id: vec![i; 4],
            ..PeerInfo::default()
        }
    }

    fn id(i: u8) -> NodeId {
        NodeId::from_peer_bytes(&peer(i).peer_id)
    }

    /// A state with members 1..=n (in join order) and a configuration with the given voters;
    /// every other member is a learner.
    fn cluster(n: u8, voters: &[u8]) -> (ControlState, RaftConf) {
        let members: Vec<_> = (1..=n).map(|i| (peer(i), RaftRole::Learner)).collect();
        let state = ControlState::bootstrap(&members);
        let conf = RaftConf {
            voters: voters.iter().map(|&v| id(v)).collect(),
            learners: (1..=n).filter(|i| !voters.contains(i)).map(id).collect(),
            joint: false,
        };
        (state, conf)
    }

    fn all(n: u8) -> BTreeSet<NodeId> {
        (1..=n).map(id).collect()
    }

    fn sorted(mut steps: Vec<ConfStep>) -> MembershipAction {
        steps.sort();
        MembershipAction::Change(steps)
    }

    #[test]
    fn stable_configuration_needs_nothing() {
        let (state, conf) = cluster(7, &[1, 2, 3, 4, 5]);
        assert_eq!(plan_membership(&state, &conf, id(1), &all(7), 5), None);
    }

    #[test]
    fn grows_to_max_voters_with_most_stable_learners_and_odd_counts() {
        let (state, conf) = cluster(4, &[1]);
        // 4 healthy caught-up nodes: 3 voters (odd), learner 4 stays.
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(4), 5),
            Some(sorted(vec![
                ConfStep::AddVoter(id(2)),
                ConfStep::AddVoter(id(3))
            ]))
        );
        // A learner that is not caught up is not promoted.
        let caught: BTreeSet<_> = [1, 3, 4].map(id).into_iter().collect();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &caught, 5),
            Some(sorted(vec![
                ConfStep::AddVoter(id(3)),
                ConfStep::AddVoter(id(4))
            ]))
        );
        // 4 healthy voters and a lagging learner: nothing is demoted while it catches up.
        let (mut state, conf) = cluster(6, &[1, 2, 3, 4, 5]);
        state.apply(&Command::Lost { node: id(5) }).unwrap();
        let caught: BTreeSet<_> = [1, 2, 3, 4].map(id).into_iter().collect();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &caught, 5),
            Some(sorted(vec![ConfStep::Remove(id(5))]))
        );
    }

    #[test]
    fn leaving_voter_is_replaced_by_oldest_learner_in_one_change() {
        let (mut state, conf) = cluster(7, &[1, 2, 3, 4, 5]);
        state
            .apply(&Command::Notice {
                node: id(3),
                deadline_ms: 10,
            })
            .unwrap();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(7), 5),
            Some(sorted(vec![
                ConfStep::AddLearner(id(3)),
                ConfStep::AddVoter(id(6))
            ]))
        );
    }

    #[test]
    fn lost_voter_and_lost_learner_are_removed() {
        let (mut state, conf) = cluster(7, &[1, 2, 3, 4, 5]);
        state.apply(&Command::Lost { node: id(2) }).unwrap();
        state.apply(&Command::Lost { node: id(7) }).unwrap();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(7), 5),
            Some(sorted(vec![
                ConfStep::Remove(id(2)),
                ConfStep::Remove(id(7)),
                ConfStep::AddVoter(id(6)),
            ]))
        );
    }

    #[test]
    fn shrinking_keeps_an_odd_voter_count() {
        let (mut state, conf) = cluster(5, &[1, 2, 3, 4, 5]);
        state.apply(&Command::Lost { node: id(5) }).unwrap();
        // 4 healthy voters, no learner: down to 3, the least stable healthy voter is demoted.
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(5), 5),
            Some(sorted(vec![
                ConfStep::Remove(id(5)),
                ConfStep::AddLearner(id(4))
            ]))
        );
    }

    #[test]
    fn leaving_leader_transfers_leadership_first() {
        let (mut state, conf) = cluster(6, &[1, 2, 3, 4, 5]);
        state
            .apply(&Command::Notice {
                node: id(1),
                deadline_ms: 10,
            })
            .unwrap();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(6), 5),
            Some(MembershipAction::TransferLeader(id(2)))
        );
        // The new leader then demotes node 1 and promotes learner 6.
        assert_eq!(
            plan_membership(&state, &conf, id(2), &all(6), 5),
            Some(sorted(vec![
                ConfStep::AddLearner(id(1)),
                ConfStep::AddVoter(id(6))
            ]))
        );
    }

    #[test]
    fn single_leaving_voter_promotes_its_successor_before_transferring() {
        let (mut state, conf) = cluster(2, &[1]);
        state
            .apply(&Command::Notice {
                node: id(1),
                deadline_ms: 10,
            })
            .unwrap();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(2), 5),
            Some(sorted(vec![ConfStep::AddVoter(id(2))]))
        );
    }

    #[test]
    fn new_members_join_as_learners_and_joint_configs_are_left() {
        let (mut state, mut conf) = cluster(3, &[1, 2, 3]);
        let p = peer(9);
        state
            .apply(&Command::Join {
                node: id(9),
                peer: p,
            })
            .unwrap();
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(3), 5),
            Some(sorted(vec![ConfStep::AddLearner(id(9))]))
        );
        conf.joint = true;
        assert_eq!(
            plan_membership(&state, &conf, id(1), &all(3), 5),
            Some(MembershipAction::LeaveJoint)
        );
        assert_eq!(state.members[&id(9)].status, MemberStatus::Spare);
        assert_eq!(odd_floor(4), 3);
        assert_eq!(odd_floor(0), 0);
    }
}
