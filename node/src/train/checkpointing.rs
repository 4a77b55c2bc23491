//! Checkpoints: the first replica of each stage saves its state every `checkpoint_every` steps
//! and after a limited job's last step, locally, on one peer outside its stage and in the job's
//! durable store, then registers its part of the step's cut in raft; under DiLoCo the first
//! replica of the stage in each other zone stores its group's state too (in the store alone,
//! registered with the cut for a replay). The first replica of the first stage records every
//! complete stored cut's manifest in the store, so a new cluster can resume from it (again as
//! more groups' states are stored). The training loop pays only for the snapshot and its digest: the file write,
//! fsync, peer copy, upload and registration run in the background, and a part is registered
//! only once durable.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use parcae_consensus::state::{Digest32, LayerRange, Plan, StageSlot};
use parcae_consensus::{Command, ControlState, NodeId};
use parcae_model::PipelineModel;
use sha2::{Digest, Sha256};

use super::context::{Current, Io, WorkerSetup};
use super::error::TrainError;
use super::zones::{PartWritten, part_written};
use crate::checkpoint::registered_steps;
use crate::dataplane::client::{PeerAddr, peer_addr, put_checkpoint};
use crate::dataplane::server::Endpoint;
use crate::metrics::Metrics;

/// What the manifest recorder remembers.
#[derive(Debug, Default)]
pub struct CutRecorder {
    /// `(history, step, groups' stored parts)` of the newest cut whose manifest this node
    /// wrote to the store.
    written: Option<(u64, u64, usize)>,
}

impl CutRecorder {
    /// At the first replica of the first stage (`slot`): writes the manifest of the newest
    /// complete cut whose parts are all stored, in the background, once.
    pub fn record_stored_cut(&mut self, state: &ControlState, slot: Option<StageSlot>, io: &Io) {
        let first = StageSlot {
            pipeline: 0,
            stage: 0,
        };
        let Some(store) = io.ep.store.clone() else {
            return;
        };
        if slot != Some(first) {
            return;
        }
        let Some(cut) = state.checkpoints.values().rev().find(|c| c.is_stored()) else {
            return;
        };
        let groups = cut.groups.iter().flat_map(|g| &g.parts);
        let key = (
            cut.history,
            cut.end.step,
            groups.filter(|p| p.stored).count(),
        );
        if self.written.is_some_and(|w| w >= key) {
            return;
        }
        self.written = Some(key);
        let cut = cut.clone();
        io.rt.spawn(async move {
            match store.put_cut(&cut).await {
                Ok(()) => tracing::info!(
                    step = cut.end.step,
                    "checkpoint recorded in the job's store"
                ),
                Err(e) => {
                    tracing::warn!(step = cut.end.step, "checkpoint manifest not stored: {e}")
                }
            }
        });
    }
}

/// Whether the state after step `k` is saved: every `every` steps (0: never), and after the
/// last step of a job limited to `max_steps` (0: no limit), whose weights are the job's result.
fn checkpoint_due(every: u64, max_steps: u64, k: u64) -> bool {
    let periodic = every > 0 && (k + 1).is_multiple_of(every);
    periodic || (max_steps > 0 && k + 1 == max_steps)
}

/// After step `k`: when a checkpoint is due and this node writes a part of it (pipeline 0's
/// replica of its stage; under DiLoCo also the first replica of the stage in each other zone,
/// [`part_written`]), snapshots the stage and saves it in the background. The cut's own part's
/// digest rides the next step.
pub fn checkpoint_if_due<M: PipelineModel>(
    setup: &WorkerSetup<M>,
    io: &Io,
    current: &mut Current<M>,
    state: &ControlState,
    (plan, k): (&Plan, u64),
) -> Result<(), TrainError> {
    if !checkpoint_due(setup.spec.checkpoint_every, setup.spec.max_steps, k) {
        return Ok(());
    }
    let group = match part_written(state, plan, current.slot, setup.spec.sync) {
        None => return Ok(()),
        Some(PartWritten::Cut) => None,
        // Another group's state goes to the store alone (a replay reads it), or nowhere.
        Some(PartWritten::Group(_)) if io.ep.store.is_none() => return Ok(()),
        Some(PartWritten::Group(zone)) => Some(zone),
    };
    let snapshot = Instant::now();
    let range = current.stage.layer_range();
    let bytes = current.stage.export_state(range.clone())?;
    let digest: Digest32 = Sha256::digest(&bytes).into();
    if group.is_none() {
        current.digest = Some(digest);
    }
    setup.metrics.checkpoints_total.inc();
    setup
        .metrics
        .checkpoint_snapshot_ms_total
        .inc_by(snapshot.elapsed().as_millis() as u64);
    let save = Save {
        ep: io.ep.clone(),
        submit: io.submit.clone(),
        metrics: setup.metrics.clone(),
        me: setup.me,
        peer: group
            .is_none()
            .then(|| checkpoint_peer(state, plan, setup.me, current.slot))
            .flatten(),
        epoch: plan.epoch,
        step: k,
        range,
        digest,
        group,
    };
    io.rt.spawn(save.run(bytes));
    Ok(())
}

/// A stage's checkpoint on its way to disk, a peer and the store.
struct Save {
    ep: Arc<Endpoint>,
    submit: Arc<dyn Fn(Command) + Send + Sync>,
    metrics: Arc<Metrics>,
    me: NodeId,
    peer: Option<PeerAddr>,
    epoch: u64,
    /// The step after which the state was taken.
    step: u64,
    range: Range<usize>,
    digest: Digest32,
    /// Under DiLoCo, another group's state (by zone): in the store alone.
    group: Option<String>,
}

impl Save {
    /// Steps trained into the state.
    fn steps(&self) -> u64 {
        self.step + 1
    }

    /// Saves `bytes` locally, then on the peer and in the store, and registers the part with
    /// the nodes that hold it; nothing is registered when the local save failed. Another
    /// group's state goes to the store alone, and is registered once there.
    async fn run(self, bytes: Vec<u8>) {
        let written = Instant::now();
        let mut holders = Vec::new();
        let bytes = if self.group.is_none() {
            let Some(bytes) = self.save_locally(bytes).await else {
                return;
            };
            holders.push(self.me);
            holders.extend(self.copy_to_peer(&bytes).await);
            self.metrics
                .checkpoint_write_ms_total
                .inc_by(written.elapsed().as_millis() as u64);
            bytes
        } else {
            bytes
        };
        let uploaded = Instant::now();
        let stored = self.upload(bytes).await;
        self.metrics
            .checkpoint_upload_ms_total
            .inc_by(uploaded.elapsed().as_millis() as u64);
        if self.group.is_some() && !stored {
            return;
        }
        (self.submit)(Command::Checkpointed {
            step: self.step,
            epoch: self.epoch,
            layers: LayerRange {
                start: self.range.start as u32,
                end: self.range.end as u32,
            },
            holders,
            digest: self.digest,
            stored,
            group: self.group,
        });
    }

    /// Writes and syncs the file on the blocking pool; the bytes back, or `None` (logged).
    async fn save_locally(&self, bytes: Vec<u8>) -> Option<Vec<u8>> {
        let (steps, range) = (self.steps(), self.range.clone());
        let store = self.ep.checkpoints.clone();
        let layers = range.clone();
        let registered = registered_steps(&self.ep.view.borrow(), &layers);
        let saved = tokio::task::spawn_blocking(move || {
            store
                .save(steps, &layers, &bytes, &registered)
                .map(|_| bytes)
        })
        .await;
        let failure = match saved {
            Ok(Ok(bytes)) => return Some(bytes),
            Ok(Err(e)) => format!("checkpoint not saved: {e}"),
            Err(e) => format!("checkpoint writer failed: {e}"),
        };
        // Training goes on from memory; the next checkpoint tries again.
        self.metrics.checkpoint_write_failures_total.inc();
        tracing::error!(steps, layers = ?range, "{failure}; training goes on, the next checkpoint retries");
        None
    }

    /// The peer that now holds a copy too, if the copy went through.
    async fn copy_to_peer(&self, bytes: &[u8]) -> Option<NodeId> {
        let peer = self.peer?;
        let copied = put_checkpoint(
            &self.ep,
            &peer,
            self.steps(),
            self.range.clone(),
            bytes,
            self.digest,
        )
        .await;
        match copied {
            Ok(()) => Some(peer.node),
            Err(e) => {
                tracing::warn!(node = %peer.node, "checkpoint copy failed: {e}");
                None
            }
        }
    }

    /// Whether the part is in the job's durable store now.
    async fn upload(&self, bytes: Vec<u8>) -> bool {
        let Some(store) = &self.ep.store else {
            return false;
        };
        let (steps, range) = (self.steps(), self.range.clone());
        let layers = range.start as u32..range.end as u32;
        match store.put_part(steps, layers, &self.digest, bytes).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(steps, layers = ?range, "checkpoint not uploaded to the job's store: {e}");
                false
            }
        }
    }
}

/// The peer that keeps a copy of a stage's checkpoint: the first replica of the next stage, or
/// for a one-stage plan any other member.
fn checkpoint_peer(
    state: &ControlState,
    plan: &Plan,
    me: NodeId,
    slot: StageSlot,
) -> Option<PeerAddr> {
    let other_stage = StageSlot {
        pipeline: 0,
        stage: (slot.stage + 1) % plan.pipeline_stages,
    };
    let node = if other_stage != slot {
        plan.assignment
            .iter()
            .find(|(_, s)| **s == other_stage)
            .map(|(n, _)| *n)
    } else {
        state
            .members
            .iter()
            .find(|(id, m)| **id != me && m.status.is_healthy())
            .map(|(id, _)| *id)
    }?;
    peer_addr(state, node).ok()
}

#[cfg(test)]
mod tests {
    use super::checkpoint_due;

    #[test]
    fn a_limited_job_saves_its_last_step_besides_the_cadence() {
        let due = |every, max, k| checkpoint_due(every, max, k);
        assert!(due(5, 0, 4) && due(5, 0, 9) && !due(5, 0, 5));
        assert!(!due(0, 0, 4));
        // The last step of a 40-step job, with and without a cadence.
        assert!(due(0, 40, 39) && due(7, 40, 39) && due(7, 40, 34));
        assert!(!due(0, 40, 38) && !due(0, 40, 40));
    }
}
