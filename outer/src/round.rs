//! A round's membership: the groups training from its outer weights, how far each is, when
//! the round is due, each one's contribution as it comes in, and when the round closes.
//!
//! A round is paced by the fleet, not by its slowest group: it is due once its members
//! together have trained `H` inner steps of the job's batch for each member still in it (a
//! faster group trains more inner steps, a slower fewer; each pseudo-gradient is weighted by
//! its samples), so no group waits for another. A group may join until the round is due (it
//! starts from the round's outer weights) and may contribute early (a notice hands its partial
//! pseudo-gradient in, at its weight). Every member in (or gone) closes the round; past its
//! deadline, the contributions in close it and the groups still training are left out (a
//! cut-off group never stalls the others for longer than the deadline). A round with nothing in
//! stays open, however late: there is nothing to average. The contributors come out in the
//! groups' order, which is the order their pseudo-gradients are summed in, so every group
//! applies the same outer step.

use std::collections::BTreeMap;
use std::fmt::Debug;

/// Where a member of a round stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Running its inner steps from the round's outer weights, this many samples so far.
    Training { trained: u64 },
    /// Its pseudo-gradient is in, for this many samples (fewer than a full round's where a
    /// notice stopped it early).
    Contributed { samples: u64 },
    /// Gone from the round: every node of it lost.
    Dropped,
}

/// Why a round refused a change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoundError {
    /// A round opened over no group.
    #[error("round {0} opened with no group")]
    NoGroups(u64),
    /// A group that did not begin the round.
    #[error("round {round}: group {group} did not begin it")]
    NotMember { round: u64, group: String },
    /// A group whose part is already settled (in, or dropped).
    #[error("round {round}: group {group} is already {state:?}")]
    Settled {
        round: u64,
        group: String,
        state: Membership,
    },
    /// A contribution of no samples.
    #[error("round {round}: group {group} contributed no samples")]
    NoSamples { round: u64, group: String },
    /// Progress below what the group reported before.
    #[error("round {round}: group {group} reported {now} samples after {before}")]
    Regressed {
        round: u64,
        group: String,
        before: u64,
        now: u64,
    },
    /// A group joining a round already due, or joining twice.
    #[error("round {round}: group {group} cannot join (round due, or already in it)")]
    Join { round: u64, group: String },
}

/// How a round closed: the contributions averaged, and the groups left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close<G> {
    /// The round.
    pub number: u64,
    /// Each contributor and its samples, in the groups' order (the order of the sum).
    pub contributors: Vec<(G, u64)>,
    /// Members that did not contribute: dropped, or still training at the deadline.
    pub left_out: Vec<G>,
}

/// One outer round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round<G: Ord> {
    number: u64,
    /// Samples a round is due at for each member still in it: `H` steps of the job's batch.
    per_member: u64,
    deadline_ms: u64,
    members: BTreeMap<G, Membership>,
}

impl<G: Ord + Clone + Debug> Round<G> {
    /// Round `number`, begun by `groups` (a group named twice counts once), due at
    /// `per_member` samples for each member, closing at the latest at `deadline_ms` once
    /// something is in.
    pub fn open(
        number: u64,
        groups: impl IntoIterator<Item = G>,
        per_member: u64,
        deadline_ms: u64,
    ) -> Result<Self, RoundError> {
        let members: BTreeMap<G, Membership> = groups
            .into_iter()
            .map(|g| (g, Membership::Training { trained: 0 }))
            .collect();
        if members.is_empty() {
            return Err(RoundError::NoGroups(number));
        }
        Ok(Self {
            number,
            per_member,
            deadline_ms,
            members,
        })
    }

    /// `group` joins the round from its outer weights (before it is due).
    pub fn join(&mut self, group: G) -> Result<(), RoundError> {
        if self.due() || self.members.contains_key(&group) {
            return Err(RoundError::Join {
                round: self.number,
                group: format!("{group:?}"),
            });
        }
        self.members
            .insert(group, Membership::Training { trained: 0 });
        Ok(())
    }

    /// `group` has trained `trained` samples this round (what it reports only grows).
    pub fn progress(&mut self, group: &G, trained: u64) -> Result<(), RoundError> {
        let number = self.number;
        let state = self.training(group)?;
        if let Membership::Training { trained: before } = *state
            && trained < before
        {
            return Err(RoundError::Regressed {
                round: number,
                group: format!("{group:?}"),
                before,
                now: trained,
            });
        }
        *state = Membership::Training { trained };
        Ok(())
    }

    /// Whether the members still in the round have together trained its samples: every
    /// member then stops and contributes.
    pub fn due(&self) -> bool {
        let (mut trained, mut members) = (0u64, 0u64);
        for m in self.members.values() {
            match *m {
                Membership::Training { trained: t } | Membership::Contributed { samples: t } => {
                    trained = trained.saturating_add(t);
                    members += 1;
                }
                Membership::Dropped => {}
            }
        }
        members > 0 && trained >= self.per_member.saturating_mul(members)
    }

    /// The round's number.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Where `group` stands (`None`: not a member).
    pub fn membership(&self, group: &G) -> Option<Membership> {
        self.members.get(group).copied()
    }

    /// `group`'s pseudo-gradient is in, for `samples` samples.
    pub fn contribute(&mut self, group: &G, samples: u64) -> Result<(), RoundError> {
        if samples == 0 {
            return Err(RoundError::NoSamples {
                round: self.number,
                group: format!("{group:?}"),
            });
        }
        self.settle(group, Membership::Contributed { samples })
    }

    /// `group` lost every node: it leaves the round.
    pub fn drop_group(&mut self, group: &G) -> Result<(), RoundError> {
        self.settle(group, Membership::Dropped)
    }

    fn settle(&mut self, group: &G, to: Membership) -> Result<(), RoundError> {
        *self.training(group)? = to;
        Ok(())
    }

    /// `group`'s place in the round, where it is still training.
    fn training(&mut self, group: &G) -> Result<&mut Membership, RoundError> {
        let number = self.number;
        let state = self
            .members
            .get_mut(group)
            .ok_or_else(|| RoundError::NotMember {
                round: number,
                group: format!("{group:?}"),
            })?;
        if !matches!(state, Membership::Training { .. }) {
            return Err(RoundError::Settled {
                round: number,
                group: format!("{group:?}"),
                state: *state,
            });
        }
        Ok(state)
    }

    /// The round's close at `now_ms`, where it closes: once nobody is training, or past the
    /// deadline; and only with at least one contribution in.
    pub fn close(&self, now_ms: u64) -> Option<Close<G>> {
        let contributors: Vec<(G, u64)> = self
            .members
            .iter()
            .filter_map(|(g, m)| match m {
                Membership::Contributed { samples } => Some((g.clone(), *samples)),
                _ => None,
            })
            .collect();
        let training = self
            .members
            .values()
            .any(|m| matches!(m, Membership::Training { .. }));
        if contributors.is_empty() || (training && now_ms < self.deadline_ms) {
            return None;
        }
        let left_out = self
            .members
            .iter()
            .filter(|(_, m)| !matches!(m, Membership::Contributed { .. }))
            .map(|(g, _)| g.clone())
            .collect();
        Some(Close {
            number: self.number,
            contributors,
            left_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round() -> Round<&'static str> {
        Round::open(7, ["zone-b", "zone-a", "zone-c"], 640, 1_000).unwrap()
    }

    #[test]
    fn a_round_closes_when_every_member_is_in_summed_in_the_groups_order() {
        let mut r = round();
        r.contribute(&"zone-c", 640).unwrap();
        r.contribute(&"zone-a", 640).unwrap();
        assert_eq!(r.close(999), None);
        r.contribute(&"zone-b", 320).unwrap();
        let close = r.close(10).unwrap();
        assert_eq!(close.number, 7);
        assert_eq!(
            close.contributors,
            [("zone-a", 640), ("zone-b", 320), ("zone-c", 640)]
        );
        assert!(close.left_out.is_empty());
    }

    #[test]
    fn a_group_that_vanishes_is_left_out_without_waiting_for_the_deadline() {
        let mut r = round();
        r.contribute(&"zone-a", 640).unwrap();
        r.contribute(&"zone-b", 640).unwrap();
        r.drop_group(&"zone-c").unwrap();
        let close = r.close(0).unwrap();
        assert_eq!(close.contributors, [("zone-a", 640), ("zone-b", 640)]);
        assert_eq!(close.left_out, ["zone-c"]);
    }

    #[test]
    fn past_the_deadline_the_contributions_in_close_the_round_and_the_rest_are_left_out() {
        let mut r = round();
        r.contribute(&"zone-b", 128).unwrap();
        assert_eq!(r.close(999), None);
        let close = r.close(1_000).unwrap();
        assert_eq!(close.contributors, [("zone-b", 128)]);
        assert_eq!(close.left_out, ["zone-a", "zone-c"]);
    }

    #[test]
    fn a_round_with_nothing_in_stays_open_however_late() {
        let mut r = round();
        assert_eq!(r.close(u64::MAX), None);
        r.drop_group(&"zone-a").unwrap();
        r.drop_group(&"zone-b").unwrap();
        assert_eq!(r.close(u64::MAX), None);
        r.contribute(&"zone-c", 1).unwrap();
        assert_eq!(r.close(0).unwrap().contributors, [("zone-c", 1)]);
    }

    #[test]
    fn only_members_still_training_may_settle_and_a_contribution_has_samples() {
        let mut r = round();
        assert_eq!(
            r.contribute(&"zone-d", 5),
            Err(RoundError::NotMember {
                round: 7,
                group: "\"zone-d\"".into()
            })
        );
        assert_eq!(r.membership(&"zone-d"), None);
        assert!(matches!(
            r.contribute(&"zone-a", 0),
            Err(RoundError::NoSamples { .. })
        ));
        r.contribute(&"zone-a", 5).unwrap();
        assert!(matches!(
            r.contribute(&"zone-a", 5),
            Err(RoundError::Settled {
                state: Membership::Contributed { samples: 5 },
                ..
            })
        ));
        assert!(matches!(
            r.drop_group(&"zone-a"),
            Err(RoundError::Settled { .. })
        ));
        r.drop_group(&"zone-b").unwrap();
        assert!(matches!(
            r.contribute(&"zone-b", 5),
            Err(RoundError::Settled {
                state: Membership::Dropped,
                ..
            })
        ));
        assert_eq!(
            r.membership(&"zone-c"),
            Some(Membership::Training { trained: 0 })
        );
        assert_eq!(
            Round::<u32>::open(3, [], 1, 0),
            Err(RoundError::NoGroups(3))
        );
        assert_eq!(Round::open(1, [2u32, 2, 1], 1, 0).unwrap().members.len(), 2);
    }

    #[test]
    fn a_round_is_due_when_its_members_together_trained_their_share() {
        let mut r = round();
        r.progress(&"zone-a", 1_000).unwrap();
        r.progress(&"zone-b", 500).unwrap();
        // 1,920 samples for three members; a faster group's extra counts for a slower one.
        assert!(!r.due());
        r.progress(&"zone-c", 419).unwrap();
        assert!(!r.due());
        r.progress(&"zone-c", 420).unwrap();
        assert!(r.due());
        assert!(matches!(r.join("zone-d"), Err(RoundError::Join { .. })));
        assert!(matches!(
            r.progress(&"zone-c", 10),
            Err(RoundError::Regressed {
                before: 420,
                now: 10,
                ..
            })
        ));
    }

    #[test]
    fn a_group_may_join_until_the_round_is_due_and_one_that_drops_lowers_the_bar() {
        let mut r = round();
        r.join("zone-d").unwrap();
        assert!(matches!(r.join("zone-d"), Err(RoundError::Join { .. })));
        r.progress(&"zone-a", 1_280).unwrap();
        r.contribute(&"zone-b", 640).unwrap();
        assert!(!r.due());
        r.drop_group(&"zone-c").unwrap();
        r.drop_group(&"zone-d").unwrap();
        // Two members left, 1,280 samples due: in.
        assert!(r.due());
        assert_eq!(r.close(0), None);
        r.contribute(&"zone-a", 1_280).unwrap();
        let close = r.close(0).unwrap();
        assert_eq!(close.contributors, [("zone-a", 1_280), ("zone-b", 640)]);
        assert_eq!(close.left_out, ["zone-c", "zone-d"]);
    }
}
