//! What [`crate::Trainer::run`] returns: how the node's run ended, how far the job got, and
//! where its weights are, read from the replicated state the node applied last.

use std::fmt;

use parcae_consensus::ControlState;

use crate::assembly::{NodeError, NodeExit};

/// Why a node's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The job reached its step limit and its last checkpoint is complete in the store (or the
    /// node stopped waiting for it: see [`TrainOutcome::weights`]).
    Finished,
    /// The node left the cluster before the job was done: a preemption notice or a signal,
    /// and its grace period passed.
    Left,
}

/// The newest complete checkpoint of the job: the whole model's weights after some step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedWeights {
    /// Steps trained into them.
    pub steps: u64,
    /// The job's store, when it was given one and every part is there (`parcae-node export
    /// --store` reads it, and a new cluster with this store resumes from it); `None`: the
    /// parts are on the disks of the nodes that saved them (their `checkpoints/`, and their
    /// own `store/` when the job was given no store).
    pub store: Option<String>,
}

/// How a node's run of a job ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutcome {
    /// Why it ended.
    pub ended: Ended,
    /// Steps the cluster committed.
    pub steps: u64,
    /// The loss of the last committed step.
    pub last_loss: Option<f64>,
    /// The newest complete checkpoint, if any.
    pub weights: Option<SavedWeights>,
}

impl TrainOutcome {
    /// The outcome of a node that ended as `exit` says, whose job keeps its checkpoints in
    /// `store` (`None`: each node's own); an exit code other than 0 is an error.
    pub fn of(exit: &NodeExit, store: Option<&str>) -> Result<Self, NodeError> {
        if exit.code != 0 {
            return Err(NodeError::Stopped(exit.code));
        }
        let ended = if exit.finished {
            Ended::Finished
        } else {
            Ended::Left
        };
        Ok(Self::from_state(ended, &exit.state, store))
    }

    fn from_state(ended: Ended, state: &ControlState, store: Option<&str>) -> Self {
        let last = state.progress.last_committed_step;
        let last_loss = state
            .progress
            .recent_losses
            .back()
            .filter(|r| Some(r.step) == last)
            .map(|r| r.loss);
        let weights = state
            .checkpoints
            .values()
            .rev()
            .find(|c| c.is_complete())
            .map(|c| SavedWeights {
                steps: c.steps_trained(),
                store: store.filter(|_| c.is_stored()).map(str::to_string),
            });
        Self {
            ended,
            steps: last.map_or(0, |s| s + 1),
            last_loss,
            weights,
        }
    }
}

impl fmt::Display for TrainOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ended = match self.ended {
            Ended::Finished => "finished",
            Ended::Left => "left the cluster",
        };
        write!(f, "{ended} after {} committed steps", self.steps)?;
        if let Some(loss) = self.last_loss {
            write!(f, ", last loss {loss:.4}")?;
        }
        match &self.weights {
            Some(SavedWeights {
                steps,
                store: Some(store),
            }) => write!(f, "; weights after {steps} steps in {store}"),
            Some(SavedWeights { steps, store: None }) => {
                write!(f, "; weights after {steps} steps on the nodes' disks only")
            }
            None => write!(f, "; no complete checkpoint"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parcae_consensus::state::{Cut, CutPart, LayerRange, LossRecord, StepEnd};

    use super::*;

    fn cut(step: u64, parts: &[(u32, u32, bool)]) -> Cut {
        Cut {
            end: StepEnd {
                step,
                epoch: 1,
                sample_cursor: 0,
                optimizer: Default::default(),
            },
            history: 0,
            layers: 4,
            parts: parts
                .iter()
                .map(|&(start, end, stored)| CutPart {
                    layers: LayerRange { start, end },
                    holders: Vec::new(),
                    digest: Default::default(),
                    stored,
                })
                .collect(),
            groups: Vec::new(),
        }
    }

    fn exit(code: i32, finished: bool) -> NodeExit {
        let mut state = ControlState::default();
        state.progress.last_committed_step = Some(39);
        for step in [38, 39] {
            let loss = 1.0 + step as f64 / 128.0;
            state
                .progress
                .recent_losses
                .push_back(LossRecord { step, loss });
        }
        state.checkpoints.insert(19, cut(19, &[(0, 4, true)]));
        state
            .checkpoints
            .insert(39, cut(39, &[(0, 2, true), (2, 4, false)]));
        state.checkpoints.insert(45, cut(45, &[(0, 2, true)]));
        NodeExit {
            code,
            finished,
            state: Arc::new(state),
        }
    }

    #[test]
    fn the_outcome_names_the_steps_the_last_loss_and_the_newest_complete_cut() {
        let o = TrainOutcome::of(&exit(0, true), Some("s3://bucket/job")).unwrap();
        assert_eq!(o.ended, Ended::Finished);
        assert_eq!(o.steps, 40);
        assert_eq!(o.last_loss, Some(1.0 + 39.0 / 128.0));
        // Step 45's cut is incomplete; step 39's is complete, one part not in the store.
        assert_eq!(
            o.weights,
            Some(SavedWeights {
                steps: 40,
                store: None
            })
        );
        assert_eq!(
            o.to_string(),
            "finished after 40 committed steps, last loss 1.3047; weights after 40 steps on \
             the nodes' disks only"
        );
    }

    #[test]
    fn a_stored_cut_names_the_store_and_a_left_node_says_so() {
        let mut e = exit(0, false);
        Arc::make_mut(&mut e.state)
            .checkpoints
            .insert(39, cut(39, &[(0, 2, true), (2, 4, true)]));
        let o = TrainOutcome::of(&e, Some("/data/store")).unwrap();
        assert_eq!(o.ended, Ended::Left);
        assert_eq!(o.weights.unwrap().store.as_deref(), Some("/data/store"));
        // Each node's own store holds only its own stages' parts.
        let o = TrainOutcome::of(&e, None).unwrap();
        assert_eq!(o.weights.unwrap().store, None);
    }

    #[test]
    fn a_failed_node_is_an_error() {
        let e = TrainOutcome::of(&exit(3, false), None).unwrap_err();
        assert!(matches!(e, NodeError::Stopped(3)), "{e}");
    }
}
