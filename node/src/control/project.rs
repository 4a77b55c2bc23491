//! The control plane's part of `/status`: a pure projection of the replicated state, raft's
//! status and what only this node saw (connections, notices, commit latencies).

use std::collections::{HashMap, HashSet};

use libp2p::PeerId;
use parcae_consensus::state::{KeyId, MemberStatus, RaftRole};
use parcae_consensus::{ControlState, NodeId, NodeStatus, Role};

use crate::status::{
    ClockRefusalView, LatencySummary, MemberState, MemberView, NoticeView, Placement, RoleView,
    StatusSnapshot,
};

/// What only this node knows, as shown on `/status`.
pub struct LocalView<'a> {
    /// This node's peer id.
    pub me: PeerId,
    /// The current leader's peer id, if known.
    pub leader: Option<PeerId>,
    /// Listen addresses.
    pub listen_addrs: Vec<String>,
    /// Data-plane address, when it trains.
    pub data_addr: Option<String>,
    /// Peers connected right now.
    pub connected: Vec<PeerId>,
    /// Its own leave deadline (unix ms), once it got a notice.
    pub leaving_deadline_unix_ms: Option<u64>,
    /// Notices received or issued, oldest first.
    pub notices: &'a [NoticeView],
    /// Proposals refused for their signing time, oldest first.
    pub clock_refusals: &'a [ClockRefusalView],
    /// Proposal-to-apply latencies of its own commands, ascending (µs).
    pub sorted_commit_latency_us: &'a [u64],
    /// Fingerprints of the cluster keys it holds.
    pub keys_held: Vec<KeyId>,
}

/// Peer ids as `/status` writes them (base58), remembered between projections: base58 is a
/// pass over the id's bytes per output digit, and the status is projected on every ready cycle
/// for every member and connection (at 32 nodes it was 13 % of the control thread's time).
#[derive(Debug, Default)]
pub struct PeerNames(HashMap<Vec<u8>, String>);

impl PeerNames {
    /// The name of the peer whose id is `bytes` (empty for bytes that are not a peer id).
    fn of_bytes(&mut self, bytes: &[u8]) -> String {
        if let Some(name) = self.0.get(bytes) {
            return name.clone();
        }
        let name = PeerId::from_bytes(bytes)
            .map(|p| p.to_string())
            .unwrap_or_default();
        self.0.insert(bytes.to_vec(), name.clone());
        name
    }

    fn of(&mut self, peer: &PeerId) -> String {
        self.of_bytes(&peer.to_bytes())
    }

    /// Forgets every name once there are more than `2 * in_use + 2`: peers that left are
    /// dropped, and one projection names again those still here.
    fn bound(&mut self, in_use: usize) {
        if self.0.len() > 2 * in_use + 2 {
            self.0.clear();
        }
    }
}

/// The `/status` snapshot; `names` keeps the peers' names for the next one.
pub fn project(
    local: LocalView<'_>,
    raft: &NodeStatus,
    state: &ControlState,
    names: &mut PeerNames,
) -> StatusSnapshot {
    names.bound(state.members.len() + local.connected.len() + 2);
    let voters: HashSet<NodeId> = raft.voters.iter().copied().collect();
    let members = state
        .members
        .iter()
        .map(|(id, m)| MemberView {
            peer_id: names.of_bytes(&m.peer.peer_id),
            // Before the first configuration is applied, the recorded role is all there is.
            voter: voters.contains(id) || m.role == RaftRole::Voter && voters.is_empty(),
            status: match m.status {
                MemberStatus::Active => MemberState::Active,
                MemberStatus::Spare => MemberState::Spare,
                MemberStatus::Leaving { .. } => MemberState::Leaving,
                MemberStatus::Lost => MemberState::Lost,
            },
            deadline_unix_ms: match m.status {
                MemberStatus::Leaving { deadline_ms } => Some(deadline_ms),
                _ => None,
            },
            placement: Placement {
                zone: m.peer.caps.zone.clone(),
                instance_type: m.peer.caps.instance_type.clone(),
                device: m.peer.caps.device.clone(),
            },
        })
        .collect();
    StatusSnapshot {
        peer_id: names.of(&local.me),
        role: role_view(raft.role),
        leader: local.leader.map(|p| names.of(&p)),
        term: raft.term,
        members,
        epoch: state.plan.as_ref().map_or(0, |p| p.epoch),
        config: state
            .plan
            .as_ref()
            .map(|p| (p.data_parallel, p.pipeline_stages)),
        step: state.progress.last_committed_step.unwrap_or(0),
        loss: state.progress.recent_losses.back().map(|l| l.loss),
        job: state.job.as_ref().map(|j| j.settings.clone()),
        validation_loss: state.progress.last_validation.map(|v| v.loss),
        validation_step: state.progress.last_validation.map(|v| v.step),
        samples: state.progress.sample_cursor,
        history: state.progress.history,
        rolled_back_steps: state.progress.rolled_back_steps,
        checkpoint_step: state.newest_complete_cut().map(|c| c.end.step),
        commit_index: raft.commit,
        applied_index: raft.applied,
        listen_addrs: local.listen_addrs,
        data_addr: local.data_addr,
        connected_peers: local.connected.iter().map(|p| names.of(p)).collect(),
        leaving_deadline_unix_ms: local.leaving_deadline_unix_ms,
        notices: local.notices.to_vec(),
        // Readiness is the `Status` actor's to judge, on the whole snapshot.
        not_ready: None,
        clock_refusals: local.clock_refusals.to_vec(),
        commit_latency_us: LatencySummary::of_sorted(local.sorted_commit_latency_us),
        // The trainer's side and the notice watch are the `Status` actor's to add.
        training: None,
        migrations: Vec::new(),
        notice_provider: None,
        keys_held: local.keys_held.iter().map(hex::encode).collect(),
        key_in_force: state.cluster_key.map(hex::encode),
    }
}

/// Raft's five roles as the three `/status` distinguishes (and learners).
fn role_view(role: Role) -> RoleView {
    match role {
        Role::Leader => RoleView::Leader,
        Role::Follower => RoleView::Follower,
        Role::Candidate | Role::PreCandidate => RoleView::Candidate,
        Role::Learner => RoleView::Learner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::membership::{join_needed, peer_info};
    use parcae_consensus::Command;

    fn local(me: PeerId) -> LocalView<'static> {
        LocalView {
            me,
            leader: Some(me),
            listen_addrs: vec!["/ip4/127.0.0.1/tcp/1".into()],
            data_addr: None,
            connected: Vec::new(),
            leaving_deadline_unix_ms: None,
            notices: &[],
            clock_refusals: &[],
            sorted_commit_latency_us: &[10, 20, 30, 40],
            keys_held: vec![[7; 8]],
        }
    }

    fn raft_status(role: Role, voters: Vec<NodeId>) -> NodeStatus {
        NodeStatus {
            id: NodeId(0),
            role,
            leader: None,
            term: 3,
            commit: 9,
            applied: 8,
            voters,
            learners: Vec::new(),
        }
    }

    #[test]
    fn peer_names_are_the_ids_base58_and_stay_bounded() {
        let mut names = PeerNames::default();
        let peers: Vec<PeerId> = (0..10).map(|_| PeerId::random()).collect();
        for p in &peers {
            assert_eq!(names.of(p), p.to_string());
            assert_eq!(names.of_bytes(&p.to_bytes()), p.to_string());
        }
        assert_eq!(names.of_bytes(b"not a peer id"), "");
        assert_eq!(names.0.len(), 11);
        names.bound(5);
        assert_eq!(names.0.len(), 11);
        names.bound(4);
        assert!(names.0.is_empty());
        assert_eq!(names.of(&peers[3]), peers[3].to_string());
    }

    #[test]
    fn members_show_their_raft_voting_and_their_duty() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut state = ControlState::default();
        for p in [a, b] {
            let join = join_needed(
                &state,
                &peer_info(&p, &[], None, None, Vec::new(), Default::default()),
                std::time::Duration::ZERO,
                std::time::Duration::MAX,
            )
            .unwrap();
            state.apply(&join).unwrap();
        }
        let b_id = NodeId::from_peer_bytes(&b.to_bytes());
        state
            .apply(&Command::Notice {
                node: b_id,
                deadline_ms: 77,
            })
            .unwrap();
        let a_id = NodeId::from_peer_bytes(&a.to_bytes());
        let snapshot = project(
            local(a),
            &raft_status(Role::PreCandidate, vec![a_id]),
            &state,
            &mut PeerNames::default(),
        );
        assert_eq!(snapshot.role, RoleView::Candidate);
        assert_eq!(
            (snapshot.term, snapshot.commit_index, snapshot.applied_index),
            (3, 9, 8)
        );
        assert_eq!(snapshot.leader, Some(a.to_string()));
        let view = |p: PeerId| {
            snapshot
                .members
                .iter()
                .find(|m| m.peer_id == p.to_string())
                .unwrap()
                .clone()
        };
        assert!(view(a).voter && view(a).status == MemberState::Spare);
        assert!(!view(b).voter);
        assert_eq!(
            (view(b).status, view(b).deadline_unix_ms),
            (MemberState::Leaving, Some(77))
        );
        assert_eq!(snapshot.commit_latency_us.p50, 20);
        assert_eq!(snapshot.commit_latency_us.max, 40);
        assert_eq!(snapshot.epoch, 0);
        assert_eq!(snapshot.config, None);
        assert_eq!(snapshot.keys_held, vec!["0707070707070707".to_string()]);
        assert_eq!(snapshot.key_in_force, None);
    }
}
