//! Lost-member detection: which members the leader declares `Lost`, re-admits, or forgets.
//!
//! A deterministic state machine fed with what the network saw (connections, control frames)
//! and asked, on every tick of the leader, which commands the membership needs. It reads no
//! clock of its own: the driver passes `now`, so every rule is tested without sleeping.
//!
//! A member is reachable when it is connected *and* sent a control frame within `lost_after`:
//! a frozen or cut-off process keeps its TCP connections open, so being connected alone does
//! not prove it is alive.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parcae_consensus::state::MemberStatus;
use parcae_consensus::{Command, ControlState, NodeId};

/// How long after a re-admission of a lost member that came back the leader may try again.
pub const REJOIN_RETRY: Duration = Duration::from_secs(1);
/// How far a marked member's unreachable clock is pushed ahead, so that the same `Lost` or
/// `Leave` is not proposed again until it is seen again or the grace restarts.
const MARKED_HOLD: Duration = Duration::from_secs(3600);

/// What the leader knows about its members' reachability.
#[derive(Debug, Default)]
pub struct Liveness {
    /// When each member was last seen disconnected or silent (absent: reachable or never
    /// checked).
    unreachable_since: HashMap<NodeId, Instant>,
    /// When each peer last sent a control frame.
    last_heard: HashMap<NodeId, Instant>,
    /// When the leader last re-admitted a lost member that came back.
    rejoin_proposed: HashMap<NodeId, Instant>,
}

impl Liveness {
    /// `node` sent a control frame at `now`.
    pub fn heard(&mut self, node: NodeId, now: Instant) {
        self.last_heard.insert(node, now);
    }

    /// A connection to `node` was established.
    pub fn connected(&mut self, node: NodeId) {
        self.unreachable_since.remove(&node);
    }

    /// The last connection to `node` closed at `now`.
    pub fn disconnected(&mut self, node: NodeId, now: Instant) {
        self.unreachable_since.entry(node).or_insert(now);
    }

    /// This node became leader at `now`: every member gets a fresh grace period before it can
    /// be declared lost, counted from now for those not connected.
    pub fn became_leader(
        &mut self,
        state: &ControlState,
        is_connected: impl Fn(NodeId) -> bool,
        now: Instant,
    ) {
        self.unreachable_since.clear();
        for id in state.members.keys() {
            self.last_heard.insert(*id, now);
            if !is_connected(*id) {
                self.unreachable_since.insert(*id, now);
            }
        }
    }

    /// The commands the membership needs at `now` (`now_ms`: the same instant in unix ms,
    /// for notice deadlines): `Lost` for active or spare members unreachable for `lost_after`,
    /// `Leave` for leaving members unreachable after their deadline, and `Join` (with their
    /// recorded identity) for lost members that are reachable again: they may have been removed
    /// from raft and cannot learn that they must re-join.
    pub fn check(
        &mut self,
        state: &ControlState,
        me: NodeId,
        is_connected: impl Fn(NodeId) -> bool,
        now: Instant,
        now_ms: u64,
        lost_after: Duration,
    ) -> Vec<Command> {
        let mut commands = Vec::new();
        for (id, m) in state.members.iter().filter(|(id, _)| **id != me) {
            let heard = self
                .last_heard
                .get(id)
                .is_some_and(|t| now.saturating_duration_since(*t) < lost_after);
            if is_connected(*id) && heard {
                self.unreachable_since.remove(id);
                if m.status == MemberStatus::Lost
                    && self
                        .rejoin_proposed
                        .get(id)
                        .is_none_or(|t| now.saturating_duration_since(*t) >= REJOIN_RETRY)
                {
                    self.rejoin_proposed.insert(*id, now);
                    commands.push(Command::Join {
                        node: *id,
                        peer: m.peer.clone(),
                    });
                }
                continue;
            }
            let since = *self.unreachable_since.entry(*id).or_insert(now);
            let marked = match m.status {
                MemberStatus::Leaving { deadline_ms } if deadline_ms <= now_ms => {
                    Some(Command::Leave { node: *id })
                }
                MemberStatus::Active | MemberStatus::Spare
                    if now.saturating_duration_since(since) >= lost_after =>
                {
                    Some(Command::Lost { node: *id })
                }
                _ => None,
            };
            if let Some(command) = marked {
                self.unreachable_since.insert(*id, now + MARKED_HOLD);
                commands.push(command);
            }
        }
        commands
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::state::PeerInfo;

    const LOST_AFTER: Duration = Duration::from_secs(3);

    fn id(n: u8) -> NodeId {
        NodeId::from_peer_bytes(&[n])
    }

    fn state_with(members: &[(u8, MemberStatus)]) -> ControlState {
        let mut state = ControlState::default();
        for (n, status) in members {
            let node = id(*n);
            state
                .apply(&Command::Join {
                    node,
                    peer: PeerInfo {
                        peer_id: vec![*n],
                        ..PeerInfo::default()
                    },
                })
                .unwrap();
            state.members.get_mut(&node).unwrap().status = *status;
        }
        state
    }

    #[test]
    fn a_silent_member_is_lost_once_after_the_timeout() {
        let state = state_with(&[(1, MemberStatus::Active), (2, MemberStatus::Spare)]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        l.became_leader(&state, |_| true, t0);
        let all = |_| true;
        assert!(l.check(&state, id(1), all, t0, 0, LOST_AFTER).is_empty());
        // Node 2 stays connected but sends nothing: a frozen process. Silent for `lost_after`,
        // it counts as unreachable from then, and is lost `lost_after` later.
        let t1 = t0 + LOST_AFTER;
        assert!(l.check(&state, id(1), all, t1, 0, LOST_AFTER).is_empty());
        let t2 = t1 + LOST_AFTER;
        assert_eq!(
            l.check(
                &state,
                id(1),
                all,
                t2 - Duration::from_millis(1),
                0,
                LOST_AFTER
            ),
            vec![]
        );
        assert_eq!(
            l.check(&state, id(1), all, t2, 0, LOST_AFTER),
            vec![Command::Lost { node: id(2) }]
        );
        assert!(
            l.check(&state, id(1), all, t2 + LOST_AFTER, 0, LOST_AFTER)
                .is_empty(),
            "the same member is not marked twice"
        );
    }

    #[test]
    fn a_member_that_keeps_talking_is_never_lost() {
        let state = state_with(&[(1, MemberStatus::Active), (2, MemberStatus::Active)]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        l.became_leader(&state, |_| true, t0);
        for s in 1..10 {
            let now = t0 + Duration::from_secs(s);
            l.heard(id(2), now);
            assert!(
                l.check(&state, id(1), |_| true, now, 0, LOST_AFTER)
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_disconnected_member_is_lost_from_when_it_disconnected() {
        let state = state_with(&[(1, MemberStatus::Active), (2, MemberStatus::Active)]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        l.became_leader(&state, |_| true, t0);
        let t1 = t0 + Duration::from_secs(2);
        l.disconnected(id(2), t1);
        let away = |n| n != id(2);
        let before = t1 + LOST_AFTER - Duration::from_millis(1);
        assert!(
            l.check(&state, id(1), away, before, 0, LOST_AFTER)
                .is_empty()
        );
        assert_eq!(
            l.check(&state, id(1), away, t1 + LOST_AFTER, 0, LOST_AFTER),
            vec![Command::Lost { node: id(2) }]
        );
    }

    #[test]
    fn a_leaving_member_is_forgotten_only_after_its_deadline() {
        let state = state_with(&[
            (1, MemberStatus::Active),
            (2, MemberStatus::Leaving { deadline_ms: 5_000 }),
        ]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        l.became_leader(&state, |n| n != id(2), t0);
        let away = |n| n != id(2);
        let late = t0 + 10 * LOST_AFTER;
        assert!(
            l.check(&state, id(1), away, late, 4_999, LOST_AFTER)
                .is_empty(),
            "a leaving member is not declared lost before its deadline"
        );
        assert_eq!(
            l.check(&state, id(1), away, late, 5_000, LOST_AFTER),
            vec![Command::Leave { node: id(2) }]
        );
    }

    #[test]
    fn a_lost_member_heard_again_is_readmitted_with_its_identity_at_most_once_a_second() {
        let state = state_with(&[(1, MemberStatus::Active), (2, MemberStatus::Lost)]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        l.became_leader(&state, |_| true, t0);
        let join = Command::Join {
            node: id(2),
            peer: state.members[&id(2)].peer.clone(),
        };
        assert_eq!(
            l.check(&state, id(1), |_| true, t0, 0, LOST_AFTER),
            vec![join.clone()]
        );
        let soon = t0 + REJOIN_RETRY / 2;
        l.heard(id(2), soon);
        assert!(
            l.check(&state, id(1), |_| true, soon, 0, LOST_AFTER)
                .is_empty()
        );
        let later = t0 + REJOIN_RETRY;
        l.heard(id(2), later);
        assert_eq!(
            l.check(&state, id(1), |_| true, later, 0, LOST_AFTER),
            vec![join]
        );
    }

    #[test]
    fn the_leader_never_checks_itself() {
        let state = state_with(&[(1, MemberStatus::Active)]);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        assert!(
            l.check(
                &state,
                id(1),
                |_| false,
                t0 + 100 * LOST_AFTER,
                0,
                LOST_AFTER
            )
            .is_empty()
        );
    }
}
