//! Leader and housekeeping duties run after each `drive`: snapshots that compact the log, and
//! the membership planner's configuration changes and leader transfers.

use std::collections::BTreeSet;

use raft::StateRole;
use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2};

use super::RaftNode;
use crate::ids::NodeId;
use crate::membership::{ConfStep, MembershipAction, RaftConf, plan_membership};

impl RaftNode {
    pub(super) fn maybe_snapshot(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        let requested = self.raw.store().take_snapshot_request();
        let due = applied >= self.last_snapshot_index + self.config.snapshot_interval;
        if applied <= self.last_snapshot_index || !(requested || due) {
            return;
        }
        let result = self
            .state
            .encode_snapshot()
            .map_err(|e| e.to_string())
            .and_then(|data| {
                self.raw
                    .mut_store()
                    .create_snapshot(applied, self.applied_conf.clone(), data)
                    .map_err(|e| e.to_string())
            });
        match result {
            Ok(()) => {
                self.last_snapshot_index = applied;
                self.metrics.snapshots_created += 1;
            }
            Err(error) => {
                self.metrics.snapshot_failures += 1;
                tracing::warn!(applied, %error, "snapshot failed");
            }
        }
    }

    /// Runs the membership planner on the leader; returns whether it proposed something.
    pub(super) fn plan_membership(&mut self) -> bool {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader
            || raft.has_pending_conf()
            || raft.lead_transferee.is_some()
            || raft.raft_log.applied < raft.raft_log.committed
        {
            return false;
        }
        let last = raft.raft_log.last_index();
        let slack = self.config.catch_up_slack;
        let me = self.config.id;
        let caught_up: BTreeSet<NodeId> = raft
            .prs()
            .iter()
            .filter(|(id, pr)| **id == me.0 || (pr.recent_active && pr.matched + slack >= last))
            .map(|(id, _)| NodeId(*id))
            .collect();
        let conf = RaftConf::from_conf_state(&raft.prs().conf().to_conf_state());
        let Some(action) =
            plan_membership(&self.state, &conf, me, &caught_up, self.config.max_voters)
        else {
            return false;
        };
        tracing::info!(?action, "membership change");
        self.metrics.membership_proposals += 1;
        match action {
            MembershipAction::TransferLeader(to) => {
                self.raw.transfer_leader(to.0);
                // Transfer takes effect through messages; nothing more to plan now.
                false
            }
            MembershipAction::LeaveJoint => self.propose_conf(ConfChangeV2::default()),
            MembershipAction::Change(steps) => {
                let mut cc = ConfChangeV2::default();
                cc.set_transition(ConfChangeTransition::Auto);
                for step in steps {
                    let (node, change_type) = match step {
                        ConfStep::AddVoter(n) => (n, ConfChangeType::AddNode),
                        ConfStep::AddLearner(n) => (n, ConfChangeType::AddLearnerNode),
                        ConfStep::Remove(n) => (n, ConfChangeType::RemoveNode),
                    };
                    let mut single = ConfChangeSingle {
                        node_id: node.0,
                        ..ConfChangeSingle::default()
                    };
                    single.set_change_type(change_type);
                    cc.changes.push(single);
                }
                self.propose_conf(cc)
            }
        }
    }

    pub(super) fn propose_conf(&mut self, cc: ConfChangeV2) -> bool {
        match self.raw.propose_conf_change(Vec::new(), cc) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "membership proposal refused");
                false
            }
        }
    }
}
