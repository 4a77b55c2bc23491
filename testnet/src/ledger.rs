//! What the testnet saw during a run, and the safety checks on it.
//!
//! * [`StepLedger`]: every committed step any node reported on `/steps` while the run went
//!   on. A committed step must never disappear or change: `lost_committed_steps` counts those
//!   that are missing from the final sequence or whose record differs from the first sighting,
//!   except the steps a rollback to a checkpoint gave up (a later history replaced them, or the
//!   final sequence ends in a later history before them): those are `rolled_back_steps`.
//! * [`sample_overlap`]: exactly-once data: the sample ranges of the final sequence must not
//!   overlap (duplicates) or leave holes (gaps).
//! * [`MigrationLedger`]: reconfigurations by epoch, with the kind any node reported and the
//!   longest duration any node took.

use std::collections::BTreeMap;

use parcae_api::{MigrationKind, MigrationView, StepRecord};
use serde::{Deserialize, Serialize};

/// A committed step as first seen, and the first later sighting that differed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SeenStep {
    record: StepRecord,
    differing: Option<StepRecord>,
}

/// A committed step that did not survive as it was.
#[derive(Debug, Clone, PartialEq)]
pub struct LostStep {
    /// The record as first seen.
    pub seen: StepRecord,
    /// The record that replaced it (during the run or in the final sequence); `None` when the
    /// step is missing from the final sequence.
    pub became: Option<StepRecord>,
}

impl std::fmt::Display for LostStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |r: &StepRecord| {
            format!(
                "epoch {} samples {}+{} loss {}",
                r.epoch, r.sample_start, r.samples, r.loss
            )
        };
        match &self.became {
            None => write!(
                f,
                "step {} ({}) is missing from the final sequence",
                self.seen.step,
                show(&self.seen)
            ),
            Some(b) => write!(
                f,
                "step {} changed from ({}) to ({})",
                self.seen.step,
                show(&self.seen),
                show(b)
            ),
        }
    }
}

/// Every step seen during a run (written into the run directory for the history check).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct StepLedger {
    steps: BTreeMap<u64, SeenStep>,
    /// Steps of an earlier history that a later one replaced.
    replaced: u64,
}

impl StepLedger {
    /// Records one node's `/steps` answer.
    pub fn observe(&mut self, records: &[StepRecord]) {
        for r in records {
            let fresh = SeenStep {
                record: r.clone(),
                differing: None,
            };
            let Some(seen) = self.steps.get_mut(&r.step) else {
                self.steps.insert(r.step, fresh);
                continue;
            };
            if r.history > seen.record.history {
                self.replaced += 1;
                *seen = fresh;
            } else if r.history == seen.record.history
                && seen.differing.is_none()
                && !same(&seen.record, r)
            {
                seen.differing = Some(r.clone());
            }
        }
    }

    /// Committed steps a rollback gave up: replaced by a later history, or after the end of
    /// `final_seq` whose last history is later than theirs.
    pub fn rolled_back(&self, final_seq: &[StepRecord]) -> u64 {
        let last_history = final_seq.iter().map(|r| r.history).max();
        let beyond = self
            .steps
            .iter()
            .filter(|(step, seen)| {
                !final_seq.iter().any(|f| f.step == **step)
                    && last_history.is_some_and(|h| h > seen.record.history)
            })
            .count() as u64;
        self.replaced + beyond
    }

    /// Steps seen.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// The history ids of the steps seen (of each step, the latest).
    pub fn histories(&self) -> std::collections::BTreeSet<u64> {
        self.steps.values().map(|s| s.record.history).collect()
    }

    /// The latest history seen.
    pub fn latest_history(&self) -> Option<u64> {
        self.steps.values().map(|s| s.record.history).max()
    }

    /// The highest step seen in the latest history seen (steps a rollback gave up do not
    /// count).
    pub fn last_step(&self) -> Option<u64> {
        let latest = self.latest_history()?;
        self.steps
            .iter()
            .rev()
            .find(|(_, s)| s.record.history == latest)
            .map(|(step, _)| *step)
    }

    /// `seq` (a node's steps, in order) preceded by the records seen of the steps before its
    /// first: a cluster that resumed from a stored checkpoint after an outage shows only the
    /// steps it committed itself, and continues the history of the steps before them.
    pub fn with_earlier(&self, seq: Vec<StepRecord>) -> Vec<StepRecord> {
        let first = seq.first().map_or(0, |r| r.step);
        self.steps
            .range(..first)
            .map(|(_, seen)| seen.record.clone())
            .chain(seq)
            .collect()
    }

    /// Committed steps missing from `final_seq` or whose record changed at any point.
    pub fn lost(&self, final_seq: &[StepRecord]) -> Vec<LostStep> {
        let finals: BTreeMap<u64, &StepRecord> = final_seq.iter().map(|r| (r.step, r)).collect();
        let last_history = final_seq.iter().map(|r| r.history).max();
        self.steps
            .iter()
            .filter_map(|(step, seen)| {
                let became = match (seen.differing.clone(), finals.get(step)) {
                    (Some(d), _) => Some(d),
                    (None, None) if last_history.is_some_and(|h| h > seen.record.history) => {
                        return None;
                    }
                    (None, Some(f)) if f.history > seen.record.history => return None,
                    (None, None) => None,
                    (None, Some(f)) if same(&seen.record, f) => return None,
                    (None, Some(f)) => Some((*f).clone()),
                };
                Some(LostStep {
                    seen: seen.record.clone(),
                    became,
                })
            })
            .collect()
    }
}

/// Two sightings of one step agree (loss bit for bit: it is the same replicated value).
fn same(a: &StepRecord, b: &StepRecord) -> bool {
    a.step == b.step
        && a.epoch == b.epoch
        && a.sample_start == b.sample_start
        && a.samples == b.samples
        && a.loss.to_bits() == b.loss.to_bits()
}

/// Samples covered twice or more, and samples skipped between the first and the last step,
/// of a sequence of steps.
pub fn sample_overlap(seq: &[StepRecord]) -> (u64, u64) {
    let mut ranges: Vec<(u64, u64)> = seq
        .iter()
        .filter(|r| r.samples > 0)
        .map(|r| (r.sample_start, r.sample_start.saturating_add(r.samples)))
        .collect();
    ranges.sort_unstable();
    let (mut duplicates, mut gaps) = (0u64, 0u64);
    let mut covered_to: Option<u64> = None;
    for (start, end) in ranges {
        match covered_to {
            Some(to) if start < to => {
                duplicates += end.min(to) - start;
                covered_to = Some(to.max(end));
            }
            Some(to) => {
                gaps += start - to;
                covered_to = Some(end);
            }
            None => covered_to = Some(end),
        }
    }
    (duplicates, gaps)
}

/// Migration kinds in the run JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MigrationCounts {
    /// Intra-stage migrations.
    pub intra: u64,
    /// Inter-stage migrations.
    pub inter: u64,
    /// Repartitions.
    pub repartition: u64,
    /// Checkpoint restarts.
    pub restart: u64,
}

/// One reconfiguration as the testnet saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochMigration {
    /// Its kind (first node to report it wins).
    pub kind: MigrationKind,
    /// Longest duration any node reported.
    pub secs: f64,
    /// Step at which it took over.
    pub at_step: u64,
    /// Seconds since the replay started when it was first seen.
    pub seen_at: f64,
}

/// Reconfigurations by epoch.
#[derive(Debug, Default)]
pub struct MigrationLedger {
    epochs: BTreeMap<u64, EpochMigration>,
}

/// One re-plan of a run (an epoch that moved the running job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reconfiguration {
    /// The plan's epoch.
    pub epoch: u64,
    /// How the nodes moved (the first node to report it).
    pub kind: MigrationKind,
    /// The step the plan took over at.
    pub at_step: u64,
    /// Seconds into the replay when a node first reported it.
    pub seen_at_secs: f64,
    /// The longest time any node spent in it, seconds.
    pub secs: f64,
}

impl MigrationLedger {
    /// Records one node's `migrations` list at time `t`.
    pub fn observe(&mut self, list: &[MigrationView], t: f64) {
        for m in list {
            let secs = if m.secs.is_finite() {
                m.secs.max(0.0)
            } else {
                0.0
            };
            self.epochs
                .entry(m.epoch)
                .and_modify(|e| e.secs = e.secs.max(secs))
                .or_insert(EpochMigration {
                    kind: m.kind,
                    secs,
                    at_step: m.at_step,
                    seen_at: t,
                });
        }
    }

    /// Reconfigurations that moved a running job (everything but the initial plan).
    pub fn migrations(&self) -> impl Iterator<Item = (&u64, &EpochMigration)> {
        self.epochs
            .iter()
            .filter(|(_, m)| m.kind != MigrationKind::Initial)
    }

    /// Counts by kind.
    pub fn counts(&self) -> MigrationCounts {
        let mut c = MigrationCounts::default();
        for (_, m) in self.migrations() {
            match m.kind {
                MigrationKind::Intra => c.intra += 1,
                MigrationKind::Inter => c.inter += 1,
                MigrationKind::Repartition => c.repartition += 1,
                MigrationKind::Restart => c.restart += 1,
                MigrationKind::Initial => {}
            }
        }
        c
    }

    /// Sum over reconfigurations of the longest per-node duration.
    pub fn total_secs(&self) -> f64 {
        // A fold from +0.0: an empty `sum()` of floats is -0.0, which would print as such.
        self.migrations().fold(0.0, |acc, (_, m)| acc + m.secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, start: u64, samples: u64, loss: f64) -> StepRecord {
        StepRecord {
            step,
            epoch: 1,
            sample_start: start,
            samples,
            loss,
            validation_loss: None,
            history: 0,
            outer_digests: Vec::new(),
            groups: Vec::new(),
            partition: Vec::new(),
        }
    }

    #[test]
    fn steps_a_rollback_replaced_are_rolled_back_not_lost() {
        let mut l = StepLedger::default();
        let old: Vec<StepRecord> = (0..6).map(|k| step(k, k * 8, 8, 4.0)).collect();
        l.observe(&old);
        let again = |k: u64| StepRecord {
            history: 1,
            loss: 3.0,
            ..step(k, k * 8, 8, 3.0)
        };
        // Rolled back to the checkpoint after step 2; steps 3 and 4 trained again so far.
        let final_seq: Vec<StepRecord> = old[..3]
            .iter()
            .cloned()
            .chain([again(3), again(4)])
            .collect();
        l.observe(&final_seq);
        l.observe(&old[4..5]);
        assert!(l.lost(&final_seq).is_empty(), "{:?}", l.lost(&final_seq));
        assert_eq!(
            l.rolled_back(&final_seq),
            3,
            "steps 3 and 4 replaced, 5 not retrained"
        );
        assert_eq!(l.last_step(), Some(4), "the latest history's last step");
        assert_eq!(l.with_earlier(vec![again(3)]), final_seq[..4].to_vec());
        assert_eq!(sample_overlap(&final_seq), (0, 0));
        let mut changed = again(2);
        changed.history = 0;
        l.observe(&[changed]);
        assert_eq!(
            l.lost(&final_seq).len(),
            1,
            "a change within one history is a loss"
        );
    }

    #[test]
    fn lost_counts_missing_and_changed_steps() {
        let mut l = StepLedger::default();
        l.observe(&[step(1, 0, 8, 4.0), step(2, 8, 8, 3.9)]);
        l.observe(&[step(1, 0, 8, 4.0), step(2, 8, 8, 3.9), step(3, 16, 8, 3.8)]);
        let all = [step(1, 0, 8, 4.0), step(2, 8, 8, 3.9), step(3, 16, 8, 3.8)];
        assert!(l.lost(&all).is_empty());
        let missing = l.lost(&all[..2]);
        assert_eq!(missing.len(), 1, "step 3 missing");
        assert_eq!(
            missing[0].to_string(),
            "step 3 (epoch 1 samples 16+8 loss 3.8) is missing from the final sequence"
        );
        // The final sequence has another record for step 1.
        let other = [step(1, 0, 8, 4.5), step(2, 8, 8, 3.9), step(3, 16, 8, 3.8)];
        assert_eq!(l.lost(&other)[0].became, Some(step(1, 0, 8, 4.5)));
        // Another node reports step 2 with another loss: a committed step changed.
        l.observe(&[step(2, 8, 8, 3.5)]);
        let changed = l.lost(&all);
        assert_eq!(changed.len(), 1);
        assert_eq!(
            changed[0].to_string(),
            "step 2 changed from (epoch 1 samples 8+8 loss 3.9) to (epoch 1 samples 8+8 loss 3.5)"
        );
        assert_eq!(l.steps.len(), 3);
        assert_eq!(l.last_step(), Some(3));
        assert_eq!(StepLedger::default().last_step(), None);
    }

    #[test]
    fn overlap_counts_duplicates_and_gaps() {
        let clean = [step(1, 0, 8, 1.0), step(2, 8, 8, 1.0), step(3, 16, 4, 1.0)];
        assert_eq!(sample_overlap(&clean), (0, 0));
        let dup = [step(1, 0, 8, 1.0), step(2, 4, 8, 1.0), step(3, 12, 8, 1.0)];
        assert_eq!(sample_overlap(&dup), (4, 0));
        let gap = [step(1, 0, 8, 1.0), step(2, 10, 8, 1.0)];
        assert_eq!(sample_overlap(&gap), (0, 2));
        let contained = [step(1, 0, 16, 1.0), step(2, 4, 4, 1.0), step(3, 16, 1, 1.0)];
        assert_eq!(sample_overlap(&contained), (4, 0));
        assert_eq!(sample_overlap(&[]), (0, 0));
    }

    #[test]
    fn migrations_by_epoch_take_the_longest_node() {
        use MigrationKind::{Initial, Inter, Intra, Repartition, Restart};
        let m = |epoch, kind, secs| MigrationView {
            epoch,
            kind,
            at_step: epoch * 10,
            secs,
            received_bytes: 0,
        };
        let mut l = MigrationLedger::default();
        l.observe(&[m(1, Initial, 2.0), m(2, Intra, 0.1)], 1.0);
        l.observe(&[m(2, Intra, 0.3), m(3, Repartition, 1.5)], 2.0);
        l.observe(&[m(4, Restart, f64::NAN), m(5, Inter, 0.5)], 3.0);
        let c = l.counts();
        assert_eq!(
            c,
            MigrationCounts {
                intra: 1,
                inter: 1,
                repartition: 1,
                restart: 1
            }
        );
        assert!((l.total_secs() - (0.3 + 1.5 + 0.0 + 0.5)).abs() < 1e-12);
        let (epoch, first) = l.migrations().next().unwrap();
        assert_eq!((*epoch, first.seen_at, first.at_step), (2, 1.0, 20));
    }
}
