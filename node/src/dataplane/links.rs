//! The links of one plan epoch: this node's pipeline neighbours and its all-reduce ring.
//!
//! Sends on a pipeline link go through a writer task, so a stage never blocks on a full socket
//! while its neighbour is blocked sending the other way (1F1B has both directions busy).

use parcae_consensus::ControlState;
use parcae_consensus::state::{Plan, StageSlot};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::DataplaneError;
use super::client::{self, PeerAddr};
use super::protocol::LinkKind;
use super::server::Endpoint;
use super::{SecureReader, SecureStream, SecureWriter};

/// One pipeline link: receive in schedule order, send without blocking.
pub struct PipeLink {
    reader: SecureReader,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    writer: JoinHandle<Result<(), DataplaneError>>,
}

impl PipeLink {
    pub(crate) fn new(stream: SecureStream) -> Self {
        let (reader, mut writer) = stream.split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                writer.send(&msg).await?;
            }
            Ok(())
        });
        Self { reader, tx, writer }
    }

    /// Queues a message.
    pub fn send(&self, msg: Vec<u8>) -> Result<(), DataplaneError> {
        self.tx
            .send(msg)
            .map_err(|_| DataplaneError::Peer("pipeline link closed".into()))
    }

    /// The next message, at most `max` bytes.
    pub async fn recv(&mut self, max: u64) -> Result<Vec<u8>, DataplaneError> {
        self.reader.recv(max).await
    }
}

impl Drop for PipeLink {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

/// The all-reduce ring of a stage's replicas.
pub struct RingLink {
    /// Position in the ring (the pipeline index).
    pub rank: usize,
    /// Replicas in the ring.
    pub size: usize,
    /// To replica `rank + 1`.
    pub next: SecureWriter,
    /// From replica `rank - 1`.
    pub prev: SecureReader,
}

/// Every link of this node in one epoch.
pub struct EpochLinks {
    /// Plan epoch.
    pub epoch: u64,
    /// To stage `s - 1` (`None` at the first stage).
    pub prev: Option<PipeLink>,
    /// To stage `s + 1` (`None` at the last stage).
    pub next: Option<PipeLink>,
    /// The ring (`None` when D = 1).
    pub ring: Option<RingLink>,
}

/// The slot of pipeline `pipeline`, stage `stage`.
pub fn slot_at(pipeline: u32, stage: u32) -> StageSlot {
    StageSlot { pipeline, stage }
}

/// The node at `slot` in `plan`.
pub fn node_at(
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
) -> Result<PeerAddr, DataplaneError> {
    let node = plan
        .assignment
        .iter()
        .find(|(_, s)| **s == slot)
        .map(|(n, _)| *n)
        .ok_or_else(|| DataplaneError::Peer(format!("no node at {slot:?}")))?;
    client::peer_addr(state, node)
}

/// Opens (towards later stages and replicas) and accepts (from earlier ones) every link of
/// `slot` in `plan`.
pub async fn connect(
    ep: &Endpoint,
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
) -> Result<EpochLinks, DataplaneError> {
    let (d, p) = (plan.data_parallel, plan.pipeline_stages);
    let epoch = plan.epoch;
    let at = slot_at;
    let next = async {
        if slot.stage + 1 >= p {
            return Ok(None);
        }
        let to = node_at(state, plan, at(slot.pipeline, slot.stage + 1))?;
        let s = client::open_link(ep, &to, epoch, LinkKind::Pipeline, slot).await?;
        Ok::<_, DataplaneError>(Some(PipeLink::new(s)))
    };
    let prev = async {
        if slot.stage == 0 {
            return Ok(None);
        }
        let from = at(slot.pipeline, slot.stage - 1);
        let peer = node_at(state, plan, from)?.peer;
        let s = ep
            .take_link((epoch, LinkKind::Pipeline, from), peer)
            .await?;
        Ok::<_, DataplaneError>(Some(PipeLink::new(s)))
    };
    let ring = async {
        if d <= 1 {
            return Ok(None);
        }
        let to = node_at(state, plan, at((slot.pipeline + 1) % d, slot.stage))?;
        let from = at((slot.pipeline + d - 1) % d, slot.stage);
        let from_peer = node_at(state, plan, from)?.peer;
        let (out, inc) = tokio::try_join!(
            client::open_link(ep, &to, epoch, LinkKind::Ring, slot),
            ep.take_link((epoch, LinkKind::Ring, from), from_peer)
        )?;
        Ok::<_, DataplaneError>(Some(RingLink {
            rank: slot.pipeline as usize,
            size: d as usize,
            next: out.split().1,
            prev: inc.split().0,
        }))
    };
    let (next, prev, ring) = tokio::try_join!(next, prev, ring)?;
    Ok(EpochLinks {
        epoch,
        prev,
        next,
        ring,
    })
}
