//! Stage checkpoints on local disk: this node's own and those peers sent it for safekeeping.
//!
//! A checkpoint is one state buffer of `parcae-model` (per-layer CRCs inside) written to a
//! temporary file, fsynced and renamed, so a crash leaves either the old or the new file. The
//! newest [`KEEP`] checkpoints of each layer range are kept, and besides them those the
//! registry committed in raft names in a complete cut ([`registered_steps`]): a copy can arrive
//! before its cut completes, and the cut it belongs to may never complete, so counting alone
//! would delete the restore target.

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use parcae_consensus::state::{Cut, Digest32};
use parcae_consensus::{ControlState, NodeId};
use sha2::{Digest, Sha256};

use crate::data_dir::write_atomic;

/// A checkpoint file could not be written, read or pruned.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint storage {}: {source}", path.display())]
pub struct CheckpointError {
    /// The file or directory involved.
    pub path: PathBuf,
    /// What the file system said.
    pub source: std::io::Error,
}

/// Checkpoints kept per layer range.
pub const KEEP: usize = 2;
/// Steps a stored checkpoint may be ahead of the committed progress ([`may_store`]).
pub const STEP_SLACK: u64 = 4;

/// Whether `sender` may store its checkpoint of `layers` after `steps` steps on this node: the
/// plan in force makes it the first replica (pipeline 0) of the stage that owns exactly those
/// layers, and the step is at most [`STEP_SLACK`] ahead of the progress committed here (the
/// checkpoint of step `k` is taken right after running it, before it is committed, and this
/// node may apply commits later than the sender). So a member can write
/// only its own stage's checkpoint, at most [`KEEP`] of them stay: its disk quota here is
/// [`KEEP`] states of its stage, and it cannot push the real checkpoints out with made-up step
/// numbers.
pub fn may_store(
    state: &ControlState,
    sender: NodeId,
    steps: u64,
    layers: &Range<usize>,
) -> Result<(), String> {
    let plan = state.plan.as_ref().ok_or("no plan in force")?;
    let slot = plan
        .assignment
        .get(&sender)
        .ok_or("the sender has no slot in the plan")?;
    let owned = plan
        .stage_layers(slot.stage)
        .map(|l| l.start as usize..l.end as usize);
    if slot.pipeline != 0 || owned.as_ref() != Some(layers) {
        return Err(format!(
            "the plan of epoch {} does not make the sender pipeline 0's holder of layers {layers:?}",
            plan.epoch
        ));
    }
    let newest = state.progress.next_step() + STEP_SLACK;
    if steps == 0 || steps > newest {
        return Err(format!(
            "a checkpoint after {steps} steps is ahead of the cluster (at most {newest})"
        ));
    }
    Ok(())
}

/// The files of the complete cuts committed in raft that hold a part of exactly `layers`, by
/// the steps trained into them (a file's name: the cut after step `s` is file `s + 1`): they
/// are kept however many newer ones arrive (at most
/// [`parcae_consensus::state::limits::MAX_COMPLETE_CUTS`] of them). Naming them by the cut's
/// step instead protected no file, and an incomplete newer copy pushed out the older complete
/// one that a restore then needed.
pub fn registered_steps(state: &ControlState, layers: &Range<usize>) -> Vec<u64> {
    state
        .checkpoints
        .values()
        .filter(|c| c.is_complete())
        .filter(|c| {
            c.parts.iter().any(|p| {
                p.layers.start as usize == layers.start && p.layers.end as usize == layers.end
            })
        })
        .map(Cut::steps_trained)
        .collect()
}

/// The directory of checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

fn io(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError {
        path: path.to_path_buf(),
        source,
    }
}

impl CheckpointStore {
    /// Checkpoints under `dir` (created on first save).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, steps: u64, layers: &Range<usize>) -> PathBuf {
        self.dir.join(format!(
            "ckpt-{steps}-{}-{}.state",
            layers.start, layers.end
        ))
    }

    /// Writes a checkpoint durably and returns its digest; of the older ones of `layers`, those
    /// beyond the newest [`KEEP`] go unless `registered` names their step.
    pub fn save(
        &self,
        steps: u64,
        layers: &Range<usize>,
        bytes: &[u8],
        registered: &[u64],
    ) -> Result<Digest32, CheckpointError> {
        fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let path = self.path(steps, layers);
        write_atomic(&path, bytes).map_err(|e| io(&path, e))?;
        self.prune(layers, registered)?;
        Ok(Sha256::digest(bytes).into())
    }

    /// Reads a checkpoint.
    pub fn load(&self, steps: u64, layers: &Range<usize>) -> Result<Vec<u8>, CheckpointError> {
        let path = self.path(steps, layers);
        fs::read(&path).map_err(|e| io(&path, e))
    }

    /// The stored checkpoints as `(steps, layers)`, newest first.
    pub fn list(&self) -> Vec<(u64, Range<usize>)> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, Range<usize>)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_name(&e.file_name().to_string_lossy()))
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.start.cmp(&b.1.start)));
        out
    }

    fn prune(&self, layers: &Range<usize>, registered: &[u64]) -> Result<(), CheckpointError> {
        let same: Vec<u64> = self
            .list()
            .into_iter()
            .filter(|(_, r)| r == layers)
            .map(|(s, _)| s)
            .collect();
        for steps in same
            .into_iter()
            .skip(KEEP)
            .filter(|s| !registered.contains(s))
        {
            let path = self.path(steps, layers);
            fs::remove_file(&path).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

fn parse_name(name: &str) -> Option<(u64, Range<usize>)> {
    let rest = name.strip_prefix("ckpt-")?.strip_suffix(".state")?;
    let mut parts = rest.split('-');
    let steps = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    (parts.next().is_none() && start < end).then_some((steps, start..end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_loads_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("ckpt"));
        for steps in 1..=4u64 {
            store.save(steps, &(0..2), &[steps as u8; 8], &[]).unwrap();
        }
        store.save(3, &(2..4), b"other", &[]).unwrap();
        assert_eq!(store.load(4, &(0..2)).unwrap(), vec![4u8; 8]);
        assert_eq!(store.list(), vec![(4, 0..2), (3, 0..2), (3, 2..4)]);
        store.save(5, &(2..4), b"newer", &[3]).unwrap();
        store.save(6, &(2..4), b"newest", &[3]).unwrap();
        assert_eq!(
            store.load(3, &(2..4)).unwrap(),
            b"other",
            "a step of a registered complete cut stays"
        );
        assert!(store.load(1, &(0..2)).is_err());
        assert_eq!(parse_name("ckpt-1-3-2.state"), None);
        assert_eq!(parse_name("ckpt-x-0-2.state"), None);
    }

    #[test]
    fn a_complete_cut_s_file_stays_when_an_incomplete_newer_one_arrives() {
        use parcae_consensus::state::{CutPart, LayerRange, StepEnd};
        let part = |start, end| CutPart {
            layers: LayerRange { start, end },
            holders: Vec::new(),
            digest: [0; 32],
            stored: false,
        };
        let cut = |step, parts| Cut {
            end: StepEnd {
                step,
                epoch: 1,
                sample_cursor: 0,
                optimizer: Default::default(),
            },
            history: 0,
            layers: 4,
            parts,
            groups: Vec::new(),
        };
        let mut state = ControlState::default();
        state
            .checkpoints
            .insert(5, cut(5, vec![part(0, 2), part(2, 4)]));
        state
            .checkpoints
            .insert(7, cut(7, vec![part(0, 2), part(2, 4)]));
        state.checkpoints.insert(9, cut(9, vec![part(2, 4)]));
        // The cuts after steps 5 and 7 are the files of 6 and 8 steps.
        let registered = registered_steps(&state, &(2..4));
        assert_eq!(registered, vec![6, 8]);
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("ckpt"));
        for steps in [6, 8, 10] {
            store
                .save(steps, &(2..4), &[steps as u8], &registered)
                .unwrap();
        }
        assert_eq!(store.load(6, &(2..4)).unwrap(), vec![6]);
        assert_eq!(store.list().len(), 3);
    }

    #[test]
    fn only_a_stage_s_first_replica_stores_its_own_layers_at_a_step_not_ahead() {
        use parcae_consensus::state::{Plan, StageSlot};
        let id = |n: u8| NodeId::from_peer_bytes(&[n]);
        let slot = |pipeline, stage| StageSlot { pipeline, stage };
        let mut state = ControlState::default();
        assert!(may_store(&state, id(1), 1, &(0..3)).is_err(), "no plan");
        state.plan = Some(Plan {
            epoch: 3,
            data_parallel: 2,
            pipeline_stages: 2,
            partition: vec![0, 3, 5],
            assignment: [
                (id(1), slot(0, 0)),
                (id(2), slot(0, 1)),
                (id(3), slot(1, 0)),
                (id(4), slot(1, 1)),
            ]
            .into_iter()
            .collect(),
            at_step: 0,
            joins_before: 0,
            batch_shares: Vec::new(),
            all_reduce: Default::default(),
        });
        state.progress.last_committed_step = Some(9);
        assert_eq!(may_store(&state, id(1), 10, &(0..3)), Ok(()));
        assert_eq!(
            may_store(&state, id(2), 11, &(3..5)),
            Ok(()),
            "the step in flight"
        );
        assert_eq!(
            may_store(&state, id(2), 14, &(3..5)),
            Ok(()),
            "this node lags"
        );
        assert!(
            may_store(&state, id(2), 15, &(3..5)).is_err(),
            "ahead of the cluster"
        );
        assert!(may_store(&state, id(1), u64::MAX, &(0..3)).is_err());
        assert!(may_store(&state, id(1), 0, &(0..3)).is_err());
        assert!(
            may_store(&state, id(1), 10, &(3..5)).is_err(),
            "another stage's layers"
        );
        assert!(
            may_store(&state, id(1), 10, &(0..2)).is_err(),
            "part of its layers"
        );
        assert!(
            may_store(&state, id(3), 10, &(0..3)).is_err(),
            "not pipeline 0"
        );
        assert!(
            may_store(&state, id(9), 10, &(0..3)).is_err(),
            "not planned"
        );
    }
}
