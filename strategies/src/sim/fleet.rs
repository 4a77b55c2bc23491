//! The simulator over zones: one job on a fleet whose zones each replay their own availability
//! trace, planned four ways.
//!
//! * `liveput-zone` ([`super::NODE_DEFAULT`]'s rule) over every zone, with what a configuration
//!   trains taken from the zone-aware layout of the nodes each zone holds
//!   ([`Layout::ZoneAware`]);
//! * `zone-blind`: the same rule over the same nodes, planning with the worst device's table
//!   as if every node were alike and in one zone, its pipelines filled with the nodes in the
//!   order they joined (a zone-ignorant system's ranks, [`join_orders`]), and booked at what
//!   that layout really trains ([`Layout::ZoneBlind`]);
//! * `reactive` over every zone: the zone-aware throughput-optimal plan, restarted from a
//!   checkpoint on every change in any zone;
//! * `single-zone-best`: `liveput-zone` on each zone alone, its own nodes and device; the best
//!   zone in hindsight. Where the fleet's units are pools (`ZONE/TYPE`), each pool alone: one
//!   instance type in one zone, what Parcae, Bamboo and Oobleck plan.
//!
//! `liveput-zone` forecasts each zone apart and values each step of its look-ahead at the
//! composition forecast ([`ZoneForecasts`]); the zone-blind planner forecasts the fleet's total
//! count as it would one zone's, the best single zone its zone's. All pay the same migration
//! costs for the same events.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::diloco::{DilocoRun, Groups, Outer, RoundsReport, diloco};
use super::join_order::join_orders;
use super::{Forecast, Plan, SimSetup, Speeds, Strategy, StrategyRun, simulate_with};
use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::fleet::{Fleet, Plans};
use crate::cost::migration::MigrationEvent;
use crate::cost::money::machine_hours;
pub use crate::cost::objective::Objective;
use crate::cost::throughput::ThroughputTable;
use crate::cost::transfer::TransferModel;
use crate::liveput::Lookahead;
use crate::predict::{ZoneForecasts, ZoneNow};
use crate::trace::{Interval, Trace};

/// The strategies of a fleet run, in report order.
pub const FLEET_STRATEGIES: [&str; 4] =
    ["liveput-zone", "zone-blind", "reactive", "single-zone-best"];

/// Why zone traces were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FleetTraceError {
    /// Not one trace per zone of the fleet.
    #[error("{traces} traces for {zones} zones")]
    Count {
        /// Traces given.
        traces: usize,
        /// Zones of the fleet.
        zones: usize,
    },
    /// Traces of unequal interval lengths.
    #[error("zone traces have intervals of {0} s and {1} s; give them one --interval-secs")]
    Interval(u64, u64),
    /// A samples-per-dollar objective without a finite, non-negative price for every zone.
    #[error("the samples-per-dollar objective needs a price for each of the {0} zones")]
    Prices(usize),
}

/// What one strategy trained on the fleet, and what it paid for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetRun {
    /// The run as the single-trace simulator books it (on the pooled trace, or on the best
    /// zone's own).
    pub run: StrategyRun,
    /// Node-hours billed in each pool, in the fleet's order: its nodes while a plan uses the
    /// pool, or while no plan is laid out (a migration); a pool the plan in force leaves idle
    /// is released, and the trace's nodes are there again when a plan takes the pool.
    pub node_hours: Vec<f64>,
    /// Node-hours the traces offered in each pool, used or not.
    pub held_node_hours: Vec<f64>,
    /// Egress dollars of the activations and gradients that crossed zones.
    pub egress_usd: f64,
    /// For `single-zone-best`, the zone it ran in.
    pub zone: Option<String>,
    /// For DiLoCo, what its rounds did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<RoundsReport>,
}

impl FleetRun {
    /// What the run paid: its node-hours in zone `z` at `usd_per_node_hour[z]`, and its egress.
    pub fn cost_usd(&self, usd_per_node_hour: &[f64]) -> f64 {
        let held: f64 = self
            .node_hours
            .iter()
            .zip(usd_per_node_hour)
            .map(|(hours, usd)| hours * usd)
            .sum();
        held + self.egress_usd
    }
}

/// One interval of every zone: the fleet's composition over time and its pooled trace.
pub struct Compositions {
    /// Nodes of each zone, per interval.
    pub counts: Vec<Vec<u32>>,
    /// The fleet as one cluster: nodes, arrivals and preemptions summed over its zones.
    pub pooled: Trace,
}

/// The compositions of `traces` (one per zone, cut to the shortest).
pub fn compositions(traces: &[Trace]) -> Result<Compositions, FleetTraceError> {
    let interval_secs = traces.first().map_or(60, |t| t.interval_secs);
    if let Some(t) = traces.iter().find(|t| t.interval_secs != interval_secs) {
        return Err(FleetTraceError::Interval(interval_secs, t.interval_secs));
    }
    let len = traces.iter().map(Trace::len).min().unwrap_or(0);
    let counts: Vec<Vec<u32>> = (0..len)
        .map(|i| traces.iter().map(|t| t.intervals[i].nodes).collect())
        .collect();
    let intervals = (0..len)
        .map(|i| {
            traces.iter().fold(
                Interval {
                    nodes: 0,
                    added: 0,
                    removed: 0,
                },
                |sum, t| Interval {
                    nodes: sum.nodes + t.intervals[i].nodes,
                    added: sum.added + t.intervals[i].added,
                    removed: sum.removed + t.intervals[i].removed,
                },
            )
        })
        .collect();
    let source = traces
        .iter()
        .map(|t| t.source.as_str())
        .collect::<Vec<_>>()
        .join("+");
    Ok(Compositions {
        counts,
        pooled: Trace {
            source,
            interval_secs,
            intervals,
        },
    })
}

/// How a strategy lays its nodes out.
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    /// Zone-aware ([`Fleet::plans`]), on each interval's nodes per zone.
    ZoneAware,
    /// Zone-blind ([`Fleet::blind_plans`]), on each interval's nodes in the order they joined
    /// (the zones of `join_order::join_orders`).
    ZoneBlind(&'a [Arc<[u8]>]),
}

impl Layout<'_> {
    /// The plans of interval `i`, whose nodes per zone are `counts[i]`.
    pub fn plans(self, fleet: &mut Fleet, counts: &[Vec<u32>], i: usize) -> Arc<Plans> {
        match self {
            Layout::ZoneAware => fleet.plans(&counts[i]),
            Layout::ZoneBlind(joined) => fleet.blind_plans(&joined[i]),
        }
    }
}

/// The tables a fleet strategy plans by and is booked at.
struct FleetSpeeds<'a> {
    fleet: &'a mut Fleet,
    counts: &'a [Vec<u32>],
    layout: Layout<'a>,
    /// A table the strategy believes whatever the composition (the zone-blind planner's); else
    /// the composition's own, as `objective` weighs it.
    believed: Option<Arc<ThroughputTable>>,
    objective: &'a Objective,
    /// The zones' traces and the planner's model of each.
    traces: &'a [Trace],
    forecasts: ZoneForecasts,
}

impl Speeds for FleetSpeeds<'_> {
    fn at(&mut self, i: usize) -> (Arc<ThroughputTable>, Arc<ThroughputTable>) {
        let plans = self.layout.plans(self.fleet, self.counts, i);
        let believed = match &self.believed {
            Some(table) => table.clone(),
            None => self.objective.table(&plans, &self.counts[i]),
        };
        (believed, plans.table.clone())
    }

    fn lookahead(&mut self, i: usize, first: bool, horizon: usize) -> Option<Lookahead> {
        if self.believed.is_some() {
            return None;
        }
        let now: Vec<ZoneNow<'_>> = self
            .traces
            .iter()
            .map(|trace| ZoneNow {
                history: trace.history(i),
                first: 0,
                event: trace.seen_at(i, first),
            })
            .collect();
        let (fleet, objective) = (&mut *self.fleet, self.objective);
        let ahead = self.forecasts.lookahead(&now, horizon, |counts| {
            objective.table(&fleet.plans(counts), counts)
        });
        Some(ahead)
    }

    fn felt(
        &mut self,
        i: usize,
        first: bool,
        to: ParallelConfig,
        ev: MigrationEvent,
    ) -> MigrationEvent {
        if first || i == 0 || ev.from.is_idle() {
            return ev;
        }
        let (counts, layout) = (self.counts, self.layout);
        let before = &counts[i - 1];
        let used = |fleet: &mut Fleet, i: usize, config: ParallelConfig| {
            let plans = layout.plans(fleet, counts, i);
            plans
                .placements
                .get(&config)
                .map(|placed| placed.nodes_per_zone(before.len()))
        };
        let (Some(from), to) = (
            used(self.fleet, i - 1, ev.from),
            used(self.fleet, i, to).unwrap_or_default(),
        ) else {
            return ev;
        };
        let mut felt = MigrationEvent {
            nodes: 0,
            added: 0,
            removed: 0,
            ..ev
        };
        for z in 0..before.len() {
            if from[z] > 0 || to.get(z).is_some_and(|&n| n > 0) {
                let event = self.traces[z].seen_at(i, false);
                felt.nodes += before[z];
                felt.added += event.added;
                felt.removed += event.removed;
            }
        }
        felt
    }
}

/// Every strategy of [`FLEET_STRATEGIES`] on `traces[z]` for zone `z` of `fleet`, over the
/// intervals `range`, looking `lookahead` intervals ahead, scenarios seeded with `seed`; the
/// zone-aware strategies (`liveput-zone`, `reactive`) plan for `objective`, the zone-blind one
/// by its one table (it cannot see what crosses zones), and the best single zone for samples
/// (it crosses none). With `outer`, DiLoCo between the pools too, after the others ([`diloco`],
/// each pool trained alone as `single-zone-best` runs it): `diloco:H` over every pool, or
/// `auto` (the pools and `H` chosen as the run goes for `objective`: `Groups::Auto`).
pub fn simulate_fleet(
    fleet: &mut Fleet,
    traces: &[Trace],
    range: Range<usize>,
    lookahead: usize,
    seed: u64,
    objective: &Objective,
    outer: Option<Outer>,
) -> Result<Vec<FleetRun>, FleetTraceError> {
    if traces.len() != fleet.pools().len() {
        return Err(FleetTraceError::Count {
            traces: traces.len(),
            zones: fleet.pools().len(),
        });
    }
    if let Objective::SamplesPerDollar { usd_per_node_hour } = objective {
        let priced = usd_per_node_hour.len() == traces.len()
            && usd_per_node_hour.iter().all(|p| p.is_finite() && *p >= 0.0);
        if !priced {
            return Err(FleetTraceError::Prices(traces.len()));
        }
    }
    fleet.set_prices(objective.prices());
    let comps = compositions(traces)?;
    let range = range.start.min(comps.counts.len())..range.end.min(comps.counts.len());
    let most: Vec<u32> = (0..traces.len())
        .map(|z| {
            comps.counts[range.clone()]
                .iter()
                .map(|c| c[z])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let total = comps.pooled.intervals[range.clone()]
        .iter()
        .map(|i| i.nodes)
        .max()
        .unwrap_or(0);
    let aware = fleet.plans(&most).table.clone();
    let interval_secs = comps.pooled.interval_secs;
    let believed = Arc::new(fleet.uniform_table(&fleet.worst().clone(), total));
    let union = ThroughputTable::from_rows(believed.configs().chain(aware.configs()));
    let setup = setup(fleet, union, lookahead, seed);
    let held = held_hours(&comps.counts[range.clone()], interval_secs);
    let joined = join_orders(traces, comps.counts.len(), seed);
    let mut runs = Vec::new();
    for (name, layout, belief) in [
        ("liveput-zone", Layout::ZoneAware, None),
        ("zone-blind", Layout::ZoneBlind(&joined), Some(believed)),
        ("reactive", Layout::ZoneAware, None),
    ] {
        let strategy = match name {
            "reactive" => Strategy::new(name, Plan::Reactive),
            "zone-blind" => liveput_zone(name, Forecast::Zone),
            _ => liveput_zone(name, Forecast::Zones),
        };
        let mut speeds = FleetSpeeds {
            fleet,
            counts: &comps.counts,
            layout,
            believed: belief,
            objective,
            traces,
            forecasts: ZoneForecasts::new(traces.len(), comps.pooled.interval_secs as f64),
        };
        let run = simulate_with(&setup, &comps.pooled, range.clone(), strategy, &mut speeds);
        let egress_usd = egress(fleet, layout, &comps.counts, &run, range.start);
        let used = nodes_used(fleet, layout, &comps.counts, &run, range.start);
        let billed = billed_nodes(&comps.counts[range.clone()], &used);
        runs.push(FleetRun {
            run,
            node_hours: held_hours(&billed, interval_secs),
            held_node_hours: held.clone(),
            egress_usd,
            zone: None,
            rounds: None,
        });
    }
    let alone = alone_runs(fleet, traces, range.clone(), lookahead, seed);
    let diloco_run = outer_run(
        fleet,
        &alone,
        &comps.counts[range],
        outer,
        objective,
        interval_secs,
    )
    .map(|ran| FleetRun {
        run: ran.run,
        node_hours: ran.node_hours,
        held_node_hours: held.clone(),
        egress_usd: ran.egress_usd,
        zone: None,
        rounds: Some(ran.rounds),
    });
    runs.extend(best_single_zone(alone, objective.prices()));
    runs.extend(diloco_run);
    Ok(runs)
}

/// DiLoCo's run over the pools, each trained as in `alone` and holding `held[k][g]` nodes in
/// interval `k`: `diloco:H` over every pool, or the pools and `H` `--sync auto` chooses as
/// the run goes; none without `outer`.
fn outer_run(
    fleet: &Fleet,
    alone: &[FleetRun],
    held: &[Vec<u32>],
    outer: Option<Outer>,
    objective: &Objective,
    interval_secs: u64,
) -> Option<DilocoRun> {
    let every: Vec<&StrategyRun> = alone.iter().map(|r| &r.run).collect();
    let pools: Vec<usize> = (0..alone.len()).collect();
    let groups = match outer? {
        Outer::Rounds(rounds) => Groups::Fixed(&pools, rounds),
        Outer::Auto(wire) => Groups::Auto {
            wire,
            usd_per_node_hour: objective.prices(),
        },
    };
    Some(diloco(fleet, &every, held, groups, interval_secs as f64))
}

/// The zone of `alone` (each zone trained alone) that trains the most, or where the pools are
/// priced (`usd_per_node_hour`) the most per dollar.
fn best_single_zone(alone: Vec<FleetRun>, usd_per_node_hour: Option<&[f64]>) -> Option<FleetRun> {
    let value = |r: &FleetRun| match usd_per_node_hour {
        Some(usd) => r.run.samples / r.cost_usd(usd).max(f64::MIN_POSITIVE),
        None => r.run.samples,
    };
    let mut best: Option<FleetRun> = None;
    for alone in alone {
        if best.as_ref().is_none_or(|b| value(&alone) > value(b)) {
            best = Some(alone);
        }
    }
    best
}

/// `liveput-zone` on each zone alone, its own nodes and device, named `single-zone-best`.
fn alone_runs(
    fleet: &Fleet,
    traces: &[Trace],
    range: Range<usize>,
    lookahead: usize,
    seed: u64,
) -> Vec<FleetRun> {
    let mut runs = Vec::with_capacity(traces.len());
    for (z, zone) in fleet.pools().iter().enumerate() {
        let trace = &traces[z];
        let most = trace.intervals[range.clone()]
            .iter()
            .map(|i| i.nodes)
            .max()
            .unwrap_or(0);
        let table = fleet.uniform_table(&zone.device, most);
        let setup = setup(fleet, table, lookahead, seed);
        let strategy = liveput_zone("single-zone-best", Forecast::Zone);
        let run = super::simulate(&setup, trace, range.clone(), strategy);
        let mut node_hours = vec![0.0; traces.len()];
        node_hours[z] = machine_hours(
            trace.intervals[range.clone()].iter().map(|i| i.nodes),
            trace.interval_secs as f64,
        );
        runs.push(FleetRun {
            run,
            held_node_hours: node_hours.clone(),
            node_hours,
            egress_usd: 0.0,
            zone: Some(zone.pool.to_string()),
            rounds: None,
        });
    }
    runs
}

/// A simulation setup whose candidates are `table`'s rows, migrations priced on Parcae's
/// profiled 10 Gb/s links (within a zone, where a migration's transfers run).
fn setup(fleet: &Fleet, table: ThroughputTable, lookahead: usize, seed: u64) -> SimSetup {
    let model = CostModel::new(fleet.spec().clone(), table, TransferModel::Profiled10Gbps);
    SimSetup {
        model: Arc::new(model),
        lookahead,
        seed,
        unannounced_kills: None,
    }
}

/// `liveput-zone`'s rule (the node's default) reported as `name`, with `forecast`.
fn liveput_zone(name: &str, forecast: Forecast) -> Strategy {
    Strategy::new(
        name,
        Plan::Liveput {
            forecast,
            terminal: true,
        },
    )
}

/// The nodes billed in each pool per interval: those `held` in every pool the interval's plan
/// uses (`used`), or in every pool where no plan is laid out.
fn billed_nodes(held: &[Vec<u32>], used: &[Vec<u32>]) -> Vec<Vec<u32>> {
    held.iter()
        .zip(used)
        .map(|(held, used)| {
            let laid_out = used.iter().any(|&n| n > 0);
            held.iter()
                .zip(used)
                .map(|(&h, &u)| if u > 0 || !laid_out { h } else { 0 })
                .collect()
        })
        .collect()
}

/// Node-hours held per zone over `counts` (one row per interval).
fn held_hours(counts: &[Vec<u32>], interval_secs: u64) -> Vec<f64> {
    let zones = counts.first().map_or(0, Vec::len);
    (0..zones)
        .map(|z| machine_hours(counts.iter().map(|c| c[z]), interval_secs as f64))
        .collect()
}

/// Egress dollars of `run`, whose first interval is `start`: each interval's samples at its
/// placement's egress per sample.
fn egress(
    fleet: &mut Fleet,
    layout: Layout<'_>,
    counts: &[Vec<u32>],
    run: &StrategyRun,
    start: usize,
) -> f64 {
    let mut before = 0.0;
    let mut usd = 0.0;
    for (k, (config, cumulative)) in run.configs.iter().zip(&run.cumulative).enumerate() {
        let samples = cumulative - before;
        before = *cumulative;
        let plans = layout.plans(fleet, counts, start + k);
        if let Some(placed) = plans.placements.get(config) {
            usd += samples * placed.egress_usd_per_sample;
        }
    }
    usd
}

/// The nodes of each zone that `run` (laid out as `layout`, first interval `start`) trains on,
/// per interval: its configuration's placement on that interval's composition (none where the
/// configuration has no placement there, as while it migrates).
pub fn nodes_used(
    fleet: &mut Fleet,
    layout: Layout<'_>,
    counts: &[Vec<u32>],
    run: &StrategyRun,
    start: usize,
) -> Vec<Vec<u32>> {
    let zones = fleet.pools().len();
    run.configs
        .iter()
        .enumerate()
        .map(|(k, config)| {
            let plans = layout.plans(fleet, counts, start + k);
            plans
                .placements
                .get(config)
                .map_or_else(|| vec![0; zones], |placed| placed.nodes_per_zone(zones))
        })
        .collect()
}
