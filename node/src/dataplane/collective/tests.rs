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

/// Replicas whose zones are `zones` all-reduce by zone over real channels, sending `wire`
/// across zones: every one ends with the latest entry; returns what each holds and what
/// each sent across.
async fn reduce_by_zone(
    zones: &[u8],
    data: Vec<Vec<f32>>,
    wire: Wire,
) -> (Vec<Vec<f32>>, Vec<u64>) {
    let n = zones.len();
    let keys = keys(n);
    let layout = ZoneLayout::new(zones);
    let members: Vec<ZoneMember> = (0..n).map(|r| layout.member(r).unwrap()).collect();
    let mut zone_rings: Vec<Option<(SecureReader, SecureWriter)>> = (0..n).map(|_| None).collect();
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
            let entered = (round, 10 + rank as u64);
            let reduced = all_reduce_mean_by_zone(&mut v, &layout, links, entered, wire)
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
        &[3, 0, 1, 2, 2, 0, 3],
        &[1, 0],
    ] {
        let n = zones.len();
        let len = 1001;
        let (data, mean) = buffers_and_mean(n, len);
        let in_process = mean_by_zone_in_process(&ZoneLayout::new(zones), &data);
        let (out, across) = reduce_by_zone(zones, data, Wire::F32).await;
        // One process summing as the zones do ends with their very bytes.
        assert_eq!(out[0], in_process, "{zones:?} in one process");
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
    let (out, across) = reduce_by_zone(&[0, 0, 0, 1, 1, 1], data, Wire::F32).await;
    assert!(out.iter().all(|v| v.iter().all(|&x| x == 2.5)));
    let frames = 2 * (HEADER_LEN + ENTRY_LEN) as u64;
    assert!(across.iter().all(|&b| b == 2000 * 4 + frames), "{across:?}");
    let flat_crossing = 2 * 5 * len as u64 * 4 / 6;
    assert!(across[0] * 2 <= flat_crossing, "at most 1/zones of it");
}

/// In bf16 or int8 across zones every replica still ends with the same bytes, the mean
/// within the form's error (each zone's sum quantised on each crossing), and each crossing
/// is the form's share of f32's bytes. Three zones forward totals around their ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_zone_in_a_lossy_form_leaves_every_replica_with_the_same_bytes() {
    for zones in [
        &[0u8, 0, 1, 1][..],
        &[0, 1, 2, 2],
        &[0, 1, 0, 1, 1],
        &[2, 0, 1],
    ] {
        let n = zones.len();
        let len = 3001;
        let (data, mean) = buffers_and_mean(n, len);
        let magnitude: f32 = data
            .iter()
            .map(|d| d.iter().fold(0.0f32, |m, x| m.max(x.abs())))
            .sum();
        let (_, f32_across) = reduce_by_zone(zones, data.clone(), Wire::F32).await;
        for (wire, share, step) in [
            (Wire::Bf16, 0.52, 2f32.powi(-8)),
            (Wire::Int8, 0.3, 1.0 / 127.0),
        ] {
            let (out, across) = reduce_by_zone(zones, data.clone(), wire).await;
            let crossings = 2.0 * (zones.iter().max().copied().unwrap_or(0) as f32 + 1.0);
            let tolerance = crossings * magnitude * step / n as f32;
            for v in &out {
                assert_eq!(v, &out[0], "replicas of {zones:?} differ in {wire}");
                for (a, b) in v.iter().zip(&mean) {
                    assert!((a - b).abs() <= tolerance, "{wire}: {a} vs {b}");
                }
            }
            assert_ne!(out[0], mean, "{wire} is lossy");
            for (lossy, whole) in across.iter().zip(&f32_across) {
                assert!(
                    *lossy as f64 <= share * *whole as f64,
                    "{wire}: {lossy} of {whole}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_mean_matches_direct_mean() {
    for n in [1usize, 2, 3, 4] {
        let len = 1001;
        let (data, mean) = buffers_and_mean(n, len);
        let in_process = ring_mean_in_process(&data);
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
        // One process summing as the ring does ends with the ring's very bytes.
        assert_eq!(results[0], in_process, "ring of {n}");
        for r in &results {
            assert_eq!(r, &results[0], "replicas differ");
            for (a, b) in r.iter().zip(&mean) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }
}
