//! The links of one plan epoch: this node's pipeline neighbours and its all-reduce (one ring
//! over the stage's replicas, or by zone as the plan names it).
//!
//! Sends on a pipeline link go through a writer task, so a stage never blocks on a full socket
//! while its neighbour is blocked sending the other way (1F1B has both directions busy).

use parcae_consensus::ControlState;
use parcae_consensus::state::{Plan, StageSlot};
use parcae_pool::AllReduce;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::DataplaneError;
use super::client::{self, PeerAddr};
use super::collective::{RingLinks, ZoneLayout, ZoneLinks, ZoneMember};
use super::protocol::LinkKind;
use super::server::Endpoint;
use super::{SecureReader, SecureStream, SecureWriter};
use crate::planner::zones::{zone_of, zones_differ};

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

/// An all-reduce ring: over a stage's replicas, or over those in one zone.
pub struct RingLink {
    /// Position in the ring (the pipeline index, or the place in the zone).
    pub rank: usize,
    /// Members of the ring.
    pub size: usize,
    /// To member `rank + 1`.
    pub next: SecureWriter,
    /// From member `rank - 1`.
    pub prev: SecureReader,
    /// Whether member `rank + 1` is in another zone.
    pub next_crosses: bool,
}

impl RingLink {
    /// The ring's links as the collective takes them.
    pub fn links(&mut self) -> RingLinks<'_> {
        RingLinks {
            rank: self.rank,
            size: self.size,
            next: &mut self.next,
            prev: &mut self.prev,
            next_crosses: self.next_crosses,
        }
    }
}

/// The links of the all-reduce by zone: the ring of this replica's zone and one link to (from)
/// each replica of the next (previous) zone it exchanges with.
pub struct ZoneReduceLink {
    /// The stage's replicas by zone.
    pub layout: ZoneLayout,
    /// This replica's place in it.
    pub member: ZoneMember,
    /// Its zone's ring (`None` when it is alone in its zone).
    pub zone_ring: Option<RingLink>,
    /// To each replica of `member.cross_next`.
    pub cross_next: Vec<SecureWriter>,
    /// From each replica of `member.cross_prev`.
    pub cross_prev: Vec<SecureReader>,
}

impl ZoneReduceLink {
    /// The links as the collective takes them.
    pub fn links(&mut self) -> ZoneLinks<'_> {
        ZoneLinks {
            member: &self.member,
            zone_ring: self.zone_ring.as_mut().map(RingLink::links),
            cross_next: self.cross_next.iter_mut().collect(),
            cross_prev: self.cross_prev.iter_mut().collect(),
        }
    }
}

/// The links of a stage's all-reduce, of the kind its plan names.
pub enum ReduceLink {
    /// One ring over every replica.
    Ring(RingLink),
    /// By zone.
    ByZone(ZoneReduceLink),
}

/// Every link of this node in one epoch.
pub struct EpochLinks {
    /// Plan epoch.
    pub epoch: u64,
    /// To stage `s - 1` (`None` at the first stage).
    pub prev: Option<PipeLink>,
    /// To stage `s + 1` (`None` at the last stage).
    pub next: Option<PipeLink>,
    /// The all-reduce (`None` when D = 1).
    pub reduce: Option<ReduceLink>,
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
/// `slot` in `plan`, its replicas' all-reduce of the kind `all_reduce` (by zone only where
/// they span zones).
pub async fn connect(
    ep: &Endpoint,
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
    all_reduce: AllReduce,
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
    let reduce = async {
        if d <= 1 {
            return Ok(None);
        }
        let zones: Vec<&str> = (0..d)
            .map(|pipeline| replica_zone(state, plan, at(pipeline, slot.stage)))
            .collect::<Result<_, _>>()?;
        let layout = ZoneLayout::new(&zones);
        let rank = slot.pipeline as usize;
        if all_reduce == AllReduce::ByZone && layout.zones() > 1 {
            return by_zone(ep, state, plan, slot, layout).await.map(Some);
        }
        let ring = ring(ep, state, plan, slot, Ring::Replicas, (rank, d as usize)).await?;
        Ok(Some(ReduceLink::Ring(RingLink {
            next_crosses: zones_differ(zones[rank], zones[(rank + 1) % zones.len()]),
            ..ring
        })))
    };
    let (next, prev, reduce) = tokio::try_join!(next, prev, reduce)?;
    Ok(EpochLinks {
        epoch,
        prev,
        next,
        reduce,
    })
}

/// The zone of the replica at `slot` ("" where its node said none).
fn replica_zone<'s>(
    state: &'s ControlState,
    plan: &Plan,
    slot: StageSlot,
) -> Result<&'s str, DataplaneError> {
    let node = plan
        .assignment
        .iter()
        .find(|(_, s)| **s == slot)
        .map(|(n, _)| n)
        .ok_or_else(|| DataplaneError::Peer(format!("no node at {slot:?}")))?;
    Ok(zone_of(state, node))
}

/// Which ring of a stage's replicas.
#[derive(Clone, Copy)]
enum Ring<'a> {
    /// Every replica, in pipeline order.
    Replicas,
    /// The replicas of one zone (by pipeline index), in pipeline order.
    Zone(&'a [usize]),
}

/// Opens this replica's link to the next member of `ring` and accepts the previous one's;
/// `(rank, size)` its place in the ring.
async fn ring(
    ep: &Endpoint,
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
    ring: Ring<'_>,
    (rank, size): (usize, usize),
) -> Result<RingLink, DataplaneError> {
    let kind = match ring {
        Ring::Replicas => LinkKind::Ring,
        Ring::Zone(_) => LinkKind::ZoneRing,
    };
    // The pipeline of the ring's member `r`.
    let place = |r: usize| match ring {
        Ring::Replicas => r as u32,
        Ring::Zone(members) => members[r] as u32,
    };
    let to = node_at(state, plan, slot_at(place((rank + 1) % size), slot.stage))?;
    let from = slot_at(place((rank + size - 1) % size), slot.stage);
    let from_peer = node_at(state, plan, from)?.peer;
    let (out, inc) = tokio::try_join!(
        client::open_link(ep, &to, plan.epoch, kind, slot),
        ep.take_link((plan.epoch, kind, from), from_peer)
    )?;
    Ok(RingLink {
        rank,
        size,
        next: out.split().1,
        prev: inc.split().0,
        next_crosses: false,
    })
}

/// The links of the all-reduce by zone of the replica at `slot`.
async fn by_zone(
    ep: &Endpoint,
    state: &ControlState,
    plan: &Plan,
    slot: StageSlot,
    layout: ZoneLayout,
) -> Result<ReduceLink, DataplaneError> {
    let rank = slot.pipeline as usize;
    let member = layout
        .member(rank)
        .ok_or_else(|| DataplaneError::Peer(format!("no replica {rank} in the layout")))?;
    let zone_members: Vec<usize> = (0..layout.replicas())
        .filter(|&r| layout.zone_of(r) == Some(member.zone))
        .collect();
    let zone_ring = async {
        if member.zone_size < 2 {
            return Ok(None);
        }
        let place = (member.local, member.zone_size);
        ring(ep, state, plan, slot, Ring::Zone(&zone_members), place)
            .await
            .map(Some)
    };
    let kind = LinkKind::AcrossZones;
    let cross_next = futures::future::try_join_all(member.cross_next.iter().map(|&r| async move {
        let to = node_at(state, plan, slot_at(r as u32, slot.stage))?;
        let s = client::open_link(ep, &to, plan.epoch, kind, slot).await?;
        Ok::<_, DataplaneError>(s.split().1)
    }));
    let cross_prev = futures::future::try_join_all(member.cross_prev.iter().map(|&r| async move {
        let from = slot_at(r as u32, slot.stage);
        let peer = node_at(state, plan, from)?.peer;
        let s = ep.take_link((plan.epoch, kind, from), peer).await?;
        Ok::<_, DataplaneError>(s.split().0)
    }));
    let (zone_ring, cross_next, cross_prev) = tokio::try_join!(zone_ring, cross_next, cross_prev)?;
    Ok(ReduceLink::ByZone(ZoneReduceLink {
        layout,
        member,
        zone_ring,
        cross_next,
        cross_prev,
    }))
}
