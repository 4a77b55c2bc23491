//! Whether DiLoCo's rounds left every group on the same outer weights (issue 68): each node's
//! `/status` shows its stage's outer weights after the last round it closed
//! ([`parcae_api::OuterView`]); every replica of the same layers must show the same digest for
//! the same round, whatever its zone.

use std::collections::{BTreeMap, BTreeSet};

use parcae_api::OuterView;
use serde::{Deserialize, Serialize};

/// A stage in a round: the round's step and the stage's layers.
type StageRound = (u64, [u32; 2]);

/// The digests seen of each round's outer weights, by stage and round: which node showed
/// which digest.
#[derive(Debug, Default)]
pub struct OuterLedger {
    seen: BTreeMap<StageRound, BTreeSet<(String, String)>>,
}

/// What the ledger came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OuterRounds {
    /// Rounds seen closed (distinct steps).
    pub rounds: u64,
    /// Stages of a round seen on two nodes or more: the ones compared.
    pub compared: u64,
    /// Of them, stages whose nodes showed different outer weights (must be 0).
    pub disagreeing: u64,
    /// The newest round seen (its step): a job with a step limit closes its last round after
    /// its last step (0 in reports written before it was kept).
    #[serde(default)]
    pub last: u64,
}

impl OuterLedger {
    /// Keeps what node `peer` shows of its last round.
    pub fn observe(&mut self, peer: &str, view: &OuterView) {
        self.seen
            .entry((view.step, view.layers))
            .or_default()
            .insert((peer.to_string(), view.digest.clone()));
    }

    /// The rounds seen, and how many stages agreed (`None` where no round was seen).
    pub fn report(&self) -> Option<OuterRounds> {
        if self.seen.is_empty() {
            return None;
        }
        let steps: BTreeSet<u64> = self.seen.keys().map(|(step, _)| *step).collect();
        let compared = self.seen.values().filter(|nodes| {
            nodes
                .iter()
                .map(|(peer, _)| peer)
                .collect::<BTreeSet<_>>()
                .len()
                > 1
        });
        let (mut total, mut disagreeing) = (0, 0);
        for nodes in compared {
            total += 1;
            let digests: BTreeSet<&String> = nodes.iter().map(|(_, d)| d).collect();
            disagreeing += u64::from(digests.len() > 1);
        }
        Some(OuterRounds {
            rounds: steps.len() as u64,
            compared: total,
            disagreeing,
            last: steps.last().copied().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(step: u64, layers: [u32; 2], digest: &str) -> OuterView {
        OuterView {
            step,
            layers,
            digest: digest.into(),
        }
    }

    #[test]
    fn replicas_of_a_stage_are_compared_round_by_round() {
        let mut l = OuterLedger::default();
        assert_eq!(l.report(), None);
        l.observe("a", &view(20, [0, 4], "x"));
        l.observe("a", &view(20, [0, 4], "x"));
        l.observe("b", &view(20, [0, 4], "x"));
        l.observe("c", &view(40, [0, 4], "y"));
        let agree = OuterRounds {
            rounds: 2,
            compared: 1,
            disagreeing: 0,
            last: 40,
        };
        assert_eq!(l.report(), Some(agree));
        l.observe("d", &view(40, [0, 4], "z"));
        l.observe("d", &view(40, [0, 2], "w"));
        let r = l.report().unwrap();
        assert_eq!((r.rounds, r.compared, r.disagreeing), (2, 2, 1));
    }
}
