//! The look-ahead of a planner that forecasts each zone of a fleet apart (the simulator's
//! `liveput-zone` over zones).
//!
//! Zones change apart: one churns by the hour while the other sits full for days, one follows
//! the clock, and a node lost in the fast zone costs more than one lost in the slow one. A
//! forecast of the pooled count mixes them: its regime (full or short), its change rate and
//! what its next change brings belong to no zone. Here each zone has its own [`ZoneModel`],
//! each forecasts its zone as the node default does, and the look-ahead is their sum, each
//! step valued at what the forecast composition trains. Its terminal value is the first change
//! of any zone: with independent zones the fleet's change rate is the sum of theirs, so the
//! expected stay is the inverse of that sum, and the change is zone `z`'s with the share of
//! its rate in it.

use std::sync::Arc;

use super::{NoticeAware, ZoneModel, observed};
use crate::cost::throughput::ThroughputTable;
use crate::liveput::{Lookahead, NextChange, Terminal};
use crate::trace::Interval;

/// What a planner knows of one zone when it decides.
#[derive(Clone, Copy, Debug)]
pub struct ZoneNow<'a> {
    /// The zone's recorded availability.
    pub history: &'a [Interval],
    /// The index of `history`'s first interval (a bounded record drops its oldest).
    pub first: usize,
    /// The upcoming interval as observed: the nodes present, the noticed departures.
    pub event: Interval,
}

/// One zone model per zone of a fleet.
pub struct ZoneForecasts {
    models: Vec<ZoneModel>,
    interval_ms: f64,
}

impl ZoneForecasts {
    /// Models of `zones` zones knowing nothing yet, for intervals of `interval_secs`.
    pub fn new(zones: usize, interval_secs: f64) -> Self {
        Self {
            models: vec![ZoneModel::new(interval_secs); zones],
            interval_ms: interval_secs * 1000.0,
        }
    }

    /// The look-ahead over `horizon` intervals from each zone's state `now` (in the fleet's zone
    /// order), each composition `[nodes of zone z]` valued by `table_of`.
    pub fn lookahead(
        &mut self,
        now: &[ZoneNow<'_>],
        horizon: usize,
        mut table_of: impl FnMut(&[u32]) -> Arc<ThroughputTable>,
    ) -> Lookahead {
        let mut zones: Vec<Vec<Interval>> = Vec::with_capacity(now.len());
        let mut ends = Vec::with_capacity(now.len());
        let mut terminals = Vec::with_capacity(now.len());
        for (model, zone) in self.models.iter_mut().zip(now) {
            let future = observed(
                &mut NoticeAware::new(&mut *model),
                zone.history,
                zone.first,
                zone.event,
                horizon,
            );
            model.observe_from(zone.first, zone.history);
            let end = future.last().map_or(zone.event.nodes, |s| s.nodes);
            let index = zone.first + zone.history.len() + future.len();
            terminals.push(model.terminal(index, end, self.interval_ms));
            ends.push(end);
            zones.push(future);
        }
        let steps = zones.iter().map(Vec::len).min().unwrap_or(0);
        let mut future = Vec::with_capacity(steps);
        let mut tables = Vec::with_capacity(steps);
        for k in 0..steps {
            let counts: Vec<u32> = zones.iter().map(|z| z[k].nodes).collect();
            future.push(pooled(zones.iter().map(|z| z[k])));
            let table = match tables.last() {
                Some((last, table)) if last == &counts => Arc::clone(table),
                _ => table_of(&counts),
            };
            tables.push((counts, table));
        }
        let (mut terminal, after) = first_change(&ends, &terminals);
        for (next, counts) in terminal.next.iter_mut().zip(&after) {
            next.table = Some(table_of(counts));
        }
        Lookahead {
            future,
            tables: tables.into_iter().map(|(_, table)| table).collect(),
            terminal,
        }
    }
}

/// One interval of the fleet from one of each zone.
fn pooled(zones: impl Iterator<Item = Interval>) -> Interval {
    zones.fold(
        Interval {
            nodes: 0,
            added: 0,
            removed: 0,
        },
        |sum, z| Interval {
            nodes: sum.nodes + z.nodes,
            added: sum.added + z.added,
            removed: sum.removed + z.removed,
        },
    )
}

/// The fleet's terminal value from each zone's (`terminals[z]`, zone `z` ending the horizon
/// with `ends[z]` nodes), and the composition after each of its next changes: the fleet stays
/// until the first change of any zone, at the sum of the zones' rates (the inverse of their
/// expected stays), and that change is zone `z`'s outcome with zone `z`'s share of the rate
/// times the outcome's probability; after it the fleet stays until the next change at the
/// other zones' rates and the outcome's own.
fn first_change(ends: &[u32], terminals: &[Terminal]) -> (Terminal, Vec<Vec<u32>>) {
    if terminals.is_empty() {
        return (Terminal::default(), Vec::new());
    }
    // A stay of under a millisecond is a change now.
    let rate = |stay_ms: f64| 1.0 / stay_ms.max(1.0);
    let rates: Vec<f64> = terminals.iter().map(|t| rate(t.stay_ms)).collect();
    let total: f64 = rates.iter().sum();
    let end: u32 = ends.iter().sum();
    let mut next = Vec::new();
    let mut after = Vec::new();
    for (z, t) in terminals.iter().enumerate() {
        let share = rates[z] / total;
        for change in &t.next {
            let mut counts = ends.to_vec();
            counts[z] = change.nodes;
            next.push(NextChange {
                probability: share * change.probability,
                nodes: end - ends[z] + change.nodes,
                stay_ms: 1.0 / (total - rates[z] + rate(change.stay_ms)),
                table: None,
            });
            after.push(counts);
        }
    }
    let terminal = Terminal {
        stay_ms: 1.0 / total,
        next,
    };
    (terminal, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(stay_ms: f64, rise: u32, fall: u32, p_rise: f64) -> Terminal {
        let change = |probability, nodes| NextChange {
            probability,
            nodes,
            stay_ms,
            table: None,
        };
        Terminal {
            stay_ms,
            next: vec![change(p_rise, rise), change(1.0 - p_rise, fall)],
        }
    }

    #[test]
    fn the_fleet_changes_first_where_its_zones_change_most_often() {
        // A zone changing every 10 minutes beside one changing every 90: the fleet changes
        // every 9 minutes, nine times in ten in the first zone.
        let (t, after) = first_change(
            &[32, 16],
            &[
                zone(600_000.0, 32, 30, 0.25),
                zone(5_400_000.0, 16, 12, 0.5),
            ],
        );
        assert!((t.stay_ms - 540_000.0).abs() < 1e-6, "{}", t.stay_ms);
        let p: Vec<f64> = t.next.iter().map(|n| n.probability).collect();
        for (got, want) in p.iter().zip([0.225, 0.675, 0.05, 0.05]) {
            assert!((got - want).abs() < 1e-12, "{p:?}");
        }
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let nodes: Vec<u32> = t.next.iter().map(|n| n.nodes).collect();
        assert_eq!(nodes, [48, 46, 48, 44]);
        assert_eq!(
            after,
            [vec![32, 16], vec![30, 16], vec![32, 16], vec![32, 12]]
        );
        // After the first zone's change the fleet runs at the rates it had.
        assert!((t.next[0].stay_ms - 540_000.0).abs() < 1e-6);
    }

    #[test]
    fn one_zone_is_its_own_terminal() {
        let alone = zone(1_200_000.0, 20, 18, 0.4);
        let (t, after) = first_change(&[19], std::slice::from_ref(&alone));
        assert!((t.stay_ms - alone.stay_ms).abs() < 1e-6);
        for (got, want) in t.next.iter().zip(&alone.next) {
            assert_eq!(got.nodes, want.nodes);
            assert!((got.probability - want.probability).abs() < 1e-12);
            assert!((got.stay_ms - want.stay_ms).abs() < 1e-6);
        }
        assert_eq!(after, [vec![20], vec![18]]);
    }

    #[test]
    fn each_step_is_valued_at_its_forecast_composition() {
        // Zone a loses two nodes in the upcoming interval (noticed); zone b stays put.
        let a = crate::trace::intervals_from_counts(8, [8, 8]);
        let b = crate::trace::intervals_from_counts(4, [4, 4]);
        let zone = |history, nodes, removed| ZoneNow {
            history,
            first: 0,
            event: Interval {
                nodes,
                added: 0,
                removed,
            },
        };
        let mut forecasts = ZoneForecasts::new(2, 60.0);
        let mut asked: Vec<Vec<u32>> = Vec::new();
        let now = [zone(&a[..], 6, 2), zone(&b[..], 4, 0)];
        let ahead = forecasts.lookahead(&now, 3, |counts| {
            asked.push(counts.to_vec());
            let rate = f64::from(counts[0]) * 10.0 + f64::from(counts[1]);
            Arc::new(ThroughputTable::from_rows([(
                crate::ParallelConfig::new(1, 1),
                rate,
            )]))
        });
        let nodes: Vec<u32> = ahead.future.iter().map(|s| s.nodes).collect();
        assert_eq!(nodes, [10, 10, 10]);
        assert_eq!(ahead.future[0].removed, 2);
        let rates: Vec<f64> = ahead
            .tables
            .iter()
            .map(|t| t.samples_per_sec(crate::ParallelConfig::new(1, 1)))
            .collect();
        assert_eq!(rates, [64.0, 64.0, 64.0]);
        assert_eq!(asked[0], [6, 4], "one table for the three equal steps");
        let after: Vec<u32> = ahead.terminal.next.iter().map(|n| n.nodes).collect();
        assert_eq!(after.len(), 4);
        for (n, table) in ahead.terminal.next.iter().map(|n| (n.nodes, &n.table)) {
            assert!(table.is_some(), "the change to {n} nodes is valued");
        }
    }
}
