//! The windows of a history: the stretches between stored checkpoints that a replay trains
//! again, and why the others are not.

use std::ops::Range;

use parcae_api::StepRecord;
use parcae_consensus::state::Cut;

/// A stretch of the history trained again: from a stored checkpoint (`None`: the seeded start)
/// through the steps `steps` to the checkpoint `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The checkpoint the replay starts from.
    pub from: Option<Cut>,
    /// The checkpoint the replay is compared with.
    pub to: Cut,
    /// The steps trained.
    pub steps: Range<u64>,
}

/// The windows of a history.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// What is replayed.
    pub windows: Vec<Window>,
    /// Committed steps no window covers.
    pub not_replayed: u64,
    /// Why checkpoints were not windows of their own, one line each.
    pub skipped: Vec<String>,
    /// The first steps of histories that no stored checkpoint anchors: a rollback must resume
    /// from a complete checkpoint of the state its first step starts from (only steps after
    /// the store's oldest checkpoint are judged; older ones may have been pruned).
    pub unanchored: Vec<u64>,
}

/// The windows of `steps` (one consecutive history) between the cuts of `cuts` that belong to
/// it (a cut of a history a rollback gave up is not one of them), none longer than
/// `max_window` steps.
pub fn plan(cuts: &[Cut], steps: &[StepRecord], max_window: u64) -> Plan {
    let Some(first) = steps.first() else {
        return Plan::default();
    };
    let record = |step: u64| {
        step.checked_sub(first.step)
            .and_then(|i| steps.get(usize::try_from(i).ok()?))
    };
    let mut ours: Vec<&Cut> = cuts
        .iter()
        .filter(|c| record(c.end.step).is_some_and(|r| r.history == c.history))
        .collect();
    ours.sort_by_key(|c| c.end.step);
    ours.dedup_by_key(|c| c.end.step);
    let mut plan = Plan::default();
    let mut start: Option<(Option<&Cut>, u64)> = (first.step == 0).then_some((None, 0));
    let mut covered = 0;
    for cut in ours {
        let end = cut.steps_trained();
        if let Some((from, trained)) = start {
            if end - trained <= max_window {
                plan.windows.push(Window {
                    from: from.cloned(),
                    to: cut.clone(),
                    steps: trained..end,
                });
                covered += end - trained;
            } else {
                plan.skipped.push(format!(
                    "steps {trained}..{end}: {} steps between checkpoints, more than the longest \
                     window ({max_window})",
                    end - trained
                ));
            }
        }
        start = Some((Some(cut), end));
    }
    plan.not_replayed = steps.len() as u64 - covered;
    let oldest = cuts.iter().map(Cut::steps_trained).min();
    plan.unanchored = steps
        .windows(2)
        .filter(|w| w[1].history != w[0].history)
        .map(|w| (w[0].history, w[1].step))
        .filter(|&(before, first)| {
            oldest.is_some_and(|o| o <= first)
                && !cuts
                    .iter()
                    .any(|c| c.history == before && c.steps_trained() == first)
        })
        .map(|(_, first)| first)
        .collect();
    plan
}
