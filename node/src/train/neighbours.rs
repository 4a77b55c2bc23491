//! A stage's pipeline neighbours and its replicas over the data plane, as a step of
//! `parcae-model` sees them ([`parcae_model::Neighbours`], [`parcae_model::Collective`]): every
//! message carries the round's [`Header`], and a receive waits (never "not here yet"), ending on
//! a timeout or as soon as a newer plan is committed (`Waiter`).

use parcae_model::{Collective, Neighbours};
use parcae_outer::Wire;

use super::error::TrainError;
use super::waiter::Waiter;
use crate::dataplane::collective::{Reduced, all_reduce_mean, all_reduce_mean_by_zone};
use crate::dataplane::links::{PipeLink, ReduceLink, RingLink};
use crate::dataplane::protocol::{Header, MsgKind, Round};
use crate::metrics::Metrics;

/// Largest activation or gradient message accepted from a pipeline neighbour (the wire decoder
/// then checks its shape against the stage's limits).
pub const MAX_STEP_MESSAGE: u64 = 256 << 20;

/// Which neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The previous stage (activations come from it, gradients go to it).
    Prev,
    /// The next stage.
    Next,
}

/// The pipeline links of one step of this node's stage.
pub(crate) struct LinkNeighbours<'w, 'l> {
    /// Bounds every wait.
    pub(crate) waiter: &'w Waiter<'w>,
    /// The step's round, in every header.
    pub(crate) round: Round,
    /// To the previous stage (`None` at the first stage).
    pub(crate) prev: Option<&'l mut PipeLink>,
    /// To the next stage (`None` at the last stage).
    pub(crate) next: Option<&'l mut PipeLink>,
}

impl LinkNeighbours<'_, '_> {
    fn link(&mut self, side: Side) -> Result<&mut PipeLink, TrainError> {
        match side {
            Side::Prev => self.prev.as_deref_mut(),
            Side::Next => self.next.as_deref_mut(),
        }
        .ok_or_else(|| TrainError::Config(format!("no pipeline link to the {side:?} stage")))
    }

    fn header(&self, kind: MsgKind, seq: usize) -> Header {
        Header {
            kind,
            round: self.round,
            seq: seq as u32,
        }
    }

    /// The next message from `side`, which must be `kind` number `seq` of this round.
    pub(crate) fn recv(
        &mut self,
        side: Side,
        kind: MsgKind,
        seq: usize,
    ) -> Result<Vec<u8>, TrainError> {
        let header = self.header(kind, seq);
        let waiter = self.waiter;
        let link = self.link(side)?;
        let bytes = waiter.wait(&format!("{kind:?}"), link.recv(MAX_STEP_MESSAGE))?;
        Ok(header.expect(&bytes)?.to_vec())
    }

    /// Queues `payload` to `side` as `kind` number `seq` of this round.
    pub(crate) fn send(
        &mut self,
        side: Side,
        kind: MsgKind,
        seq: usize,
        payload: &[u8],
    ) -> Result<(), TrainError> {
        let framed = self.header(kind, seq).frame(payload);
        Ok(self.link(side)?.send(framed)?)
    }
}

impl Neighbours for LinkNeighbours<'_, '_> {
    type Error = TrainError;

    fn recv_activation(&mut self, mb: usize) -> Result<Option<Vec<u8>>, TrainError> {
        self.recv(Side::Prev, MsgKind::Activation, mb).map(Some)
    }

    fn send_activation(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), TrainError> {
        self.send(Side::Next, MsgKind::Activation, mb, &bytes)
    }

    fn recv_grad(&mut self, mb: usize) -> Result<Option<Vec<u8>>, TrainError> {
        self.recv(Side::Next, MsgKind::Grad, mb).map(Some)
    }

    fn send_grad(&mut self, mb: usize, bytes: Vec<u8>) -> Result<(), TrainError> {
        self.send(Side::Prev, MsgKind::Grad, mb, &bytes)
    }
}

/// Which replicas of the stage an all-reduce spans.
pub(crate) enum Reach<'l> {
    /// Every replica, over the plan's links.
    Replicas(&'l mut ReduceLink),
    /// Those in this replica's zone, over its zone's ring (DiLoCo's inner steps).
    Zone(&'l mut RingLink),
}

/// The all-reduce of this node's stage for one step.
pub(crate) struct RingCollective<'w, 'l> {
    /// Bounds the reduction.
    pub(crate) waiter: &'w Waiter<'w>,
    /// The step's round, in every chunk's header.
    pub(crate) round: Round,
    /// The links of the all-reduce.
    pub(crate) links: Reach<'l>,
    /// Counts what the all-reduce sends.
    pub(crate) metrics: &'l Metrics,
    /// The form of what an all-reduce by zone sends between zones.
    pub(crate) across: Wire,
}

impl RingCollective<'_, '_> {
    /// The same all-reduce, sending `wire` between zones.
    pub(crate) fn across_as(self, wire: Wire) -> Self {
        Self {
            across: wire,
            ..self
        }
    }
}

impl Collective for RingCollective<'_, '_> {
    type Error = TrainError;

    fn all_reduce_mean(&mut self, values: &mut [f32]) -> Result<(), TrainError> {
        self.all_reduce_mean_entered(values, 0).map(drop)
    }

    fn all_reduce_mean_entered(
        &mut self,
        values: &mut [f32],
        entered: u64,
    ) -> Result<u64, TrainError> {
        let (round, waiter) = (self.round, self.waiter);
        let reduced = match &mut self.links {
            Reach::Zone(ring) => ring_all_reduce(waiter, values, ring, round, entered)?,
            Reach::Replicas(ReduceLink::Ring(ring)) => {
                ring_all_reduce(waiter, values, ring, round, entered)?
            }
            Reach::Replicas(ReduceLink::ByZone(by_zone)) => {
                let layout = by_zone.layout.clone();
                let (links, wire) = (by_zone.links(), self.across);
                waiter.wait(
                    "all-reduce by zone",
                    all_reduce_mean_by_zone(values, &layout, links, (round, entered), wire),
                )?
            }
        };
        self.metrics.allreduce_bytes_total.inc_by(reduced.sent);
        self.metrics
            .allreduce_cross_zone_bytes_total
            .inc_by(reduced.across);
        Ok(reduced.latest)
    }
}

/// The ring all-reduce over `ring`, bounded by `waiter`.
fn ring_all_reduce(
    waiter: &Waiter<'_>,
    values: &mut [f32],
    ring: &mut RingLink,
    round: Round,
    entered: u64,
) -> Result<Reduced, TrainError> {
    waiter.wait(
        "all-reduce",
        all_reduce_mean(values, ring.links(), round, entered),
    )
}
