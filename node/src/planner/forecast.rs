//! What the strategies forecast from: the availability the replicated state records, the
//! upcoming interval as the cluster observes it, and the two predictors' forecasts after it.

use std::sync::Arc;

use parcae_consensus::ControlState;
use parcae_strategies::cost::throughput::ThroughputTable;
use parcae_strategies::liveput::Terminal;
use parcae_strategies::predict::{
    ForecastInput, NoticeAware, Predictor, ZoneForecasts, ZoneModel, ZoneNow, observed,
};
use parcae_strategies::trace::{Interval, intervals_from_counts};

use super::settle::{departing_members, departure};
use super::zones::pool_of;

/// A forecast: the count before the upcoming event, the next intervals, and the value of the
/// cluster past them.
pub struct Forecast {
    /// Nodes before the upcoming interval's departures.
    pub before: u32,
    /// The upcoming interval and those after it.
    pub future: Vec<Interval>,
    /// What the cluster is worth past the last forecast interval.
    pub terminal: Terminal,
    /// What each configuration trains at each step, where that depends on more than the
    /// count (a forecast of each zone); empty: the cost model's table throughout.
    pub tables: Vec<Arc<ThroughputTable>>,
}

/// The count before the upcoming event, and the next `lookahead` intervals as the
/// simulator's `liveput-zone` sees them at an interval's start: the upcoming interval
/// observed (the `n` workers present, the members leaving or lost as its removals) and the
/// zone model's forecast of the recorded availability after it; with the zone's terminal
/// value as the forecast ends. Observing the first step, not forecasting it, makes the
/// choice at a notice the one the next boundary makes when nothing else happened: a
/// forecast first step of more nodes than are here sent the planner to the throughput-
/// optimal configuration at a notice and the optimizer's own at the next boundary (six of
/// the 23 re-plans of the 32-node hh replay were such a pair).
pub fn zone_forecast(
    zone: &mut NoticeAware<ZoneModel>,
    state: &ControlState,
    n: u32,
    lookahead: usize,
    interval_secs: f64,
) -> Forecast {
    let history = availability_history(state);
    let first = first_recorded(state);
    let departing = departing_members(state, |_| true);
    let event = Interval {
        nodes: n,
        added: 0,
        removed: departing,
    };
    let future = observed(zone, &history, first, event, lookahead);
    let end = future.last().map_or(n, |s| s.nodes);
    let terminal = zone.inner().terminal(
        first + history.len() + future.len(),
        end,
        interval_secs * 1000.0,
    );
    Forecast {
        before: n + departing,
        future,
        terminal,
        tables: Vec::new(),
    }
}

/// The zones the workers are planned over.
pub struct ZonesAt<'a> {
    /// Their names, in the fleet's order.
    pub names: Vec<&'a str>,
    /// Workers in each.
    pub workers: Vec<u32>,
    /// What each configuration trains, as the plans weigh it, with `counts[z]` nodes in zone
    /// `z` (`None` once the fleet is gone).
    pub table_of: &'a dyn Fn(&[u32]) -> Option<Arc<ThroughputTable>>,
}

/// [`zone_forecast`] for workers in several zones (`zones`): each zone forecast by its own model
/// (`forecasts`, one per zone in `zones`' order) from its recorded availability, with its
/// upcoming interval observed (its workers present, its members leaving or lost as the
/// removals), summed, each step valued at the forecast composition's table and the first change
/// of any zone as the terminal value (`predict::ZoneForecasts`, the simulator's `liveput-zone`
/// over zones).
pub fn zones_forecast(
    forecasts: &mut ZoneForecasts,
    state: &ControlState,
    zones: &ZonesAt<'_>,
    lookahead: usize,
) -> Option<Forecast> {
    let (first, histories) = zone_histories(state, &zones.names);
    let mut before = 0;
    let mut now = Vec::with_capacity(zones.names.len());
    for ((name, &nodes), history) in zones.names.iter().zip(&zones.workers).zip(&histories) {
        let removed = state
            .members
            .iter()
            .filter(|(id, m)| {
                departure(m.status).is_some()
                    && pool_of(state, id).is_some_and(|pool| pool.to_string() == *name)
            })
            .count() as u32;
        before += nodes + removed;
        now.push(ZoneNow {
            history,
            first,
            event: Interval {
                nodes,
                added: 0,
                removed,
            },
        });
    }
    let mut missing = false;
    let ahead = forecasts.lookahead(&now, lookahead, |counts| {
        (zones.table_of)(counts).unwrap_or_else(|| {
            missing = true;
            Arc::new(ThroughputTable::from_rows([]))
        })
    });
    (!missing).then_some(Forecast {
        before,
        future: ahead.future,
        terminal: ahead.terminal,
        tables: ahead.tables,
    })
}

/// Each of the zones `names`' recorded availability, from the latest run of samples that
/// count their nodes by zone (a zone a sample does not name had none), and the index of its
/// first interval.
pub fn zone_histories(state: &ControlState, names: &[&str]) -> (usize, Vec<Vec<Interval>>) {
    // The latest run of samples by zone: after the last one without zones.
    let start = state
        .availability
        .iter()
        .rposition(|s| s.pools.is_empty())
        .map_or(0, |i| i + 1);
    let by_zone = state.availability.range(start..);
    let first = first_recorded(state) + start;
    let histories = names
        .iter()
        .map(|name| {
            let counts: Vec<u32> = by_zone
                .clone()
                .map(|s| {
                    s.pools
                        .iter()
                        .find(|p| p.pool == *name)
                        .map_or(0, |p| p.nodes)
                })
                .collect();
            intervals_from_counts(counts.first().copied().unwrap_or(0), counts)
        })
        .collect();
    (first, histories)
}

/// Parcae's forecast of the next intervals from the recorded availability alone, made once an
/// availability interval: the count of the upcoming interval is told only before any was
/// recorded (the job's initial allocation), and notices are not folded in (the simulator's
/// `liveput-predict`). Parcae calls its predictor once an interval, as the simulator does; a
/// re-plan inside the interval (at a notice) decides on the forecast made at the interval's
/// start. Called at every re-plan, the predictor forecast from the same record twice and drew
/// its random preemptions again (six of the 18 re-plans of an lh round came in pairs).
pub struct IntervalForecast<P> {
    predictor: P,
    /// The forecast made, and what it was made from.
    kept: Option<(MadeFrom, Vec<Interval>)>,
}

/// What a forecast was made from: the last interval recorded, and the count told when none was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MadeFrom {
    /// The last interval recorded.
    recorded: Option<u64>,
    /// The count told, when none was recorded.
    known_next: Option<u32>,
}

impl<P: Predictor> IntervalForecast<P> {
    /// Forecasts with `predictor`.
    pub fn new(predictor: P) -> Self {
        Self {
            predictor,
            kept: None,
        }
    }

    /// The next `horizon` intervals, with `n` workers present: the forecast made in this
    /// interval if there is one.
    pub fn forecast(&mut self, state: &ControlState, n: u32, horizon: usize) -> Vec<Interval> {
        let known_next = state.availability.is_empty().then_some(n);
        let made_from = MadeFrom {
            recorded: state.availability.back().map(|s| s.interval),
            known_next,
        };
        match &self.kept {
            Some((from, future)) if *from == made_from && future.len() == horizon => future.clone(),
            _ => {
                let history = availability_history(state);
                let future = self.predictor.forecast(&ForecastInput {
                    history: &history,
                    first: first_recorded(state),
                    known_next,
                    notices: &[],
                    horizon,
                });
                self.kept = Some((made_from, future.clone()));
                future
            }
        }
    }
}

/// The recorded availability as intervals (each one's arrivals and departures against the
/// previous count).
pub fn availability_history(state: &ControlState) -> Vec<Interval> {
    let mut history: Vec<Interval> = Vec::with_capacity(state.availability.len());
    let mut prev: Option<u32> = None;
    for s in &state.availability {
        let p = prev.unwrap_or(s.count);
        history.push(Interval {
            nodes: s.count,
            added: s.count.saturating_sub(p),
            removed: p.saturating_sub(s.count),
        });
        prev = Some(s.count);
    }
    history
}

/// The number of the oldest availability interval the replicated state still records (it
/// keeps the latest `limits::MAX_AVAILABILITY`; the leader numbers them one by one from 0).
pub fn first_recorded(state: &ControlState) -> usize {
    state
        .availability
        .front()
        .map_or(0, |s| s.interval as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_consensus::Command;
    use parcae_strategies::predict::{RulePredictor, SeriesModel};

    #[test]
    fn the_forecast_counts_intervals_past_the_record_s_bound() {
        use parcae_consensus::state::limits::MAX_AVAILABILITY;
        let mut state = ControlState::default();
        assert_eq!(first_recorded(&state), 0);
        let mut zone = NoticeAware::new(ZoneModel::new(60.0));
        let total = MAX_AVAILABILITY + 100;
        for interval in 0..total as u64 {
            let count = 8 + u32::from(interval >= 3000 && interval % 2 == 1);
            state
                .apply(&Command::AvailabilityTick {
                    interval,
                    count,
                    pools: Vec::new(),
                })
                .unwrap();
            if interval % 1000 == 0 {
                zone_forecast(&mut zone, &state, count, 4, 60.0);
            }
        }
        assert_eq!(first_recorded(&state), 100);
        let stay = |zone: &mut NoticeAware<ZoneModel>, state: &ControlState| {
            zone_forecast(zone, state, 9, 4, 60.0).terminal.stay_ms
        };
        let kept = stay(&mut zone, &state);
        let new_leader = stay(&mut NoticeAware::new(ZoneModel::new(60.0)), &state);
        // A new leader learns from the record alone, the old one also from what it dropped.
        assert!(
            (kept - new_leader).abs() <= 0.05 * kept,
            "a new leader values about as the old one: {kept} vs {new_leader}"
        );
        for interval in total as u64..total as u64 + 30 {
            state
                .apply(&Command::AvailabilityTick {
                    interval,
                    count: 9,
                    pools: Vec::new(),
                })
                .unwrap();
        }
        assert!(
            stay(&mut zone, &state) > kept,
            "the calm intervals after the record was full were consumed"
        );
    }

    #[test]
    fn parcae_forecasts_from_the_recorded_availability_alone() {
        let bounds = parcae_strategies::predict::Bounds {
            min_nodes: 2,
            max_nodes: 32,
        };
        let mut arima = IntervalForecast::new(RulePredictor::new(SeriesModel::Arima, bounds, 7));
        let mut state = ControlState::default();
        // Before any interval was recorded, the nodes present are the job's allocation.
        let first = arima.forecast(&state, 12, 4);
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].nodes, 12);
        for (interval, count) in [(0, 20), (1, 18), (2, 16), (3, 14)] {
            state
                .apply(&Command::AvailabilityTick {
                    interval,
                    count,
                    pools: Vec::new(),
                })
                .unwrap();
        }
        assert_eq!(
            availability_history(&state)
                .iter()
                .map(|i| (i.nodes, i.added, i.removed))
                .collect::<Vec<_>>(),
            vec![(20, 0, 0), (18, 0, 2), (16, 0, 2), (14, 0, 2)]
        );
        // Afterwards the present count is not told (30 here): the forecast continues the
        // recorded series from its last count, within the job's bounds.
        let later = arima.forecast(&state, 30, 4);
        assert_eq!(later.len(), 4);
        assert!(
            later.iter().all(|i| (2..=32).contains(&i.nodes)),
            "{later:?}"
        );
        assert!(later[0].nodes <= 16, "{later:?}");
    }

    #[test]
    fn the_predictor_is_asked_once_an_interval() {
        /// A predictor whose every forecast differs: it says how often it was asked.
        struct Asked(u32);
        impl Predictor for Asked {
            fn forecast(&mut self, input: &ForecastInput<'_>) -> Vec<Interval> {
                self.0 += 1;
                let asked = Interval {
                    nodes: self.0,
                    added: 0,
                    removed: 0,
                };
                vec![asked; input.horizon]
            }
        }
        let mut parcae = IntervalForecast::new(Asked(0));
        let mut state = ControlState::default();
        let tick = |state: &mut ControlState, interval| {
            let tick = Command::AvailabilityTick {
                interval,
                count: 8,
                pools: Vec::new(),
            };
            state.apply(&tick).unwrap();
        };
        assert_eq!(parcae.forecast(&state, 8, 3)[0].nodes, 1);
        assert_eq!(
            parcae.forecast(&state, 9, 3)[0].nodes,
            2,
            "before any record, the count told is what it forecasts from"
        );
        tick(&mut state, 0);
        assert_eq!(parcae.forecast(&state, 8, 3)[0].nodes, 3);
        assert_eq!(
            parcae.forecast(&state, 7, 3)[0].nodes,
            3,
            "a re-plan inside the interval: the same forecast"
        );
        tick(&mut state, 1);
        assert_eq!(parcae.forecast(&state, 7, 3)[0].nodes, 4, "a new interval");
        assert_eq!(parcae.forecast(&state, 7, 5).len(), 5);
    }

    #[test]
    fn each_zone_is_forecast_from_its_own_record_and_its_own_departures() {
        use parcae_consensus::NodeId;
        use parcae_consensus::state::{Capabilities, PeerInfo, PoolCount};
        let mut state = ControlState::default();
        let zone = |pool: &str, nodes| PoolCount {
            pool: pool.into(),
            nodes,
        };
        // A sample of a cluster not yet named by zone, then three by zone.
        let ticks = [
            (6, vec![]),
            (6, vec![zone("a", 4), zone("b", 2)]),
            (7, vec![zone("a", 4), zone("b", 3)]),
            (4, vec![zone("a", 4)]),
        ];
        for (interval, (count, zones)) in ticks.into_iter().enumerate() {
            let tick = Command::AvailabilityTick {
                interval: interval as u64,
                count,
                pools: zones,
            };
            state.apply(&tick).unwrap();
        }
        let (first, histories) = zone_histories(&state, &["a", "b"]);
        assert_eq!(first, 1, "from the first sample by zone");
        let counts = |h: &[Interval]| h.iter().map(|i| i.nodes).collect::<Vec<_>>();
        assert_eq!(counts(&histories[0]), [4, 4, 4]);
        assert_eq!(counts(&histories[1]), [2, 3, 0]);
        assert_eq!(histories[1][2].removed, 3);
        // Zone b's one member has noticed its preemption; a's four stay.
        for (n, name) in [(1u8, "a"), (2, "a"), (3, "a"), (4, "a"), (5, "b")] {
            let peer = PeerInfo {
                peer_id: vec![n],
                caps: Capabilities {
                    zone: name.into(),
                    ..Capabilities::default()
                },
                ..PeerInfo::default()
            };
            let node = NodeId::from_peer_bytes(&[n]);
            state.apply(&Command::Join { node, peer }).unwrap();
        }
        let leaving = Command::Notice {
            node: NodeId::from_peer_bytes(&[5]),
            deadline_ms: 10_000,
        };
        state.apply(&leaving).unwrap();
        let asked = std::cell::RefCell::new(Vec::new());
        let table_of = |counts: &[u32]| {
            asked.borrow_mut().push(counts.to_vec());
            Some(Arc::new(ThroughputTable::from_rows([])))
        };
        let zones = ZonesAt {
            names: vec!["a", "b"],
            workers: vec![4, 0],
            table_of: &table_of,
        };
        let mut models = ZoneForecasts::new(2, 60.0);
        let forecast = zones_forecast(&mut models, &state, &zones, 4).unwrap();
        assert_eq!(forecast.before, 5);
        assert_eq!(forecast.future.len(), 4);
        assert_eq!(
            (forecast.future[0].nodes, forecast.future[0].removed),
            (4, 1)
        );
        assert_eq!(forecast.tables.len(), 4);
        assert_eq!(
            asked.borrow()[0],
            [4, 0],
            "the steps are valued at a's four alone"
        );
        let gone = |_: &[u32]| -> Option<Arc<ThroughputTable>> { None };
        let zones = ZonesAt {
            table_of: &gone,
            ..zones
        };
        assert!(
            zones_forecast(&mut models, &state, &zones, 4).is_none(),
            "no fleet to value the steps: the pooled forecast"
        );
    }
}
