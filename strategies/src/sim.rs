//! Trace-driven simulation of planning strategies (spec 4.3, 5): replays an availability trace
//! interval by interval and books the samples each strategy trains, its configurations and
//! the time it spends migrating.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::baselines;
use crate::config::ParallelConfig;
use crate::cost::CostModel;
use crate::cost::migration::{MigrationEvent, MigrationKind};
use crate::cost::spec::RestartKind;
use crate::cost::throughput::ThroughputTable;
use crate::liveput::{LiveputOptimizer, Lookahead, PlanState, Terminal};
use crate::predict::{self, Bounds, ForecastInput, NoticeAware, Predictor, ZoneModel};
use crate::trace::{Interval, Trace};

pub mod diloco;
pub mod fleet;
pub mod join_order;

/// Where a liveput strategy's view of the future comes from.
pub enum Forecast {
    /// The true future (an oracle: Parcae's "liveput-truth").
    Truth,
    /// A predictor fed with the real past (Parcae's "liveput-predict").
    Predicted(Box<dyn Predictor>),
    /// A predictor, with the upcoming interval's event known when the decision is taken:
    /// preemptions from their notices, arrivals from their joins. This is what a node's
    /// planner sees, since it re-plans on membership events and notices come ahead.
    Observed(Box<dyn Predictor>),
    /// The zone model's own forecast (persistence plus its time-of-day drift, notices folded
    /// in), with the upcoming event observed as in [`Forecast::Observed`].
    Zone,
    /// A zone model per zone of a fleet, each forecasting its zone as [`Forecast::Zone`] does,
    /// and each step valued at what the forecast composition trains ([`Speeds::lookahead`]);
    /// where the speeds know no zones, [`Forecast::Zone`].
    Zones,
}

/// How a strategy picks configurations and pays for changes.
pub enum Plan {
    /// Throughput-optimal configuration every interval, reconfiguration for free.
    Ideal,
    /// Throughput-optimal configuration, checkpoint-restart on every change (spec 5).
    Reactive,
    /// The liveput optimizer with the given forecast; with `terminal`, each look-ahead ends
    /// in the zone model's terminal value ([`crate::liveput::Terminal`]: staying in the final
    /// configuration until the zone's next expected change, then what that change costs it),
    /// otherwise nothing counts after the horizon, as in Parcae.
    Liveput {
        /// Where the forecast comes from.
        forecast: Forecast,
        /// Whether the look-ahead is valued past its horizon.
        terminal: bool,
    },
}

/// A named strategy to simulate.
pub struct Strategy {
    /// Name in reports.
    pub name: String,
    /// Its rule.
    pub plan: Plan,
}

impl Strategy {
    /// A strategy called `name`.
    pub fn new(name: impl Into<String>, plan: Plan) -> Self {
        Self {
            name: name.into(),
            plan,
        }
    }
}

/// Migrations of one run by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationCounts {
    /// Intra-stage migrations.
    pub intra: u32,
    /// Inter-stage migrations.
    pub inter: u32,
    /// Repartitions.
    pub repartition: u32,
    /// Restarts.
    pub restart: u32,
}

impl MigrationCounts {
    /// Adds `other`'s counts (runs of several groups, each its own migrations).
    pub fn add(&mut self, other: &MigrationCounts) {
        self.intra += other.intra;
        self.inter += other.inter;
        self.repartition += other.repartition;
        self.restart += other.restart;
    }

    /// Count one migration of `kind`.
    pub fn record(&mut self, kind: MigrationKind) {
        match kind {
            MigrationKind::Intra => self.intra += 1,
            MigrationKind::Inter => self.inter += 1,
            MigrationKind::Repartition => self.repartition += 1,
            MigrationKind::Restart => self.restart += 1,
            MigrationKind::None => {}
        }
    }

    /// All migrations.
    pub fn total(&self) -> u32 {
        self.intra + self.inter + self.repartition + self.restart
    }
}

/// What one strategy achieved on a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StrategyRun {
    /// Strategy name.
    pub name: String,
    /// Samples trained.
    pub samples: f64,
    /// Migrations started.
    pub migrations: u32,
    /// Migrations by kind.
    pub kinds: MigrationCounts,
    /// Seconds spent migrating instead of training.
    pub migration_secs: f64,
    /// Configuration of every interval.
    pub configs: Vec<ParallelConfig>,
    /// Cumulative samples at the end of every interval.
    pub cumulative: Vec<f64>,
    /// Seconds of every interval charged to migration instead of training.
    #[serde(default)]
    pub charged_secs: Vec<f64>,
}

/// Simulation parameters shared by all strategies of a run.
#[derive(Clone, Debug)]
pub struct SimSetup {
    /// The job's cost model.
    pub model: Arc<CostModel>,
    /// Intervals of the forecast.
    pub lookahead: usize,
    /// Seed of the scenario sampling.
    pub seed: u64,
    /// What the reactive baseline's kills cost beyond its restart, where its cluster is killed
    /// without notice; `None` charges nothing for them, as Parcae's simulator does.
    pub unannounced_kills: Option<baselines::UnannouncedKills>,
}

/// Books one interval of a run.
struct Ledger {
    run: StrategyRun,
    interval_ms: f64,
}

impl Ledger {
    fn new(name: &str, interval_ms: f64) -> Self {
        Self {
            run: StrategyRun {
                name: name.to_string(),
                samples: 0.0,
                migrations: 0,
                kinds: MigrationCounts::default(),
                migration_secs: 0.0,
                configs: Vec::new(),
                cumulative: Vec::new(),
                charged_secs: Vec::new(),
            },
            interval_ms,
        }
    }

    /// The interval ran `config` at `samples_per_sec` after `busy_ms` of migration.
    fn book(&mut self, config: ParallelConfig, samples_per_sec: f64, busy_ms: f64) {
        let work_ms = (self.interval_ms - busy_ms).max(0.0);
        self.run.samples += samples_per_sec * work_ms / 1000.0;
        let charged_secs = busy_ms.min(self.interval_ms) / 1000.0;
        self.run.migration_secs += charged_secs;
        self.run.charged_secs.push(charged_secs);
        self.run.configs.push(config);
        self.run.cumulative.push(self.run.samples);
    }

    fn migration(&mut self, kind: MigrationKind) {
        self.run.migrations += 1;
        self.run.kinds.record(kind);
    }
}

/// What every configuration trains at each interval: the table a planner decides by and the
/// one the interval's samples are booked at. They differ where the planner is wrong about its
/// cluster (a planner blind to zones and device kinds), and they change from interval to
/// interval where what a configuration trains depends on more than the count of nodes (zones
/// that change apart, [`fleet`]).
pub trait Speeds {
    /// `(planned, actual)` tables of interval `i`.
    fn at(&mut self, i: usize) -> (Arc<ThroughputTable>, Arc<ThroughputTable>);

    /// The look-ahead of interval `i` (the run's `first`) over `horizon` intervals from a
    /// forecast of each zone, where these speeds know the zones; `None` where they do not.
    fn lookahead(&mut self, _i: usize, _first: bool, _horizon: usize) -> Option<Lookahead> {
        None
    }

    /// Interval `i`'s event `ev` as the move to `to` feels it: where these speeds know which
    /// nodes the plans use, only those of the pools `ev.from` or `to` runs on (a preemption in
    /// a pool no plan uses interrupts nothing); else `ev`.
    fn felt(
        &mut self,
        _i: usize,
        _first: bool,
        _to: ParallelConfig,
        ev: MigrationEvent,
    ) -> MigrationEvent {
        ev
    }
}

/// The model's own table, planned and booked, at every interval.
struct ModelSpeeds(Arc<ThroughputTable>);

impl Speeds for ModelSpeeds {
    fn at(&mut self, _: usize) -> (Arc<ThroughputTable>, Arc<ThroughputTable>) {
        (self.0.clone(), self.0.clone())
    }
}

/// Simulate `strategy` on `trace.intervals[range]`.
pub fn simulate(
    setup: &SimSetup,
    trace: &Trace,
    range: Range<usize>,
    strategy: Strategy,
) -> StrategyRun {
    let mut speeds = ModelSpeeds(Arc::new(setup.model.throughput.clone()));
    simulate_with(setup, trace, range, strategy, &mut speeds)
}

/// [`simulate`] with the throughput of each interval from `speeds`; the setup's model gives
/// the candidates and the migration costs.
pub fn simulate_with(
    setup: &SimSetup,
    trace: &Trace,
    range: Range<usize>,
    strategy: Strategy,
    speeds: &mut dyn Speeds,
) -> StrategyRun {
    let interval_ms = trace.interval_secs as f64 * 1000.0;
    let mut ledger = Ledger::new(&strategy.name, interval_ms);
    let model = &setup.model;
    match strategy.plan {
        Plan::Ideal => {
            for i in range {
                let (planned, actual) = speeds.at(i);
                let c = planned.best(trace.intervals[i].nodes);
                ledger.book(c, actual.samples_per_sec(c), 0.0);
            }
        }
        Plan::Reactive => {
            let mut leftover_ms = 0.0;
            let mut running = ParallelConfig::IDLE;
            for i in range.clone() {
                let iv = trace.intervals[i];
                let (planned, actual) = speeds.at(i);
                let c = planned.best(iv.nodes);
                let first = i == range.start;
                if first || iv.added + iv.removed > 0 {
                    let kind = if first || iv.added > 0 {
                        RestartKind::Add
                    } else {
                        RestartKind::Remove
                    };
                    // A cluster still restarting has no step in flight and no node in use.
                    let training = if leftover_ms > 0.0 {
                        ParallelConfig::IDLE
                    } else {
                        running
                    };
                    let killed_ms = setup.unannounced_kills.map_or(0.0, |kills| {
                        let rate = actual.samples_per_sec(training);
                        let step_ms = if rate > 0.0 {
                            1000.0 * f64::from(model.spec.global_batch) / rate
                        } else {
                            0.0
                        };
                        kills.expected_ms(iv.nodes_before(), iv.removed, training, step_ms)
                    });
                    let cost = killed_ms + baselines::restart_ms(model, c, kind, !first);
                    leftover_ms = if leftover_ms > 0.0 {
                        cost + model.spec.restart.restart_ms(c, kind)
                    } else {
                        cost
                    };
                    ledger.migration(MigrationKind::Restart);
                }
                ledger.book(c, actual.samples_per_sec(c), leftover_ms);
                leftover_ms = (leftover_ms - interval_ms).max(0.0);
                running = c;
            }
        }
        Plan::Liveput {
            mut forecast,
            terminal,
        } => {
            let mut opt =
                LiveputOptimizer::new(model.clone(), trace.interval_secs as f64, setup.seed);
            let mut zone = ZoneModel::new(trace.interval_secs as f64);
            let mut now = PlanState {
                nodes: 0,
                config: ParallelConfig::IDLE,
                leftover_ms: 0.0,
            };
            for i in range.clone() {
                let first = i == range.start;
                let real = trace.intervals[i];
                let real_event = trace.seen_at(i, first);
                let zoned = match forecast {
                    Forecast::Zones => speeds.lookahead(i, first, setup.lookahead),
                    _ => None,
                };
                let (future, value, tables) = match zoned {
                    Some(ahead) => {
                        let value = if terminal {
                            ahead.terminal
                        } else {
                            Terminal::default()
                        };
                        (ahead.future, value, ahead.tables)
                    }
                    None => {
                        let future = forecast.future(
                            trace,
                            i,
                            first,
                            real_event,
                            setup.lookahead,
                            &mut zone,
                        );
                        let value = if terminal {
                            zone.observe(trace.history(i));
                            let end = future.last().map_or(real.nodes, |s| s.nodes);
                            zone.terminal(i + future.len(), end, interval_ms)
                        } else {
                            Terminal::default()
                        };
                        (future, value, Vec::new())
                    }
                };
                let (planned, actual) = speeds.at(i);
                opt.set_throughput(planned);
                let decision = opt.decide_with_tables(now, &future, value, &tables);
                let to = decision.config.clamp_to(real.nodes);
                let ev = speeds.felt(
                    i,
                    first,
                    to,
                    MigrationEvent {
                        nodes: now.nodes,
                        from: now.config,
                        added: real_event.added,
                        removed: real_event.removed,
                    },
                );
                let (cost, kind) = opt.costs().expected_with_kind(ev, to);
                let mut leftover_ms = now.leftover_ms;
                if cost > 0.0 {
                    leftover_ms = if leftover_ms > 0.0 {
                        cost + model.spec.restart.restart_ms(to, RestartKind::Remove)
                    } else {
                        cost
                    };
                    ledger.migration(kind);
                }
                ledger.book(to, actual.samples_per_sec(to), leftover_ms);
                now = PlanState {
                    nodes: real.nodes,
                    config: to,
                    leftover_ms: (leftover_ms - interval_ms).max(0.0),
                };
            }
        }
    }
    ledger.run
}

impl Forecast {
    /// The forecast used at the start of interval `i`; `event` is interval `i`'s true event as
    /// the job sees it; `zone` is the strategy's zone model, which [`Forecast::Zone`] feeds.
    fn future(
        &mut self,
        trace: &Trace,
        i: usize,
        first: bool,
        event: Interval,
        horizon: usize,
        zone: &mut ZoneModel,
    ) -> Vec<Interval> {
        match self {
            Forecast::Truth => {
                let mut f = trace.future(i, horizon).to_vec();
                if let Some(head) = f.first_mut() {
                    *head = event;
                }
                f
            }
            Forecast::Predicted(p) => {
                let known_next = first.then_some(event.nodes);
                let input = ForecastInput {
                    history: trace.history(i),
                    first: 0,
                    known_next,
                    notices: &[],
                    horizon,
                };
                p.forecast(&input)
            }
            Forecast::Observed(p) => {
                predict::observed(p.as_mut(), trace.history(i), 0, event, horizon)
            }
            Forecast::Zone | Forecast::Zones => {
                let mut notice_aware = NoticeAware::new(zone);
                predict::observed(&mut notice_aware, trace.history(i), 0, event, horizon)
            }
        }
    }
}

/// Names of the strategies [`strategy_by_name`] knows, in report order.
pub const STRATEGIES: [&str; 9] = [
    "ideal",
    "reactive",
    "liveput-truth",
    "liveput-predict",
    "liveput-es",
    "liveput-aware",
    "liveput-persist",
    "liveput-zone",
    "liveput-zone-truth",
];

/// The strategy a node's planner runs unless told otherwise.
pub const NODE_DEFAULT: &str = "liveput-zone";

/// A strategy name that [`strategy_by_name`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy {0:?} (expected one of: {list})", list = STRATEGIES.join(", "))]
pub struct UnknownStrategy(pub String);

/// The strategy called `name`; forecasts are bounded by the job's `bounds` and seeded.
///
/// `liveput-predict` is Parcae (ARIMA rules); `liveput-es` swaps in exponential smoothing;
/// `liveput-aware` is ours: Parcae's predictor plus the upcoming interval's event as a node
/// sees it (notices of preemptions, joins of arrivals); `liveput-persist` is ours too: the same
/// observed event with a persistence forecast, which is more accurate than ARIMA on real spot
/// traces. `liveput-zone` ([`NODE_DEFAULT`]) adds the zone model: its forecast and the
/// terminal value of the look-ahead; `liveput-zone-truth` is the oracle with that terminal
/// value.
pub fn strategy_by_name(
    name: &str,
    bounds: Bounds,
    seed: u64,
) -> Result<Strategy, UnknownStrategy> {
    let predictor = |spec: &str| {
        predict::by_name(spec, bounds, seed).map_err(|_| UnknownStrategy(name.to_string()))
    };
    let plan = match name {
        "ideal" => Plan::Ideal,
        "reactive" => Plan::Reactive,
        "liveput-truth" => parcae(Forecast::Truth),
        "liveput-predict" => parcae(Forecast::Predicted(predictor("arima")?)),
        "liveput-es" => parcae(Forecast::Predicted(predictor("es")?)),
        "liveput-aware" => parcae(Forecast::Observed(predictor("arima+notices")?)),
        "liveput-persist" => parcae(Forecast::Observed(predictor("last+nopoisson+notices")?)),
        "liveput-zone" => Plan::Liveput {
            forecast: Forecast::Zone,
            terminal: true,
        },
        "liveput-zone-truth" => Plan::Liveput {
            forecast: Forecast::Truth,
            terminal: true,
        },
        _ => return Err(UnknownStrategy(name.to_string())),
    };
    Ok(Strategy::new(name, plan))
}

/// Parcae's objective (nothing after the horizon) with `forecast`.
fn parcae(forecast: Forecast) -> Plan {
    Plan::Liveput {
        forecast,
        terminal: false,
    }
}

/// Forecast bounds of a job: its smallest feasible configuration and the cluster it asked for
/// (Parcae's 8 and 32 were exactly these for its GPT runs).
pub fn job_bounds(model: &CostModel, requested_nodes: u32) -> Bounds {
    let min_nodes = model
        .candidates()
        .iter()
        .map(|c| c.nodes())
        .min()
        .unwrap_or(1);
    Bounds {
        min_nodes,
        max_nodes: requested_nodes.max(min_nodes),
    }
}
