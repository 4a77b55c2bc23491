use super::*;

/// Runs the all-reduce by zone in memory over `data` (one buffer a replica) with the
/// schedule's own functions: sums (not yet divided), and the bytes of values each replica sent
/// across zones; checks that every send is received as sent.
fn simulate(layout: &ZoneLayout, data: Vec<Vec<f32>>) -> (Vec<Vec<f32>>, Vec<usize>) {
    let w = layout.replicas();
    let len = data[0].len();
    let members: Vec<ZoneMember> = (0..w).map(|r| layout.member(r).unwrap()).collect();
    for z in 0..layout.zones() {
        let ring: Vec<usize> = (0..w).filter(|&r| members[r].zone == z).collect();
        let n = ring.len();
        for (local, &r) in ring.iter().enumerate() {
            let prev = ring[(local + n - 1) % n];
            assert_eq!(members[r].zone_ring.map(|z| z.0), (n > 1).then_some(prev));
        }
    }
    let mut across = vec![0; w];
    let pieces: Vec<Vec<Piece>> = members.iter().map(|m| layout.pieces(m, len)).collect();
    for step in RingStep::all(layout.zones()) {
        for (r, m) in members.iter().enumerate() {
            for &to in &m.cross_next {
                let sent = layout.sends(m, &pieces[r], step, to);
                let got = layout.receives(&members[to], &pieces[to], step, r);
                assert_eq!(sent, got, "{r} -> {to} at {step:?}");
                across[r] += sent.iter().map(|range| range.len() * 4).sum::<usize>();
            }
            for &from in &m.cross_prev {
                assert!(
                    members[from].cross_next.contains(&r),
                    "{from} does not send to {r}"
                );
            }
        }
    }
    (layout.sums_in_process(&data), across)
}

fn buffers(w: usize, len: usize) -> Vec<Vec<f32>> {
    (0..w)
        .map(|r| {
            (0..len)
                .map(|i| ((i * 7 + r * 13) % 97) as f32 * 0.125 - r as f32)
                .collect()
        })
        .collect()
}

#[test]
fn parts_cut_in_proportion_cover_the_buffer() {
    for (len, n) in [(10, 3), (5, 3), (2, 4), (1001, 7), (0, 2)] {
        let parts: Vec<Range<usize>> = (0..n).map(|i| part(len, n, i)).collect();
        assert_eq!(parts[0].start, 0);
        assert_eq!(parts[n - 1].end, len);
        for w in parts.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert!(
            sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
            "{sizes:?}"
        );
    }
    assert_eq!(part(10, 3, 1), 3..6);
}

#[test]
fn a_ring_step_sends_what_the_successor_receives() {
    for n in 2..6 {
        for step in RingStep::all(n) {
            for at in 0..n {
                let (send, _) = step.parts(n, at);
                let (_, recv) = step.parts(n, (at + 1) % n);
                assert_eq!(send, recv, "{step:?} of {n} at {at}");
            }
        }
    }
    // After the reduce-scatter member r holds part r + 1: it received it at the last step.
    assert_eq!(RingStep::Reduce(2).parts(4, 1).1, reduced_part(4, 1));
}

#[test]
fn replicas_group_by_zone_in_key_order() {
    let layout = ZoneLayout::new(&["b", "a", "b", "a", "b"]);
    assert_eq!((layout.zones(), layout.replicas()), (2, 5));
    assert_eq!(layout.zone_of(0), Some(1));
    let m = layout.member(2).unwrap();
    assert_eq!((m.zone, m.local, m.zone_size), (1, 1, 3));
    assert_eq!(m.zone_ring, Some((0, 4)));
    // Zone b's replica 2 holds part 2 of 3 (2/3..1): zone a's replica 1 holds part 1 of 2
    // (1/2..1), replica 3 part 0 (0..1/2).
    assert_eq!(m.cross_next, vec![1]);
    assert_eq!(m.cross_prev, vec![1]);
    let lone = ZoneLayout::new(&["a", "b"]).member(0).unwrap();
    assert_eq!((lone.zone_ring, lone.cross_next.clone()), (None, vec![1]));
    assert!(
        ZoneLayout::new(&["a", "a"])
            .member(1)
            .unwrap()
            .cross_next
            .is_empty()
    );
}

#[test]
fn every_replica_ends_with_the_flat_sum_in_the_same_bytes() {
    let layouts: [&[u8]; 9] = [
        &[0, 0, 1, 1],
        &[0, 1, 0, 1],
        &[0, 0, 0, 1],
        &[0, 1],
        &[0, 0, 1, 1, 1],
        &[0, 1, 2],
        &[0, 0, 1, 1, 2, 2],
        &[2, 0, 1, 1, 0, 3, 3, 3, 1],
        &[0, 0, 0],
    ];
    for zones in layouts {
        let layout = ZoneLayout::new(zones);
        for len in [1usize, 3, 7, 64, 1001] {
            let data = buffers(zones.len(), len);
            let flat: Vec<f32> = (0..len).map(|i| data.iter().map(|d| d[i]).sum()).collect();
            let (out, _) = simulate(&layout, data);
            for (r, got) in out.iter().enumerate() {
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    out[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "replica {r} of {zones:?}, {len} values"
                );
                for (a, b) in got.iter().zip(&flat) {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                        "{a} vs {b} in {zones:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn each_replica_sends_across_zones_a_share_of_its_part() {
    // Two zones of 4: each replica holds a quarter and sends it once (half each way of the
    // ring over two zones: the reduce-scatter's sub-piece, then the all-gather's).
    let layout = ZoneLayout::new(&[0, 0, 0, 0, 1, 1, 1, 1]);
    let (_, across) = simulate(&layout, buffers(8, 4000));
    assert!(across.iter().all(|&b| b == 1000 * 4), "{across:?}");
    // A flat ring of 8 over two zones sends 2 (8 - 1) / 8 of the buffer on each crossing link.
    let flat_crossing = 2 * 7 * 4000 * 4 / 8;
    assert!(across[0] * 2 <= flat_crossing, "at most 1/zones of it");
    // Three zones of 2: 2 (3 - 1) / 3 of each replica's half crosses.
    let layout = ZoneLayout::new(&[0, 0, 1, 1, 2, 2]);
    let (_, across) = simulate(&layout, buffers(6, 6000));
    assert!(across.iter().all(|&b| b == 4000 * 4), "{across:?}");
    // Unequal zones: the lone replica sends its whole buffer, once.
    let layout = ZoneLayout::new(&[0, 0, 0, 1]);
    let (_, across) = simulate(&layout, buffers(4, 3000));
    assert_eq!(across, vec![1000 * 4, 1000 * 4, 1000 * 4, 3000 * 4]);
}
