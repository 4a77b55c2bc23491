//! `simulate --zones`: one job over several zones, each replaying its own trace on its own
//! device kind, planned zone-aware (the node's rule), zone-blind, reactively, and on the best
//! zone alone (`parcae_strategies::sim::fleet`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use parcae_pool::Pool;
use parcae_strategies::cost::CostModel;
use parcae_strategies::cost::advice::advise;
use parcae_strategies::cost::analytic::Hardware;
use parcae_strategies::cost::fleet::{Fleet, FleetPool};
use parcae_strategies::cost::links::Links;
use parcae_strategies::cost::mixed::DeviceCosts;
use parcae_strategies::cost::objective::ObjectiveKind;
use parcae_strategies::sim::diloco::{Outer, RoundsReport};
use parcae_strategies::sim::fleet::{
    FleetRun, Layout, Objective, compositions, nodes_used, simulate_fleet,
};
use parcae_strategies::trace::{self, Trace};
use serde::Serialize;

use crate::plot::zones::{ZoneLine, fleet_simulation};
use crate::prices::zone_prices;

/// Fastest a zone's device may be against the profiled one, either way.
const MAX_SPEED: f64 = 100.0;
/// Most memory a zone's device may have, GiB.
const MAX_MEMORY_GIB: f64 = 4096.0;

/// One `--zones` entry: `NAME=TRACE[@SPEED[/MEMORY_GIB]]`, `NAME` a zone or a pool of one
/// instance type in a zone (`ZONE/TYPE`).
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneSpec {
    /// The zone, or the pool (`ZONE/TYPE`).
    pub pool: Pool,
    /// Its trace (a file or `synthetic:...`).
    pub trace: String,
    /// Its device's speed against the model's profiled device.
    pub speed: f64,
    /// Its device's memory, GiB (`None`: the profiled device's).
    pub memory_gib: Option<f64>,
}

/// Reads one `--zones` entry, naming what is wrong.
pub fn parse_zone(text: &str) -> Result<ZoneSpec> {
    let usage =
        "expected NAME=TRACE[@SPEED[/MEMORY_GIB]], e.g. us-east-1b=synthetic:quiet:2@1.5/24";
    let (name, rest) = text
        .split_once('=')
        .with_context(|| format!("zone {text:?}: {usage}"))?;
    let pool: Pool = name.parse().map_err(|e| {
        anyhow::anyhow!("zone {text:?}: the name {name:?} is not a ZONE or ZONE/TYPE: {e}")
    })?;
    let (trace, device) = match rest.rsplit_once('@') {
        Some((trace, device)) => (trace, Some(device)),
        None => (rest, None),
    };
    if trace.is_empty() {
        bail!("zone {text:?}: no trace; {usage}");
    }
    let (speed, memory_gib) = match device {
        None => (1.0, None),
        Some(device) => {
            let (speed, memory) = match device.split_once('/') {
                Some((s, m)) => (s, Some(m)),
                None => (device, None),
            };
            let figure = |what: &str, value: &str, most: f64| -> Result<f64> {
                let v: f64 = value
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite() && *v > 0.0 && *v <= most)
                    .with_context(|| {
                        format!("zone {text:?}: {what} {value:?} must be a number above 0 and at most {most}")
                    })?;
                Ok(v)
            };
            let speed = figure("speed", speed, MAX_SPEED)?;
            if speed < 1.0 / MAX_SPEED {
                bail!(
                    "zone {text:?}: speed {speed} must be at least {}",
                    1.0 / MAX_SPEED
                );
            }
            let memory = memory
                .map(|m| figure("memory (GiB)", m, MAX_MEMORY_GIB))
                .transpose()?;
            (speed, memory)
        }
    };
    Ok(ZoneSpec {
        pool,
        trace: trace.into(),
        speed,
        memory_gib,
    })
}

/// What `--zones` needs from `simulate`'s options.
pub struct FleetArgs<'a> {
    pub zones: &'a [String],
    pub links: &'a [String],
    pub prices: &'a [String],
    pub objective: ObjectiveKind,
    /// Whether rings across zones may all-reduce by zone.
    pub by_zone: bool,
    /// DiLoCo's rounds, where `--sync diloco:H|auto` asks for them.
    pub outer: Option<Outer>,
    pub model: &'a CostModel,
    pub model_name: &'a str,
    pub interval_secs: u64,
    pub start_hour: f64,
    pub end_hour: Option<f64>,
    pub lookahead: usize,
    pub seed: u64,
    pub json: Option<&'a Path>,
    pub plot: Option<&'a Path>,
}

/// The JSON document `--json` writes with `--zones`.
#[derive(Serialize)]
struct FleetReport {
    model: String,
    intervals: usize,
    interval_secs: u64,
    /// The strategy a node's planner runs, here laid out over the zones.
    node_default: &'static str,
    /// What the zone-aware strategies planned for: `samples` or `samples-per-dollar`.
    objective: &'static str,
    zones: Vec<ZoneJson>,
    strategies: Vec<FleetStrategyJson>,
    /// What to do with each pool under `liveput-zone`'s plan at the run's last interval.
    advice: Vec<AdviceJson>,
}

/// One pool's advice (`cost::advice`).
#[derive(Serialize)]
struct AdviceJson {
    pool: String,
    nodes_now: u32,
    nodes_used: u32,
    action: &'static str,
    reason: String,
}

#[derive(Serialize)]
struct ZoneJson {
    name: String,
    trace: String,
    speed: f64,
    memory_gib: f64,
    usd_per_node_hour: Option<f64>,
}

/// One pool's part of a strategy's bill.
#[derive(Serialize)]
struct PoolLedgerJson {
    name: String,
    held_node_hours: f64,
    billed_node_hours: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    usd: Option<f64>,
}

#[derive(Serialize)]
struct FleetStrategyJson {
    name: String,
    samples: f64,
    x_single_zone_best: Option<f64>,
    x_zone_blind: Option<f64>,
    migrations: u32,
    migration_secs: f64,
    /// Node-hours billed: each pool's nodes while a plan uses the pool (or none is laid out).
    node_hours: f64,
    /// Node-hours the traces offered, used or not.
    held_node_hours: f64,
    egress_usd: f64,
    /// Each pool's node-hours, offered and billed, and what they cost.
    pools: Vec<PoolLedgerJson>,
    /// Node-hours at each zone's price, egress included (when every zone has a price).
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    samples_per_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<String>,
    /// DiLoCo's rounds: how many, what crossed zones, the waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds: Option<RoundsReport>,
    configs: Vec<[u32; 2]>,
}

/// Runs `simulate --zones`.
pub fn run(args: FleetArgs) -> Result<()> {
    let specs: Vec<ZoneSpec> = args
        .zones
        .iter()
        .map(|z| parse_zone(z))
        .collect::<Result<_>>()?;
    let mut links = Links::default();
    for link in args.links {
        links.set(link)?;
    }
    let pools: Vec<Pool> = specs.iter().map(|s| s.pool.clone()).collect();
    let prices = zone_prices(args.prices, &pools)?;
    let objective = match (args.objective, &prices) {
        (ObjectiveKind::Samples, _) => Objective::Samples,
        (ObjectiveKind::SamplesPerDollar, Some(p)) => Objective::SamplesPerDollar {
            usd_per_node_hour: p.clone(),
        },
        (ObjectiveKind::SamplesPerDollar, None) => {
            bail!("--objective samples-per-dollar needs --price-spot for every zone")
        }
    };
    let base = DeviceCosts::profiled(
        &args.model.spec,
        args.model_name,
        Hardware::default().memory_mb,
    );
    let mut traces: Vec<Trace> = Vec::new();
    let mut zones = Vec::new();
    for z in &specs {
        traces.push(
            trace::load(&z.trace, args.interval_secs)
                .with_context(|| format!("zone {}", z.pool))?,
        );
        let memory_mb = z.memory_gib.map_or(base.memory_mb, |g| g * 1024.0);
        zones.push(FleetPool {
            pool: z.pool.clone(),
            device: base.derived(
                &format!("{}x{}", args.model_name, z.speed),
                z.speed,
                memory_mb,
            ),
        });
    }
    let shortest = traces
        .iter()
        .min_by_key(|t| t.len())
        .context("--zones names no zone")?;
    let end = args.end_hour.unwrap_or(shortest.hours());
    let range = shortest.window(args.start_hour, end)?;
    if range.is_empty() {
        bail!(
            "window {}..{} h holds no interval of every zone",
            args.start_hour,
            end
        );
    }
    let mut fleet =
        Fleet::new(args.model.spec.clone(), zones, links)?.with_all_reduce_by_zone(args.by_zone);
    let runs = simulate_fleet(
        &mut fleet,
        &traces,
        range.clone(),
        args.lookahead,
        args.seed,
        &objective,
        args.outer,
    )?;
    let rows = rows(&runs, &pools, prices.as_deref());
    print_rows(&specs, args.model_name, range.len(), &rows);
    if let Some(path) = args.plot {
        plot(
            path,
            args.model_name,
            &mut fleet,
            &traces,
            range.clone(),
            &runs,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = args.json {
        let report = FleetReport {
            model: args.model_name.into(),
            intervals: range.len(),
            interval_secs: args.interval_secs,
            node_default: parcae_strategies::sim::NODE_DEFAULT,
            objective: args.objective.as_str(),
            zones: specs
                .iter()
                .zip(fleet.pools())
                .enumerate()
                .map(|(i, (s, z))| ZoneJson {
                    name: s.pool.to_string(),
                    trace: s.trace.clone(),
                    speed: s.speed,
                    memory_gib: z.device.memory_mb / 1024.0,
                    usd_per_node_hour: prices.as_ref().map(|p| p[i]),
                })
                .collect(),
            strategies: rows,
            advice: last_advice(&mut fleet, &traces, range.clone(), &runs)?,
        };
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Nodes of each pool, one row per interval.
type PerInterval = Vec<Vec<u32>>;

/// Each pool's nodes per interval of `traces`, and of those the first run's (`liveput-zone`)
/// per interval of `range`.
fn ours_on_pools(
    fleet: &mut Fleet,
    traces: &[Trace],
    range: std::ops::Range<usize>,
    runs: &[FleetRun],
) -> Result<(PerInterval, PerInterval)> {
    let counts = compositions(traces)?.counts;
    let ours = &runs.first().context("no strategy ran")?.run;
    let used = nodes_used(fleet, Layout::ZoneAware, &counts, ours, range.start);
    Ok((counts, used))
}

/// The advice for each pool under the first run's plan (`liveput-zone`) at the last interval
/// of `range`.
fn last_advice(
    fleet: &mut Fleet,
    traces: &[Trace],
    range: std::ops::Range<usize>,
    runs: &[FleetRun],
) -> Result<Vec<AdviceJson>> {
    let (counts, used) = ours_on_pools(fleet, traces, range.clone(), runs)?;
    let (Some(held), Some(used)) = (counts.get(range.end.saturating_sub(1)), used.last()) else {
        return Ok(Vec::new());
    };
    Ok(advise(held, used)
        .into_iter()
        .enumerate()
        .map(|(z, a)| AdviceJson {
            pool: fleet.pools()[z].pool.to_string(),
            nodes_now: held[z],
            nodes_used: used[z],
            action: a.action.as_str(),
            reason: a.reason,
        })
        .collect())
}

/// The plot of `runs` over `range`: each zone's nodes and those the zone-aware strategy (the
/// first run) trains on.
fn plot(
    path: &Path,
    model: &str,
    fleet: &mut Fleet,
    traces: &[Trace],
    range: std::ops::Range<usize>,
    runs: &[FleetRun],
) -> Result<()> {
    let (counts, used) = ours_on_pools(fleet, traces, range.clone(), runs)?;
    let names: Vec<String> = fleet.pools().iter().map(|z| z.pool.to_string()).collect();
    let zones: Vec<ZoneLine> = names
        .iter()
        .enumerate()
        .map(|(z, name)| ZoneLine {
            name,
            held: counts[range.clone()].iter().map(|c| c[z]).collect(),
            used: used.iter().map(|u| u[z]).collect(),
        })
        .collect();
    let runs: Vec<_> = runs.iter().map(|r| &r.run).collect();
    let title = format!("{model} over {} zones", zones.len());
    let interval_secs = traces.first().map_or(60, |t| t.interval_secs);
    fleet_simulation(path, &title, interval_secs, &zones, &runs)
}

fn rows(runs: &[FleetRun], pools: &[Pool], prices: Option<&[f64]>) -> Vec<FleetStrategyJson> {
    let samples = |name: &str| {
        runs.iter()
            .find(|r| r.run.name == name)
            .map(|r| r.run.samples)
    };
    let ratio = |x: f64, base: Option<f64>| base.filter(|b| *b > 0.0).map(|b| x / b);
    runs.iter()
        .map(|r| {
            let cost = prices.map(|p| r.cost_usd(p));
            FleetStrategyJson {
                name: r.run.name.clone(),
                samples: r.run.samples,
                x_single_zone_best: ratio(r.run.samples, samples("single-zone-best")),
                x_zone_blind: ratio(r.run.samples, samples("zone-blind")),
                migrations: r.run.migrations,
                migration_secs: r.run.migration_secs,
                node_hours: r.node_hours.iter().sum(),
                held_node_hours: r.held_node_hours.iter().sum(),
                egress_usd: r.egress_usd,
                pools: pools
                    .iter()
                    .enumerate()
                    .map(|(z, pool)| PoolLedgerJson {
                        name: pool.to_string(),
                        held_node_hours: r.held_node_hours.get(z).copied().unwrap_or(0.0),
                        billed_node_hours: r.node_hours.get(z).copied().unwrap_or(0.0),
                        usd: prices.and_then(|p| Some(p.get(z)? * r.node_hours.get(z)?)),
                    })
                    .collect(),
                cost,
                samples_per_usd: cost.filter(|c| *c > 0.0).map(|c| r.run.samples / c),
                zone: r.zone.clone(),
                rounds: r.rounds.clone(),
                configs: r.run.configs.iter().map(|c| [c.d, c.p]).collect(),
            }
        })
        .collect()
}

fn print_rows(specs: &[ZoneSpec], model: &str, intervals: usize, rows: &[FleetStrategyJson]) {
    println!(
        "model {model}, {intervals} intervals over {} zones:",
        specs.len()
    );
    for z in specs {
        let memory = z
            .memory_gib
            .map_or("profiled".into(), |g| format!("{g} GiB"));
        println!(
            "  {:<16} {} (device x{}, memory {memory})",
            z.pool, z.trace, z.speed
        );
    }
    let show = |x: Option<f64>, digits: usize| x.map_or("-".into(), |v| format!("{v:.digits$}"));
    println!(
        "{:<18} {:>12} {:>8} {:>8} {:>10} {:>11} {:>11} {:>10} {:>10} {:>12}",
        "strategy",
        "samples",
        "x single",
        "x blind",
        "migrations",
        "held n-h",
        "billed n-h",
        "egress $",
        "cost $",
        "samples/$"
    );
    for r in rows {
        let name = match &r.zone {
            Some(zone) => format!("{} ({zone})", r.name),
            None => r.name.clone(),
        };
        println!(
            "{:<18} {:>12.0} {:>8} {:>8} {:>10} {:>11.1} {:>11.1} {:>10.2} {:>10} {:>12}",
            name,
            r.samples,
            show(r.x_single_zone_best, 3),
            show(r.x_zone_blind, 3),
            r.migrations,
            r.held_node_hours,
            r.node_hours,
            r.egress_usd,
            show(r.cost, 2),
            show(r.samples_per_usd, 0),
        );
    }
    println!(
        "liveput-zone is the node's rule laid out zone-aware; zone-blind plans as if every node were the worst device in one zone"
    );
    println!(
        "billed: a pool's nodes while a plan uses the pool; a pool the plan in force leaves idle is released"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_names_its_trace_and_device() {
        let z = parse_zone("us-east-1b=synthetic:quiet:2@1.5/24").unwrap();
        assert_eq!(z.pool.to_string(), "us-east-1b");
        assert_eq!(z.trace, "synthetic:quiet:2");
        assert_eq!(z.speed, 1.5);
        assert_eq!(z.memory_gib, Some(24.0));
        let plain = parse_zone("a=../p3.csv").unwrap();
        assert_eq!((plain.speed, plain.memory_gib), (1.0, None));
        assert_eq!(parse_zone("a=t@2").unwrap().speed, 2.0);
    }

    #[test]
    fn a_bad_zone_is_refused_naming_what_is_wrong() {
        for (text, names) in [
            ("no-equals", "expected NAME=TRACE"),
            ("Upper=t", "the name \"Upper\""),
            ("a=", "no trace"),
            ("a=t@fast", "speed \"fast\""),
            ("a=t@0", "speed \"0\""),
            ("a=t@1.5/-3", "memory (GiB) \"-3\""),
            ("a=t@1e9", "speed \"1e9\""),
            ("a=t@0.001", "speed 0.001 must be at least"),
        ] {
            let err = parse_zone(text).unwrap_err().to_string();
            assert!(err.contains(names), "{text}: {err}");
        }
    }

    #[test]
    fn a_pool_is_a_zone_and_an_instance_type() {
        let pool = parse_zone("a/g5.xlarge=t@0.6/24").unwrap();
        assert_eq!(pool.pool.instance_type(), Some("g5.xlarge"));
        assert_eq!((pool.pool.zone(), pool.speed), ("a", 0.6));
        for bad in ["a/=t", "a/p3 2x=t", "A/p3=t"] {
            let err = parse_zone(bad).unwrap_err().to_string();
            assert!(err.contains("ZONE/TYPE"), "{bad}: {err}");
        }
    }
}
