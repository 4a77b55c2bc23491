//! The `--check` gate of a run's report: what must hold of a run for CI to pass it.

use crate::failover::LeaderFailover;
use crate::report::{MAX_OVERRUN_FRACTION, RunReport};

/// The `--check` gate for CI: the run trained (committed steps, the loss fell), lost no
/// committed step and trained no sample twice. The error lists every failed condition.
pub fn check(r: &RunReport) -> Result<(), String> {
    let mut failed = Vec::new();
    if r.committed_steps == 0 {
        failed.push("no step was committed".to_string());
    }
    match (r.loss_first, r.loss_last) {
        (Some(a), Some(b)) if b < a => {}
        (Some(a), Some(b)) => failed.push(format!("the loss did not fall ({a:.4} -> {b:.4})")),
        _ => failed.push("no loss was reported".to_string()),
    }
    if r.lost_committed_steps > 0 {
        failed.push(format!(
            "{} committed steps were lost",
            r.lost_committed_steps
        ));
    }
    if let Some(o) = &r.outage
        && (o.steps_after == 0 || o.resumed_from_step.is_none())
    {
        failed.push(format!(
            "training did not resume from a stored checkpoint after the outage ({} steps after it)",
            o.steps_after
        ));
    }
    if r.duplicate_samples > 0 {
        failed.push(format!(
            "{} samples were trained twice",
            r.duplicate_samples
        ));
    }
    if let Some(o) = r.outer_rounds.filter(|o| o.disagreeing > 0) {
        failed.push(format!(
            "{} of {} stages compared after DiLoCo rounds showed different outer weights on \
             different nodes",
            o.disagreeing, o.compared
        ));
    }
    if let Some(o) = r.outer_rounds.filter(|o| o.unlike_committed > 0) {
        failed.push(format!(
            "{} of {} stages seen after a committed DiLoCo round showed other outer weights \
             than raft committed with it",
            o.unlike_committed, o.held_to_committed
        ));
    }
    if let Some(n) = r.minority_commits.filter(|n| *n > 0) {
        failed.push(format!(
            "{n} steps were applied by nodes cut off in a minority and are not in the final \
             history as they were"
        ));
    }
    if let Some(h) = r.history_check.as_ref().filter(|h| !h.passed) {
        failed.push(format!(
            "the history check failed: {}",
            h.problems.join("; ")
        ));
    }
    if let Some(e) = &r.emulated
        && e.overrun_fraction > MAX_OVERRUN_FRACTION
    {
        failed.push(format!(
            "real work overran the emulated {} by {:.1}% of its busy time (more than {:.0}%): \
             the machine is too slow for time scale {}",
            e.profile,
            100.0 * e.overrun_fraction,
            100.0 * MAX_OVERRUN_FRACTION,
            e.time_scale
        ));
    }
    if let Some(problem) = r.leader_failover.as_ref().and_then(LeaderFailover::problem) {
        failed.push(problem);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} run failed its check: {}",
            r.strategy,
            failed.join("; ")
        ))
    }
}
