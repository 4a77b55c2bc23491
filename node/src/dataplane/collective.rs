//! Ring all-reduce (reduce-scatter then all-gather) of f32 gradients over data-plane channels,
//! so each replica sends and receives `2 (n - 1) / n` of the buffer whatever the group size.
//!
//! Every chunk also carries the latest entry into the reduction its sender has heard of: each
//! member enters with its place on an emulated accelerator's timeline (0 on a real device), and
//! after the `n - 1` steps of the reduce-scatter every member knows the latest of them, where
//! the emulated ring starts (`crate::emulate::PacedCollective`).

use tokio::try_join;

use super::DataplaneError;
use super::channel::{SecureReader, SecureWriter};
use super::protocol::{HEADER_LEN, Header, MsgKind, Round};

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
}

fn chunk_range(len: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
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

fn frame(round: Round, seq: u32, latest: u64, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN + values.len() * 4);
    header(round, seq).encode_into(&mut out);
    out.extend_from_slice(&latest.to_le_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The latest entry and the values of chunk `seq` of `round`, which must hold `want` values.
fn unframe(
    round: Round,
    seq: u32,
    bytes: &[u8],
    want: usize,
) -> Result<(u64, impl Iterator<Item = f32> + '_), DataplaneError> {
    let payload = header(round, seq).expect(bytes)?;
    if payload.len() != ENTRY_LEN + want * 4 {
        return Err(DataplaneError::Protocol(format!(
            "all-reduce chunk of {} bytes, expected {}",
            payload.len(),
            ENTRY_LEN + want * 4
        )));
    }
    let (entry, values) = payload.split_at(ENTRY_LEN);
    let mut latest = [0u8; ENTRY_LEN];
    latest.copy_from_slice(entry);
    let values = values
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    Ok((u64::from_le_bytes(latest), values))
}

/// Replace `values` by their mean over the ring (every member ends with identical bytes).
/// This member enters at `entered` on its timeline; returns the latest entry of any member.
pub async fn all_reduce_mean(
    values: &mut [f32],
    links: RingLinks<'_>,
    round: Round,
    entered: u64,
) -> Result<u64, DataplaneError> {
    let n = links.size;
    if n <= 1 {
        return Ok(entered);
    }
    let RingLinks {
        rank, next, prev, ..
    } = links;
    let mut ring = Ring {
        next,
        prev,
        round,
        seq: 0,
        parts: n,
        latest: entered,
    };
    // Reduce-scatter: after n-1 steps member r holds the full sum of chunk (r + 1) mod n.
    for k in 0..n - 1 {
        let (send, recv) = ((rank + n - k) % n, (rank + n - k - 1) % n);
        ring.exchange(values, send, recv, |v, x| *v += x).await?;
    }
    // All-gather: circulate the reduced chunks.
    for k in 0..n - 1 {
        let (send, recv) = ((rank + 1 + n - k) % n, (rank + n - k) % n);
        ring.exchange(values, send, recv, |v, x| *v = x).await?;
    }
    let scale = 1.0 / n as f32;
    for v in values.iter_mut() {
        *v *= scale;
    }
    Ok(ring.latest)
}

/// One member's position in a running all-reduce.
struct Ring<'a, 'b> {
    next: &'a mut SecureWriter,
    prev: &'b mut SecureReader,
    round: Round,
    seq: u32,
    parts: usize,
    /// The latest entry heard of so far.
    latest: u64,
}

impl Ring<'_, '_> {
    /// Send chunk `send` to the successor while receiving chunk `recv` from the predecessor,
    /// folding the received values into ours with `combine`.
    async fn exchange(
        &mut self,
        values: &mut [f32],
        send: usize,
        recv: usize,
        combine: impl Fn(&mut f32, f32),
    ) -> Result<(), DataplaneError> {
        let len = values.len();
        let max = (HEADER_LEN + ENTRY_LEN + (len / self.parts + 1) * 4) as u64;
        let out = frame(
            self.round,
            self.seq,
            self.latest,
            &values[chunk_range(len, self.parts, send)],
        );
        let (_, got) = try_join!(self.next.send(&out), self.prev.recv(max))?;
        let r = chunk_range(len, self.parts, recv);
        let (latest, incoming) = unframe(self.round, self.seq, &got, r.len())?;
        self.latest = self.latest.max(latest);
        for (v, x) in values[r].iter_mut().zip(incoming) {
            combine(v, x);
        }
        self.seq += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{accept, connect};
    use super::*;
    use crate::key::ClusterKey;
    use libp2p::identity::Keypair;

    async fn ring(n: usize) -> Vec<(SecureReader, SecureWriter)> {
        let secret = ClusterKey::from_bytes([1u8; 32]);
        let keys: Vec<Keypair> = (0..n).map(|_| Keypair::generate_ed25519()).collect();
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for i in 0..n {
            let j = (i + 1) % n;
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let kj = keys[j].clone();
            let s2 = secret.clone();
            let acc = tokio::spawn(async move {
                let (s, _) = l.accept().await.unwrap();
                accept(s, &kj, &[s2], |_| async { true }).await.unwrap().1
            });
            let out = connect(
                addr,
                &keys[i],
                keys[j].public().to_peer_id(),
                std::slice::from_ref(&secret),
            )
            .await
            .unwrap();
            let inb = acc.await.unwrap();
            writers.push(out.split().1);
            readers.push((j, inb.split().0));
        }
        readers.sort_by_key(|(j, _)| *j);
        readers.into_iter().map(|(_, r)| r).zip(writers).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ring_mean_matches_direct_mean() {
        for n in [1usize, 2, 3, 4] {
            let len = 1001;
            let data: Vec<Vec<f32>> = (0..n)
                .map(|r| {
                    (0..len)
                        .map(|i| (i * (r + 1)) as f32 * 0.001 - r as f32)
                        .collect()
                })
                .collect();
            let mean: Vec<f32> = (0..len)
                .map(|i| data.iter().map(|d| d[i]).sum::<f32>() / n as f32)
                .collect();
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
                    };
                    // Entries 100, 107, 101, 108, ...: every member learns the latest.
                    let entered = 100 + (rank as u64 % 2) * 7 + rank as u64 / 2;
                    let latest = all_reduce_mean(&mut v, l, round, entered).await.unwrap();
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
