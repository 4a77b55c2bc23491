//! This node's own membership record, and which notices the leader still has to propose.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::{Multiaddr, PeerId};
use parcae_consensus::state::{Capabilities, Digest32, KeyId, MemberStatus, PeerInfo};
use parcae_consensus::{Command, ControlState, NodeId};

/// How long a proposed notice counts as on its way: after that (a dropped proposal, a change
/// of leader) the same notice may be proposed again.
pub const NOTICE_IN_FLIGHT: Duration = Duration::from_secs(1);

/// This node's identity, addresses, job, cluster keys and where it runs, as recorded in the
/// membership.
pub fn peer_info(
    peer: &PeerId,
    addrs: &[Multiaddr],
    data_addr: Option<String>,
    job: Option<Digest32>,
    keys: Vec<KeyId>,
    caps: Capabilities,
) -> PeerInfo {
    PeerInfo {
        peer_id: peer.to_bytes(),
        addrs: addrs.iter().map(|a| a.to_string()).collect(),
        data_addr,
        caps,
        job,
        keys,
    }
}

/// The `Join` this node must (re-)send: unless the replicated state already lists it healthy,
/// at the addresses, job and keys of `me`; and even then when it has known no leader for `leaderless_for`
/// of at least `patience`. Its state may be stale: a node that was down while the cluster
/// declared it lost and took it out of raft still reads itself healthy in its own log, cannot
/// be heard by the voters it remembers, and only the current leader can re-admit it. For a
/// member that is in fact healthy, the repeat `Join` changes nothing.
pub fn join_needed(
    state: &ControlState,
    me: &PeerInfo,
    leaderless_for: Duration,
    patience: Duration,
) -> Option<Command> {
    let node = NodeId::from_peer_bytes(&me.peer_id);
    let current = state.members.get(&node).is_some_and(|m| {
        m.status.is_healthy()
            && m.peer.addrs == me.addrs
            && m.peer.data_addr == me.data_addr
            && m.peer.job == me.job
            && m.peer.keys == me.keys
            && m.peer.caps == me.caps
    });
    (!current || leaderless_for >= patience).then(|| Command::Join {
        node,
        peer: me.clone(),
    })
}

/// The notices the leader has proposed and not yet seen applied.
///
/// A notice reaches the leader twice: gossiped by the leaving node, and as that node's own
/// proposal. Whichever comes first is proposed; the other, and any repeat, is dropped here
/// instead of taking a second trip through the log.
#[derive(Debug, Default)]
pub struct NoticesInFlight {
    proposed: HashMap<NodeId, (u64, Instant)>,
}

impl NoticesInFlight {
    /// Whether a notice that `node` leaves by `deadline_ms` would change the state and is not
    /// already on its way; if so, it is recorded as on its way from `now`.
    pub fn admit(
        &mut self,
        state: &ControlState,
        node: NodeId,
        deadline_ms: u64,
        now: Instant,
    ) -> bool {
        self.proposed
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < NOTICE_IN_FLIGHT);
        let recorded = match state.members.get(&node).map(|m| m.status) {
            Some(MemberStatus::Leaving { deadline_ms: d }) => d <= deadline_ms,
            Some(MemberStatus::Active | MemberStatus::Spare) => false,
            Some(MemberStatus::Lost) | None => true,
        };
        let on_its_way = self
            .proposed
            .get(&node)
            .is_some_and(|(d, _)| *d <= deadline_ms);
        if recorded || on_its_way {
            return false;
        }
        self.proposed.insert(node, (deadline_ms, now));
        true
    }
}

/// The configured listen addresses a peer can dial: port 0 and unspecified IPs are no way to
/// reach a node, which shows and announces the real ones as its swarm reports them.
pub fn dialable(configured: Vec<Multiaddr>) -> Vec<Multiaddr> {
    use libp2p::multiaddr::Protocol;
    let placeholder = |addr: &Multiaddr| {
        addr.iter().any(|p| match p {
            Protocol::Tcp(0) => true,
            Protocol::Ip4(ip) => ip.is_unspecified(),
            Protocol::Ip6(ip) => ip.is_unspecified(),
            _ => false,
        })
    };
    configured.into_iter().filter(|a| !placeholder(a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(3);

    fn joined(me: &PeerInfo) -> ControlState {
        let mut state = ControlState::default();
        state
            .apply(&join_needed(&state, me, Duration::ZERO, PATIENCE).unwrap())
            .unwrap();
        state
    }

    fn me() -> PeerInfo {
        peer_info(
            &PeerId::random(),
            &["/ip4/127.0.0.1/tcp/4001".parse().unwrap()],
            Some("127.0.0.1:5001".into()),
            Some([1; 32]),
            vec![[1; 8]],
            Capabilities::default(),
        )
    }

    #[test]
    fn only_addresses_a_peer_can_dial_are_announced() {
        let addrs: Vec<Multiaddr> = [
            "/ip4/127.0.0.1/tcp/0",
            "/ip4/0.0.0.0/tcp/7001",
            "/ip6/::/tcp/7001",
            "/ip4/10.0.0.2/tcp/7001",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(dialable(addrs.clone()), addrs[3..]);
    }

    #[test]
    fn join_is_sent_until_the_record_is_current() {
        let me = me();
        let mut state = joined(&me);
        assert_eq!(join_needed(&state, &me, Duration::ZERO, PATIENCE), None);
        let mut moved = me.clone();
        moved.data_addr = Some("127.0.0.1:5002".into());
        assert!(
            join_needed(&state, &moved, Duration::ZERO, PATIENCE).is_some(),
            "new data address"
        );
        let mut staged = me.clone();
        staged.keys.push([2; 8]);
        assert!(
            join_needed(&state, &staged, Duration::ZERO, PATIENCE).is_some(),
            "a staged cluster key"
        );
        let mut placed = me.clone();
        placed.caps.zone = "us-east-1a".into();
        assert!(
            join_needed(&state, &placed, Duration::ZERO, PATIENCE).is_some(),
            "a zone it did not say before"
        );
        let node = NodeId::from_peer_bytes(&me.peer_id);
        state.members.get_mut(&node).unwrap().status = MemberStatus::Lost;
        assert!(
            join_needed(&state, &me, Duration::ZERO, PATIENCE).is_some(),
            "declared lost"
        );
    }

    #[test]
    fn a_member_that_knows_no_leader_for_long_announces_itself_again() {
        let me = me();
        let state = joined(&me);
        assert_eq!(join_needed(&state, &me, PATIENCE / 2, PATIENCE), None);
        assert_eq!(
            join_needed(&state, &me, PATIENCE, PATIENCE),
            Some(Command::Join {
                node: NodeId::from_peer_bytes(&me.peer_id),
                peer: me.clone(),
            }),
            "its own healthy record may be stale"
        );
    }

    #[test]
    fn a_notice_is_proposed_once_until_it_is_applied_or_times_out() {
        let me = me();
        let mut state = joined(&me);
        let node = NodeId::from_peer_bytes(&me.peer_id);
        let mut notices = NoticesInFlight::default();
        let t0 = Instant::now();
        assert!(notices.admit(&state, node, 9_000, t0), "the first copy");
        assert!(!notices.admit(&state, node, 9_000, t0), "the gossiped copy");
        assert!(
            notices.admit(&state, node, 8_000, t0),
            "an earlier deadline is news"
        );
        state
            .apply(&Command::Notice {
                node,
                deadline_ms: 8_000,
            })
            .unwrap();
        let later = t0 + NOTICE_IN_FLIGHT;
        assert!(
            !notices.admit(&state, node, 9_000, later),
            "already recorded"
        );
        assert!(
            !notices.admit(&state, node, 8_000, later),
            "already recorded"
        );
        assert!(notices.admit(&state, node, 7_000, later));
    }

    #[test]
    fn a_dropped_notice_is_proposed_again_after_a_while() {
        let me = me();
        let state = joined(&me);
        let node = NodeId::from_peer_bytes(&me.peer_id);
        let mut notices = NoticesInFlight::default();
        let t0 = Instant::now();
        assert!(notices.admit(&state, node, 9_000, t0));
        assert!(!notices.admit(&state, node, 9_000, t0 + NOTICE_IN_FLIGHT / 2));
        assert!(notices.admit(&state, node, 9_000, t0 + NOTICE_IN_FLIGHT));
    }

    #[test]
    fn notices_about_unknown_or_lost_nodes_are_not_proposed() {
        let me = me();
        let mut state = joined(&me);
        let node = NodeId::from_peer_bytes(&me.peer_id);
        let mut notices = NoticesInFlight::default();
        let t0 = Instant::now();
        assert!(!notices.admit(&state, NodeId(7), 9_000, t0));
        state.members.get_mut(&node).unwrap().status = MemberStatus::Lost;
        assert!(!notices.admit(&state, node, 9_000, t0));
    }
}
