//! The checker of a run's whole history: `chaos`'s `history_check`, and `parcae-testnet check
//! DIR` on a run directory kept with `--work-dir`.
//!
//! What the nodes committed is read from every node's `/steps` during the run (every few
//! seconds, and right before a node is killed or a split heals) into a [`StepLedger`]: the first
//! sighting of each step and the first sighting that differed from it. With the final committed
//! sequence and what the minority sides applied while cut off, it is written to the run
//! directory as `history.json`, so that the check can be run again, alone, on a kept directory.
//! The check: the final history is one sequence (consecutive steps, history ids that only move
//! forward); no committed step changed or disappeared, except those a rollback to a checkpoint
//! gave up; every sample of the final history is trained exactly once; and no step a minority
//! applied while cut off is missing from the final history as it was; under DiLoCo, raft
//! committed each round (its outer digests) with exactly the steps that open one. Then the
//! replay check
//! ([`crate::model_replay`]) trains the final history again in one process and compares the
//! weights with the cluster's checkpoints (`replay_max_abs_diff`; null where it was not run).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use parcae_api::{ReplayReport, StepRecord};
use parcae_outer::SyncMode;
use serde::{Deserialize, Serialize};

use crate::ledger::{StepLedger, sample_overlap};
use crate::model_replay;
use crate::node_bin;

/// The file in the run directory.
pub const FILE: &str = "history.json";
/// Problems listed one by one before the rest are counted.
const MAX_LISTED: usize = 8;

/// Everything the check reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunHistory {
    /// Every committed step any node reported.
    pub ledger: StepLedger,
    /// The final committed sequence.
    pub final_seq: Vec<StepRecord>,
    /// What minority sides applied while cut off (`None`: the network never split).
    pub minority_seen: Option<Vec<StepRecord>>,
    /// How the job's groups synchronised (`step` in histories written before it was kept).
    #[serde(default)]
    pub sync: SyncMode,
}

/// The verdict, as the report's `history_check`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCheck {
    /// No problem found.
    pub passed: bool,
    /// History ids seen (a rollback to a checkpoint starts a new one).
    pub histories: u64,
    /// Committed steps seen and checked.
    pub steps_checked: u64,
    /// Steps a minority applied that the final history does not hold as they were (`None`:
    /// the network never split).
    pub minority_commits: Option<u64>,
    /// Largest difference between a checkpoint's weights and one process's replay of the final
    /// history up to it, over every checkpoint replayed (`None`: not replayed).
    pub replay_max_abs_diff: Option<f64>,
    /// Largest difference between a committed step's loss and the replay's (`None`: not
    /// replayed).
    #[serde(default)]
    pub replay_max_loss_diff: Option<f64>,
    /// What is wrong, one line each.
    pub problems: Vec<String>,
}

/// Checks `h`.
pub fn check(h: &RunHistory) -> HistoryCheck {
    let mut problems = Vec::new();
    for pair in h.final_seq.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.step != a.step + 1 {
            problems.push(format!(
                "the final history jumps from step {} to step {}",
                a.step, b.step
            ));
        }
        if b.history < a.history {
            problems.push(format!(
                "the final history goes back from history {} (step {}) to {} (step {})",
                a.history, a.step, b.history, b.step
            ));
        }
    }
    for lost in h.ledger.lost(&h.final_seq) {
        problems.push(format!("committed {lost}"));
    }
    problems.extend(uncommitted_rounds(&h.final_seq, h.sync));
    let (duplicates, gaps) = sample_overlap(&h.final_seq);
    if duplicates > 0 {
        problems.push(format!(
            "{duplicates} samples of the final history are trained twice"
        ));
    }
    if gaps > 0 {
        problems.push(format!("{gaps} samples are skipped by the final history"));
    }
    let minority_commits = h.minority_seen.as_ref().map(|seen| {
        let mut applied = StepLedger::default();
        applied.observe(seen);
        applied.lost(&h.final_seq).len() as u64
    });
    if let Some(n) = minority_commits.filter(|n| *n > 0) {
        problems.push(format!(
            "{n} steps applied by nodes cut off in a minority are not in the final history as \
             they were"
        ));
    }
    let listed = problems.len().min(MAX_LISTED);
    if problems.len() > listed {
        let more = problems.len() - listed;
        problems.truncate(listed);
        problems.push(format!("... and {more} more"));
    }
    let histories = h
        .ledger
        .histories()
        .into_iter()
        .chain(h.final_seq.iter().map(|r| r.history))
        .collect::<std::collections::BTreeSet<u64>>()
        .len() as u64;
    HistoryCheck {
        passed: problems.is_empty(),
        histories,
        steps_checked: h.ledger.len() as u64,
        minority_commits,
        replay_max_abs_diff: None,
        replay_max_loss_diff: None,
        problems,
    }
}

/// Under `diloco:H`, the steps of `seq` that should open a round (positive multiples of H) and
/// committed none, and the others that committed one; nothing under `step`.
fn uncommitted_rounds(seq: &[StepRecord], sync: SyncMode) -> Vec<String> {
    let h = u64::from(sync.inner_steps().unwrap_or(0));
    seq.iter()
        .filter_map(|r| {
            let opens = h > 0 && r.step > 0 && r.step.is_multiple_of(h);
            match (opens, r.outer_digests.is_empty()) {
                (true, true) => Some(format!(
                    "step {} opened a DiLoCo round that raft did not commit with it",
                    r.step
                )),
                (false, false) => Some(format!(
                    "step {} committed a DiLoCo round it does not open",
                    r.step
                )),
                _ => None,
            }
        })
        .collect()
}

/// The history check with the replay's verdict: its largest difference, and its problems (or
/// why it could not run) among the check's.
pub fn with_replay(check: &mut HistoryCheck, replay: Result<ReplayReport>) {
    match replay {
        Ok(r) => {
            check.replay_max_abs_diff = Some(r.max_abs_diff);
            check.replay_max_loss_diff = Some(r.max_loss_diff);
            check
                .problems
                .extend(r.problems.into_iter().map(|p| format!("replay: {p}")));
        }
        Err(e) => check.problems.push(format!("replay: {e:#}")),
    }
    check.passed = check.problems.is_empty();
}

/// Writes `h` into the run directory `dir`; returns the file.
pub fn write(dir: &Path, h: &RunHistory) -> Result<PathBuf> {
    let path = dir.join(FILE);
    let json = serde_json::to_vec(h).context("encoding the run's history")?;
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Reads the history a run wrote into `dir`.
pub fn read(dir: &Path) -> Result<RunHistory> {
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (a run directory kept with --work-dir holds it)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a run history", path.display()))
}

/// `parcae-testnet check DIR`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A run directory kept with `--work-dir` (it holds `history.json`).
    dir: PathBuf,
    /// The `parcae-node` binary that replays the history (default: beside this one, or
    /// `PARCAE_NODE_BIN`).
    #[arg(long)]
    node_bin: Option<PathBuf>,
}

/// Checks the history in `args.dir`, replaying it where the directory holds the job's store;
/// fails when the check does.
pub fn run(args: Args) -> Result<()> {
    let history = read(&args.dir)?;
    let mut c = check(&history);
    if model_replay::possible(&args.dir) {
        let bin = node_bin::locate(args.node_bin.as_deref())?;
        with_replay(
            &mut c,
            model_replay::run(&bin, &args.dir, &history.final_seq, "cpu"),
        );
    }
    println!("{}", summary(&c));
    for p in &c.problems {
        println!("  {p}");
    }
    anyhow::ensure!(c.passed, "the history check failed");
    Ok(())
}

/// One line.
pub fn summary(c: &HistoryCheck) -> String {
    format!(
        "history check {}: {} histories, {} committed steps checked, {} minority commits, replay {}",
        if c.passed { "passed" } else { "FAILED" },
        c.histories,
        c.steps_checked,
        c.minority_commits
            .map_or_else(|| "- (no splits)".to_string(), |n| n.to_string()),
        match (c.replay_max_abs_diff, c.replay_max_loss_diff) {
            (Some(w), Some(l)) => format!("max |diff| {w:.3e}, loss {l:.3e}"),
            (Some(w), None) => format!("max |diff| {w:.3e}"),
            _ => "not run".to_string(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, history: u64, sample_start: u64) -> StepRecord {
        StepRecord {
            step,
            epoch: 1,
            sample_start,
            samples: 4,
            loss: 1.0 / (step + 1) as f64,
            validation_loss: None,
            history,
            outer_digests: Vec::new(),
            groups: Vec::new(),
            partition: Vec::new(),
        }
    }

    fn history(seen: &[StepRecord], final_seq: Vec<StepRecord>) -> RunHistory {
        let mut ledger = StepLedger::default();
        ledger.observe(seen);
        RunHistory {
            ledger,
            final_seq,
            minority_seen: None,
            sync: SyncMode::Step,
        }
    }

    fn passed() -> HistoryCheck {
        HistoryCheck {
            passed: true,
            histories: 1,
            steps_checked: 40,
            minority_commits: None,
            replay_max_abs_diff: None,
            replay_max_loss_diff: None,
            problems: Vec::new(),
        }
    }

    fn report(max_abs_diff: f64, problems: Vec<String>) -> ReplayReport {
        ReplayReport {
            passed: problems.is_empty(),
            tolerance: 1e-4,
            windows: 2,
            steps_replayed: 40,
            steps_not_replayed: 0,
            max_abs_diff,
            max_loss_diff: 1e-6,
            last_checkpoint_step: Some(39),
            problems,
        }
    }

    #[test]
    fn the_replays_verdict_joins_the_history_checks() {
        let mut c = passed();
        with_replay(&mut c, Ok(report(3e-6, Vec::new())));
        assert!(c.passed);
        assert_eq!(c.replay_max_abs_diff, Some(3e-6));

        let mut c = passed();
        with_replay(
            &mut c,
            Ok(report(
                0.2,
                vec!["the checkpoint after step 39 differs".into()],
            )),
        );
        assert!(!c.passed);
        assert_eq!(
            c.problems,
            vec!["replay: the checkpoint after step 39 differs"]
        );

        let mut c = passed();
        with_replay(
            &mut c,
            Err(anyhow::anyhow!("parcae-node replay wrote no report")),
        );
        assert!(!c.passed && c.replay_max_abs_diff.is_none());
        assert!(
            c.problems[0].contains("wrote no report"),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn a_clean_history_passes_and_survives_its_file() {
        let seq: Vec<StepRecord> = (0..5).map(|s| record(s, 0, 4 * s)).collect();
        let h = history(&seq, seq.clone());
        let c = check(&h);
        assert!(c.passed, "{c:?}");
        assert_eq!((c.histories, c.steps_checked), (1, 5));
        assert_eq!(c.replay_max_abs_diff, None);
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &h).unwrap();
        assert_eq!(check(&read(dir.path()).unwrap()), c);
    }

    /// Under DiLoCo the check learns the round: raft commits one with exactly the steps
    /// that open one (its outer digests).
    #[test]
    fn a_diloco_history_commits_its_rounds_with_the_steps_that_open_them() {
        let seq: Vec<StepRecord> = (0..9)
            .map(|s| StepRecord {
                outer_digests: if s == 4 || s == 8 {
                    vec!["ab".into(), "cd".into()]
                } else {
                    Vec::new()
                },
                ..record(s, 0, 4 * s)
            })
            .collect();
        let mut h = history(&seq, seq.clone());
        h.sync = SyncMode::Diloco(4);
        assert!(check(&h).passed, "{:?}", check(&h));
        h.sync = SyncMode::Step;
        assert_eq!(check(&h).problems.len(), 2, "rounds where none open");
        h.sync = SyncMode::Diloco(3);
        let c = check(&h);
        assert!(
            c.problems
                .contains(&"step 3 opened a DiLoCo round that raft did not commit with it".into()),
            "{:?}",
            c.problems
        );
        assert_eq!(c.problems.len(), 4, "{:?}", c.problems);
    }

    #[test]
    fn a_rollback_to_a_checkpoint_is_one_sequence() {
        // Steps 3-4 of history 0 given up; history 1 trains them again from step 3.
        let mut seen: Vec<StepRecord> = (0..5).map(|s| record(s, 0, 4 * s)).collect();
        let again: Vec<StepRecord> = (3..6).map(|s| record(s, 1, 4 * s)).collect();
        seen.extend(again.iter().cloned());
        let final_seq: Vec<StepRecord> = seen[..3].iter().chain(&again).cloned().collect();
        let c = check(&history(&seen, final_seq));
        assert!(c.passed, "{c:?}");
        assert_eq!(c.histories, 2);
    }

    #[test]
    fn a_changed_step_a_hole_a_repeated_sample_and_a_minority_commit_fail() {
        let seq: Vec<StepRecord> = (0..5).map(|s| record(s, 0, 4 * s)).collect();
        let mut changed = seq.clone();
        changed[2].loss = 9.0;
        let c = check(&history(&seq, changed));
        assert!(!c.passed);
        assert!(c.problems[0].contains("step 2 changed"), "{c:?}");

        let holed: Vec<StepRecord> = [0, 1, 3, 4].iter().map(|&i| seq[i].clone()).collect();
        let c = check(&history(&seq, holed));
        assert!(
            c.problems
                .iter()
                .any(|p| p.contains("jumps from step 1 to step 3")),
            "{c:?}"
        );

        let mut repeated = seq.clone();
        repeated[3].sample_start = 8;
        let c = check(&history(&repeated, repeated.clone()));
        assert!(
            c.problems.iter().any(|p| p.contains("trained twice")),
            "{c:?}"
        );

        let mut h = history(&seq, seq.clone());
        h.minority_seen = Some(vec![record(5, 0, 20)]);
        let c = check(&h);
        assert_eq!(c.minority_commits, Some(1));
        assert!(!c.passed);
    }

    #[test]
    fn a_directory_without_a_history_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = format!("{:#}", read(dir.path()).unwrap_err());
        assert!(e.contains(FILE) && e.contains("--work-dir"), "{e}");
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        let e = format!("{:#}", read(dir.path()).unwrap_err());
        assert!(e.contains("not a run history"), "{e}");
    }
}
