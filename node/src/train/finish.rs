//! The end of a job with a step limit: its last step committed and the checkpoint of that step
//! (which every job with a limit takes, [`super::checkpointing`]) complete in the job's store.
//! A node run as a training loop's `fit` ([`crate::Trainer::run`], `parcae-node run
//! --exit-when-done`) stops then; one run as a service idles in `finished`.
//!
//! The decision is a pure function of the replicated state, so every node takes it at the same
//! point of the log; the timing around it (a linger that lets the followers apply the commit
//! that completed the cut, a bounded wait for a final checkpoint that never completes) is
//! [`Finisher`]'s, which the worker asks each round.

use std::time::{Duration, Instant};

use parcae_consensus::ControlState;

/// Where a job stands against its step limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// No limit, or steps left to train.
    Training,
    /// Every step committed; the checkpoint of the last one not yet complete in the store.
    Saving,
    /// Every step committed and the last one's checkpoint complete in the job's store.
    Done,
}

/// Where the job of `state` stands against `max_steps` (0: no limit).
pub fn job_end(state: &ControlState, max_steps: u64) -> JobEnd {
    if max_steps == 0 || state.progress.next_step() < max_steps {
        return JobEnd::Training;
    }
    let saved = state
        .checkpoints
        .values()
        .any(|c| c.end.step + 1 >= max_steps && c.is_stored());
    if saved { JobEnd::Done } else { JobEnd::Saving }
}

/// How long a node stays after it saw the job done: the leader's heartbeats in that time carry
/// the commit that completed the cut to every follower, which then sees the job done too.
pub const LINGER: Duration = Duration::from_secs(3);

/// How long a node waits for the last step's checkpoint to complete in the store (a part
/// whose upload failed, a stage owner preempted at the end) before it stops with the newest
/// complete checkpoint there is.
pub const FINAL_SAVE_WAIT: Duration = Duration::from_secs(60);

/// Calls a node's stop once the job is done, or once the final checkpoint is given up on.
pub struct Finisher {
    stop: Option<Box<dyn FnOnce() + Send>>,
    /// When this node first saw every step committed.
    saving_since: Option<Instant>,
    /// When it first saw the job `Done`.
    done_since: Option<Instant>,
}

impl Finisher {
    /// A finisher that calls `stop` once (`None`: the node idles when the job is done).
    pub fn new(stop: Option<Box<dyn FnOnce() + Send>>) -> Self {
        Self {
            stop,
            saving_since: None,
            done_since: None,
        }
    }

    /// Takes in where the job stands at `now`; calls the stop when it is due.
    pub fn observe(&mut self, end: JobEnd, now: Instant) {
        if end == JobEnd::Training {
            return;
        }
        let saving = *self.saving_since.get_or_insert(now);
        if end == JobEnd::Done {
            self.done_since.get_or_insert(now);
        }
        if !stop_due(saving, self.done_since, now) {
            return;
        }
        if let Some(stop) = self.stop.take() {
            if self.done_since.is_none() {
                tracing::warn!(
                    waited = ?FINAL_SAVE_WAIT,
                    "the last step's checkpoint did not complete in the job's store: stopping \
                     with the newest complete one"
                );
            }
            tracing::info!("the job is done: stopping");
            stop();
        }
    }
}

/// Whether a node that saw every step committed at `saving` (and the job done at `done`)
/// stops at `now`.
fn stop_due(saving: Instant, done: Option<Instant>, now: Instant) -> bool {
    match done {
        Some(done) => now.duration_since(done) >= LINGER,
        None => now.duration_since(saving) >= FINAL_SAVE_WAIT,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use parcae_consensus::state::{Cut, CutPart, Digest32, LayerRange, StepEnd};

    use super::*;

    fn state(committed: Option<u64>, cut: Option<(u64, bool)>) -> ControlState {
        let mut s = ControlState::default();
        s.progress.last_committed_step = committed;
        if let Some((step, stored)) = cut {
            let end = StepEnd {
                step,
                epoch: 1,
                sample_cursor: 0,
                optimizer: Default::default(),
            };
            let part = CutPart {
                layers: LayerRange { start: 0, end: 4 },
                holders: Vec::new(),
                digest: Digest32::default(),
                stored,
            };
            s.checkpoints.insert(
                step,
                Cut {
                    end,
                    history: 0,
                    layers: 4,
                    parts: vec![part],
                    groups: Vec::new(),
                },
            );
        }
        s
    }

    #[test]
    fn a_job_is_done_when_its_last_step_is_committed_and_stored() {
        assert_eq!(
            job_end(&state(Some(9), Some((9, true))), 0),
            JobEnd::Training
        );
        assert_eq!(
            job_end(&state(Some(8), Some((8, true))), 10),
            JobEnd::Training
        );
        assert_eq!(job_end(&state(Some(9), None), 10), JobEnd::Saving);
        assert_eq!(
            job_end(&state(Some(9), Some((4, true))), 10),
            JobEnd::Saving
        );
        assert_eq!(
            job_end(&state(Some(9), Some((9, false))), 10),
            JobEnd::Saving
        );
        assert_eq!(job_end(&state(Some(9), Some((9, true))), 10), JobEnd::Done);
    }

    #[test]
    fn the_stop_comes_after_the_linger_or_the_final_save_s_wait() {
        let t0 = Instant::now();
        assert!(!stop_due(t0, Some(t0), t0 + LINGER / 2));
        assert!(stop_due(t0, Some(t0), t0 + LINGER));
        assert!(!stop_due(t0, None, t0 + FINAL_SAVE_WAIT / 2));
        assert!(stop_due(t0, None, t0 + FINAL_SAVE_WAIT));
        // The linger counts from when the job was done, not from the wait before it.
        let done = t0 + FINAL_SAVE_WAIT / 2;
        assert!(!stop_due(t0, Some(done), done + LINGER / 2));
    }

    #[test]
    fn a_finisher_stops_once() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let mut f = Finisher::new(Some(Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })));
        let t0 = Instant::now();
        f.observe(JobEnd::Training, t0 + FINAL_SAVE_WAIT * 2);
        f.observe(JobEnd::Done, t0);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        f.observe(JobEnd::Done, t0 + LINGER);
        f.observe(JobEnd::Done, t0 + LINGER * 2);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
