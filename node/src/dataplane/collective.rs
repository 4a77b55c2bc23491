//! Ring all-reduce (reduce-scatter then all-gather) of f32 gradients over data-plane channels,
//! so each replica sends and receives `2 (n - 1) / n` of the buffer whatever the group size;
//! and the all-reduce by zone ([`zones`]), the same ring inside each zone with only a share of
//! each replica's part crossing between zones, in a wire form of its own (f32 for a step's
//! gradients; DiLoCo's rounds may send their pseudo-gradients as bf16 or int8 there).
//!
//! A wire form other than f32 is lossy, yet every replica must end with the same bytes: each
//! range crossing zones is encoded on its own (the same ranges in every zone), and a total's
//! holder reads back what it sends, so the copies it hands on around the zones
//! are its own values; forms are settled (`parcae_outer::codec`), so a copy re-encoded on its
//! way is the same bytes.
//!
//! Every chunk also carries the latest entry into the reduction its sender has heard of: each
//! member enters with its place on an emulated accelerator's timeline (0 on a real device), and
//! after the `n - 1` steps of the reduce-scatter every member knows the latest of them, where
//! the emulated ring starts (`crate::emulate::PacedCollective`).

use std::ops::Range;

use futures::future::try_join_all;
use parcae_outer::Wire;
use parcae_outer::codec;
use tokio::try_join;

use super::DataplaneError;
use super::channel::{SecureReader, SecureWriter};
use super::protocol::{HEADER_LEN, Header, MsgKind, Round};

use zones::{RingStep, fold, part, ring_in_process};
pub use zones::{ZoneLayout, ZoneMember};

/// A member's links in the ring: it sends to its successor and receives from its predecessor.
pub struct RingLinks<'a> {
    /// Position of this member in the ring.
    pub rank: usize,
    /// Members in the ring.
    pub size: usize,
    /// Channel to `rank + 1`.
    pub next: &'a mut SecureWriter,
    /// Channel from `rank - 1`.
    pub prev: &'a mut SecureReader,
    /// Whether `rank + 1` is in another zone (what it is sent is counted as crossing).
    pub next_crosses: bool,
}

/// A member's links in the all-reduce by zone ([`zones`]): its zone's ring, and one link to
/// (from) each replica of the next (previous) zone whose part overlaps its own, in the order
/// of [`ZoneMember::cross_next`] ([`ZoneMember::cross_prev`]).
pub struct ZoneLinks<'a> {
    /// Where the member stands.
    pub member: &'a ZoneMember,
    /// The ring of its zone (`rank` its place in the zone), when the zone holds two or more.
    pub zone_ring: Option<RingLinks<'a>>,
    /// To each replica of the next zone it sends to.
    pub cross_next: Vec<&'a mut SecureWriter>,
    /// From each replica of the previous zone it receives from.
    pub cross_prev: Vec<&'a mut SecureReader>,
}

/// What one member's all-reduce did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reduced {
    /// The latest entry of any member.
    pub latest: u64,
    /// Bytes this member sent.
    pub sent: u64,
    /// Of them, bytes sent to a member in another zone.
    pub across: u64,
}

/// The header of chunk `seq` of the all-reduce of `round`.
fn header(round: Round, seq: u32) -> Header {
    Header {
        kind: MsgKind::AllReduce,
        round,
        seq,
    }
}

/// Bytes of the latest entry a chunk carries after its header.
const ENTRY_LEN: usize = 8;

/// Bytes on the wire of a chunk of `ranges` in the `wire` form (each range encoded on its own).
fn frame_len(ranges: &[Range<usize>], wire: Wire) -> usize {
    ranges.iter().fold(HEADER_LEN + ENTRY_LEN, |sum, r| {
        sum.saturating_add(wire.encoded_len(r.len()).unwrap_or(usize::MAX))
    })
}

/// Chunk `seq` of `round`: the latest entry heard of, then `ranges` of `values` in the `wire`
/// form, one after the other. f32 values go as they are, whatever they hold.
fn frame(
    round: Round,
    seq: u32,
    latest: u64,
    values: &[f32],
    ranges: &[Range<usize>],
    wire: Wire,
) -> Result<Vec<u8>, DataplaneError> {
    let mut out = Vec::with_capacity(frame_len(ranges, wire));
    header(round, seq).encode_into(&mut out);
    out.extend_from_slice(&latest.to_le_bytes());
    for r in ranges {
        match wire {
            Wire::F32 => values[r.clone()]
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            _ => codec::encode_into(&values[r.clone()], wire, &mut out).map_err(wire_error)?,
        }
    }
    Ok(out)
}

/// Folds chunk `seq` of `round` into `ranges` of `values` (added, or replacing); returns the
/// latest entry it carried.
fn unframe(
    round: Round,
    seq: u32,
    bytes: &[u8],
    values: &mut [f32],
    ranges: &[Range<usize>],
    (adds, wire): (bool, Wire),
) -> Result<u64, DataplaneError> {
    let payload = header(round, seq).expect(bytes)?;
    let want = frame_len(ranges, wire) - HEADER_LEN;
    if payload.len() != want {
        return Err(DataplaneError::Protocol(format!(
            "all-reduce chunk of {} bytes, expected {want}",
            payload.len()
        )));
    }
    let (entry, mut incoming) = payload.split_at(ENTRY_LEN);
    let mut latest = [0u8; ENTRY_LEN];
    latest.copy_from_slice(entry);
    for r in ranges {
        // Every range's length was counted into `want`.
        let (these, rest) = incoming.split_at(wire.encoded_len(r.len()).unwrap_or_default());
        incoming = rest;
        let into = &mut values[r.clone()];
        match wire {
            Wire::F32 => fold(
                into,
                these
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                adds,
            ),
            _ => fold(
                into,
                codec::decode(these, wire, r.len())
                    .map_err(wire_error)?
                    .into_iter(),
                adds,
            ),
        }
    }
    Ok(u64::from_le_bytes(latest))
}

/// Adds `xs` to `into`, or puts them in its place.
fn wire_error(e: codec::CodecError) -> DataplaneError {
    DataplaneError::Protocol(format!("all-reduce by zone: {e}"))
}

/// Replace `values` by their mean over the ring (every member ends with identical bytes).
/// This member enters at `entered` on its timeline; returns, with what it sent, the latest
/// entry of any member.
pub async fn all_reduce_mean(
    values: &mut [f32],
    links: RingLinks<'_>,
    round: Round,
    entered: u64,
) -> Result<Reduced, DataplaneError> {
    let n = links.size;
    let mut ring = Ring::new(links, round, entered);
    for step in RingStep::all(n) {
        ring.exchange(values, step).await?;
    }
    scale(values, n);
    Ok(ring.reduced)
}

/// What every member of a ring of `values.len()` members holds after [`all_reduce_mean`],
/// member `r` bringing `values[r]`: the same steps and the same additions, in one process (a
/// replay sums as the ring does, bit for bit).
pub fn ring_mean_in_process(values: &[Vec<f32>]) -> Vec<f32> {
    let mut held = values.to_vec();
    let ring: Vec<usize> = (0..held.len()).collect();
    ring_in_process(&mut held, &ring, RingStep::all(ring.len()));
    let mut mean = held.into_iter().next().unwrap_or_default();
    scale(&mut mean, ring.len());
    mean
}

/// What every replica of `layout` holds after [`all_reduce_mean_by_zone`] in f32, replica `r`
/// bringing `values[r]`: the same additions in the same order, in one process
/// ([`ZoneLayout::sums_in_process`]; a replay of a round sums as the zones do, bit for bit,
/// for any number of zones).
pub fn mean_by_zone_in_process(layout: &ZoneLayout, values: &[Vec<f32>]) -> Vec<f32> {
    let mut mean = layout
        .sums_in_process(values)
        .into_iter()
        .next()
        .unwrap_or_default();
    scale(&mut mean, layout.replicas());
    mean
}

/// Replace `values` by their mean over every zone's replicas ([`zones`]: reduce-scatter in
/// each zone's ring, the zones' sums of each piece meet in a ring over the zones in the
/// `wire` form, all-gather in each zone's ring); every member ends with identical bytes. As
/// [`all_reduce_mean`] for `entered` and what it returns.
pub async fn all_reduce_mean_by_zone(
    values: &mut [f32],
    layout: &ZoneLayout,
    links: ZoneLinks<'_>,
    (round, entered): (Round, u64),
    wire: Wire,
) -> Result<Reduced, DataplaneError> {
    let ZoneLinks {
        member,
        zone_ring,
        mut cross_next,
        mut cross_prev,
    } = links;
    if cross_next.len() != member.cross_next.len() || cross_prev.len() != member.cross_prev.len() {
        return Err(DataplaneError::Protocol(
            "links across zones do not match the layout".into(),
        ));
    }
    let n = member.zone_size;
    let mut reduced = Reduced {
        latest: entered,
        ..Reduced::default()
    };
    let mut ring = zone_ring.map(|links| Ring::new(links, round, entered));
    if let Some(ring) = ring.as_mut() {
        for step in RingStep::all(n).filter(|s| s.adds()) {
            ring.exchange(values, step).await?;
        }
        reduced.latest = ring.reduced.latest;
    }
    // Across zones, on this member's part only.
    let pieces = layout.pieces(member, values.len());
    for (seq, step) in RingStep::all(layout.zones()).enumerate() {
        let mut outgoing = Vec::with_capacity(member.cross_next.len());
        for &to in &member.cross_next {
            let ranges = layout.sends(member, &pieces, step, to);
            let sent = frame(round, seq as u32, reduced.latest, values, &ranges, wire)?;
            if !step.adds() && wire != Wire::F32 {
                // A total leaves its holder as every other zone will hold it: what it sends.
                unframe(round, seq as u32, &sent, values, &ranges, (false, wire))?;
            }
            outgoing.push(sent);
        }
        let incoming: Vec<Vec<Range<usize>>> = member
            .cross_prev
            .iter()
            .map(|&from| layout.receives(member, &pieces, step, from))
            .collect();
        let sends = try_join_all(cross_next.iter_mut().zip(&outgoing).map(|(w, f)| w.send(f)));
        let recvs = try_join_all(
            cross_prev
                .iter_mut()
                .zip(&incoming)
                .map(|(r, ranges)| r.recv(frame_len(ranges, wire) as u64)),
        );
        let (_, got) = try_join!(sends, recvs)?;
        let bytes: u64 = outgoing.iter().map(|f| f.len() as u64).sum();
        reduced.sent += bytes;
        reduced.across += bytes;
        for (chunk, ranges) in got.iter().zip(&incoming) {
            let latest = unframe(
                round,
                seq as u32,
                chunk,
                values,
                ranges,
                (step.adds(), wire),
            )?;
            reduced.latest = reduced.latest.max(latest);
        }
    }
    if let Some(ring) = ring.as_mut() {
        ring.reduced.latest = reduced.latest;
        for step in RingStep::all(n).filter(|s| !s.adds()) {
            ring.exchange(values, step).await?;
        }
        reduced.latest = ring.reduced.latest;
        reduced.sent += ring.reduced.sent;
    }
    scale(values, layout.replicas());
    Ok(reduced)
}

/// Divides the sums by the `n` members.
fn scale(values: &mut [f32], n: usize) {
    let scale = 1.0 / n.max(1) as f32;
    for v in values.iter_mut() {
        *v *= scale;
    }
}

/// One member's position in a running ring.
struct Ring<'a> {
    links: RingLinks<'a>,
    round: Round,
    seq: u32,
    reduced: Reduced,
}

impl<'a> Ring<'a> {
    fn new(links: RingLinks<'a>, round: Round, entered: u64) -> Self {
        Self {
            links,
            round,
            seq: 0,
            reduced: Reduced {
                latest: entered,
                ..Reduced::default()
            },
        }
    }

    /// Send this step's part to the successor while receiving the predecessor's, folding it
    /// into ours.
    async fn exchange(&mut self, values: &mut [f32], step: RingStep) -> Result<(), DataplaneError> {
        let (len, n) = (values.len(), self.links.size);
        let (send, recv) = step.parts(n, self.links.rank);
        let (send, recv) = (part(len, n, send), part(len, n, recv));
        let (send, recv) = ([send], [recv]);
        let out = frame(
            self.round,
            self.seq,
            self.reduced.latest,
            values,
            &send,
            Wire::F32,
        )?;
        let max = frame_len(&recv, Wire::F32) as u64;
        let (_, got) = try_join!(self.links.next.send(&out), self.links.prev.recv(max))?;
        let latest = unframe(
            self.round,
            self.seq,
            &got,
            values,
            &recv,
            (step.adds(), Wire::F32),
        )?;
        self.reduced.latest = self.reduced.latest.max(latest);
        self.reduced.sent += out.len() as u64;
        if self.links.next_crosses {
            self.reduced.across += out.len() as u64;
        }
        self.seq += 1;
        Ok(())
    }
}

mod zones;

#[cfg(test)]
mod tests;
