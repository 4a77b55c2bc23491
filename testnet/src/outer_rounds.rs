//! Whether DiLoCo's rounds left every group on the same outer weights (issue 68): each node's
//! `/status` shows its stage's outer weights after the last round it closed
//! ([`parcae_api::OuterView`]); every replica of the same layers must show the same digest for
//! the same round, whatever its zone, and the digest raft committed with the step the round
//! opened (`StepRecord::outer_digests`).

use std::collections::{BTreeMap, BTreeSet};

use parcae_api::{OuterView, StepRecord};
use serde::{Deserialize, Serialize};

/// A stage in a round: the round's step, the stage's index and its layers.
type StageRound = (u64, u32, [u32; 2]);

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
    /// The newest round seen (the step it closed before): a job with a step limit closes its
    /// last round after its last step, before the limit (0 in reports written before it was
    /// kept).
    #[serde(default)]
    pub last: u64,
    /// Rounds the final history committed with their outer digests.
    #[serde(default)]
    pub committed: u64,
    /// Stages of a committed round seen on a node and held to the committed digest.
    #[serde(default)]
    pub held_to_committed: u64,
    /// Of them, stages a node showed with another digest (must be 0).
    #[serde(default)]
    pub unlike_committed: u64,
}

impl OuterLedger {
    /// Keeps what node `peer` shows of its last round.
    pub fn observe(&mut self, peer: &str, view: &OuterView) {
        self.seen
            .entry((view.step, view.stage, view.layers))
            .or_default()
            .insert((peer.to_string(), view.digest.clone()));
    }

    /// The rounds seen, how many stages agreed with each other and with what `final_seq` (the
    /// final history) committed (`None` where no round was seen or committed).
    pub fn report(&self, final_seq: &[StepRecord]) -> Option<OuterRounds> {
        let committed: BTreeMap<u64, &[String]> = final_seq
            .iter()
            .filter(|r| !r.outer_digests.is_empty())
            .map(|r| (r.step, r.outer_digests.as_slice()))
            .collect();
        if self.seen.is_empty() && committed.is_empty() {
            return None;
        }
        let steps: BTreeSet<u64> = self.seen.keys().map(|(step, ..)| *step).collect();
        let mut r = OuterRounds {
            rounds: steps.len() as u64,
            compared: 0,
            disagreeing: 0,
            last: steps.last().copied().unwrap_or_default(),
            committed: committed.len() as u64,
            held_to_committed: 0,
            unlike_committed: 0,
        };
        for ((step, stage, _), nodes) in &self.seen {
            let digests: BTreeSet<&String> = nodes.iter().map(|(_, d)| d).collect();
            let peers: BTreeSet<&String> = nodes.iter().map(|(p, _)| p).collect();
            if peers.len() > 1 {
                r.compared += 1;
                r.disagreeing += u64::from(digests.len() > 1);
            }
            if let Some(digest) = committed.get(step).and_then(|c| c.get(*stage as usize)) {
                r.held_to_committed += 1;
                r.unlike_committed += u64::from(digests.iter().any(|d| *d != digest));
            }
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(step: u64, stage: u32, digest: &str) -> OuterView {
        OuterView {
            step,
            layers: [stage * 2, stage * 2 + 2],
            digest: digest.into(),
            stage,
        }
    }

    #[test]
    fn replicas_of_a_stage_are_compared_round_by_round() {
        let mut l = OuterLedger::default();
        assert_eq!(l.report(&[]), None);
        l.observe("a", &view(20, 0, "x"));
        l.observe("a", &view(20, 0, "x"));
        l.observe("b", &view(20, 0, "x"));
        l.observe("c", &view(40, 0, "y"));
        let agree = OuterRounds {
            rounds: 2,
            compared: 1,
            disagreeing: 0,
            last: 40,
            committed: 0,
            held_to_committed: 0,
            unlike_committed: 0,
        };
        assert_eq!(l.report(&[]), Some(agree));
        l.observe("d", &view(40, 0, "z"));
        l.observe("d", &view(40, 1, "w"));
        let r = l.report(&[]).unwrap();
        assert_eq!((r.rounds, r.compared, r.disagreeing), (2, 2, 1));
    }

    #[test]
    fn each_stage_is_held_to_the_digest_raft_committed_with_its_round() {
        let round = |step: u64, digests: &[&str]| StepRecord {
            step,
            outer_digests: digests.iter().map(|d| d.to_string()).collect(),
            ..StepRecord::default()
        };
        let history = [round(19, &[]), round(20, &["x", "v"]), round(21, &[])];
        let mut l = OuterLedger::default();
        l.observe("a", &view(20, 0, "x"));
        l.observe("b", &view(20, 1, "v"));
        l.observe("c", &view(22, 0, "q"));
        let r = l.report(&history).unwrap();
        assert_eq!(
            (r.committed, r.held_to_committed, r.unlike_committed),
            (1, 2, 0),
            "round 22 was seen but not committed: nothing to hold it to"
        );
        l.observe("d", &view(20, 1, "w"));
        let r = l.report(&history).unwrap();
        assert_eq!((r.held_to_committed, r.unlike_committed), (2, 1));
        assert_eq!(
            OuterLedger::default().report(&history).map(|r| r.committed),
            Some(1),
            "a committed round counts though no node was seen after it"
        );
    }
}
