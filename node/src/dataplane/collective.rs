//! Ring all-reduce (reduce-scatter then all-gather) of f32 gradients over data-plane channels,
//! so each replica sends and receives `2 (n - 1) / n` of the buffer whatever the group size;
//! and the all-reduce by zone ([`zones`]), the same ring inside each zone with only a share of
//! each replica's part crossing between zones.
//!
//! Every chunk also carries the latest entry into the reduction its sender has heard of: each
//! member enters with its place on an emulated accelerator's timeline (0 on a real device), and
//! after the `n - 1` steps of the reduce-scatter every member knows the latest of them, where
//! the emulated ring starts (`crate::emulate::PacedCollective`).

use futures::future::try_join_all;
use tokio::try_join;

use super::DataplaneError;
use super::channel::{SecureReader, SecureWriter};
use super::protocol::{HEADER_LEN, Header, MsgKind, Round};

use zones::{RingStep, part};
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

/// Bytes on the wire of a chunk of `values` values.
fn frame_len(values: usize) -> usize {
    HEADER_LEN + ENTRY_LEN + values * 4
}

/// Chunk `seq` of `round`: the latest entry heard of, then the values of `ranges` of `values`.
fn frame(
    round: Round,
    seq: u32,
    latest: u64,
    values: &[f32],
    ranges: &[std::ops::Range<usize>],
) -> Vec<u8> {
    let len = ranges.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(frame_len(len));
    header(round, seq).encode_into(&mut out);
    out.extend_from_slice(&latest.to_le_bytes());
    for r in ranges {
        for v in &values[r.clone()] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Folds chunk `seq` of `round` into `ranges` of `values` (added, or replacing); returns the
/// latest entry it carried.
fn unframe(
    round: Round,
    seq: u32,
    bytes: &[u8],
    values: &mut [f32],
    ranges: &[std::ops::Range<usize>],
    adds: bool,
) -> Result<u64, DataplaneError> {
    let payload = header(round, seq).expect(bytes)?;
    let want = frame_len(ranges.iter().map(|r| r.len()).sum()) - HEADER_LEN;
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
        let (these, rest) = incoming.split_at(r.len() * 4);
        incoming = rest;
        let xs = these
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        for (v, x) in values[r.clone()].iter_mut().zip(xs) {
            if adds {
                *v += x;
            } else {
                *v = x;
            }
        }
    }
    Ok(u64::from_le_bytes(latest))
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

/// Replace `values` by their mean over every zone's replicas ([`zones`]: reduce-scatter in
/// each zone's ring, the zones' sums of each piece meet in a ring over the zones, all-gather
/// in each zone's ring); every member ends with identical bytes. As [`all_reduce_mean`] for
/// `entered` and what it returns.
pub async fn all_reduce_mean_by_zone(
    values: &mut [f32],
    layout: &ZoneLayout,
    links: ZoneLinks<'_>,
    round: Round,
    entered: u64,
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
        let outgoing: Vec<Vec<u8>> = member
            .cross_next
            .iter()
            .map(|&to| {
                let ranges = layout.sends(member, &pieces, step, to);
                frame(round, seq as u32, reduced.latest, values, &ranges)
            })
            .collect();
        let incoming: Vec<Vec<std::ops::Range<usize>>> = member
            .cross_prev
            .iter()
            .map(|&from| layout.receives(member, &pieces, step, from))
            .collect();
        let sends = try_join_all(cross_next.iter_mut().zip(&outgoing).map(|(w, f)| w.send(f)));
        let recvs = try_join_all(cross_prev.iter_mut().zip(&incoming).map(|(r, ranges)| {
            let len = ranges.iter().map(|r| r.len()).sum();
            r.recv(frame_len(len) as u64)
        }));
        let (_, got) = try_join!(sends, recvs)?;
        let bytes: u64 = outgoing.iter().map(|f| f.len() as u64).sum();
        reduced.sent += bytes;
        reduced.across += bytes;
        for (chunk, ranges) in got.iter().zip(&incoming) {
            let latest = unframe(round, seq as u32, chunk, values, ranges, step.adds())?;
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
        let out = frame(self.round, self.seq, self.reduced.latest, values, &[send]);
        let max = frame_len(recv.len()) as u64;
        let (_, got) = try_join!(self.links.next.send(&out), self.links.prev.recv(max))?;
        let latest = unframe(self.round, self.seq, &got, values, &[recv], step.adds())?;
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
mod tests {
    use super::super::{accept, connect};
    use super::*;
    use crate::key::ClusterKey;
    use libp2p::identity::Keypair;

    /// A keyed channel from `from` to `to`: the sender's half and the receiver's.
    async fn channel(from: &Keypair, to: &Keypair) -> (SecureWriter, SecureReader) {
        let secret = ClusterKey::from_bytes([1u8; 32]);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (kj, s2) = (to.clone(), secret.clone());
        let acc = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            accept(s, &kj, &[s2], |_| async { true }).await.unwrap().1
        });
        let peer = to.public().to_peer_id();
        let out = connect(addr, from, peer, std::slice::from_ref(&secret))
            .await
            .unwrap();
        (out.split().1, acc.await.unwrap().split().0)
    }

    fn keys(n: usize) -> Vec<Keypair> {
        (0..n).map(|_| Keypair::generate_ed25519()).collect()
    }

    /// A ring over `members` (indices into `keys`): each one's reader from its predecessor and
    /// writer to its successor, in the members' order.
    async fn ring_of(keys: &[Keypair], members: &[usize]) -> Vec<(SecureReader, SecureWriter)> {
        let n = members.len();
        let mut links: Vec<(Option<SecureReader>, Option<SecureWriter>)> =
            (0..n).map(|_| (None, None)).collect();
        for i in 0..n {
            let j = (i + 1) % n;
            let (w, r) = channel(&keys[members[i]], &keys[members[j]]).await;
            links[i].1 = Some(w);
            links[j].0 = Some(r);
        }
        links
            .into_iter()
            .map(|(r, w)| (r.unwrap(), w.unwrap()))
            .collect()
    }

    async fn ring(n: usize) -> Vec<(SecureReader, SecureWriter)> {
        let members: Vec<usize> = (0..n).collect();
        ring_of(&keys(n), &members).await
    }

    /// Replicas whose zones are `zones` all-reduce by zone over real channels: every one ends
    /// with the same bytes, the mean, and the latest entry; returns what each sent across.
    async fn reduce_by_zone(zones: &[u8], data: Vec<Vec<f32>>) -> (Vec<Vec<f32>>, Vec<u64>) {
        let n = zones.len();
        let keys = keys(n);
        let layout = ZoneLayout::new(zones);
        let members: Vec<ZoneMember> = (0..n).map(|r| layout.member(r).unwrap()).collect();
        let mut zone_rings: Vec<Option<(SecureReader, SecureWriter)>> =
            (0..n).map(|_| None).collect();
        for z in 0..layout.zones() {
            let in_zone: Vec<usize> = (0..n).filter(|&r| members[r].zone == z).collect();
            if in_zone.len() > 1 {
                for (r, links) in in_zone.iter().zip(ring_of(&keys, &in_zone).await) {
                    zone_rings[*r] = Some(links);
                }
            }
        }
        let mut cross_next: Vec<Vec<Option<SecureWriter>>> = Vec::new();
        let mut cross_prev: Vec<Vec<Option<SecureReader>>> = members
            .iter()
            .map(|m| m.cross_prev.iter().map(|_| None).collect())
            .collect();
        for (r, m) in members.iter().enumerate() {
            let mut out = Vec::new();
            for &to in &m.cross_next {
                let (w, rd) = channel(&keys[r], &keys[to]).await;
                out.push(Some(w));
                let at = members[to].cross_prev.iter().position(|&f| f == r).unwrap();
                cross_prev[to][at] = Some(rd);
            }
            cross_next.push(out);
        }
        let round = Round { epoch: 2, step: 5 };
        let mut tasks = Vec::new();
        for (rank, v) in data.into_iter().enumerate() {
            let (layout, member) = (layout.clone(), members[rank].clone());
            let mut ring = zone_rings[rank].take();
            let mut next: Vec<SecureWriter> = cross_next[rank]
                .iter_mut()
                .map(|w| w.take().unwrap())
                .collect();
            let mut prev: Vec<SecureReader> = cross_prev[rank]
                .iter_mut()
                .map(|r| r.take().unwrap())
                .collect();
            tasks.push(tokio::spawn(async move {
                let mut v = v;
                let zone_ring = ring.as_mut().map(|(prev, next)| RingLinks {
                    rank: member.local,
                    size: member.zone_size,
                    next,
                    prev,
                    next_crosses: false,
                });
                let links = ZoneLinks {
                    member: &member,
                    zone_ring,
                    cross_next: next.iter_mut().collect(),
                    cross_prev: prev.iter_mut().collect(),
                };
                let reduced =
                    all_reduce_mean_by_zone(&mut v, &layout, links, round, 10 + rank as u64)
                        .await
                        .unwrap();
                (v, reduced)
            }));
        }
        let mut out = Vec::new();
        let mut across = Vec::new();
        for t in tasks {
            let (v, reduced) = t.await.unwrap();
            assert_eq!(
                reduced.latest,
                10 + n as u64 - 1,
                "every replica learns the latest entry"
            );
            assert!(reduced.sent >= reduced.across);
            out.push(v);
            across.push(reduced.across);
        }
        (out, across)
    }

    /// A buffer of `len` values for each of `n` replicas, and their mean.
    fn buffers_and_mean(n: usize, len: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
        let data: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                (0..len)
                    .map(|i| (i * (r + 1)) as f32 * 0.001 - r as f32)
                    .collect()
            })
            .collect();
        let mean = (0..len)
            .map(|i| data.iter().map(|d| d[i]).sum::<f32>() / n as f32)
            .collect();
        (data, mean)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_zone_gives_the_flat_mean_on_every_replica() {
        for zones in [
            &[0u8, 0, 1, 1][..],
            &[0, 1, 0, 1, 1],
            &[0, 1, 2, 2],
            &[1, 0],
        ] {
            let n = zones.len();
            let len = 1001;
            let (data, mean) = buffers_and_mean(n, len);
            let (out, across) = reduce_by_zone(zones, data).await;
            for v in &out {
                assert_eq!(v, &out[0], "replicas of {zones:?} differ");
                for (a, b) in v.iter().zip(&mean) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
            }
            assert!(across.iter().all(|&b| b > 0), "{across:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_zone_sends_across_a_share_of_what_a_flat_ring_sends() {
        // Two zones of three: each replica's third of the buffer, once; a flat ring's crossing
        // member sends 2 * 5/6 of it.
        let len = 6000;
        let data: Vec<Vec<f32>> = (0..6).map(|r| vec![r as f32; len]).collect();
        let (out, across) = reduce_by_zone(&[0, 0, 0, 1, 1, 1], data).await;
        assert!(out.iter().all(|v| v.iter().all(|&x| x == 2.5)));
        let frames = 2 * (HEADER_LEN + ENTRY_LEN) as u64;
        assert!(across.iter().all(|&b| b == 2000 * 4 + frames), "{across:?}");
        let flat_crossing = 2 * 5 * len as u64 * 4 / 6;
        assert!(across[0] * 2 <= flat_crossing, "at most 1/zones of it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ring_mean_matches_direct_mean() {
        for n in [1usize, 2, 3, 4] {
            let len = 1001;
            let (data, mean) = buffers_and_mean(n, len);
            let links = ring(n).await;
            let round = Round { epoch: 3, step: 9 };
            let mut tasks = Vec::new();
            for (rank, ((mut prev, mut next), mut v)) in links.into_iter().zip(data).enumerate() {
                tasks.push(tokio::spawn(async move {
                    let l = RingLinks {
                        rank,
                        size: n,
                        next: &mut next,
                        prev: &mut prev,
                        next_crosses: false,
                    };
                    // Entries 100, 107, 101, 108, ...: every member learns the latest.
                    let entered = 100 + (rank as u64 % 2) * 7 + rank as u64 / 2;
                    let latest = all_reduce_mean(&mut v, l, round, entered)
                        .await
                        .unwrap()
                        .latest;
                    (v, latest)
                }));
            }
            let mut results = Vec::new();
            for t in tasks {
                let (v, latest) = t.await.unwrap();
                let expected = (0..n as u64).map(|r| 100 + (r % 2) * 7 + r / 2).max();
                assert_eq!(Some(latest), expected, "latest entry of {n}");
                results.push(v);
            }
            for r in &results {
                assert_eq!(r, &results[0], "replicas differ");
                for (a, b) in r.iter().zip(&mean) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
            }
        }
    }
}
