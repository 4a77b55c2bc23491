//! The fleet's nodes in the order they joined, interval by interval: what a zone-ignorant
//! system ranks its workers by (Parcae, Bamboo and Oobleck take workers in the order they
//! register, whatever their zone), so the zone-blind planner fills its pipelines from it.
//!
//! The traces count nodes, not names, so who leaves and how simultaneous arrivals interleave is
//! drawn from a seed: a preemption takes any of a zone's nodes with equal chance (a spot
//! reclaim does not look at join order), and the nodes that arrive in one interval, from every
//! zone, register in a random order (their boots race).

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::Trace;

/// The zone (index of `traces`) of every node alive in each of the first `len` intervals, in
/// the order the nodes joined; seeded by `seed`. Each interval removes its `removed` nodes of a
/// zone and adds its `added`, then meets the interval's `nodes` (a trace whose counts do not
/// add up is followed by its counts).
pub fn join_orders(traces: &[Trace], len: usize, seed: u64) -> Vec<Arc<[u8]>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut alive: Vec<u8> = Vec::new();
    let mut orders = Vec::with_capacity(len);
    for i in 0..len {
        let mut arrivals = Vec::new();
        for (z, trace) in traces.iter().enumerate() {
            let zone = z as u8;
            let iv = &trace.intervals[i];
            let had = alive.iter().filter(|&&a| a == zone).count() as u32;
            let (removed, added) = if i == 0 {
                (0, iv.nodes)
            } else {
                leaves_and_joins(had, iv.removed, iv.added, iv.nodes)
            };
            remove_some(&mut alive, zone, removed, &mut rng);
            arrivals.extend(std::iter::repeat_n(zone, added as usize));
        }
        arrivals.shuffle(&mut rng);
        alive.extend(arrivals);
        orders.push(Arc::from(alive.as_slice()));
    }
    orders
}

/// How many of a zone's `had` nodes leave and how many join, from an interval's `removed`,
/// `added` and `nodes`: its events where they add up to `nodes`, else fewer arrivals, then
/// more removals (or more arrivals) until they do.
fn leaves_and_joins(had: u32, removed: u32, added: u32, nodes: u32) -> (u32, u32) {
    let removed = removed.min(had);
    let after = had - removed + added;
    if after >= nodes {
        let excess = after - nodes;
        let fewer_arrivals = excess.min(added);
        (removed + excess - fewer_arrivals, added - fewer_arrivals)
    } else {
        (removed, added + nodes - after)
    }
}

/// Removes `n` of `zone`'s nodes from `alive`, each of them with equal chance, keeping the
/// others' order.
fn remove_some(alive: &mut Vec<u8>, zone: u8, n: u32, rng: &mut ChaCha8Rng) {
    for _ in 0..n {
        let held = alive.iter().filter(|&&a| a == zone).count();
        if held == 0 {
            return;
        }
        let pick = rng.random_range(0..held);
        if let Some(at) = alive
            .iter()
            .enumerate()
            .filter(|(_, a)| **a == zone)
            .nth(pick)
            .map(|(at, _)| at)
        {
            alive.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Interval;

    fn trace(intervals: &[(u32, u32, u32)]) -> Trace {
        Trace {
            source: "test".into(),
            interval_secs: 60,
            intervals: intervals
                .iter()
                .map(|&(nodes, added, removed)| Interval {
                    nodes,
                    added,
                    removed,
                })
                .collect(),
        }
    }

    fn count(order: &[u8], zone: u8) -> u32 {
        order.iter().filter(|&&z| z == zone).count() as u32
    }

    #[test]
    fn each_interval_holds_each_zones_count_and_keeps_the_survivors_order() {
        let a = trace(&[(4, 4, 0), (3, 0, 1), (5, 2, 0), (5, 1, 1), (2, 0, 3)]);
        let b = trace(&[(2, 2, 0), (2, 0, 0), (0, 0, 2), (3, 3, 0), (3, 0, 0)]);
        let orders = join_orders(&[a.clone(), b.clone()], 5, 7);
        assert_eq!(orders.len(), 5);
        for (i, order) in orders.iter().enumerate() {
            assert_eq!(count(order, 0), a.intervals[i].nodes, "interval {i}");
            assert_eq!(count(order, 1), b.intervals[i].nodes, "interval {i}");
        }
        // An interval with no event keeps the order as it was.
        let quiet = join_orders(
            &[
                trace(&[(3, 3, 0), (3, 0, 0)]),
                trace(&[(2, 2, 0), (2, 0, 0)]),
            ],
            2,
            1,
        );
        assert_eq!(quiet[0], quiet[1]);
        // Arrivals go after every node that was there.
        let grown = join_orders(
            &[
                trace(&[(2, 2, 0), (2, 0, 0)]),
                trace(&[(0, 0, 0), (3, 3, 0)]),
            ],
            2,
            1,
        );
        assert_eq!(&grown[1][..2], &grown[0][..]);
        assert_eq!(&grown[1][2..], &[1, 1, 1]);
    }

    #[test]
    fn events_are_taken_where_they_add_up_and_bent_to_the_counts_where_not() {
        assert_eq!(leaves_and_joins(5, 2, 1, 4), (2, 1));
        assert_eq!(leaves_and_joins(5, 0, 3, 6), (0, 1), "fewer arrivals first");
        assert_eq!(leaves_and_joins(5, 1, 0, 2), (3, 0), "then more removals");
        assert_eq!(
            leaves_and_joins(5, 9, 0, 1),
            (5, 1),
            "no more removals than nodes"
        );
        assert_eq!(leaves_and_joins(2, 0, 0, 5), (0, 3), "or more arrivals");
    }

    #[test]
    fn counts_that_do_not_add_up_are_followed() {
        // 4 nodes, then a trace that says 6 with one arrival, then 1 with no removal.
        let a = trace(&[(4, 4, 0), (6, 1, 0), (1, 0, 0)]);
        let orders = join_orders(&[a], 3, 3);
        let sizes: Vec<usize> = orders.iter().map(|o| o.len()).collect();
        assert_eq!(sizes, vec![4, 6, 1]);
    }

    #[test]
    fn the_order_depends_on_the_seed_and_on_nothing_else() {
        let a = trace(&[(8, 8, 0), (6, 0, 2), (8, 2, 0)]);
        let b = trace(&[(8, 8, 0), (7, 1, 2), (7, 0, 0)]);
        let traces = [a, b];
        assert_eq!(join_orders(&traces, 3, 5), join_orders(&traces, 3, 5));
        let differs = (0..8).any(|s| join_orders(&traces, 3, s) != join_orders(&traces, 3, 5));
        assert!(differs, "eight seeds drew one order");
        // Simultaneous arrivals interleave: not every zone's nodes in one run.
        let first = &join_orders(&traces, 1, 5)[0];
        assert_ne!(&first[..8], &[0; 8]);
    }
}
