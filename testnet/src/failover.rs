//! A leader killed on purpose (`run --kill-leader-at SECS`): when, which node, and how long
//! the cluster was without a leader afterwards.

use parcae_api::{RoleView, StatusSnapshot};
use serde::{Deserialize, Serialize};

/// Most seconds a `--check` accepts between the leader's kill and a new leader.
pub const MAX_FAILOVER_SECS: f64 = 5.0;

/// The leader kill of a run and what followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderFailover {
    /// Seconds into the replay when the leader was SIGKILLed.
    pub killed_at_secs: f64,
    /// The killed leader's peer id.
    pub killed: String,
    /// Seconds from the kill until a surviving node was read saying it leads (an upper
    /// bound: the time its status was read; null when none did before the run ended).
    pub new_leader_after_secs: Option<f64>,
}

impl LeaderFailover {
    /// The leader `killed` was SIGKILLed `killed_at_secs` into the replay.
    pub fn new(killed_at_secs: f64, killed: String) -> Self {
        Self {
            killed_at_secs,
            killed,
            new_leader_after_secs: None,
        }
    }

    /// Whether the cluster is still without a new leader as far as the polls saw.
    pub fn pending(&self) -> bool {
        self.new_leader_after_secs.is_none()
    }

    /// Records `statuses`, read by `read_at` seconds into the replay: the first time another
    /// node says it leads ends the failover.
    pub fn observe(&mut self, read_at: f64, statuses: &[(usize, StatusSnapshot)]) {
        if self.pending() && leader(statuses).is_some_and(|(_, s)| s.peer_id != self.killed) {
            self.new_leader_after_secs = Some((read_at - self.killed_at_secs).max(0.0));
        }
    }

    /// What `--check` finds wrong with the failover, if anything.
    pub fn problem(&self) -> Option<String> {
        match self.new_leader_after_secs {
            None => Some("no new leader after the leader was killed".into()),
            Some(s) if s > MAX_FAILOVER_SECS => Some(format!(
                "a new leader took {s:.1} s after the leader was killed (more than \
                 {MAX_FAILOVER_SECS:.0} s)"
            )),
            Some(_) => None,
        }
    }
}

/// The node that says it leads (its role and the leader it names agree), with its status.
pub fn leader(statuses: &[(usize, StatusSnapshot)]) -> Option<&(usize, StatusSnapshot)> {
    statuses.iter().find(|(_, s)| {
        s.role == RoleView::Leader && s.leader.as_deref() == Some(s.peer_id.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, role: RoleView, leader: Option<&str>) -> StatusSnapshot {
        StatusSnapshot {
            peer_id: id.into(),
            role,
            leader: leader.map(str::to_string),
            ..StatusSnapshot::default()
        }
    }

    #[test]
    fn the_failover_ends_when_another_node_leads() {
        let mut f = LeaderFailover::new(10.0, "a".into());
        assert!(f.pending());
        assert!(f.problem().unwrap().contains("no new leader"));
        // The killed leader's last word, and followers naming it, do not count.
        f.observe(
            10.2,
            &[
                (0, status("a", RoleView::Leader, Some("a"))),
                (1, status("b", RoleView::Follower, Some("a"))),
                (2, status("c", RoleView::Candidate, None)),
            ],
        );
        assert!(f.pending());
        f.observe(12.5, &[(1, status("b", RoleView::Leader, Some("b")))]);
        assert_eq!(f.new_leader_after_secs, Some(2.5));
        assert_eq!(f.problem(), None);
        // Later polls change nothing.
        f.observe(20.0, &[(2, status("c", RoleView::Leader, Some("c")))]);
        assert_eq!(f.new_leader_after_secs, Some(2.5));
        let slow = LeaderFailover {
            new_leader_after_secs: Some(7.0),
            ..f
        };
        assert!(slow.problem().unwrap().contains("7.0 s"), "{slow:?}");
    }
}
