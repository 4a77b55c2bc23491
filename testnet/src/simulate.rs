//! `parcae-testnet simulate`: every strategy on one trace, as a table, JSON and a plot.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use parcae_outer::{SyncMode, Wire};
use parcae_strategies::ParallelConfig;
use parcae_strategies::cost::builtin::MODELS;
use parcae_strategies::cost::money::{self, Bill, OnDemand, Prices};
use parcae_strategies::cost::objective::ObjectiveKind;

use crate::prices::{PriceArgs, names_zones};
use parcae_strategies::cost::throughput::Profile;
use parcae_strategies::cost::{CostModel, RepartitionRule};
use parcae_strategies::sim::diloco::{Outer, Rounds};
use parcae_strategies::sim::{self, STRATEGIES, SimSetup, StrategyRun};
use parcae_strategies::trace::{self, Trace};
use serde::Serialize;

pub mod zones;

/// Options of `simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace file (event, count or replay format), `synthetic:BAND[:SEED]` (BAND in hh, hl,
    /// lh, ll) or `synthetic:FAMILY[:SEED][:nodes=N][:days=D][:region=R]` (a multi-day zone:
    /// quiet, outage, diurnal, shifting; zones naming one region share its outages).
    #[arg(long, default_value = "synthetic:hh")]
    trace: String,
    /// Profiled model: gpt-1.5b, gpt-6.7b, bert, resnet152 or vgg19.
    #[arg(long, default_value = "gpt-1.5b")]
    model: String,
    /// Throughput profile CSV replacing the model's table (columns as throughput_profiles.csv).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Look-ahead of the liveput optimizer, intervals.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=64))]
    lookahead: u16,
    /// Length of one planning interval, seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    interval_secs: u64,
    /// Start of the simulated window, hours from the trace start.
    #[arg(long, default_value_t = 0.0)]
    start_hour: f64,
    /// End of the simulated window, hours from the trace start (default: the trace end).
    #[arg(long)]
    end_hour: Option<f64>,
    /// Comma-separated strategies (default: all).
    #[arg(long, value_delimiter = ',')]
    strategies: Option<Vec<String>>,
    /// How a repartition is priced: Parcae's formula with the `sum` of every stage's missing
    /// layers, or the artifact's `last`; or `handoff`, what `parcae-node` does (every node
    /// fetches what it lacks from the holders at once, each link carrying what it receives
    /// and sends).
    #[arg(long, default_value = "sum", value_parser = ["sum", "last", "handoff"])]
    repartition: String,
    /// Seed of the scenario sampling and of the predictors.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a PNG plot here (availability, configurations, cumulative samples; with --zones,
    /// each zone's nodes and those the zone-aware plan trains on).
    #[arg(long)]
    plot: Option<PathBuf>,
    #[command(flatten)]
    prices: PriceArgs,
    /// Zones of one job, each `NAME=TRACE[@SPEED[/MEMORY_GIB]]` (its trace, and its device's
    /// speed and memory against the model's profiled V100), `NAME` a zone or a pool of one
    /// instance type in a zone (`ZONE/TYPE`; pools of one zone share its free link): simulates
    /// the zone-aware planner against zone-blind, reactive and the best single zone (or pool)
    /// instead of --trace.
    #[arg(long, value_delimiter = ',')]
    zones: Vec<String>,
    /// A link between two zones, `ZONE/ZONE=GBIT,MS,USD_PER_GB` (repeatable; default: AWS's,
    /// 10 Gb/s free within a zone, 5 Gb/s at $0.02/GB across).
    #[arg(long = "link")]
    links: Vec<String>,
    /// What the zone-aware planners want with --zones: the most samples, or the most samples
    /// per dollar of nodes and egress (needs --price-spot).
    #[arg(long, value_enum, default_value = "samples")]
    objective: ObjectiveKind,
    /// With --zones: every ring across zones of the zone-aware strategies one flat ring, as
    /// before the all-reduce by zone (to measure what it gains).
    #[arg(long)]
    flat_rings: bool,
    /// With --zones: how the pools synchronise. `step` (one synchronous job, every strategy
    /// above), `diloco:H` (adds DiLoCo between the pools: each trains alone, H inner steps of
    /// the job's batch a round, then one exchange of pseudo-gradients) or `auto` (adds the
    /// pools and H the cost model picks for --objective, or the synchronous plan).
    #[arg(long, default_value = "step")]
    sync: SyncMode,
    /// With --sync diloco:H: the pseudo-gradient's wire form, f32, bf16 or int8.
    #[arg(long, default_value = "f32")]
    pseudo_gradient: Wire,
}

/// The JSON document `--json` writes.
#[derive(Serialize)]
pub struct Report {
    /// Trace source.
    pub trace: String,
    /// Model name.
    pub model: String,
    /// Intervals simulated.
    pub intervals: usize,
    /// The strategy a node's planner runs by default.
    pub node_default: &'static str,
    /// One entry per strategy.
    pub strategies: Vec<StrategyJson>,
}

/// One strategy's results in [`Report`].
#[derive(Serialize)]
pub struct StrategyJson {
    /// Strategy name.
    pub name: String,
    /// Samples trained.
    pub samples: f64,
    /// Samples over `reactive`'s (when it ran).
    pub x_reactive: Option<f64>,
    /// Samples over the better of `reactive` and `liveput-predict` (when both ran): the bar a
    /// planner must clear to be worth running.
    pub x_best_baseline: Option<f64>,
    /// Samples as a percentage of `ideal`'s (when it ran).
    pub pct_ideal: Option<f64>,
    /// Migrations started.
    pub migrations: u32,
    /// Seconds spent migrating.
    pub migration_secs: f64,
    /// `[d, p]` of every interval.
    pub configs: Vec<[u32; 2]>,
    /// Machine-hours, cost and saving, when prices were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Bill>,
}

pub fn run(args: Args) -> Result<()> {
    let outer = match args.sync {
        SyncMode::Step => None,
        SyncMode::Diloco(inner_steps) => Some(Outer::Rounds(Rounds {
            inner_steps,
            wire: args.pseudo_gradient,
        })),
        SyncMode::Auto => Some(Outer::Auto(args.pseudo_gradient)),
    };
    if !args.zones.is_empty() {
        let model = cost_model(&args)?;
        return zones::run(zones::FleetArgs {
            zones: &args.zones,
            links: &args.links,
            prices: &args.prices.price_spot,
            objective: args.objective,
            by_zone: !args.flat_rings,
            outer,
            model: &model,
            model_name: &args.model,
            interval_secs: args.interval_secs,
            start_hour: args.start_hour,
            end_hour: args.end_hour,
            lookahead: usize::from(args.lookahead),
            seed: args.seed,
            json: args.json.as_deref(),
            plot: args.plot.as_deref(),
        });
    }
    if !args.links.is_empty()
        || names_zones(&args.prices.price_spot)
        || args.objective != ObjectiveKind::Samples
        || args.flat_rings
        || outer.is_some()
    {
        bail!(
            "--link, --price-spot ZONE=USD, --objective, --flat-rings and --sync diloco:H|auto plan a fleet: give its zones with --zones"
        );
    }
    let prices = args.prices.prices()?;
    let trace = trace::load(&args.trace, args.interval_secs)?;
    let model = cost_model(&args)?;
    let names = match &args.strategies {
        Some(list) => list.clone(),
        None => STRATEGIES.iter().map(|s| s.to_string()).collect(),
    };
    if names.is_empty() {
        bail!("--strategies names no strategy");
    }
    let end = args.end_hour.unwrap_or(trace.hours());
    let range = trace.window(args.start_hour, end)?;
    if range.is_empty() {
        bail!(
            "{}: window {}..{} h holds no interval (the trace covers {:.2} h)",
            trace.source,
            args.start_hour,
            end,
            trace.hours()
        );
    }
    let bounds = sim::job_bounds(&model, trace.max_nodes());
    let on_demand = OnDemand::of(&model, trace.max_nodes());
    let held = money::machine_hours(
        trace.intervals[range.clone()].iter().map(|i| i.nodes),
        trace.interval_secs as f64,
    );
    let bill = |r: &StrategyRun| prices.map(|p| money::bill(held, r.samples, p, Some(on_demand)));
    let setup = SimSetup {
        model: Arc::new(model),
        lookahead: usize::from(args.lookahead),
        seed: args.seed,
        unannounced_kills: None,
    };
    let mut runs = Vec::with_capacity(names.len());
    for name in &names {
        let strategy = sim::strategy_by_name(name, bounds, args.seed)?;
        runs.push(sim::simulate(&setup, &trace, range.clone(), strategy));
    }
    let bars = Bars::of(&runs);
    print_table(&trace, &args.model, &runs, &bars);
    if let Some(p) = prices {
        print_bills(&runs, &bill, p, on_demand);
    }
    let report = Report {
        trace: trace.source.clone(),
        model: args.model.clone(),
        intervals: range.len(),
        node_default: sim::NODE_DEFAULT,
        strategies: runs
            .iter()
            .map(|r| strategy_json(r, &bars, bill(r)))
            .collect(),
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let avail: Vec<u32> = trace.intervals[range].iter().map(|i| i.nodes).collect();
        crate::plot::simulation(path, &trace.source, trace.interval_secs, &avail, &runs)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn cost_model(args: &Args) -> Result<CostModel> {
    let mut model = CostModel::builtin(&args.model).with_context(|| {
        format!(
            "unknown model `{}` (expected one of {})",
            args.model,
            MODELS.join(", ")
        )
    })?;
    if let Some(path) = &args.profile {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("{name}: cannot read"))?;
        let profile = Profile::parse(&text, &name)?;
        model = CostModel::new(model.spec, profile.table, model.transfer);
    }
    let rule = match args.repartition.as_str() {
        "last" => RepartitionRule::LastStage,
        "handoff" => RepartitionRule::Handoff,
        _ => RepartitionRule::Sum,
    };
    Ok(model.with_repartition(rule))
}

/// What every strategy is measured against: the samples of `ideal`, `reactive` and the better
/// of `reactive` and `liveput-predict`, each when it ran.
struct Bars {
    ideal: Option<f64>,
    reactive: Option<f64>,
    best_baseline: Option<f64>,
}

impl Bars {
    fn of(runs: &[StrategyRun]) -> Self {
        let samples = |name: &str| runs.iter().find(|r| r.name == name).map(|r| r.samples);
        let reactive = samples("reactive");
        Self {
            ideal: samples("ideal"),
            reactive,
            best_baseline: reactive
                .zip(samples("liveput-predict"))
                .map(|(a, b)| a.max(b)),
        }
    }

    /// `x / base` when the base ran and is positive.
    fn ratio(x: f64, base: Option<f64>) -> Option<f64> {
        base.filter(|b| *b > 0.0).map(|b| x / b)
    }
}

fn strategy_json(r: &StrategyRun, bars: &Bars, cost: Option<Bill>) -> StrategyJson {
    StrategyJson {
        name: r.name.clone(),
        samples: r.samples,
        x_reactive: Bars::ratio(r.samples, bars.reactive),
        x_best_baseline: Bars::ratio(r.samples, bars.best_baseline),
        pct_ideal: Bars::ratio(r.samples, bars.ideal).map(|x| 100.0 * x),
        migrations: r.migrations,
        migration_secs: r.migration_secs,
        configs: r
            .configs
            .iter()
            .map(|c: &ParallelConfig| [c.d, c.p])
            .collect(),
        cost,
    }
}

/// The money table: every strategy holds the same spot machines; what differs is what they
/// trained with them.
fn print_bills(
    runs: &[StrategyRun],
    bill: &dyn Fn(&StrategyRun) -> Option<Bill>,
    prices: Prices,
    on_demand: OnDemand,
) {
    println!(
        "money at {} per spot and {} per on-demand machine-hour; on-demand baseline: {} machines at {:.1} samples/s",
        prices.spot, prices.on_demand, on_demand.machines, on_demand.samples_per_sec
    );
    println!(
        "{:<19} {:>14} {:>12} {:>16} {:>12}",
        "strategy", "machine-hours", "cost", "per M samples", "saving"
    );
    for r in runs {
        let Some(b) = bill(r) else { continue };
        println!(
            "{:<19} {:>14.1} {:>12.2} {:>16} {:>12}",
            r.name,
            b.machine_hours,
            b.cost,
            b.cost_per_million_samples
                .map_or("-".into(), |v| format!("{v:.2}")),
            b.saving_vs_on_demand
                .map_or("-".into(), |v| format!("{:.1} %", 100.0 * v)),
        );
    }
}

fn print_table(trace: &Trace, model: &str, runs: &[StrategyRun], bars: &Bars) {
    let show = |x: Option<f64>, digits: usize| match x {
        Some(v) => format!("{v:.digits$}"),
        None => "-".to_string(),
    };
    println!(
        "trace {} ({} intervals of {} s), model {model}",
        trace.source,
        trace.len(),
        trace.interval_secs
    );
    println!(
        "{:<19} {:>14} {:>8} {:>10} {:>14} {:>10} {:>13}",
        "strategy",
        "samples",
        "% ideal",
        "x reactive",
        "x max(r, pred)",
        "migrations",
        "migrating (s)"
    );
    for r in runs {
        let marker = if r.name == sim::NODE_DEFAULT {
            " *"
        } else {
            ""
        };
        println!(
            "{:<19} {:>14.0} {:>8} {:>10} {:>14} {:>10} {:>13.0}",
            format!("{}{marker}", r.name),
            r.samples,
            show(Bars::ratio(r.samples, bars.ideal).map(|x| 100.0 * x), 1),
            show(Bars::ratio(r.samples, bars.reactive), 3),
            show(Bars::ratio(r.samples, bars.best_baseline), 3),
            r.migrations,
            r.migration_secs
        );
    }
    println!(
        "* the node's default; x max(r, pred): over the better of reactive and liveput-predict"
    );
}
